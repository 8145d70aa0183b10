"""Multi-head latent attention (d2lmini.mla) against Hugging Face DeepSeek-V3, and the KV-cache bytes per token."""

from __future__ import annotations

import pytest
import torch

from d2lmini import GatedAttention, MultiHeadAttention, TransformerBlock
from d2lmini.mla import MultiHeadLatentAttention, kv_cache_bytes_per_token
from d2lmini.chapters.ch11_beyond_softmax import compare_with_hf
from d2lmini.reference import from_deepseek_v3_attention, from_deepseek_v3_layer, hf_call, hf_make

TOLERANCE = 1e-5  # max |Δ| in float32

#: A tiny DeepSeek-V3: 4 heads, every width distinct so a swapped one cannot pass; layer 0 dense.
TINY_DEEPSEEK = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, intermediate_size=80,
                     moe_intermediate_size=16, q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=10,
                     qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                     topk_group=1, first_k_dense_replace=1, rms_norm_eps=1e-5, max_position_embeddings=64,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "mscale": 0.8, "mscale_all_dim": 1.2}
VARIANTS = {"q latent, interleaved RoPE": {}, "no q latent": {"q_lora_rank": None},
            "half-split RoPE": {"rope_interleave": False}, "biases": {"attention_bias": True},
            "YaRN with mscale": {"rope_parameters": YARN}}


def _deepseek(layer_class: str, seed: int = 0, layer_idx: int = 0, **overrides):
    """A tiny random HF DeepSeek-V3 ``layer_class`` (every parameter randomized) and its config."""
    pytest.importorskip("transformers")
    return hf_make("deepseek_v3", layer_class, "DeepseekV3Config", dict(TINY_DEEPSEEK, **overrides),
                   layer_idx=layer_idx)(seed)


def _compare(layer, config, ours, layer_class: str, valid_lens, num_steps: int = 16, seed: int = 0) -> dict:
    """Max |Δ| of outputs (at real tokens) and input gradients, HF layer vs ours, on a (2, n, d) batch."""
    call = hf_call("deepseek_v3", layer_class, rotary="DeepseekV3RotaryEmbedding")

    def run_ours(Z):
        return ours(Z, Z, Z, valid_lens) if isinstance(ours, MultiHeadLatentAttention) else ours(Z, valid_lens)

    return compare_with_hf(lambda Z: call(layer, config, Z, valid_lens), run_ours, config.hidden_size, valid_lens,
                           num_steps=num_steps, seed=seed)


@pytest.mark.parametrize("valid_lens", [None, torch.tensor([16, 11])], ids=["unpadded", "padded"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mla_matches_deepseek_v3_attention(variant, valid_lens):
    layer, config = _deepseek("DeepseekV3Attention", **VARIANTS[variant])
    ours = from_deepseek_v3_attention(layer, config)
    result = _compare(layer, config, ours, "DeepseekV3Attention", valid_lens)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1


@pytest.mark.parametrize("variant", ["q latent, interleaved RoPE", "no q latent", "YaRN with mscale"])
def test_dense_deepseek_v3_layer_is_a_pre_norm_block_with_mla(variant):
    layer, config = _deepseek("DeepseekV3DecoderLayer", **VARIANTS[variant])
    block = from_deepseek_v3_layer(layer, config)
    assert isinstance(block, TransformerBlock) and isinstance(block.attention, MultiHeadLatentAttention)
    assert block.placement == "pre" and block.norm == "rms"
    result = _compare(layer, config, block, "DeepseekV3DecoderLayer", torch.tensor([16, 9]))
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result


def test_every_parameter_is_randomized_and_copied():
    layer, config = _deepseek("DeepseekV3DecoderLayer")
    block = from_deepseek_v3_layer(layer, config)
    ours = dict(block.named_parameters())
    assert len(ours) == len(list(layer.parameters())) == 12
    for name, p in ours.items():
        if p.dim() == 1:  # a norm gain: randomized away from 1
            assert (p - 1).abs().max() > 0.01, name


def test_latent_kv_is_what_deepseek_caches():
    layer, config = _deepseek("DeepseekV3Attention", rope_interleave=False)
    ours = from_deepseek_v3_attention(layer, config)
    X = torch.randn(2, 5, config.hidden_size)
    c_kv, k_rope = ours.latent_kv(X)
    assert c_kv.shape == (2, 5, config.kv_lora_rank) and k_rope.shape == (2, 5, config.qk_rope_head_dim)
    latent = layer.kv_a_proj_with_mqa(X)
    torch.testing.assert_close(c_kv, layer.kv_a_layernorm(latent[..., :config.kv_lora_rank]))
    torch.testing.assert_close(k_rope[:, 0], latent[:, 0, config.kv_lora_rank:])  # position 0: not rotated


@pytest.mark.parametrize("break_it", ["skip the de-interleaving", "drop the YaRN mscale", "not causal"])
def test_the_check_catches_a_dropped_feature(break_it, monkeypatch):
    overrides = {"rope_parameters": YARN} if break_it == "drop the YaRN mscale" else {}
    layer, config = _deepseek("DeepseekV3Attention", **overrides)
    if break_it == "skip the de-interleaving":  # convert as if half-split, run HF interleaved
        monkeypatch.setattr(config, "rope_interleave", False)
        ours = from_deepseek_v3_attention(layer, config)
        monkeypatch.setattr(config, "rope_interleave", True)
    else:
        ours = from_deepseek_v3_attention(layer, config)
        if break_it == "drop the YaRN mscale":
            ours.scale = ours.qk_head_dim ** -0.5
        else:
            ours.causal = False
    result = _compare(layer, config, ours, "DeepseekV3Attention", None)
    assert result["max_abs_diff"] > 100 * TOLERANCE


# --------------------------------------------------------------------------- the module on its own


def _mla(**kwargs) -> MultiHeadLatentAttention:
    args = dict(q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                rope_theta=10000.0)
    args.update(kwargs)
    return MultiHeadLatentAttention(16, 2, **args)


def test_mla_plugs_into_a_transformer_block():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, attn_factory=lambda: _mla())
    X = torch.randn(3, 7, 16)
    assert block(X, torch.tensor([7, 3, 1])).shape == (3, 7, 16)
    with pytest.raises(ValueError, match="num_heads=2"):
        TransformerBlock(16, 4, attn_factory=lambda: _mla())


def test_causal_mask_is_the_multi_head_attention_one():
    torch.manual_seed(0)
    mla = _mla()
    X = torch.randn(1, 6, 16)
    Y = mla(X, X, X)
    X2 = X.clone()
    X2[:, 4:] = torch.randn(1, 2, 16)  # the future does not reach the past
    torch.testing.assert_close(mla(X2, X2, X2)[:, :4], Y[:, :4])
    bidirectional = _mla(causal=False)
    bidirectional.load_state_dict(mla.state_dict())
    assert (bidirectional(X, X, X) - Y)[:, :-1].abs().max() > 1e-3


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(qk_rope_head_dim=5), ValueError, "qk_rope_head_dim must be even"),
    (dict(q_lora_rank=0), ValueError, "q_lora_rank"),
    (dict(kv_lora_rank=None), TypeError, "kv_lora_rank"),
    (dict(rope_theta=-1.0), ValueError, "rope_theta"),
    (dict(rope_scaling={"rope_type": "dynamic"}), ValueError, "rope_type"),
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(causal="yes"), TypeError, "causal"),
    (dict(bias="qkv"), TypeError, "bias"),
])
def test_bad_arguments_are_rejected_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        _mla(**kwargs)


