"""d2lmini.hyper: manifold-constrained hyper-connections, checked against DeepSeek-V4 (transformers 5.24)."""

import pytest
import torch
from torch import nn

from d2lmini.hyper import (INIT_STD, HyperConnectedBlock, HyperConnection, HyperHead, expand_streams,
                           sinkhorn_knopp)
from d2lmini.reference import randomize_

D, N_STREAMS, TOL = 32, 3, 1e-5


def _v4():
    pytest.importorskip("transformers")
    from transformers.models.deepseek_v4 import configuration_deepseek_v4 as c, modeling_deepseek_v4 as m
    config = c.DeepseekV4Config(
        vocab_size=50, hidden_size=D, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, q_lora_rank=16, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=4, hc_mult=N_STREAMS)
    return m, config


def _randomize_hc_(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter random, the projections large enough that the mappings are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 2 else 1.0)
                    + (1.0 if p.numel() <= 3 else 0.0))  # alpha around 1
    return module


def _streams(seed: int = 0, batch: int = 2, steps: int = 6) -> torch.Tensor:
    return torch.randn(batch, steps, N_STREAMS, D, generator=torch.Generator().manual_seed(seed))


def _outputs_and_grads(run, X: torch.Tensor, seed: int = 1):
    """Outputs of ``run(X)`` (a tensor or a tuple of tensors) and the gradient of a random read-out w.r.t. ``X``."""
    Z = X.clone().requires_grad_(True)
    Y = run(Z)
    Y = Y if isinstance(Y, tuple) else (Y,)
    gen = torch.Generator().manual_seed(seed)
    sum((y * torch.randn(y.shape, generator=gen)).sum() for y in Y).backward()
    return [y.detach() for y in Y], Z.grad


def _max_diffs(run_a, run_b, X):
    outs_a, grad_a = _outputs_and_grads(run_a, X)
    outs_b, grad_b = _outputs_and_grads(run_b, X)
    out = max(float((a - b).abs().max()) for a, b in zip(outs_a, outs_b))
    return out, float((grad_a - grad_b).abs().max())


def _copy_hc(v4_hc, hc: HyperConnection) -> None:
    with torch.no_grad():
        v4_hc.fn.copy_(hc.phi)
        v4_hc.base.copy_(hc.bias)
        v4_hc.scale.copy_(hc.alpha)


# ----------------------------------------------------------------------------- against DeepSeek-V4


def test_hyper_connection_matches_deepseek_v4():
    m, config = _v4()
    hc = _randomize_hc_(HyperConnection(D, N_STREAMS), seed=0)
    v4 = m.DeepseekV4HyperConnection(config)
    _copy_hc(v4, hc)

    def ours(S):
        h_pre, h_post, h_res = hc.mappings(S)
        return h_post, h_res.transpose(-1, -2), (h_pre.unsqueeze(-1) * S).sum(dim=2)

    X = _streams()
    _, _, h_res = hc.mappings(X)
    assert (h_res - h_res.transpose(-1, -2)).abs().max() > 1e-2  # the transpose is observable
    out, grad = _max_diffs(ours, v4, X)
    assert out <= TOL and grad <= TOL, (out, grad)


def test_forward_is_v4s_collapse_expand_and_transposed_mix():
    m, config = _v4()
    hc = _randomize_hc_(HyperConnection(D, N_STREAMS), seed=1)
    v4 = m.DeepseekV4HyperConnection(config)
    _copy_hc(v4, hc)
    F = nn.Linear(D, D)

    def theirs(S):
        post, comb, collapsed = v4(S)
        return post.unsqueeze(-1) * torch.tanh(F(collapsed)).unsqueeze(-2) + comb.transpose(-1, -2) @ S

    out, grad = _max_diffs(lambda S: hc(S, lambda x: torch.tanh(F(x))), theirs, _streams(2))
    assert out <= TOL and grad <= TOL, (out, grad)


def test_hyper_head_matches_deepseek_v4():
    m, config = _v4()
    head = _randomize_hc_(HyperHead(D, N_STREAMS), seed=3)
    v4 = m.DeepseekV4HyperHead(config)
    with torch.no_grad():
        v4.hc_fn.copy_(head.phi)
        v4.hc_base.copy_(head.bias)
        v4.hc_scale.copy_(head.alpha)
    out, grad = _max_diffs(head, v4, _streams(4))
    assert out <= TOL and grad <= TOL, (out, grad)


class _V4Attention(nn.Module):
    """d2lmini's attention module as ``DeepseekV4DecoderLayer.self_attn``: ``(x, **kwargs) -> (out, None)``."""

    def __init__(self, attention: nn.Module, valid_lens=None):
        super().__init__()
        self.attention, self.valid_lens = attention, valid_lens

    def forward(self, hidden_states, **kwargs):
        return self.attention(hidden_states, hidden_states, hidden_states, self.valid_lens), None


class _V4MLP(nn.Module):
    """d2lmini's FFN as ``DeepseekV4DecoderLayer.mlp``: ``(x, input_ids=None) -> out``."""

    def __init__(self, ffn: nn.Module):
        super().__init__()
        self.ffn = ffn

    def forward(self, hidden_states, input_ids=None):
        return self.ffn(hidden_states)


