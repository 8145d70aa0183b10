"""BERT and GPT-2: the 2017 block as Hugging Face stores it (post-LN encoder; pre-LN decoder, ``Conv1D`` weights).

Relative to :mod:`d2lmini.reference.pytorch`: BERT keeps post-LN but its LayerNorm eps is
1e-12 and its q, k, v are separate; GPT-2 moves the norm before each sublayer (pre-LN), stores
its projections (in, out) in ``Conv1D`` and uses the tanh GELU. Both apply dropout where the
block can, so training-mode layers convert when their attention and branch dropouts agree.
"""

from __future__ import annotations

from ..block import TransformerBlock
from ..ffn import FeedForward
from .base import converter, copy_linear, copy_norm, copy_qkv_packed, hf_act, start_conversion
from .base import LayerRow


def _attention_and_branch_dropout(layer, config, attention: str, branch: str) -> float:
    """The block ``dropout`` reproducing a layer that drops out its attention weights with ``config.<attention>``
    and each branch output (before the residual sum) with ``config.<branch>`` and nothing else (BERT, GPT-2):
    the common probability in training mode when the two are equal, else 0 (where :func:`start_conversion` refuses a
    training-mode layer with either > 0). The block then needs an FFN without dropout (:func:`_ffn_kwargs`)."""
    p_attention, p_branch = getattr(config, attention), getattr(config, branch)
    return float(p_branch) if layer.training and p_attention == p_branch else 0.0


def _ffn_kwargs(d: int, ffn_num_hiddens: int, act: str, bias: bool, dropout: float) -> dict:
    """``TransformerBlock`` FFN arguments: ``act``/``ffn_num_hiddens``, or with a block ``dropout`` > 0 an
    ``ffn_factory`` of a :class:`~d2lmini.ffn.FeedForward` without dropout on its hidden units."""
    if dropout == 0:
        return {"act": act, "ffn_num_hiddens": ffn_num_hiddens}
    return {"ffn_factory": lambda: FeedForward(d, ffn_num_hiddens, act=act, bias=bias)}


