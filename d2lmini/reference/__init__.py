"""Real models' layers as d2lmini blocks: configure, copy the weights, compare.

Introduced in the appendix "The block zoo". For each reference layer there is a ``from_*``
function that returns a d2lmini block configured like the layer and holding copies of its
weights (not shared), so both compute the same function; the block is on the layer's device and
dtype, in the layer's train/eval mode. Dropout: in eval mode it does nothing and is not
converted; a Hugging Face layer in training mode with a dropout probability > 0 is converted only
where the block applies it where the layer does (BERT's and GPT-2's, when their attention and
branch dropouts are equal), and refused with a ``ValueError`` naming the config field otherwise.

One module per model family, each opening with what the family changes relative to its base
(as Hugging Face's modular files do), and each registering its Hugging Face layer classes in
:data:`HF_CONVERTERS` with :func:`~d2lmini.reference.base.converter`; :func:`from_hf` converts any
of them, dispatching on the layer's class name (``transformers`` is an optional dependency,
imported only inside functions):

=====================================  ==========================================================
module                                 family
=====================================  ==========================================================
:mod:`~d2lmini.reference.base`         copy helpers, config readers, the registry, :func:`from_hf`
:mod:`~d2lmini.reference.pytorch`      ``nn.TransformerEncoderLayer``/``DecoderLayer`` (2017)
:mod:`~d2lmini.reference.bert_gpt2`    BERT, GPT-2
:mod:`~d2lmini.reference.llama`        Llama, Mistral, Ministral, Ministral 3, Qwen2, Qwen3,
                                       Granite, SmolLM3, StarCoder2
:mod:`~d2lmini.reference.olmo`         OLMo, OLMo 2, OLMo 3
:mod:`~d2lmini.reference.gemma`        Gemma 2, Gemma 3, Gemma 4
:mod:`~d2lmini.reference.parallel`     Phi, Phi-3, GPT-NeoX, GPT-J, Falcon, Cohere, StableLM
:mod:`~d2lmini.reference.trinity`      Arcee Trinity (AFMoE)
:mod:`~d2lmini.reference.gpt_oss`      gpt-oss
:mod:`~d2lmini.reference.llama4`       Llama 4
:mod:`~d2lmini.reference.qwen3_5`      Qwen3.5 (gated attention, Gated DeltaNet; dense and MoE)
:mod:`~d2lmini.reference.deepseek`     DeepSeek-V3 (MLA, its MoE; Kimi K2), DeepSeek-V4
:mod:`~d2lmini.reference.glm`          GLM-5 (MLA with DeepSeek Sparse Attention)
:mod:`~d2lmini.reference.harness`      tiny references and the comparison harness
:mod:`~d2lmini.reference.export`       :func:`to_hf`: a d2lmini language model as Llama or Qwen3
=====================================  ==========================================================

:func:`hf_make` and :func:`hf_call` build a tiny random Hugging Face layer and call it as its
model does (the model's own masks from ``transformers.masking_utils`` and its own rotary tables);
:data:`REFERENCES` and :func:`compare_with_reference` run a reference and its d2lmini twin on the
same padded batch and report the largest output and input-gradient differences.

Traps handled here, each one a silent wrong answer if missed: BERT's LayerNorm eps of 1e-12;
GPT-2's ``Conv1D`` weights stored (in, out) and its tanh GELU; Gemma's RMSNorm gain stored as
``w`` and applied as ``1 + w``, and its logit scale ``query_pre_attn_scalar ** -0.5``; OLMo 2's
QK-norm over the whole projection; Qwen3's ``head_dim`` unequal to ``d / h``; OLMo's
parameter-free LayerNorm with its eps fixed at 1e-5 (and ``clip_qkv``, refused); Qwen2's biases
on q, k, v but not o; Gemma 3's local layers, which use their own RoPE base; keys of
``rope_parameters`` that ``transformers`` reads for one RoPE type but not another (YaRN's
``truncate`` from the top level, ``mscale`` only with ``mscale_all_dim``;
:func:`~d2lmini.reference.base.rope_kwargs`); Ministral 3's query scaling, whose period is YaRN's
``original_max_position_embeddings``; Arcee Trinity's global layers, which apply no RoPE though
the model computes a rotary table; layer types (sliding or full, RoPE or NoPE) chosen by
``layer_idx``; ``nn.TransformerEncoderLayer``'s fused fast path (eval, no grad) which returns
zeros at padded positions; and Hugging Face layers called with ``attention_mask=None``, which are
causal under SDPA but bidirectional under eager attention -- so masks are always passed
explicitly. Among the parallel and partial-RoPE layers: GPT-J's and Cohere's *interleaved* RoPE
pairs (converted by permuting the rows of ``W_q`` and ``W_k``, :func:`rope_interleaved_to_half`),
partial RoPE on ``int(head_dim * partial_rotary_factor)`` features, the fused q/k/v layouts of
GPT-NeoX (per head), Phi-3 (q, then k, then v) and Falcon (three of them), MLP biases that differ
from the attention's (GPT-J, GPT-NeoX), and Falcon's required ``alibi`` argument.
"""

