"""DeepSeek-V4's whole decoder layer against Hugging Face ``DeepseekV4DecoderLayer`` (transformers 5.24).

Its three layer types (sliding window + hash-routed MoE, HCA, CSA with the lightning indexer),
outputs and input gradients to 1e-5 in float32 on padded streams; mutations that must break
the match; and the new modules' errors (d2lmini/deepseek_v4.py).
"""

import pytest
import torch

from d2lmini.attention import rotary_cos_sin
from d2lmini.deepseek_v4 import (
    CompressedAttention,
    HashRoutedMoE,
    KVCompressor,
    rotate_interleaved,
    visible_entries,
)
from d2lmini.ffn import FeedForward
from d2lmini.reference.gpt_oss import ClampedSwiGLU
from d2lmini.hyper import HyperConnectedBlock
from d2lmini.moe import MixtureOfExperts
from d2lmini.reference import (
    HF_CONVERTERS,
    TOLERANCE,
    compare_deepseek_v4_layer,
    from_deepseek_v4_layer,
    from_hf,
    hf_deepseek_v4_make,
)

pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

KINDS = {0: "sliding_attention", 1: "heavily_compressed_attention", 2: "compressed_sparse_attention"}


@pytest.mark.parametrize("layer_idx", [0, 1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_each_layer_type_matches_hugging_face(layer_idx, seed):
    result = compare_deepseek_v4_layer(layer_idx, seed)
    assert result["max_abs_diff"] <= TOLERANCE and result["max_abs_grad_diff"] <= TOLERANCE
    assert result["max_abs_output"] > 1  # not trivially zero
    block = result["block"]
    assert isinstance(block, HyperConnectedBlock)
    assert block.attention.compress == {0: None, 1: "hca", 2: "csa"}[layer_idx]
    assert isinstance(block.ffn, HashRoutedMoE) == (layer_idx == 0)


def test_registered_and_dispatched():
    assert HF_CONVERTERS["DeepseekV4DecoderLayer"] is from_deepseek_v4_layer
    layer, config = hf_deepseek_v4_make(2)
    assert from_hf(layer, config).attention.compress == "csa"
    with pytest.raises(ValueError, match="layer_idx=1"):
        from_deepseek_v4_layer(layer, config, layer_idx=1)


@pytest.mark.parametrize("layer_idx", [1, 2])
def test_yarn_compress_rope_matches(layer_idx):
    layer, config = hf_deepseek_v4_make(layer_idx, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                    "original_max_position_embeddings": 16},
                                        max_position_embeddings=64)
    result = compare_deepseek_v4_layer(layer_idx, layer=layer, config=config)
    assert result["block"].attention.rope_scaling["rope_type"] == "yarn"
    assert result["max_abs_diff"] <= TOLERANCE and result["max_abs_grad_diff"] <= TOLERANCE


def _mutated(layer_idx, mutate):
    layer, config = hf_deepseek_v4_make(layer_idx)
    block = from_deepseek_v4_layer(layer, config).eval()
    with torch.no_grad():
        mutate(block)
    return compare_deepseek_v4_layer(layer_idx, layer=layer, config=config, block=block)["max_abs_diff"]


def _shuffle_table(block):
    block.ffn.token_experts.copy_(block.ffn.token_experts.flip(-1).roll(1, dims=0))


MUTATIONS = {
    "hash table": (0, _shuffle_table),
    "sinks": (0, lambda b: b.attention.sinks.zero_()),
    "window": (0, lambda b: setattr(b.attention, "window", 7)),
    "V4's SwiGLU clamp": (0, lambda b: [setattr(e, "swiglu_limit", 1e9) for e in b.ffn.experts]),
    "HCA compressor gate": (1, lambda b: b.attention.compressor.position_bias.add_(
        torch.randn(b.attention.compressor.position_bias.shape))),
    "CSA overlap (the previous window's first halves)": (
        2, lambda b: b.attention.compressor.W_kv.weight[:b.attention.head_dim].mul_(-1)),
    "CSA indexer selection": (2, lambda b: setattr(b.attention.indexer, "topk", 100)),
    "undoing the values' rotation": (2, lambda b: setattr(b.attention, "rope_theta", 1000.0)),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_mutation_is_caught(name):
    layer_idx, mutate = MUTATIONS[name]
    assert _mutated(layer_idx, mutate) > 1e-3


def test_compressed_entries_and_visibility():
    comp = KVCompressor(8, 4, 3, rope_dim=2)
    assert comp(torch.randn(2, 10, 8)).shape == (2, 3, 4)
    assert comp(torch.randn(2, 2, 8)).shape == (2, 0, 4)  # no complete window
    seen = visible_entries(8, 2, 3)
    assert seen[:2].sum() == 0 and seen[2].tolist() == [True, False] and seen[5].tolist() == [True, True]


def test_rotate_interleaved_is_undone_by_minus_sin():
    X = torch.randn(2, 3, 5, 6)
    cos, sin = rotary_cos_sin(torch.arange(5), 4, interleaved=True)
    Y = rotate_interleaved(X, cos, sin)
    assert torch.equal(Y[..., :2], X[..., :2]) and not torch.allclose(Y, X)
    assert torch.allclose(rotate_interleaved(Y, cos, -sin), X, atol=1e-6)


def _attention(**kwargs):
    base = dict(head_dim=8, q_lora_rank=8, rope_dim=4, window=3, o_groups=2, o_lora_rank=4)
    return CompressedAttention(16, 2, **{**base, **kwargs})


@pytest.mark.parametrize("kwargs, match", [
    (dict(compress="dsa"), "compress"),
    (dict(compress="hca"), "compress_ratio"),
    (dict(compress_ratio=4), "compress_ratio applies only"),
    (dict(compress="csa", compress_ratio=4), "index_heads"),
    (dict(compress="hca", compress_ratio=4, index_topk=2), "apply only with compress='csa'"),
    (dict(o_groups=3), "o_groups"),
    (dict(rope_dim=3), "rope_dim"),
    (dict(rope_dim=10), "rope_dim"),
    (dict(compress="csa", compress_ratio=4, index_heads=2, index_head_dim=2, index_topk=2), "index_head_dim"),
])
def test_bad_attention_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _attention(**kwargs)


def test_attention_call_errors():
    attn = _attention()
    X = torch.randn(2, 5, 16)
    assert attn(X, X, X).shape == (2, 5, 16)
    with pytest.raises(ValueError, match="self-attention only"):
        attn(X, X.clone(), X)
    with pytest.raises(ValueError, match="queries"):
        attn(X[..., :8], X[..., :8], X[..., :8])


def test_hash_routed_moe():
    moe = HashRoutedMoE(8, 4, top_k=2, vocab_size=10, router="sqrtsoftplus")
    X, ids = torch.randn(2, 3, 8), torch.randint(0, 10, (2, 3))
    assert moe(X, ids).shape == X.shape
    with pytest.raises(ValueError, match="input_ids"):
        moe(X)
    with pytest.raises(ValueError, match="vocab_size"):
        moe(X, ids + 10)
    with pytest.raises(ValueError, match="shape"):
        moe(X, ids[:, :2])
    with pytest.raises(TypeError, match="input_ids"):
        moe(X, ids.float())
    with pytest.raises(ValueError, match="sigmoid_input"):
        HashRoutedMoE(8, 4, vocab_size=10, router="sigmoid_input")


def test_sqrtsoftplus_router_weights():
    moe = MixtureOfExperts(8, 4, top_k=2, router="sqrtsoftplus", route_scale=1.5)
    X = torch.randn(5, 8)
    weights, experts = moe.route(X)
    scores = torch.nn.functional.softplus(moe.router(X)).sqrt()
    assert torch.equal(experts.sort(-1).values, scores.topk(2).indices.sort(-1).values)
    assert torch.allclose(weights.sum(-1), torch.full((5,), 1.5))


def test_swiglu_limit_clamps_without_shift():
    ffn = ClampedSwiGLU(4, 6, swiglu_limit=0.5)  # DeepSeek-V4's form: no slope, no + 1
    X = torch.randn(3, 4) * 5
    G, U = ffn.W_g(X).clamp(max=0.5), ffn.W_1(X).clamp(-0.5, 0.5)
    assert torch.allclose(ffn(X), ffn.W_2(torch.nn.functional.silu(G) * U))
    assert "swiglu_limit=0.5" in repr(ffn)


def test_hyper_block_factories():
    block = HyperConnectedBlock(16, 2, attn_factory=_attention, ffn_factory=lambda: FeedForward(16, 8, act="swiglu"))
    assert isinstance(block.attention, CompressedAttention)
    assert block(torch.randn(1, 5, 4, 16)).shape == (1, 5, 4, 16)
    with pytest.raises(ValueError, match="attn_factory"):
        HyperConnectedBlock(16, 2, attn_factory=_attention, causal=True)
    with pytest.raises(ValueError, match="ffn_factory"):
        HyperConnectedBlock(16, 2, ffn_factory=lambda: FeedForward(16), act="gelu")
    with pytest.raises(TypeError, match="attn_factory"):
        HyperConnectedBlock(16, 2, attn_factory=lambda: 3)


def test_unsupported_rope_type_is_refused():
    layer, config = hf_deepseek_v4_make(1)
    config.rope_parameters["compress"]["rope_type"] = "linear"
    with pytest.raises(ValueError, match="'compress' RoPE"):
        from_deepseek_v4_layer(layer, config)
