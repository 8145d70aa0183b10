"""Position options of MultiHeadAttention: partial RoPE and RoPE scaling (rope_scaling=) and
Ministral 3's position-dependent query scaling (query_scaling=).

Checked against Hugging Face ``transformers`` 5.24: ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (the
frequencies and YaRN's attention factor), ``PhiAttention`` / ``StableLmAttention`` / ``Phi3Attention``
(``partial_rotary_factor``), ``LlamaAttention`` with linear / llama3 / yarn ``rope_parameters``,
``Gemma3RotaryEmbedding`` (Gemma 3's linear global layers) and ``Ministral3Attention`` (YaRN plus
``get_llama_4_attn_scale``), each with every parameter randomized, a padded batch, float32, outputs and
input gradients to 1e-5.
"""

import math

import pytest
import torch

from d2lmini import reference
from d2lmini.attention import (
    MultiHeadAttention,
    apply_rotary,
    check_rope_scaling,
    interleaved_to_half_order,
    rope_frequencies,
    rotary_cos_sin,
    valid_lens_mask,
)
from d2lmini.block import TransformerBlock
from d2lmini.reference.llama import LlamaVariantAttention

tf = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

TOL = 1e-5
YARN_GPT_OSS = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
SCALINGS = [
    {"rope_type": "linear", "factor": 8.0},
    YARN_GPT_OSS,
    {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64, "mscale": 1.2, "mscale_all_dim": 0.7},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "attention_factor": 1.3,
     "beta_fast": 8.0, "beta_slow": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
]


# --------------------------------------------------------------------------- helpers