@pytest.mark.parametrize("valid_lens", [None, torch.tensor([6, 3])])
def test_block_matches_deepseek_v4_decoder_layer_wiring(valid_lens):
    m, config = _v4()
    block = HyperConnectedBlock(D, 4, num_streams=N_STREAMS, causal=True, num_kv_heads=2)
    randomize_(block, seed=5)  # attention, FFN and both norm gains
    _randomize_hc_(block.hc1, seed=6)
    _randomize_hc_(block.hc2, seed=7)
    layer = m.DeepseekV4DecoderLayer(config, 0)
    layer.self_attn = _V4Attention(block.attention, valid_lens)  # the SAME modules: only the wiring is compared
    layer.mlp = _V4MLP(block.ffn)
    _copy_hc(layer.attn_hc, block.hc1)
    _copy_hc(layer.ffn_hc, block.hc2)
    with torch.no_grad():
        layer.input_layernorm.weight.copy_(block.norm1.weight)
        layer.post_attention_layernorm.weight.copy_(block.norm2.weight)
    out, grad = _max_diffs(lambda S: block(S, valid_lens), layer, _streams(8))
    assert out <= TOL and grad <= TOL, (out, grad)


def test_expand_streams_matches_deepseek_v4_model_entry():
    X = torch.randn(2, 5, D)
    S = expand_streams(X, N_STREAMS)
    assert S.shape == (2, 5, N_STREAMS, D) and S.is_contiguous()
    assert torch.equal(S, X.unsqueeze(2).expand(-1, -1, N_STREAMS, -1))


def test_a_stack_runs_on_ordinary_sequences():
    torch.manual_seed(0)
    blocks = [HyperConnectedBlock(D, 4, num_streams=N_STREAMS, causal=True) for _ in range(3)]
    head = HyperHead(D, N_STREAMS)
    S = expand_streams(torch.randn(2, 7, D), N_STREAMS)
    for block in blocks:
        S = block(S, torch.tensor([7, 4]))
    assert head(S).shape == (2, 7, D) and torch.isfinite(head(S)).all()


# ----------------------------------------------------------------------------- properties


def test_sinkhorn_knopp_rows_and_columns_sum_to_one():
    logits = torch.randn(500, 4, 4, generator=torch.Generator().manual_seed(0))
    M = sinkhorn_knopp(logits)
    assert (M >= 0).all()
    assert (M.sum(dim=-2) - 1).abs().max() < 1e-5  # it ends on a column step
    assert (M.sum(dim=-1) - 1).abs().max() < 1e-3
    one_step = sinkhorn_knopp(logits, iters=1)  # fewer iterations: rows further from 1
    assert (one_step.sum(dim=-1) - 1).abs().max() > 10 * (M.sum(dim=-1) - 1).abs().max()


def test_sinkhorn_knopp_is_v4s_recipe():
    logits = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(1))
    eps = 1e-6
    M = torch.softmax(logits, -1) + eps
    M = M / (M.sum(-2, keepdim=True) + eps)
    for _ in range(4):
        M = M / (M.sum(-1, keepdim=True) + eps)
        M = M / (M.sum(-2, keepdim=True) + eps)
    torch.testing.assert_close(sinkhorn_knopp(logits, iters=5, eps=eps), M, rtol=0, atol=0)


def test_mixing_keeps_the_streams_mean_and_equal_streams_equal():
    hc = HyperConnection(D, N_STREAMS)
    with torch.no_grad():
        hc.phi.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
        hc.bias.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    X = _streams(9)
    mixed = hc(X, torch.zeros_like)  # sublayer 0: only H^res x
    _, _, h_res = hc.mappings(X)
    assert (h_res.sum(dim=-1) - 1).abs().max() < 1e-5  # rows of H^res = columns of V4's comb
    assert (h_res.sum(dim=-2) - 1).abs().max() < 1e-3
    assert (mixed.mean(dim=2) - X.mean(dim=2)).abs().max() < 1e-3  # doubly stochastic: the mean is kept
    equal = expand_streams(torch.randn(2, 6, D), N_STREAMS)
    out = hc(equal, torch.zeros_like)
    assert (out - equal).abs().max() < 1e-4  # rows summing to 1: equal streams stay equal


def test_initialization_follows_deepseek_v4():
    torch.manual_seed(0)
    hc, head = HyperConnection(64, 4), HyperHead(64, 4)
    assert hc.phi.shape == (24, 256) and hc.bias.shape == (24,) and hc.alpha.shape == (3,)
    assert head.phi.shape == (4, 256) and head.bias.shape == (4,) and head.alpha.shape == (1,)
    for module in (hc, head):
        assert torch.equal(module.bias, torch.zeros_like(module.bias))
        assert torch.equal(module.alpha, torch.ones_like(module.alpha))
        assert abs(float(module.phi.detach().std()) - INIT_STD) < 0.1 * INIT_STD
    with torch.no_grad():  # random around 1/2, 1 and J/n (logits of std INIT_STD * sqrt(n d) = 0.32)
        h_pre, h_post, h_res = hc.mappings(torch.randn(8, 16, 4, 64))
    assert abs(float(h_pre.mean()) - 0.5) < 0.02 and abs(float(h_post.mean()) - 1) < 0.04
    assert abs(float(h_res.mean()) - 0.25) < 1e-3 and 0.05 < float(h_pre.std()) < 0.12  # 0.32 / 4


