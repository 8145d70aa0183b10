"""Attention sinks (MultiHeadAttention(sinks=True), TransformerBlock(sinks=True)), as gpt-oss.

Checked against Hugging Face ``transformers`` 5.24 ``models/gpt_oss/modeling_gpt_oss.py``
(``GptOssAttention.sinks``, ``eager_attention_forward``: the sink logit of each head is appended to every
query's logits after the mask, the softmax taken, the sink's column dropped), with YaRN RoPE
(``GptOssRotaryEmbedding``), q/k/v/o biases, a sliding and a full layer, a padded batch, every parameter
randomized, float32, outputs and input gradients to 1e-5.
"""

import pytest
import torch
from torch.nn import functional as F

from d2lmini import reference
from d2lmini.attention import MultiHeadAttention, valid_lens_mask
from d2lmini.block import TransformerBlock
from d2lmini.reference.gemma import GemmaAttention

tf = pytest.importorskip("transformers")

TOL = 1e-5


def _pair(seed=0, cls=MultiHeadAttention, **kwargs):
    """Two attentions with the same weights and random sinks: one with, one without sinks."""
    torch.manual_seed(seed)
    with_sinks = cls(32, 4, sinks=True, **kwargs).eval()
    with torch.no_grad():
        with_sinks.sinks.normal_(0, 2)
    without = cls(32, 4, **kwargs).eval()
    without.load_state_dict({k: v for k, v in with_sinks.state_dict().items() if k != "sinks"})
    return with_sinks, without


def _by_formula(attn, X, mask, cap=None):
    """softmax over [logits, sink] of each head, the sink's column dropped: gpt-oss' eager_attention_forward."""
    q, k = attn.queries_and_keys(X, X)
    v = attn.W_v(X).unflatten(-1, (attn.num_kv_heads, attn.head_dim)).transpose(1, 2)
    group = attn.num_heads // attn.num_kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    logits = q @ k.transpose(-1, -2) * attn.logit_scale
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    sinks = attn.sinks[:, None, None].expand(*logits.shape[:-1], 1)
    weights = torch.softmax(torch.cat((logits, sinks), -1), -1)[..., :-1]
    return attn.W_o((weights @ v).transpose(1, 2).flatten(-2)), weights


@pytest.mark.parametrize("sinks", [1, None, "yes", 0.0])
def test_bad_sinks_is_rejected_naming_it(sinks):
    with pytest.raises(TypeError, match="sinks"):
        MultiHeadAttention(32, 4, sinks=sinks)
    with pytest.raises(TypeError, match="sinks"):
        TransformerBlock(32, 4, sinks=sinks)


def test_sinks_are_a_zero_initialized_parameter_per_query_head():
    attn = MultiHeadAttention(32, 8, num_kv_heads=2, sinks=True)
    assert isinstance(attn.sinks, torch.nn.Parameter) and torch.equal(attn.sinks, torch.zeros(8))
    assert "sinks" in dict(attn.named_parameters()) and "sinks=True" in repr(attn)
    assert MultiHeadAttention(32, 8).sinks is None and "sinks" not in MultiHeadAttention(32, 8).state_dict()
    block = TransformerBlock(32, 8, sinks=True)
    assert block.attention.sinks.shape == (8,)
    with pytest.raises(ValueError, match="sinks=True would be ignored"):
        TransformerBlock(32, 8, sinks=True, attn_factory=lambda: MultiHeadAttention(32, 8))


@pytest.mark.parametrize("kwargs", [{}, {"num_kv_heads": 2, "causal": True, "rope_theta": 100.0},
                                    {"num_kv_heads": 1, "causal": True, "window": 3}])
@pytest.mark.parametrize("valid", [None, "b", "bq"])
def test_fused_sinks_equal_the_formula_with_gradients(kwargs, valid):
    attn, _ = _pair(**kwargs)
    X = torch.randn(2, 7, 32, requires_grad=True)
    valid_lens = {None: None, "b": torch.tensor([7, 4]), "bq": torch.tensor([[7] * 7, [1, 2, 3, 4, 4, 4, 4]])}[valid]
    mask = attn.mask(valid_lens, 2, 7, 7, X.device)
    ours = attn(X, X, X, valid_lens)
    expected, weights = _by_formula(attn, X, mask)
    assert (ours - expected).abs().max() <= TOL
    g = torch.randn_like(ours)
    grads = torch.autograd.grad((ours * g).sum(), (X, attn.sinks))
    expected_grads = torch.autograd.grad((expected * g).sum(), (X, attn.sinks))
    for a, b in zip(grads, expected_grads):
        assert (a - b).abs().max() <= TOL
    assert grads[1].abs().min() > 0  # the sinks learn
    assert (weights.sum(-1) < 1).all()  # some weight goes to the sink


def test_sinks_change_the_output_and_a_very_negative_sink_is_no_sink():
    attn, plain = _pair(causal=True, rope_theta=100.0)
    X = torch.randn(2, 6, 32)
    assert (attn(X, X, X) - plain(X, X, X)).abs().max() > 1e-3
    with torch.no_grad():
        attn.sinks.zero_()
    assert (attn(X, X, X) - plain(X, X, X)).abs().max() > 1e-3  # a sink logit of 0 still takes weight
    with torch.no_grad():
        attn.sinks.fill_(-1e4)
    assert (attn(X, X, X) - plain(X, X, X)).abs().max() <= 1e-6