def _additive_mask(valid_lens, n, window=None):
    """(b, 1, n, n) float mask: causal, the window (HF/Mistral convention) and the keys' padding."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (j > i - window)
    allowed = allowed & valid_lens_mask(valid_lens, n)[:, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


def copy_linear(dst, src_weight, src_bias=None):
    with torch.no_grad():
        dst.weight.copy_(src_weight)
        assert (src_bias is None) == (dst.bias is None)
        if src_bias is not None:
            dst.bias.copy_(src_bias)


def _copy_qkvo(ours, theirs, o_name="o_proj"):
    for name, src in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", o_name)):
        copy_linear(getattr(ours, name), getattr(theirs, src).weight, getattr(theirs, src).bias)


def _compare(ours, hf, rotary, valid_lens, n=16, d=64, seed=0, window=None, rotary_kwargs=None):
    """Max |diff| of outputs (real positions) and of input gradients, ours vs a Hugging Face attention."""
    gen = torch.Generator().manual_seed(seed)
    X, R = torch.randn(2, n, d, generator=gen), torch.randn(2, n, d, generator=gen)
    position_ids = torch.arange(n)[None].expand(2, -1)
    mask = _additive_mask(valid_lens, n, window)
    keep = valid_lens_mask(valid_lens, n)[..., None]

    def theirs(Z):
        cos_sin = rotary(Z, position_ids, **(rotary_kwargs or {}))
        return hf(Z, position_embeddings=cos_sin, attention_mask=mask, position_ids=position_ids)[0]

    runs = (lambda Z: ours(Z, Z, Z, valid_lens), theirs)
    result = reference.output_and_grad_differences(runs, X, R, keep)
    return result["max_abs_diff"], result["max_abs_grad_diff"]


def _hf_config(cls, implementation, **kwargs):
    config = cls(num_hidden_layers=1, vocab_size=100, **kwargs)
    config._attn_implementation = implementation
    return config


# --------------------------------------------------------------------------- frequencies


@pytest.mark.parametrize("theta", [10000.0, 150000.0])
@pytest.mark.parametrize("head_dim, factor", [(64, 1.0), (32, 0.5), (40, 0.75), (16, 0.25)])
@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"])
def test_rope_frequencies_match_transformers(theta, head_dim, factor, scaling):
    params = {**scaling, "rope_theta": theta}
    if factor != 1.0:
        params["partial_rotary_factor"] = factor
    config = tf.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                            max_position_embeddings=131072, rope_parameters=params)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config)
    ours, our_factor = rope_frequencies(int(head_dim * factor), theta, scaling)
    assert ours.shape == inv_freq.shape and ours.dtype == torch.float32
    assert ((ours - inv_freq).abs() / inv_freq).max() <= 1e-6
    assert our_factor == pytest.approx(attention_factor, rel=1e-12)


def test_rope_frequencies_unscaled_is_plain_rope_and_scalings_change_it():
    plain, factor = rope_frequencies(16, 100.0)
    assert factor == 1.0 and torch.equal(plain, 1.0 / (100.0 ** (torch.arange(0, 16, 2).float() / 16)))
    for scaling in SCALINGS:
        scaled, _ = rope_frequencies(16, 100.0, scaling)
        assert (scaled - plain).abs().max() > 1e-4, scaling
    linear, _ = rope_frequencies(16, 100.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, plain / 4)


def test_yarn_keeps_fast_pairs_and_interpolates_slow_ones():
    plain, _ = rope_frequencies(64, 10000.0)
    yarn, attention_factor = rope_frequencies(64, 10000.0, YARN_GPT_OSS)
    assert torch.equal(yarn[:10], plain[:10])  # turn > 32 times over 4096 positions: kept
    torch.testing.assert_close(yarn[-8:], plain[-8:] / 32)  # turn < once: divided by the factor
    assert attention_factor == pytest.approx(0.1 * math.log(32) + 1)  # YaRN's sqrt(1/t)


def test_rotary_cos_sin_default_is_unchanged_and_attention_factor_scales_it():
    cos, sin = rotary_cos_sin(9, 16, 500.0)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    angles = torch.arange(9, dtype=torch.float32)[:, None] * inv_freq
    assert torch.equal(cos, torch.cat((angles, angles), -1).cos())
    yarn_cos, yarn_sin = rotary_cos_sin(9, 16, 500.0, scaling={**YARN_GPT_OSS, "attention_factor": 2.0})
    assert torch.allclose(yarn_cos[0], torch.full((16,), 2.0)) and torch.equal(yarn_sin[0], torch.zeros(16))


@pytest.mark.parametrize("rope_type", ["linear"])
def test_gemma3_linear_global_rotary_matches(rope_type):
    config = tf.Gemma3TextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 num_hidden_layers=2, vocab_size=100, layer_types=["sliding_attention", "full_attention"],
                                 rope_parameters={"full_attention": {"rope_type": rope_type, "factor": 8.0,
                                                                     "rope_theta": 1_000_000.0},
                                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
    rotary = tf.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding(config)
    n = 64
    position_ids = torch.arange(n)[None]
    cos, sin = rotary(torch.zeros(1, n, 64), position_ids, "full_attention")
    ours = rotary_cos_sin(n, 32, 1_000_000.0, scaling={"rope_type": rope_type, "factor": 8.0})
    assert (ours[0] - cos[0]).abs().max() <= 1e-6 and (ours[1] - sin[0]).abs().max() <= 1e-6
    plain = rotary_cos_sin(n, 32, 1_000_000.0)
    assert (plain[1] - sin[0]).abs().max() > 1e-2  # the factor matters


# --------------------------------------------------------------------------- partial RoPE


def test_interleaved_rope_is_the_half_split_rope_after_reordering_the_features():
    """One RoPE, two layouts: rotating pairs (2l, 2l+1) gives, feature for feature, what the
    half-split rotation gives on the features reordered by interleaved_to_half_order."""
    torch.manual_seed(0)
    X = torch.randn(2, 3, 7, 8)
    order = torch.cat((interleaved_to_half_order(6), torch.arange(6, 8)))
    cos_i, sin_i = rotary_cos_sin(7, 6, 500.0, interleaved=True)
    cos_h, sin_h = rotary_cos_sin(7, 6, 500.0)
    Y_i = apply_rotary(X, cos_i, sin_i, interleaved=True)
    assert torch.equal(Y_i[..., order], apply_rotary(X[..., order], cos_h, sin_h))
    assert torch.equal(Y_i[..., 6:], X[..., 6:]) and not torch.allclose(Y_i, X)
    assert torch.allclose(apply_rotary(Y_i, cos_i, -sin_i, interleaved=True), X, atol=1e-6)
    # the positions may be given themselves: 0..n-1 is the same table
    for a, b in zip(rotary_cos_sin(torch.arange(7), 6, 500.0, interleaved=True), (cos_i, sin_i)):
        assert torch.equal(a, b)


def partial(share: float) -> dict:
    """``rope_scaling`` that turns ``share`` of each head's features, unscaled."""
    return {"rope_type": "default", "partial_rotary_factor": share}