def test_bad_calls_are_rejected():
    mla = _mla()
    X = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="self-attention only"):
        mla(X, X.clone(), X)
    with pytest.raises(ValueError, match="valid_lens"):
        mla(X, X, X, torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="queries"):
        Z = torch.randn(2, 5, 8)
        mla(Z, Z, Z)
    with pytest.raises(TypeError):
        Z = X.double()
        mla(Z, Z, Z)


def test_converters_refuse_what_they_cannot_reproduce(monkeypatch):
    layer, config = _deepseek("DeepseekV3DecoderLayer", layer_idx=1, norm_topk_prob=False)  # a MoE layer
    with pytest.raises(ValueError, match="norm_topk_prob"):
        from_deepseek_v3_layer(layer, config)
    attn, config = _deepseek("DeepseekV3Attention", rope_parameters=dict(YARN, mscale=None))
    with pytest.raises(ValueError, match="mscale_all_dim but no mscale"):
        from_deepseek_v3_attention(attn, config)
    attn, config = _deepseek("DeepseekV3Attention")
    monkeypatch.setattr(config, "num_key_value_heads", 2)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        from_deepseek_v3_attention(attn, config)


# --------------------------------------------------------------------------- KV cache


def test_kv_cache_bytes_per_token_of_every_attention():
    d, h = 64, 8
    assert kv_cache_bytes_per_token(MultiHeadAttention(d, h)) == 2 * 8 * 8 * 2  # MHA: every head's k and v
    assert kv_cache_bytes_per_token(MultiHeadAttention(d, h, num_kv_heads=2)) == 2 * 2 * 8 * 2  # GQA
    assert kv_cache_bytes_per_token(MultiHeadAttention(d, h, num_kv_heads=1), dtype_bytes=4) == 2 * 8 * 4  # MQA
    assert kv_cache_bytes_per_token(GatedAttention(d, h, num_kv_heads=4, head_dim=16)) == 2 * 4 * 16 * 2
    assert kv_cache_bytes_per_token(_mla()) == (10 + 4) * 2
    assert kv_cache_bytes_per_token(TransformerBlock(16, 2, attn_factory=lambda: _mla()), dtype_bytes=1) == 14
    assert kv_cache_bytes_per_token(TransformerBlock(d, h, num_kv_heads=2)) == 64
    with pytest.raises(TypeError, match="MultiHeadLatentAttention"):
        kv_cache_bytes_per_token(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="dtype_bytes"):
        kv_cache_bytes_per_token(_mla(), dtype_bytes=0)


def test_deepseek_v3_sized_mla_caches_far_less_than_mha_and_gqa():
    """DeepSeek-V3 (d = 7168, 128 heads): MLA 576 numbers per token and layer, MHA 32,768, GQA-8 2,048."""
    with torch.device("meta"):  # no memory: only the shapes matter
        mla = MultiHeadLatentAttention(7168, 128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                       qk_rope_head_dim=64, v_head_dim=128, rope_theta=10000.0)
        mha = MultiHeadAttention(7168, 128, head_dim=128)
        gqa = MultiHeadAttention(7168, 128, head_dim=128, num_kv_heads=8)
    assert mla.W_ukv.weight.shape == (128 * 256, 512)
    assert [kv_cache_bytes_per_token(m) for m in (mla, mha, gqa)] == [1152, 65536, 4096]