# The order is the modules' own: each imports only those above it.
from .base import HF_CONVERTERS, LayerRow, Row2026, converter, from_hf, rope_interleaved_to_half
from .pytorch import from_torch_decoder_layer, from_torch_encoder_layer
from .bert_gpt2 import from_bert_layer, from_gpt2_block
from .llama import (from_granite_layer, from_llama_layer, from_ministral3_layer, from_ministral_layer,
                    from_mistral_layer, from_qwen2_layer, from_qwen3_layer, from_smollm3_layer, from_starcoder2_layer)
from .olmo import from_olmo2_layer, from_olmo3_layer, from_olmo_layer
from .gemma import from_gemma2_layer, from_gemma3_layer, from_gemma4_layer
from .parallel import (from_cohere_layer, from_falcon_layer, from_gpt_neox_layer, from_gptj_block, from_phi3_layer,
                       from_phi_layer, from_stablelm_layer)
from .trinity import from_afmoe_layer
from .gpt_oss import copy_gptoss_experts, from_gpt_oss_layer
from .llama4 import from_llama4_layer
from .qwen3_5 import from_qwen3_5_attention, from_qwen3_5_gated_deltanet, from_qwen3_5_layer
from .tiny import TINY, TINY_CONFIGS, WINDOW, tiny_config
from .harness import (HF_TINY, REFERENCES, TOLERANCE, Reference, additive_mask, compare_with_reference, hf_call,
                      hf_make, hf_reference, output_and_grad_differences, randomize_, register_references)
from .deepseek import (compare_deepseek_v4_layer, from_deepseek_v3_attention, from_deepseek_v3_layer,
                       from_deepseek_v3_moe, from_deepseek_v4_layer, hf_deepseek_v4_call, hf_deepseek_v4_make,
                       mla_decoder_block)
from .glm import from_glm_moe_dsa_attention, from_glm_moe_dsa_layer, hf_glm_moe_dsa_call
from .export import to_hf
from . import bert_gpt2, deepseek, gemma, glm, gpt_oss, llama, llama4, olmo, parallel, qwen3_5, trinity

#: The family modules whose rows the zoo, the harness and the 2026 table are built from, in the order
#: their rows are collected (within a year, the zoo lists its rows in this order). A family module
#: declares its tiny configurations (``TINY_CONFIGS``) and ``ROWS`` (:class:`~d2lmini.reference.base.LayerRow`,
#: the layers it reproduces) and/or ``ROWS_2026`` (:class:`~d2lmini.reference.base.Row2026`, its models in the
#: 2026 table).
FAMILIES = (bert_gpt2, llama, gpt_oss, llama4, olmo, trinity, deepseek, qwen3_5, gemma, glm, parallel)
#: Every family's layer rows, family by family.
LAYER_ROWS: tuple[LayerRow, ...] = tuple(row for family in FAMILIES for row in getattr(family, "ROWS", ()))
#: Every family's rows of the 2026 table, family by family.
ROWS_2026: tuple[Row2026, ...] = tuple(row for family in FAMILIES for row in getattr(family, "ROWS_2026", ()))
for _family in FAMILIES:  # every family's tiny configurations, in one dict
    if set(_family.TINY_CONFIGS) & set(TINY_CONFIGS):
        raise ValueError(f"{_family.__name__} redefines a tiny configuration of another family")
    TINY_CONFIGS.update(_family.TINY_CONFIGS)
del _family
register_references(LAYER_ROWS)

__all__ = [
    "FAMILIES", "HF_CONVERTERS", "HF_TINY", "LAYER_ROWS", "LayerRow", "REFERENCES", "ROWS_2026", "Row2026", "TINY",
    "TINY_CONFIGS", "TOLERANCE", "Reference", "WINDOW", "additive_mask", "register_references",
    "compare_deepseek_v4_layer", "compare_with_reference", "converter", "copy_gptoss_experts", "from_afmoe_layer",
    "from_bert_layer", "from_cohere_layer", "from_deepseek_v3_attention", "from_deepseek_v3_layer",
    "from_deepseek_v3_moe", "from_deepseek_v4_layer", "from_falcon_layer", "from_gemma2_layer", "from_gemma3_layer",
    "from_gemma4_layer", "from_glm_moe_dsa_attention", "from_glm_moe_dsa_layer", "from_gpt2_block",
    "from_gpt_neox_layer", "from_gpt_oss_layer", "from_gptj_block", "from_granite_layer", "from_hf",
    "from_llama4_layer", "from_llama_layer", "from_ministral3_layer", "from_ministral_layer", "from_mistral_layer",
    "from_olmo2_layer", "from_olmo3_layer", "from_olmo_layer", "from_phi3_layer", "from_phi_layer",
    "from_qwen2_layer", "from_qwen3_5_attention", "from_qwen3_5_gated_deltanet", "from_qwen3_5_layer",
    "from_qwen3_layer", "from_smollm3_layer", "from_stablelm_layer", "from_starcoder2_layer",
    "from_torch_decoder_layer", "from_torch_encoder_layer", "hf_call", "hf_deepseek_v4_call", "hf_deepseek_v4_make",
    "hf_glm_moe_dsa_call", "hf_make", "hf_reference", "mla_decoder_block", "output_and_grad_differences",
    "randomize_", "rope_interleaved_to_half", "tiny_config", "to_hf",
]