def test_partial_rotary_leaves_the_tail_alone_and_full_rotary_dim_is_the_default():
    cos, sin = rotary_cos_sin(5, 4, 100.0)
    X = torch.randn(2, 3, 5, 10)
    Y = apply_rotary(X, cos, sin)
    assert torch.equal(Y[..., 4:], X[..., 4:])
    assert torch.equal(Y[..., :4], apply_rotary(X[..., :4], cos, sin))
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, causal=True, rope_theta=100.0)
    full = MultiHeadAttention(32, 4, causal=True, rope_theta=100.0, rope_scaling=partial(1.0))
    half = MultiHeadAttention(32, 4, causal=True, rope_theta=100.0, rope_scaling=partial(0.5))
    assert (full.rotary_dim, full.rope_scaling, half.rotary_dim, half.rope_scaling) == (None, None, 4, None)
    full.load_state_dict(plain.state_dict())
    half.load_state_dict(plain.state_dict())
    X = torch.randn(2, 6, 32)
    assert torch.equal(full(X, X, X), plain(X, X, X))
    assert (half(X, X, X) - plain(X, X, X)).abs().max() > 1e-4


def _phi(implementation, seed):
    config = _hf_config(tf.PhiConfig, implementation, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                        intermediate_size=96, partial_rotary_factor=0.5, qk_layernorm=False)
    hf = reference.randomize_(tf.models.phi.modeling_phi.PhiAttention(config, layer_idx=0), seed).eval()
    ours = MultiHeadAttention(64, 4, bias=True, causal=True, rope_theta=config.rope_parameters["rope_theta"],
                              rope_scaling=partial(0.5)).eval()
    _copy_qkvo(ours, hf, o_name="dense")
    return ours, hf, tf.models.phi.modeling_phi.PhiRotaryEmbedding(config)


def _stablelm(implementation, seed):
    config = _hf_config(tf.StableLmConfig, implementation, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=96, partial_rotary_factor=0.25, use_qkv_bias=True)
    hf = reference.randomize_(tf.models.stablelm.modeling_stablelm.StableLmAttention(config, layer_idx=0), seed).eval()
    ours = LlamaVariantAttention(64, 4, num_kv_heads=2, qkv_bias=True, causal=True,
                                 rope_theta=config.rope_parameters["rope_theta"],
                                 rope_scaling=partial(0.25)).eval()
    _copy_qkvo(ours, hf)
    return ours, hf, tf.models.stablelm.modeling_stablelm.StableLmRotaryEmbedding(config)


