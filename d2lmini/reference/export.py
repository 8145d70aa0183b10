"""The other direction: a d2lmini language model as the Hugging Face Llama or Qwen3 model that computes the same.

Not a family: :func:`to_hf` derives a ``LlamaConfig`` or ``Qwen3Config`` from a
:class:`~d2lmini.lm.LanguageModel` (refusing, by name, any setting neither has) and copies the
weights across; the chapter "The 2026 block" generates with both.
"""

from __future__ import annotations

from .._shown import shown_in
from ..attention import MultiHeadAttention
from ..ffn import FeedForward
from ..lm import LanguageModel
from ..parameters import copy_parameters


def _hf_causal_lm_config(lm) -> tuple[str, dict]:
    """The Hugging Face model class (``'llama'`` or ``'qwen3'``) and config that compute what ``lm`` does.

    Raises ``ValueError`` naming the first setting of ``lm`` that neither ``LlamaForCausalLM``
    nor ``Qwen3ForCausalLM`` has.
    """
    if not isinstance(lm, LanguageModel):
        raise TypeError(f"lm must be a d2lmini.LanguageModel, got {type(lm).__name__}")
    if lm.positions != "rope":
        raise ValueError(f"to_hf needs positions='rope' (Llama and Qwen3 have no position embedding), "
                         f"got positions={lm.positions!r}")
    if lm.head.bias is not None:
        raise ValueError("to_hf needs an output head without a bias (lm_head has none); this model's head has one")
    first = lm.blocks[0]
    attention = first.attention
    if type(first.ffn) is not FeedForward:
        raise ValueError(f"to_hf supports d2lmini's FeedForward (SwiGLU), got {type(first.ffn).__name__}")
    wanted = {"placement": ("pre", first.placement), "norm": ("rms", first.norm), "act": ("swiglu", first.ffn.act)}
    if type(attention) is not MultiHeadAttention:
        raise ValueError(f"to_hf supports d2lmini's MultiHeadAttention (MHA, GQA), got {type(attention).__name__}")
    if attention.qk_norm not in (None, "per_head"):
        raise ValueError(f"to_hf: qk_norm={attention.qk_norm!r} has no counterpart in LlamaForCausalLM or "
                         "Qwen3ForCausalLM (allowed: None, or 'per_head' as Qwen3)")
    wanted.update({"attention bias": (False, attention.W_q.bias is not None or attention.W_o.bias is not None),
                   "FFN bias": (False, first.ffn.W_1.bias is not None)})
    for name in ("window", "rotary_dim", "rope_scaling", "scale"):
        wanted[name] = (None, getattr(attention, name))
    wanted["sinks"] = (False, attention.sinks is not None)
    wanted.update({"residual": (True, first.addnorm1.residual), "layer_scalar": (1.0, first.layer_scalar),
                   "residual_multiplier": (1.0, first.addnorm1.residual_multiplier)})
    for name, (allowed, value) in wanted.items():
        if value != allowed:
            raise ValueError(f"to_hf: {name}={value!r} has no counterpart in LlamaForCausalLM or Qwen3ForCausalLM "
                             f"(allowed: {allowed!r})")
    for i, block in enumerate(lm.blocks[1:], start=1):
        if repr(block) != repr(first):
            raise ValueError(f"to_hf needs every block configured alike; block {i} differs from block 0")
    eps = first.addnorm1.norm_in.eps
    if attention.qk_norm is not None and attention.qk_norm_eps != eps:
        raise ValueError(f"to_hf: Qwen3's QK-norm uses rms_norm_eps={eps}, got qk_norm_eps={attention.qk_norm_eps}")
    config = dict(vocab_size=lm.vocab_size, hidden_size=first.num_hiddens, intermediate_size=first.ffn.ffn_num_hiddens,
                  num_hidden_layers=len(lm.blocks), num_attention_heads=attention.num_heads,
                  num_key_value_heads=attention.num_kv_heads, head_dim=attention.head_dim,
                  max_position_embeddings=lm.context_len, rms_norm_eps=eps, hidden_act="silu",
                  rope_parameters={"rope_type": "default", "rope_theta": attention.rope_theta},
                  tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no token ends generation
    return ("qwen3" if attention.qk_norm == "per_head" else "llama"), config


@shown_in("ch09")
def to_hf(lm):
    """The Hugging Face causal language model that computes what the d2lmini ``lm`` computes.

    ``Qwen3ForCausalLM`` when the blocks have QK-norm (per head, before RoPE, as Qwen3), else
    ``LlamaForCausalLM``: the config is derived from ``lm`` (nothing is downloaded), the weights
    are copied (not shared), and the model is in eval mode, on ``lm``'s device and dtype. Its
    logits agree with ``lm``'s to rounding, and its ``generate(do_sample=False)`` gives
    :func:`d2lmini.generate`'s tokens: the config names no end-of-sequence token (``LlamaConfig``'s
    default ``eos_token_id=2`` would stop generation at token 2), so neither stops early.

    Raises:
        TypeError: if ``lm`` is not a :class:`~d2lmini.lm.LanguageModel`.
        ValueError: a model either class cannot express (learned or sinusoidal positions, a head
            with a bias, another placement, norm or FFN, biases, windows, sinks, ...): the message
            names the setting and what is allowed.
    """
    import transformers

    family, config = _hf_causal_lm_config(lm)
    Config, Model = ((transformers.Qwen3Config, transformers.Qwen3ForCausalLM)
                     if family == "qwen3"
                     else (transformers.LlamaConfig, transformers.LlamaForCausalLM))
    hf = Model(Config(**config))
    rename = {"embedding": "model.embed_tokens", "final_norm": "model.norm",
              "head": "lm_head"}
    per_block = {  # ours: theirs, in every block
        "attention.W_q": "self_attn.q_proj", "attention.W_k": "self_attn.k_proj",
        "attention.W_v": "self_attn.v_proj", "attention.W_o": "self_attn.o_proj",
        "attention.q_norm": "self_attn.q_norm", "attention.k_norm": "self_attn.k_norm",
        "ffn.W_g": "mlp.gate_proj", "ffn.W_1": "mlp.up_proj",
        "ffn.W_2": "mlp.down_proj", "addnorm1.norm_in": "input_layernorm",
        "addnorm2.norm_in": "post_attention_layernorm"}
    for i in range(len(lm.blocks)):
        for a, b in per_block.items():
            rename[f"blocks.{i}.{a}"] = f"model.layers.{i}.{b}"
    parameter = next(lm.parameters())
    copy_parameters(lm, hf.to(device=parameter.device, dtype=parameter.dtype), rename)
    return hf.eval()
