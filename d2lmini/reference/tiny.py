"""The tiny configurations of the reference layers: one home, for the zoo, the chapters and the tests.

Each entry of :data:`TINY_CONFIGS` is the keyword arguments of one ``transformers`` configuration class
(:func:`~d2lmini.reference.harness.hf_make` builds a layer from it): small enough that the layer builds and
runs in milliseconds on a CPU, and shaped so that every feature its converter reads is exercised -- sliding
windows and attention chunks shorter than the 16 steps of the test sequences, distinct widths where a swapped
one must not pass, enough layers that the tested one has the type under test. A tiny configuration is not a
released model: the released values are in the converters' docstrings and the zoo's notes.

Not a family: it holds data only and imports nothing.
"""

from __future__ import annotations

import copy

#: The shared base: width 64, 4 query heads sharing 2 key/value heads, an FFN of 160.
TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160)

#: Every sliding window of the tiny configurations: shorter than the 16-step test sequences.
WINDOW = 5

_GEMMA = dict(TINY, head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW)

# A tiny DeepSeek-V3: layer 0 dense (MLA + SwiGLU), layer 1 a MoE layer whose 8 experts form 4 groups, a token's
# 2 experts from the best 2 groups; every width distinct, so a swapped one cannot pass.
_DEEPSEEK_V3 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, intermediate_size=80,
                    moe_intermediate_size=16, q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=10,
                    qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                    topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                    num_hidden_layers=2, rms_norm_eps=1e-5, max_position_embeddings=64,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

# A tiny Qwen3.5: layer 0 a Gated DeltaNet layer, layer 1 a gated-attention layer (GQA 4/2, partial RoPE).
_QWEN3_5 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=80,
                num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], rms_norm_eps=1e-5,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, max_position_embeddings=64, vocab_size=16,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})