def _phi3(implementation, seed):
    config = _hf_config(tf.Phi3Config, implementation, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=96, partial_rotary_factor=0.75, pad_token_id=0)
    hf = reference.randomize_(tf.models.phi3.modeling_phi3.Phi3Attention(config, layer_idx=0), seed).eval()
    ours = MultiHeadAttention(64, 4, num_kv_heads=2, causal=True, rope_theta=config.rope_parameters["rope_theta"],
                              rope_scaling=partial(0.75)).eval()
    W = hf.qkv_proj.weight  # rows: q (h * hd) | k (h_kv * hd) | v (h_kv * hd)
    copy_linear(ours.W_q, W[:64])
    copy_linear(ours.W_k, W[64:96])
    copy_linear(ours.W_v, W[96:])
    copy_linear(ours.W_o, hf.o_proj.weight)
    return ours, hf, tf.models.phi3.modeling_phi3.Phi3RotaryEmbedding(config)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("make", [_phi, _stablelm, _phi3], ids=["phi_0.5", "stablelm_0.25", "phi3_0.75"])
def test_partial_rotary_matches_transformers(make, implementation):
    ours, hf, rotary = make(implementation, seed=1)
    out, grad = _compare(ours, hf, rotary, torch.tensor([16, 11]))
    print(make.__name__, implementation, out, grad)
    assert out <= TOL and grad <= TOL
    ours.rotary_dim = None  # rotate every feature: no longer the reference (the rotary cache is keyed on it)
    assert _compare(ours, hf, rotary, torch.tensor([16, 11]))[0] > 1e-3


# --------------------------------------------------------------------------- RoPE scaling in a whole attention


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("scaling", [SCALINGS[0], SCALINGS[2], SCALINGS[4], SCALINGS[5]],
                         ids=["linear", "yarn_mscale", "yarn_short", "llama3"])
def test_scaled_rope_llama_attention_matches_transformers(scaling, implementation):
    theta = 500.0
    config = _hf_config(tf.LlamaConfig, implementation, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=96, max_position_embeddings=512,
                        rope_parameters={**scaling, "rope_theta": theta})
    hf = reference.randomize_(tf.models.llama.modeling_llama.LlamaAttention(config, layer_idx=0), 2).eval()
    ours = MultiHeadAttention(64, 4, num_kv_heads=2, causal=True, rope_theta=theta, rope_scaling=scaling).eval()
    _copy_qkvo(ours, hf)
    rotary = tf.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    out, grad = _compare(ours, hf, rotary, torch.tensor([16, 9]), seed=3)
    print(scaling["rope_type"], implementation, out, grad)
    assert out <= TOL and grad <= TOL
    plain = MultiHeadAttention(64, 4, num_kv_heads=2, causal=True, rope_theta=theta).eval()
    plain.load_state_dict(ours.state_dict())
    assert _compare(plain, hf, rotary, torch.tensor([16, 9]), seed=3)[0] > 1e-4


# --------------------------------------------------------------------------- Ministral 3: YaRN + query scaling


def _ministral3(implementation, beta=0.5, period=4, seed=4):
    rope = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 16.0, "original_max_position_embeddings": period,
            "max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.3, "mscale_all_dim": 0.8,
            "llama_4_scaling_beta": beta}
    config = _hf_config(tf.Ministral3Config, implementation, hidden_size=64, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=64,
                        rope_parameters=rope)
    hf = reference.randomize_(tf.models.ministral3.modeling_ministral3.Ministral3Attention(config, layer_idx=0),
                               seed).eval()
    scaling = {key: rope[key] for key in ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                                          "beta_slow", "mscale", "mscale_all_dim")}
    ours = LlamaVariantAttention(64, 4, num_kv_heads=2, head_dim=16, causal=True, rope_theta=rope["rope_theta"],
                                 rope_scaling=scaling, query_scaling=(beta, period)).eval()
    _copy_qkvo(ours, hf)
    return ours, hf, tf.models.ministral3.modeling_ministral3.Ministral3RotaryEmbedding(config)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_ministral3_attention_matches_transformers(implementation):
    ours, hf, rotary = _ministral3(implementation)
    assert rotary.attention_scaling != 1.0  # mscale / mscale_all_dim: a real attention factor
    out, grad = _compare(ours, hf, rotary, torch.tensor([16, 10]), seed=5)
    print("ministral3", implementation, out, grad)
    assert out <= TOL and grad <= TOL
    ours.query_scaling = None  # without the query factor it is no longer the reference
    assert _compare(ours, hf, rotary, torch.tensor([16, 10]), seed=5)[0] > 1e-3


