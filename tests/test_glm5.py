"""GLM-5's layer (MLA with DeepSeek Sparse Attention) against Hugging Face ``GlmMoeDsaDecoderLayer``.

d2lmini.mla.DSAIndexer, MultiHeadLatentAttention(indexer=...), from_glm_moe_dsa_attention and
d2lmini.reference.from_glm_moe_dsa_layer. The batches have 16 steps and the indexer keeps 6 keys per
query, so the sparse selection matters for most queries.
"""

from __future__ import annotations

import pytest
import torch

from d2lmini import TransformerBlock
from d2lmini.attention import rotary_cos_sin, valid_lens_mask
from d2lmini.mla import DSAIndexer, MultiHeadLatentAttention, kv_cache_bytes_per_token
from d2lmini.reference import (HF_CONVERTERS, TOLERANCE, from_glm_moe_dsa_attention, from_glm_moe_dsa_layer, from_hf, hf_glm_moe_dsa_call,
                               hf_make, output_and_grad_differences, tiny_config)

#: A tiny GLM-5: every width distinct; layer 0 dense, layer 1 MoE (8 experts in 4 groups, 2 of them chosen).
TINY_GLM5 = tiny_config("glm_moe_dsa")
NUM_STEPS = 16
PADDINGS = {"unpadded": None, "padded": torch.tensor([16, 11]), "padded short": torch.tensor([5, 16])}


def _glm5(layer_idx: int = 0, seed: int = 0, **overrides):
    """A tiny random HF ``GlmMoeDsaDecoderLayer`` (every parameter randomized) and its config."""
    pytest.importorskip("transformers")
    return hf_make("glm_moe_dsa", "GlmMoeDsaDecoderLayer", "GlmMoeDsaConfig", dict(TINY_GLM5, **overrides),
                   layer_idx=layer_idx)(seed)