#: The tiny configurations by name (mostly the ``transformers`` model type; a second name where one model type
#: is tested in two shapes).
TINY_CONFIGS: dict[str, dict] = {
    "bert": dict(hidden_size=64, num_attention_heads=4, intermediate_size=256),
    "gpt2": dict(n_embd=64, n_head=4),
    "llama": dict(TINY, num_hidden_layers=1, rope_theta=500000.0),
    "qwen3": dict(TINY, num_hidden_layers=1, head_dim=32),
    "olmo2": dict(TINY, num_hidden_layers=1),
    # one global layer; "gemma3_sliding" has a local layer before it
    "gemma3": dict(TINY, num_hidden_layers=1, head_dim=32, query_pre_attn_scalar=24, layer_types=["full_attention"]),
    "gemma3_sliding": dict(_GEMMA, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]),
    "gemma2": dict(_GEMMA, num_hidden_layers=2, attn_logit_softcapping=5.0),  # layer types: local, global
    "mistral": dict(TINY, num_hidden_layers=1, sliding_window=WINDOW, rope_theta=10000.0),
    "olmo": dict(TINY, num_hidden_layers=1),
    "starcoder2": dict(TINY, num_hidden_layers=1, sliding_window=WINDOW, bos_token_id=None, eos_token_id=None),
    "qwen2": dict(TINY, num_hidden_layers=1, use_sliding_window=False),
    "ministral": dict(TINY, num_hidden_layers=2, head_dim=16, sliding_window=WINDOW,  # head_dim: no default
                      layer_types=["full_attention", "sliding_attention"]),
    "granite": dict(TINY, num_hidden_layers=1, residual_multiplier=0.22, attention_multiplier=0.0078,
                    embedding_multiplier=12.0, logits_scaling=8.0),
    "smollm3": dict(TINY, num_hidden_layers=4),  # layers 0-2 RoPE, 3 NoPE (no_rope_layer_interval=4)
    "olmo3": dict(TINY, num_hidden_layers=4, sliding_window=WINDOW),  # layers 0-2 sliding, 3 full
    # Ministral 3: YaRN over an "original" context of 4 positions, so the query scaling 1 + beta log(1 + floor(p / 4))
    # changes within the 16 test steps (the released models: 16384, factor 16).
    "ministral3": dict(TINY, num_hidden_layers=1, head_dim=16, max_position_embeddings=64,
                       rope_parameters=dict(rope_type="yarn", rope_theta=1_000_000.0, factor=16.0,
                                            original_max_position_embeddings=4, beta_fast=32.0, beta_slow=1.0,
                                            mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)),
    # Arcee Trinity: a local (sliding-window, RoPE) and a global (no positions) layer, both with the MoE FFN.
    "afmoe": dict(TINY, head_dim=32, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  num_shared_experts=1, num_dense_layers=0, num_hidden_layers=2, sliding_window=WINDOW,
                  layer_types=["sliding_attention", "full_attention"]),
    # one global layer of the same shapes (the chapter "The 2026 block")
    "afmoe_global": dict(TINY, head_dim=32, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                         num_shared_experts=1, num_dense_layers=0, num_hidden_layers=1,
                         layer_types=["full_attention"]),
    # gpt-oss: layers alternate sliding (layer 0) and full; YaRN as released (factor 32 over 4096, not truncated);
    # a SwiGLU clamp of 1 (released: 7) so that the tiny layer's activations reach it.
    "gpt_oss": dict(TINY, head_dim=16, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                    sliding_window=WINDOW, swiglu_limit=1.0,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, original_max_position_embeddings=4096)),
    "phi": dict(TINY, num_key_value_heads=4, num_hidden_layers=1, partial_rotary_factor=0.5),
    "phi3": dict(TINY, num_key_value_heads=4, num_hidden_layers=1, sliding_window=WINDOW, pad_token_id=0),
    "phi4_mini": dict(TINY, num_hidden_layers=1, partial_rotary_factor=0.75, pad_token_id=0),  # Phi3Config
    "gpt_neox": dict(hidden_size=64, num_attention_heads=4, intermediate_size=160, num_hidden_layers=1,
                     rotary_pct=0.25),
    "gptj": dict(n_embd=64, n_head=2, n_inner=160, n_layer=1, rotary_dim=8),
    "falcon": dict(hidden_size=64, num_attention_heads=4, multi_query=True, parallel_attn=True,
                   new_decoder_architecture=False, alibi=False, bias=False, ffn_hidden_size=160, num_hidden_layers=1),
    "cohere": dict(TINY, num_hidden_layers=1),  # CohereConfig's default and the released model: no biases
    "stablelm": dict(TINY, num_hidden_layers=1, partial_rotary_factor=0.25, use_qkv_bias=True,
                     use_parallel_residual=False),
    "deepseek_v3": _DEEPSEEK_V3,
    # GLM-5: the DeepSeek-V3 shapes plus a DSA indexer keeping 6 keys per query (the checks run 16 steps, so the
    # selection matters); layer 0 dense, layer 1 MoE (8 experts in 4 groups).
    "glm_moe_dsa": dict(_DEEPSEEK_V3, index_topk=6, index_head_dim=16, index_n_heads=8),
    "qwen3_5": _QWEN3_5,
    # The same shapes with Qwen3.5's MoE FFN in every layer (Qwen3_5MoeSparseMoeBlock): 8 experts of width 16,
    # top-2, and a shared expert of width 32 behind its sigmoid gate.
    "qwen3_5_moe": dict({k: v for k, v in _QWEN3_5.items() if k != "intermediate_size"}, moe_intermediate_size=16,
                        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    # Llama 4 with each of its four layer kinds: 0 RoPE (chunked, L2 QK-norm) + dense MLP, 1 NoPE (full, temperature
    # tuning) + MoE, 2 RoPE + MoE, 3 NoPE + dense. Chunks of 5 and floor_scale 3 so that both vary within the
    # 16-step test sequence.
    "llama4": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=24,
                   intermediate_size_mlp=40, num_local_experts=4, num_experts_per_tok=1, num_hidden_layers=4,
                   no_rope_layers=[1, 0, 1, 0], moe_layers=[1, 2], attention_chunk_size=5, floor_scale=3,
                   attn_scale=0.5, rms_norm_eps=1e-5, max_position_embeddings=64, vocab_size=16,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Gemma 4 without per-layer inputs: local (sliding, window 5, head width 8, 2 key/value heads, plain RoPE) and
    # global layers (head width 16, one key/value head, keys as values, proportional RoPE on a quarter of the
    # pairs) alternate; four layers, so that the two tested ones (0 and 1) are not the last of their type, which
    # store their keys and values for later layers.
    "gemma4": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
                   num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=5,
                   hidden_size_per_layer_input=0, global_head_dim=16, num_global_key_value_heads=1,
                   attention_k_eq_v=True, max_position_embeddings=64, vocab_size=16, rms_norm_eps=1e-6),
    # DeepSeek-V4 with one layer of each type -- 0 sliding window + hash-routed MoE, 1 HCA + top-k MoE, 2 CSA +
    # top-k MoE -- sized so that everything acts within 24 steps: a window of 6, HCA entries of 8 tokens, CSA
    # entries of 4 of which the indexer keeps 3, RoPE on half of each head, a SwiGLU clamp of 1.
    "deepseek_v4": dict(
        vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=16, q_lora_rank=16,
        partial_rotary_factor=0.5, o_groups=2, o_lora_rank=8, sliding_window=6,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, index_n_heads=2,
        index_head_dim=8, index_topk=3, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        swiglu_limit=1.0, hc_mult=4,
        layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"]),
}


def tiny_config(name: str, **overrides) -> dict:
    """A fresh copy of the tiny configuration ``name``, with ``overrides`` applied.

    Args:
        name: a key of :data:`TINY_CONFIGS`.
        **overrides: configuration keys to set or replace (e.g. ``layer_types=[...]``).

    Returns:
        A new dict (nested lists and dicts copied too: ``transformers`` configurations edit them in place).

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    if name not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny configuration {name!r}; known: {sorted(TINY_CONFIGS)}")
    return copy.deepcopy({**TINY_CONFIGS[name], **overrides})


__all__ = ["TINY", "TINY_CONFIGS", "WINDOW", "tiny_config"]