def test_query_scales_follow_get_llama_4_attn_scale():
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale
    attn = LlamaVariantAttention(32, 4, causal=True, rope_theta=100.0, query_scaling=(0.3, 4))
    theirs = get_llama_4_attn_scale(torch.arange(17)[None], 0.3, 4)[0, 0]  # (n, 1)
    ours = attn.query_scales(17, torch.zeros(()))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
    assert torch.equal(ours[:4], torch.ones(4, 1)) and ours[16, 0] == pytest.approx(1 + 0.3 * math.log(5))


def test_query_scaling_scales_only_the_queries_from_the_first_period_on():
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, causal=True, rope_theta=100.0)
    scaled = LlamaVariantAttention(32, 4, causal=True, rope_theta=100.0, query_scaling=(0.5, 3))
    scaled.load_state_dict(plain.state_dict())
    X = torch.randn(2, 8, 32)
    q0, k0 = plain.queries_and_keys(X, X)
    q1, k1 = scaled.queries_and_keys(X, X)
    assert torch.equal(k0, k1) and torch.equal(q0[:, :, :3], q1[:, :, :3])
    torch.testing.assert_close(q1[:, :, 3:6], q0[:, :, 3:6] * (1 + 0.5 * math.log(2)))
    diff = (scaled(X, X, X) - plain(X, X, X)).abs().amax(dim=(0, 2))
    assert torch.equal(diff[:3], torch.zeros(3)) and diff[3:].min() > 0  # causal: positions < period unchanged


# --------------------------------------------------------------------------- bad input and plumbing


@pytest.mark.parametrize("share, error", [(0.0, ValueError), (0.375, ValueError), (0.1, ValueError), (1.25, ValueError),
                                          (-0.5, ValueError), ("0.5", TypeError)])
def test_bad_partial_rotary_factor_is_rejected_naming_it(share, error):
    # head_dim 8: 0.375 turns 3 features (odd), 0.1 turns none
    with pytest.raises(error, match="partial_rotary_factor"):
        MultiHeadAttention(32, 4, rope_theta=100.0, rope_scaling=partial(share))
    with pytest.raises(error, match="partial_rotary_factor"):
        TransformerBlock(32, 4, rope_theta=100.0, rope_scaling=partial(share))


def test_partial_rotation_is_refused_where_only_the_frequencies_are_read():
    # MLA and DeepSeek-V4 rotate a fixed width: a partial_rotary_factor there would be silently ignored.
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        check_rope_scaling({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5})
    assert check_rope_scaling(partial(0.5), partial=True) == partial(0.5)


@pytest.mark.parametrize("kwargs", [{"rope_scaling": partial(0.5)},
                                    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}])
def test_rope_options_need_rope_theta(kwargs):
    with pytest.raises(ValueError, match="rope_theta"):
        MultiHeadAttention(32, 4, **kwargs)