def test_sinks_keep_the_fused_path_and_softcap_takes_the_explicit_one(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    attn, _ = _pair(causal=True)
    X = torch.randn(2, 5, 32)
    attn(X, X, X)
    assert calls == [1]
    capped, _ = _pair(causal=True, cls=GemmaAttention, logit_softcap=2.0)
    capped(X, X, X)
    assert calls == [1]


@pytest.mark.parametrize("valid", [False, True])
def test_softcap_with_sinks_caps_the_logits_not_the_sinks(valid):
    attn, _ = _pair(num_kv_heads=2, causal=True, rope_theta=100.0, cls=GemmaAttention, logit_softcap=0.5)
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([3.0, -2.0, 0.7, 1.5]))  # beyond the cap: capping them would change them
    X = torch.randn(2, 7, 32, requires_grad=True)
    valid_lens = torch.tensor([7, 4]) if valid else None
    ours = attn(X, X, X, valid_lens)
    expected, _ = _by_formula(attn, X, attn.mask(valid_lens, 2, 7, 7, X.device), cap=0.5)
    assert (ours - expected).abs().max() <= TOL
    huge_cap = GemmaAttention(32, 4, num_kv_heads=2, causal=True, rope_theta=100.0, logit_softcap=1e9,
                              sinks=True).eval()
    fused = MultiHeadAttention(32, 4, num_kv_heads=2, causal=True, rope_theta=100.0, sinks=True).eval()
    huge_cap.load_state_dict(attn.state_dict())
    fused.load_state_dict(attn.state_dict())
    assert (huge_cap(X, X, X, valid_lens) - fused(X, X, X, valid_lens)).abs().max() <= 1e-6


def test_sinks_train_with_dropout():
    attn, _ = _pair(causal=True)
    attn.dropout = 0.5
    attn.train()
    X = torch.randn(2, 5, 32)
    attn(X, X, X).sum().backward()
    assert attn.sinks.grad is not None and torch.isfinite(attn.sinks.grad).all()


# --------------------------------------------------------------------------- gpt-oss


def _gpt_oss(layer_idx, seed=0):
    config = tf.GptOssConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             intermediate_size=96, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1,
                             vocab_size=100, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                             max_position_embeddings=4096 * 32,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                              "original_max_position_embeddings": 4096})
    config._attn_implementation = "eager"  # GptOssAttention does not support SDPA (_supports_sdpa = False)
    hf = tf.models.gpt_oss.modeling_gpt_oss.GptOssAttention(config, layer_idx=layer_idx)
    reference.randomize_(hf, seed).eval()
    with torch.no_grad():
        hf.sinks.normal_(0, 1.5, generator=torch.Generator().manual_seed(seed + 1))
    scaling = {key: value for key, value in config.rope_parameters.items() if key != "rope_theta"}
    ours = MultiHeadAttention(64, 4, num_kv_heads=2, head_dim=16, bias=True, causal=True, window=hf.sliding_window,
                              rope_theta=config.rope_parameters["rope_theta"], rope_scaling=scaling, sinks=True).eval()
    for name, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
        with torch.no_grad():
            getattr(ours, name).weight.copy_(getattr(hf, theirs).weight)
            getattr(ours, name).bias.copy_(getattr(hf, theirs).bias)
    with torch.no_grad():
        ours.sinks.copy_(hf.sinks)
    return ours, hf, tf.models.gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding(config)


def _gpt_oss_mask(valid_lens, n, window):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    allowed = (j <= i) & ((j > i - window) if window is not None else True)
    allowed = allowed & valid_lens_mask(valid_lens, n)[:, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "full"])
def test_gpt_oss_attention_matches_transformers(layer_idx):
    ours, hf, rotary = _gpt_oss(layer_idx)
    assert (hf.sliding_window is not None) == (layer_idx == 0)
    n = 12
    gen = torch.Generator().manual_seed(7)
    X, R = torch.randn(2, n, 64, generator=gen), torch.randn(2, n, 64, generator=gen)
    valid_lens = torch.tensor([12, 7])
    position_ids = torch.arange(n)[None].expand(2, -1)
    mask = _gpt_oss_mask(valid_lens, n, hf.sliding_window)
    keep = valid_lens_mask(valid_lens, n)[..., None]
    runs = (lambda Z: ours(Z, Z, Z, valid_lens),
            lambda Z: hf(Z, position_embeddings=rotary(Z, position_ids), attention_mask=mask)[0])
    result = reference.output_and_grad_differences(runs, X, R, keep)
    print("gpt-oss", ["sliding", "full"][layer_idx], result["max_abs_diff"], result["max_abs_grad_diff"])
    assert result["max_abs_diff"] <= TOL and result["max_abs_grad_diff"] <= TOL
    # the sinks' gradients too
    ours.zero_grad()
    hf.zero_grad()
    for run in runs:
        (run(X) * R * keep).sum().backward()
    assert (ours.sinks.grad - hf.sinks.grad).abs().max() <= TOL
    with torch.no_grad():
        ours.sinks.zero_()  # other sinks: no longer the reference
    assert reference.output_and_grad_differences(runs, X, R, keep)["max_abs_diff"] > 1e-3
