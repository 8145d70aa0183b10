"""Parallel attention + FFN: TransformerBlock(placement='parallel' | 'parallel_two_norms').

``x <- x + Attn(N_1(x)) + FFN(N_2(x))``, checked against the real layers of ``transformers``:
``GPTNeoXLayer`` (``use_parallel_residual``, two norms), ``PhiDecoderLayer`` and Falcon-7B's
``FalconDecoderLayer`` (``parallel_attn``, one shared norm), and Falcon-40B's
(``new_decoder_architecture``, ``ln_attn``/``ln_mlp``). All of them rotate queries and keys
with RoPE in layouts of their own; to isolate the parallel structure the reference layers get
``position_embeddings`` with ``cos = 1``, ``sin = 0`` (the identity rotation) and the d2lmini
block ``rope_theta=None``. Float32, tiny random configs with every parameter randomized
(norms and biases too), a padded batch; outputs and input gradients to 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from d2lmini import AddNorm, TransformerBlock, TransformerDecoderBlock
from d2lmini.attention import valid_lens_mask
from d2lmini.block import PARALLEL_PLACEMENTS, PLACEMENTS, SEQUENTIAL_PLACEMENTS
from d2lmini.reference import (
    _copy_linear,
    _copy_norm,
    _randomize_,
    additive_mask,
    output_and_grad_differences,
)

tf = pytest.importorskip("transformers")

D, H, N, B = 64, 4, 12, 2
HEAD = D // H


# --------------------------------------------------------------------------- against transformers


def _compare(layer, block, call, seed=0):
    """Max |output diff| and |input-gradient diff| on a padded batch (second sequence 7 of 12)."""
    gen = torch.Generator().manual_seed(seed + 1)
    X, R = torch.randn(B, N, D, generator=gen), torch.randn(B, N, D, generator=gen)
    valid_lens = torch.tensor([N, 7])
    mask = additive_mask(valid_lens, N, causal=True, batch_size=B)
    keep = valid_lens_mask(valid_lens, N)[..., None]
    runs = (lambda Z: call(Z, mask), lambda Z: block(Z, valid_lens))
    return output_and_grad_differences(runs, X, R, keep)


def _identity_rotation(dim):
    """(cos, sin) of shape (B, N, dim) that rotate by 0: RoPE left out on both sides."""
    return torch.ones(B, N, dim), torch.zeros(B, N, dim)


def _gpt_neox(seed=0):
    config = tf.GPTNeoXConfig(hidden_size=D, num_attention_heads=H, intermediate_size=160, use_parallel_residual=True,
                              hidden_act="gelu", num_hidden_layers=1, attention_bias=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    layer = _randomize_(tf.models.gpt_neox.modeling_gpt_neox.GPTNeoXLayer(config, layer_idx=0), seed).eval()
    block = TransformerBlock(D, H, norm="layer", act="gelu", placement="parallel_two_norms", bias=True,
                             ffn_num_hiddens=160, eps=config.layer_norm_eps, causal=True).eval()
    attn = layer.attention
    # The fused projection is laid out per head: rows (heads, [q, k, v], head_dim).
    W = attn.query_key_value.weight.view(H, 3, HEAD, D)
    b = attn.query_key_value.bias.view(H, 3, HEAD)
    for i, name in enumerate(("W_q", "W_k", "W_v")):
        _copy_linear(getattr(block.attention, name), W[:, i].reshape(D, D), b[:, i].reshape(D))
    _copy_linear(block.attention.W_o, attn.dense.weight, attn.dense.bias)
    _copy_linear(block.ffn.W_1, layer.mlp.dense_h_to_4h.weight, layer.mlp.dense_h_to_4h.bias)
    _copy_linear(block.ffn.W_2, layer.mlp.dense_4h_to_h.weight, layer.mlp.dense_4h_to_h.bias)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    _copy_norm(block.addnorm2.norm_in, layer.post_attention_layernorm)
    rotation = _identity_rotation(attn.rotary_ndims)

    def call(Z, mask):
        return layer(Z, attention_mask=mask, position_embeddings=rotation)

    return layer, block, call


def _phi(seed=0):
    config = tf.PhiConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=2, intermediate_size=160,
                          num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    layer = _randomize_(tf.models.phi.modeling_phi.PhiDecoderLayer(config, layer_idx=0), seed).eval()
    block = TransformerBlock(D, H, norm="layer", act="gelu_tanh", placement="parallel", bias=True, num_kv_heads=2,
                             ffn_num_hiddens=160, eps=config.layer_norm_eps, causal=True).eval()
    attn = layer.self_attn
    for ours, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "dense")):
        src = getattr(attn, theirs)
        _copy_linear(getattr(block.attention, ours), src.weight, src.bias)
    _copy_linear(block.ffn.W_1, layer.mlp.fc1.weight, layer.mlp.fc1.bias)
    _copy_linear(block.ffn.W_2, layer.mlp.fc2.weight, layer.mlp.fc2.bias)
    _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)  # addnorm2 holds the same module
    rotation = _identity_rotation(attn.rotary_ndims)

    def call(Z, mask):
        return layer(Z, attention_mask=mask, position_embeddings=rotation)

    return layer, block, call


def _falcon(seed=0, new_decoder_architecture=False):
    """Falcon-7B (multi-query, one input_layernorm) or Falcon-40B (grouped kv, ln_attn and ln_mlp)."""
    kv = 2 if new_decoder_architecture else 1
    config = tf.FalconConfig(hidden_size=D, num_attention_heads=H, num_kv_heads=kv, multi_query=True,
                             parallel_attn=True, new_decoder_architecture=new_decoder_architecture, bias=False,
                             alibi=False, ffn_hidden_size=160, num_hidden_layers=1)
    config._attn_implementation = "eager"  # SDPA does not broadcast Falcon-7B's single key head
    torch.manual_seed(seed)
    layer = _randomize_(tf.models.falcon.modeling_falcon.FalconDecoderLayer(config, layer_idx=0), seed).eval()
    block = TransformerBlock(D, H, norm="layer", act="gelu", bias=False, num_kv_heads=kv, ffn_num_hiddens=160,
                             placement="parallel_two_norms" if new_decoder_architecture else "parallel",
                             eps=config.layer_norm_epsilon, causal=True).eval()
    attn = layer.self_attention
    W = attn.query_key_value.weight
    if new_decoder_architecture:  # rows (kv groups, [q_1 .. q_{h/kv}, k, v], head_dim)
        W = W.view(kv, H // kv + 2, HEAD, D)
        Wq, Wk, Wv = W[:, :-2].reshape(D, D), W[:, -2].reshape(-1, D), W[:, -1].reshape(-1, D)
    else:  # rows [q (all heads); k; v], one key/value head
        Wq, Wk, Wv = W.split([D, HEAD, HEAD])
    for name, weight in (("W_q", Wq), ("W_k", Wk), ("W_v", Wv)):
        _copy_linear(getattr(block.attention, name), weight)
    _copy_linear(block.attention.W_o, attn.dense.weight)
    _copy_linear(block.ffn.W_1, layer.mlp.dense_h_to_4h.weight)
    _copy_linear(block.ffn.W_2, layer.mlp.dense_4h_to_h.weight)
    if new_decoder_architecture:
        _copy_norm(block.addnorm1.norm_in, layer.ln_attn)
        _copy_norm(block.addnorm2.norm_in, layer.ln_mlp)
    else:
        _copy_norm(block.addnorm1.norm_in, layer.input_layernorm)
    rotation = _identity_rotation(HEAD)

    def call(Z, mask):
        return layer(Z, alibi=None, attention_mask=mask, position_embeddings=rotation)

    return layer, block, call


@pytest.mark.parametrize("make", [_gpt_neox, _phi, _falcon, lambda seed: _falcon(seed, True)],
                         ids=["GPTNeoXLayer", "PhiDecoderLayer", "FalconDecoderLayer-7B", "FalconDecoderLayer-40B"])
@pytest.mark.parametrize("seed", [0, 1])
def test_parallel_block_equals_the_reference_layer(make, seed):
    layer, block, call = make(seed)
    diff = _compare(layer, block, call, seed)
    assert diff["max_abs_output"] > 0.5  # a real signal, not zeros
    assert diff["max_abs_diff"] <= 1e-5, diff
    assert diff["max_abs_grad_diff"] <= 1e-5, diff


def test_the_reference_layers_are_really_parallel():
    """Sanity of the comparison: the same weights in a sequential ('pre') block do not match."""
    layer, block, call = _gpt_neox()
    sequential = TransformerBlock(D, H, norm="layer", act="gelu", placement="pre", bias=True, ffn_num_hiddens=160,
                                  causal=True).eval()
    sequential.load_state_dict(block.state_dict())
    assert _compare(layer, sequential, call)["max_abs_diff"] > 1e-2


# --------------------------------------------------------------------------- structure


def _block(placement, **kwargs):
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, norm="layer", placement=placement, **kwargs).eval()
    _randomize_(block, 0)
    return block


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_block_is_the_update_rule(placement):
    block = _block(placement)
    X = torch.randn(2, 5, 32)
    a1, a2 = block.addnorm1, block.addnorm2
    attended = block.attention(*(a1.norm_in(X),) * 3)
    expected = X + attended + block.ffn(a2.norm_in(X))
    torch.testing.assert_close(block(X), expected, atol=1e-6, rtol=1e-6)


def test_parallel_shares_one_norm_and_two_norms_have_their_own():
    shared, two = _block("parallel"), _block("parallel_two_norms")
    assert shared.addnorm2.norm_in is shared.addnorm1.norm_in
    assert two.addnorm2.norm_in is not two.addnorm1.norm_in
    norm_params = 2 * 32  # LayerNorm gain and bias
    assert sum(p.numel() for p in two.parameters()) - sum(p.numel() for p in shared.parameters()) == norm_params
    assert not any(a.norm_out is not None or a.norm_post is not None for a in (shared.addnorm1, shared.addnorm2))


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_differs_from_pre(placement):
    """The option changes the output: same weights in a sequential pre-norm block."""
    block = _block(placement)
    pre = TransformerBlock(32, 4, norm="layer", placement="pre").eval()
    state = block.state_dict()
    if placement == "parallel":  # the shared norm, once per connection
        state["addnorm2.norm_in.weight"] = state["addnorm1.norm_in.weight"]
        state["addnorm2.norm_in.bias"] = state["addnorm1.norm_in.bias"]
    pre.load_state_dict(state)
    X = torch.randn(2, 5, 32)
    assert (pre(X) - block(X)).abs().max() > 1e-2


def test_residual_false_leaves_the_sum_of_the_two_branches():
    block = _block("parallel_two_norms")
    plain = TransformerBlock(32, 4, norm="layer", placement="parallel_two_norms", residual=False).eval()
    plain.load_state_dict(block.state_dict())
    X = torch.randn(2, 5, 32)
    torch.testing.assert_close(plain(X), block(X) - X, atol=1e-5, rtol=1e-5)


def test_dropout_on_each_branch_in_training():
    block = TransformerBlock(32, 4, placement="parallel", dropout=0.5).train()
    assert block.addnorm1.dropout.p == block.addnorm2.dropout.p == 0.5
    X = torch.randn(2, 5, 32)
    torch.manual_seed(1)
    Y1 = block(X)
    torch.manual_seed(2)
    assert not torch.allclose(Y1, block(X))
    block.eval()
    torch.testing.assert_close(block(X), block(X))


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_parallel_block_trains_and_every_parameter_gets_a_gradient(placement):
    block = TransformerBlock(32, 4, placement=placement, causal=True, bias=True)
    X = torch.randn(2, 5, 32, requires_grad=True)
    block(X, torch.tensor([5, 3])).pow(2).mean().backward()
    assert torch.isfinite(X.grad).all()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
@pytest.mark.parametrize("kwargs", [{"sublayer_norm_gain": 0.5}, {"residual_multiplier": 0.22}])
def test_parallel_rejects_sublayer_norm_gain_and_residual_multiplier(placement, kwargs):
    with pytest.raises(ValueError, match=f"placement='{placement}' takes neither"):
        TransformerBlock(32, 4, placement=placement, **kwargs)


def test_parallel_rejects_a_residual_multiplier_of_the_wrong_type():
    with pytest.raises(TypeError, match="residual_multiplier"):
        TransformerBlock(32, 4, placement="parallel", residual_multiplier="2")


@pytest.mark.parametrize("placement", PARALLEL_PLACEMENTS)
def test_addnorm_and_decoder_block_reject_parallel_placements(placement):
    with pytest.raises(ValueError, match="combines two sublayers"):
        AddNorm(32, placement)
    with pytest.raises(ValueError, match="one after the other"):
        TransformerDecoderBlock(32, 4, placement=placement)


def test_unknown_placement_lists_all_six():
    with pytest.raises(ValueError, match="parallel_two_norms"):
        TransformerBlock(32, 4, placement="paralel")
    assert PLACEMENTS == SEQUENTIAL_PLACEMENTS + PARALLEL_PLACEMENTS


def test_chapter_one_replay_rejects_parallel_blocks():
    from d2lmini.chapters.ch01_anatomy import record_contributions, residual_sum

    with pytest.raises(ValueError, match="sequential blocks only"):
        record_contributions([TransformerBlock(32, 4, placement="parallel")], torch.randn(1, 3, 32))
    with pytest.raises(ValueError, match="placement"):
        residual_sum("parallel", depth=1)


def test_decoder_block_still_takes_sequential_placements():
    for placement in SEQUENTIAL_PLACEMENTS:
        block = TransformerDecoderBlock(32, 4, placement=placement)
        assert block(torch.randn(1, 3, 32), torch.randn(1, 4, 32)).shape == (1, 3, 32)
    assert isinstance(block.addnorm3, nn.Module)