BAD_SCALINGS = [
    ("linear", TypeError, "rope_scaling must be None or a dict"),
    ({"factor": 2.0}, ValueError, r"rope_type.*'linear', 'yarn', 'llama3'"),
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "rope_type"),
    ({"type": "linear", "factor": 2.0}, ValueError, "rope_type"),
    ({"rope_type": "linear"}, ValueError, r"missing \['factor'\]"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, ValueError, "rope_theta is its own argument"),
    ({"rope_type": "yarn", "factor": 2.0}, ValueError, "original_max_position_embeddings"),
    ({**YARN_GPT_OSS, "llama_4_scaling_beta": 0.1}, ValueError, "query_scaling"),
    ({"rope_type": "linear", "factor": 0.5}, ValueError, ">= 1"),
    ({"rope_type": "linear", "factor": "2"}, TypeError, "factor"),
    ({**YARN_GPT_OSS, "original_max_position_embeddings": 4096.0}, TypeError, "original_max_position_embeddings"),
    ({**YARN_GPT_OSS, "beta_fast": -1.0}, ValueError, "beta_fast"),
    ({**YARN_GPT_OSS, "beta_fast": 1.0, "beta_slow": 2.0}, ValueError, "beta_fast >= beta_slow"),
    ({**YARN_GPT_OSS, "mscale": 1.0}, ValueError, "mscale_all_dim"),
    ({**YARN_GPT_OSS, "truncate": 0}, TypeError, "truncate"),
    ({**YARN_GPT_OSS, "attention_factor": 0.0}, ValueError, "attention_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}, ValueError, "low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 4.0,
      "high_freq_factor": 1.0}, ValueError, "high_freq_factor > low_freq_factor"),
]


@pytest.mark.parametrize("scaling, error, match", BAD_SCALINGS)
def test_bad_rope_scaling_is_rejected_listing_what_is_allowed(scaling, error, match):
    with pytest.raises(error, match=match):
        rope_frequencies(16, 100.0, scaling)
    with pytest.raises(error, match=match):
        MultiHeadAttention(32, 4, rope_theta=100.0, rope_scaling=scaling)
    with pytest.raises(error, match=match):
        TransformerBlock(32, 4, rope_theta=100.0, rope_scaling=scaling)


def test_bad_rope_frequencies_arguments():
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(7, 100.0)
    with pytest.raises(ValueError, match="theta"):
        rope_frequencies(8, 0.0)


@pytest.mark.parametrize("value, error, match", [
    (0.1, TypeError, "pair"), ((0.1,), TypeError, "pair"), ((0.1, 4, 1, 0), TypeError, "pair"),
    ((0.1, 4, -1), ValueError, "offset"), ((0.1, 4, 1.0), TypeError, "offset"),
    ((0.0, 4), ValueError, "beta"), ((-0.1, 4), ValueError, "beta"), (("0.1", 4), TypeError, "beta"),
    ((0.1, 0), ValueError, "period"), ((0.1, 4.0), TypeError, "period"), ((0.1, True), TypeError, "period"),
])
def test_bad_query_scaling_is_rejected_naming_it(value, error, match):
    with pytest.raises(error, match=f"query_scaling.*{match}|{match}.*query_scaling"):
        LlamaVariantAttention(32, 4, query_scaling=value)


def test_new_options_are_keyword_only_passed_by_the_block_and_refused_with_a_factory():
    options = {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}}
    block = TransformerBlock(32, 4, causal=True, rope_theta=100.0, **options)
    assert block.attention.rotary_dim == 4
    assert block.attention.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    for name, value in options.items():
        with pytest.raises(ValueError, match=f"{name}=.* would be ignored"):
            TransformerBlock(32, 4, **{name: value},
                             attn_factory=lambda: MultiHeadAttention(32, 4, causal=True, rope_theta=100.0))
    assert "rotary_dim=4" in repr(block.attention)
    with pytest.raises(TypeError, match="unknown argument.*query_scaling"):  # a released model's: LlamaVariantAttention
        TransformerBlock(32, 4, causal=True, rope_theta=100.0, query_scaling=(0.1, 4))
    scaled = LlamaVariantAttention(32, 4, causal=True, rope_theta=100.0, query_scaling=(0.1, 4))
    assert scaled.query_scaling == (0.1, 4) and "query_scaling=(0.1, 4)" in repr(scaled)
    import inspect
    params = inspect.signature(MultiHeadAttention.__init__).parameters
    assert all(params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in (*options, "sinks"))
    assert all(params[name].default in (None, False) for name in (*options, "sinks"))