@converter("BertLayer")
def from_bert_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``BertLayer`` (Devlin et al., 2019).

    Post-LN, LayerNorm with ``config.layer_norm_eps`` (1e-12 in BERT), exact GELU,
    biases everywhere, bidirectional attention -- or causal with ``config.is_decoder``
    (``BertLayer`` passes ``is_causal=config.is_decoder`` to its attention). In training
    mode, BERT's dropouts (``attention_probs_dropout_prob`` on the attention weights,
    ``hidden_dropout_prob`` on each branch output) are reproduced when they are equal
    (BERT's default: 0.1): ``dropout=p`` and an FFN without dropout on its hidden units.

    Args:
        layer, config: a ``BertLayer`` and its ``BertConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The post-LN block.

    Raises:
        ValueError: for ``config.add_cross_attention`` (a decoder layer with cross-attention,
            which a :class:`TransformerBlock` does not have), a layer in training mode whose two
            dropouts differ, or an unsupported activation.
    """
    if getattr(config, "add_cross_attention", False):
        raise ValueError("BERT with add_cross_attention=True (cross-attention to an encoder) is not supported; "
                         "use add_cross_attention=False")
    dropout = _attention_and_branch_dropout(layer, config, "attention_probs_dropout_prob", "hidden_dropout_prob")
    start_conversion(layer, config, layer_idx, reproduced=("attention_probs_dropout_prob", "hidden_dropout_prob") if dropout else ())
    attn = layer.attention.self
    d = config.hidden_size
    block = TransformerBlock(d, config.num_attention_heads, norm="layer", placement="post", bias=True,
                             eps=config.layer_norm_eps, causal=bool(config.is_decoder), dropout=dropout,
                             **_ffn_kwargs(d, config.intermediate_size, hf_act(config.hidden_act), True, dropout))
    copy_linear(block.attention.W_q, attn.query.weight, attn.query.bias)
    copy_linear(block.attention.W_k, attn.key.weight, attn.key.bias)
    copy_linear(block.attention.W_v, attn.value.weight, attn.value.bias)
    out = layer.attention.output
    copy_linear(block.attention.W_o, out.dense.weight, out.dense.bias)
    copy_norm(block.addnorm1.norm_post, out.LayerNorm)
    copy_linear(block.ffn.W_1, layer.intermediate.dense.weight, layer.intermediate.dense.bias)
    copy_linear(block.ffn.W_2, layer.output.dense.weight, layer.output.dense.bias)
    copy_norm(block.addnorm2.norm_post, layer.output.LayerNorm)
    return block.to(attn.query.weight).train(layer.training)


@converter("GPT2Block")
def from_gpt2_block(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``GPT2Block`` (Radford et al., 2019).

    Pre-LN, LayerNorm (eps 1e-5), tanh-approximated GELU, biases, causal attention.
    GPT-2 stores its projections as ``Conv1D`` with weights of shape (in, out):
    they are transposed into ``nn.Linear``'s (out, in). In training mode, GPT-2's dropouts
    (``attn_pdrop`` on the attention weights, ``resid_pdrop`` on each branch output) are
    reproduced when they are equal (GPT-2's default: 0.1): ``dropout=p`` and an FFN
    without dropout on its hidden units.

    Args:
        layer, config: a ``GPT2Block`` and its ``GPT2Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-LN causal block.

    Raises:
        ValueError: for GPT-2 options d2lmini does not implement
            (``scale_attn_by_inverse_layer_idx``, unscaled attention, ``add_cross_attention``), a
            layer in training mode whose two dropouts differ, or an unsupported activation.
    """
    if getattr(config, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True is not supported; use add_cross_attention=False")
    dropout = _attention_and_branch_dropout(layer, config, "attn_pdrop", "resid_pdrop")
    start_conversion(layer, config, layer_idx, reproduced=("attn_pdrop", "resid_pdrop") if dropout else ())
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(config, "scale_attn_weights", True):
        raise ValueError("only GPT-2's default attention scaling 1/sqrt(head_dim) is supported")
    d, h = config.n_embd, config.n_head
    inner = config.n_inner or 4 * d
    block = TransformerBlock(d, h, norm="layer", placement="pre", bias=True, eps=config.layer_norm_epsilon,
                             causal=True, dropout=dropout,
                             **_ffn_kwargs(d, inner, hf_act(config.activation_function), True, dropout))
    W, b = layer.attn.c_attn.weight.t(), layer.attn.c_attn.bias  # (3d, d) after the transpose
    copy_qkv_packed(block.attention, W, b)
    copy_linear(block.attention.W_o, layer.attn.c_proj.weight.t(), layer.attn.c_proj.bias)
    copy_linear(block.ffn.W_1, layer.mlp.c_fc.weight.t(), layer.mlp.c_fc.bias)
    copy_linear(block.ffn.W_2, layer.mlp.c_proj.weight.t(), layer.mlp.c_proj.bias)
    copy_norm(block.addnorm1.norm_in, layer.ln_1)
    copy_norm(block.addnorm2.norm_in, layer.ln_2)
    return block.to(W).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    "bert": dict(hidden_size=64, num_attention_heads=4, intermediate_size=256),
    "gpt2": dict(n_embd=64, n_head=4),
}


# --------------------------------------------------------------------------- the family's rows

_LEARNED = "learned absolute positions, added to the input (outside the layer)"

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("BERT", "BERT", 2018, "BertLayer", "bert", "BertConfig", "bert", causal=False, note=_LEARNED,
             reference="BERT"),
    LayerRow("GPT-2", "GPT", 2019, "GPT2Block", "gpt2", "GPT2Config", "gpt2", note=_LEARNED, reference="GPT-2"),
)
