"""OLMo, OLMo 2 and OLMo 3: the Llama block with a parameter-free LayerNorm (OLMo) or the norm moved onto each sublayer's output.

Relative to :func:`~d2lmini.reference.llama.from_llama_layer`: OLMo's LayerNorm has no gain and
no bias and an eps fixed at 1e-5; OLMo 2 norms each sublayer's output inside the residual branch
(``placement='post_sublayer'``) and adds QK-norm over the whole q and k projections; OLMo 3 adds
sliding and full layer types with their own RoPE.
"""

from __future__ import annotations

from ..block import TransformerBlock
from .base import converter, copy_norm, gated_act, layer_type_of, start_conversion, window_of
from .base import LayerRow, Row2026
from .llama import gated_decoder
from .tiny import TINY, WINDOW


@converter("OlmoDecoderLayer")
def from_olmo_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``OlmoDecoderLayer`` (OLMo, 2024).

    Pre-LN with a *non-parametric* LayerNorm (no gain, no bias; ``OlmoLayerNorm``, whose
    eps is fixed at 1e-5 whatever the config says), RoPE, SwiGLU, no biases.

    Args:
        layer, config: a ``OlmoDecoderLayer`` and its ``OlmoConfig``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The pre-norm block with ``norm='layer_nonparametric'``.

    Raises:
        ValueError: for ``clip_qkv`` (OLMo's clamping of q, k and v, which d2lmini does not
            implement), biases or a RoPE type d2lmini does not reproduce.
    """
    start_conversion(layer, config, layer_idx)
    if getattr(config, "clip_qkv", None) is not None:
        raise ValueError(f"OLMo's clip_qkv={config.clip_qkv!r} is not supported; use clip_qkv=None")
    block = gated_decoder(layer, config, "pre", None, act=gated_act(config.hidden_act),
                          norm="layer_nonparametric", eps=1e-5)
    return block.to(layer.self_attn.q_proj.weight).train(layer.training)


@converter("Olmo2DecoderLayer")
def from_olmo2_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Olmo2DecoderLayer`` (OLMo 2, 2024).

    RMSNorm on each sublayer's *output* inside the residual branch
    (``placement='post_sublayer'``), QK-norm over the whole q and k projections
    before the head split, RoPE, SwiGLU.

    Args:
        layer, config: a ``Olmo2DecoderLayer`` and its ``Olmo2Config``.
        layer_idx: ``None`` (the default: the index the layer was built with) or that index, as for every
            converter (:func:`~d2lmini.reference.base.start_conversion`); this layer's type does not depend on it.

    Returns:
        The ``'post_sublayer'`` block with QK-norm over the projection.
    """
    return from_olmo3_layer(layer, config, layer_idx)


@converter("Olmo3DecoderLayer")
def from_olmo3_layer(layer, config, layer_idx: int | None = None) -> TransformerBlock:
    """A :class:`TransformerBlock` equal to Hugging Face ``Olmo3DecoderLayer`` (OLMo 3, 2025).

    OLMo 2's block (``'post_sublayer'`` RMSNorm, QK-norm over the projection) with
    layer types: a ``'sliding_attention'`` layer in ``config.layer_types`` gets
    ``window=config.sliding_window`` and the RoPE base of
    ``config.rope_parameters['sliding_attention']``, a ``'full_attention'`` layer no
    window and the full layers' RoPE.

    Args:
        layer, config: a ``Olmo3DecoderLayer`` and its ``Olmo3Config`` (or an OLMo 2 pair).
        layer_idx: the layer's position in the stack (selects its type); ``None`` (the default): the
            index the layer was built with; a given one must equal it (:func:`start_conversion`).

    Returns:
        The ``'post_sublayer'`` block, windowed on sliding layers.

    Raises:
        ValueError: for a RoPE type d2lmini does not reproduce (YaRN, as on the full layers of
            released OLMo 3 models, is reproduced) or a ``layer_idx`` outside ``config.layer_types``.
    """
    layer_idx = start_conversion(layer, config, layer_idx)
    block = gated_decoder(layer, config, "post_sublayer", "projection", act=gated_act(config.hidden_act),
                          layer_type=layer_type_of(config, layer_idx), window=window_of(config, layer_idx))
    copy_norm(block.addnorm1.norm_out, layer.post_attention_layernorm)
    copy_norm(block.addnorm2.norm_out, layer.post_feedforward_layernorm)
    return block.to(layer.post_attention_layernorm.weight).train(layer.training)


# --------------------------------------------------------------------------- the family's tiny configurations

#: The family's tiny configurations by name (the keyword arguments of its ``transformers`` configuration
#: classes), collected into :data:`~d2lmini.reference.tiny.TINY_CONFIGS`.
TINY_CONFIGS: dict[str, dict] = {
    # released OLMo 2's base and eps (Olmo2Config's defaults are 10,000 and 1e-5)
    "olmo2": dict(TINY, num_hidden_layers=1, rope_theta=500000.0, rms_norm_eps=1e-6),
    "olmo": dict(TINY, num_hidden_layers=1),
    "olmo3": dict(TINY, num_hidden_layers=4, sliding_window=WINDOW),  # layers 0-2 sliding, 3 full
}


# --------------------------------------------------------------------------- the family's rows

#: The layers of the family the zoo reproduces (:class:`~d2lmini.reference.base.LayerRow`).
ROWS = (
    LayerRow("OLMo", "OLMo", 2024, "OlmoDecoderLayer", "olmo", "OlmoConfig", "olmo"),
    LayerRow("OLMo 2", "OLMo", 2024, "Olmo2DecoderLayer", "olmo2", "Olmo2Config", "olmo2", reference="OLMo 2"),
    LayerRow("OLMo 3 (sliding)", "OLMo", 2025, "Olmo3DecoderLayer", "olmo3", "Olmo3Config", "olmo3", layer_idx=0),
    LayerRow("OLMo 3 (full)", "OLMo", 2025, "Olmo3DecoderLayer", "olmo3", "Olmo3Config", "olmo3", layer_idx=3),
)

#: The family's models in the zoo's 2026 table (:class:`~d2lmini.reference.base.Row2026`).
ROWS_2026 = (
    Row2026("OLMo 3", 2025, "olmo2025olmo3", "Olmo3Config",
            dict(norm="RMSNorm, on each sublayer's output", qk_norm="QK-norm over the whole projection"),
            "OLMo 3 7B", check="OLMo 3",
            zoo_rows=("OLMo 3 (sliding)", "OLMo 3 (full)")),
)