def test_more_streams_change_the_output():
    torch.manual_seed(0)
    X = torch.randn(2, 5, D)
    one = HyperConnectedBlock(D, 4, num_streams=1, causal=True)
    two = HyperConnectedBlock(D, 4, num_streams=2, causal=True)
    state = {k: v for k, v in one.state_dict().items() if not k.startswith(("hc1.", "hc2."))}
    two.load_state_dict(state, strict=False)
    _randomize_hc_(two.hc1, 0)
    y1 = one(expand_streams(X, 1)).squeeze(2)
    y2 = two(expand_streams(X, 2)).mean(dim=2)
    assert (y1 - y2).abs().max() > 1e-3


def test_hyper_connection_is_float32_inside_for_bfloat16_streams():
    hc = _randomize_hc_(HyperConnection(D, N_STREAMS), seed=0)
    X = _streams(3).bfloat16()
    h_pre, h_post, h_res = hc.mappings(X)
    assert h_pre.dtype == h_post.dtype == h_res.dtype == torch.float32
    assert hc(X, lambda x: x).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("make, error, name", [
    (lambda: HyperConnection(D, 0), ValueError, "num_streams"),
    (lambda: HyperConnection(D, 2.0), TypeError, "num_streams"),
    (lambda: HyperConnection(0, 2), ValueError, "num_hiddens"),
    (lambda: HyperConnection(D, 2, sinkhorn_iters=0), ValueError, "sinkhorn_iters"),
    (lambda: HyperConnection(D, 2, eps=0.0), ValueError, "eps"),
    (lambda: HyperConnection(D, 2, norm_eps=-1.0), ValueError, "norm_eps"),
    (lambda: HyperHead(D, 0), ValueError, "num_streams"),
    (lambda: HyperConnectedBlock(D, 4, num_streams=0), ValueError, "num_streams"),
    (lambda: HyperConnectedBlock(D, 4, act="tanh"), ValueError, "act"),
    (lambda: HyperConnectedBlock(D, 4, window=0, causal=True), ValueError, "window"),
])
def test_bad_arguments(make, error, name):
    with pytest.raises(error, match=name):
        make()


def test_arguments_after_num_streams_are_keyword_only():
    with pytest.raises(TypeError):
        HyperConnection(D, 2, 20)
    with pytest.raises(TypeError):
        HyperConnectedBlock(D, 4, 2)


@pytest.mark.parametrize("X, error", [
    (torch.randn(2, 6, D), ValueError),  # (b, n, d): not expanded
    (torch.randn(2, 6, N_STREAMS + 1, D), ValueError),  # wrong number of streams
    (torch.randn(2, 6, N_STREAMS, D + 1), ValueError),  # wrong width
    (torch.ones(2, 6, N_STREAMS, D, dtype=torch.long), TypeError),
    ([[1.0]], TypeError),
])
def test_bad_streams(X, error):
    hc, head = HyperConnection(D, N_STREAMS), HyperHead(D, N_STREAMS)
    block = HyperConnectedBlock(D, 4, num_streams=N_STREAMS)
    for call in (lambda: hc(X, lambda x: x), lambda: head(X), lambda: block(X), lambda: hc.mappings(X)):
        with pytest.raises(error, match="streams"):
            call()


def test_bad_sublayer_logits_and_entry():
    hc = HyperConnection(D, N_STREAMS)
    with pytest.raises(TypeError, match="sublayer"):
        hc(_streams(), "attention")
    with pytest.raises(ValueError, match="logits"):
        sinkhorn_knopp(torch.randn(3, 4))
    with pytest.raises(TypeError, match="logits"):
        sinkhorn_knopp(torch.ones(4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="iters"):
        sinkhorn_knopp(torch.randn(4, 4), iters=0)
    with pytest.raises(ValueError, match="X"):
        expand_streams(torch.randn(6, D), 4)
    with pytest.raises(ValueError, match="num_streams"):
        expand_streams(torch.randn(2, 6, D), 0)
    with pytest.raises(TypeError, match="X"):
        expand_streams(torch.ones(2, 6, D, dtype=torch.long), 4)


def test_valid_lens_reach_the_attention():
    torch.manual_seed(0)
    block = HyperConnectedBlock(D, 4, num_streams=N_STREAMS, causal=False)
    S = _streams(8)
    with torch.no_grad():
        full, padded = block(S), block(S, torch.tensor([6, 3]))
    assert torch.equal(full[0], padded[0])  # length 6 = all positions: unchanged
    assert (full[1] - padded[1]).abs().max() > 1e-3