def _compare(layer, config, block, valid_lens, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(2, NUM_STEPS, config.hidden_size, generator=gen)
    R = torch.randn(X.shape, generator=gen)
    keep = torch.ones(2, NUM_STEPS, 1, dtype=torch.bool) if valid_lens is None \
        else valid_lens_mask(valid_lens, NUM_STEPS)[..., None]
    return output_and_grad_differences([lambda Z: hf_glm_moe_dsa_call(layer, config, Z, valid_lens),
                                        lambda Z: block(Z, valid_lens)], X, R, keep)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("layer_idx", [0, 1], ids=["dense", "moe"])
def test_block_matches_glm_moe_dsa_layer(layer_idx, padding, seed):
    layer, config = _glm5(layer_idx, seed)
    block = from_glm_moe_dsa_layer(layer, config)
    assert isinstance(block.attention, MultiHeadLatentAttention) and isinstance(block.attention.indexer, DSAIndexer)
    result = _compare(layer, config, block, PADDINGS[padding], seed)
    assert max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE, result
    assert result["max_abs_output"] > 0.1


def test_from_hf_dispatches_to_the_glm5_converter():
    layer, config = _glm5(1)
    assert HF_CONVERTERS["GlmMoeDsaDecoderLayer"] is from_glm_moe_dsa_layer
    block = from_hf(layer, config)
    assert _compare(layer, config, block, PADDINGS["padded"])["max_abs_diff"] <= TOLERANCE
    with pytest.raises(ValueError, match="layer_idx=0"):
        from_glm_moe_dsa_layer(layer, config, layer_idx=0)


def test_the_sparse_selection_matters():
    """Mutation tests: without the indexer, or with HF's index_topk >= n, the outputs move."""
    layer, config = _glm5(1)
    block = from_glm_moe_dsa_layer(layer, config)
    block.attention.indexer = None  # dense MLA: no longer GLM-5's layer at 16 steps
    assert _compare(layer, config, block, PADDINGS["padded"])["max_abs_diff"] > 1e-2
    dense_layer, dense_config = _glm5(1, index_topk=NUM_STEPS)  # HF's own layer, every key selected
    assert _compare(dense_layer, dense_config, block, PADDINGS["padded"])["max_abs_diff"] <= TOLERANCE


def test_indexer_keeps_topk_unmasked_keys_per_query():
    torch.manual_seed(0)
    indexer = DSAIndexer(16, 12, num_heads=4, head_dim=8, rope_dim=4, topk=3)
    X, c_q = torch.randn(2, 7, 16), torch.randn(2, 7, 12)
    cos, sin = rotary_cos_sin(7, 4)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    selected = indexer(X, c_q, cos, sin, causal)
    assert selected.shape == (2, 7, 7) and selected.dtype == torch.bool
    assert ((selected & causal).sum(-1) == torch.arange(1, 8).clamp(max=3)).all()
    index = indexer.scores(X, c_q, cos, sin).masked_fill(~causal, float("-inf"))
    worst_kept = index.masked_fill(~(selected & causal), float("inf")).amin(-1)
    best_dropped = index.masked_fill(selected | ~causal, float("-inf")).amax(-1)
    assert (worst_kept >= best_dropped).all()  # the best keys, not any keys


def test_topk_at_least_n_is_dense_mla_and_the_selection_gets_no_gradient():
    torch.manual_seed(0)
    args = dict(q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                rope_theta=10000.0)
    dense = MultiHeadLatentAttention(16, 2, **args)
    sparse = MultiHeadLatentAttention(16, 2, **args, indexer=DSAIndexer(16, 12, num_heads=2, head_dim=8,
                                                                         rope_dim=4, topk=9))
    sparse.load_state_dict(dense.state_dict(), strict=False)
    X = torch.randn(2, 9, 16, requires_grad=True)
    valid_lens = torch.tensor([9, 4])
    torch.testing.assert_close(sparse(X, X, X, valid_lens), dense(X, X, X, valid_lens), rtol=0, atol=1e-6)
    sparse.indexer.topk = 2
    sparse(X, X, X, valid_lens).sum().backward()
    assert X.grad is not None and all(p.grad is None for p in sparse.indexer.parameters())


def test_kv_cache_counts_the_indexer_key():
    args = dict(q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                rope_theta=10000.0)
    indexer = DSAIndexer(16, 12, num_heads=2, head_dim=8, rope_dim=4, topk=3)
    assert kv_cache_bytes_per_token(MultiHeadLatentAttention(16, 2, **args, indexer=indexer)) == 2 * (10 + 4 + 8)
    block = TransformerBlock(16, 2, attn_factory=lambda: MultiHeadLatentAttention(16, 2, **args, indexer=indexer))
    assert kv_cache_bytes_per_token(block, dtype_bytes=1) == 10 + 4 + 8


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(rope_dim=3), ValueError, "rope_dim must be even"),
    (dict(rope_dim=10), ValueError, "rope_dim must be even and <= head_dim"),
    (dict(topk=0), ValueError, "topk"),
    (dict(num_heads=2.0), TypeError, "num_heads"),
    (dict(eps=0.0), ValueError, "eps"),
])
def test_bad_indexer_arguments_are_rejected(kwargs, error, match):
    args = dict(num_heads=2, head_dim=8, rope_dim=4, topk=3)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        DSAIndexer(16, 12, **args)


@pytest.mark.parametrize("attention, indexer, error, match", [
    (dict(), "not an indexer", TypeError, "indexer must be None or a DSAIndexer"),
    (dict(q_lora_rank=None), dict(), ValueError, "query latent"),
    (dict(q_lora_rank=10), dict(), ValueError, "q_lora_rank=12 must equal"),
    (dict(), dict(rope_dim=2), ValueError, "rope_dim=4"),
])
def test_bad_indexer_for_the_attention_is_rejected(attention, indexer, error, match):
    args = dict(q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
                rope_theta=10000.0)
    args.update(attention)
    if isinstance(indexer, dict):
        indexer = DSAIndexer(16, 12, **dict(dict(num_heads=2, head_dim=8, rope_dim=4, topk=3), **indexer))
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(16, 2, **args, indexer=indexer)


def test_shared_indexer_layers_are_refused():
    layer, config = _glm5(1, indexer_types=["full", "shared"])
    assert layer.self_attn.indexer is None
    with pytest.raises(ValueError, match="'shared' DSA layer"):
        from_glm_moe_dsa_layer(layer, config)
    with pytest.raises(ValueError, match="'shared' DSA layer"):
        from_glm_moe_dsa_attention(layer.self_attn, config)
