"""The block zoo: released models' blocks, described from d2lmini blocks and checked against their layers.

Introduced in the appendix "The Block Zoo" (``chapters/zoo.ipynb``). It holds what that page shows:

* :func:`who_uses_what` -- eight models' blocks, each described from a d2lmini block
  configured like the model and, where a reference layer class exists, verified
  against it (via :mod:`d2lmini.reference`, plus :func:`compare_with_trinity` for
  Arcee Trinity's ``AfmoeDecoderLayer``);
* :func:`table_2026` -- the 2026 table: ten models of late 2024 to 2026 described from
  their ``transformers`` configuration classes (:func:`describe_config`, with the
  modeling-file facts of :data:`MODELING`) and, where d2lmini rebuilds their layers,
  verified (:func:`verify_2026`, :data:`CHECKS`; :func:`deepseek_v4_wiring_check` for
  DeepSeek-V4's hyper-connections); :func:`feature_counts` and :func:`the_2026_block`,
  the block most of those rows share;
* :func:`zoo_switches` -- three rows of the zoo side by side, as the constructor
  arguments their converted blocks hold;
* :func:`zoo_table` -- the zoo itself, below.

Every row of :data:`ZOO` names a model (and, for models that alternate layer types,
which layer: Gemma 2's local or global layers, SmolLM3's RoPE or NoPE layers), the
Hugging Face layer class that implements it, and how to build a tiny random
instance of that layer (no download) and call it as its model would: with the
model's own causal, sliding-window and padding masks from
``transformers.masking_utils`` and its own rotary tables
(:func:`d2lmini.reference.hf_call`). :func:`zoo_table` converts every row's layer
with :func:`d2lmini.reference.from_hf`, runs both on the same padded batch
(:func:`d2lmini.reference.compare_with_reference`) and describes the block it got
(:func:`describe`): the table's descriptive columns are read from the converted
block, not typed by hand.

Each line comes from :func:`zoo_row`, which reports a row whose layer class the
installed ``transformers`` lacks (an older release, as Colab may have) instead of
raising. The appendix prints the table with :func:`zoo_frame` and
counts features by year with :func:`features_by_year`.

Adding a model: one :class:`~d2lmini.reference.base.LayerRow` in its family module's
``ROWS`` (a tiny config in :data:`d2lmini.reference.tiny.TINY_CONFIGS`, whose windows are
shorter than the test sequence of 16 steps), a converter in
:data:`d2lmini.reference.HF_CONVERTERS`, and, for a new block feature, a column in
:func:`describe`; :data:`ZOO` is built from the rows.

Shapes use the legend b = batch, n = num_steps, d = num_hiddens.
"""

from __future__ import annotations

import math
import re
import types
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from .._checks import check_bool, check_instance, check_int_at_least, check_seed
from .._shown import shown_in
from ..attention import GatedAttention, MultiHeadAttention
from ..block import TransformerBlock
from ..placements import PLACEMENT_TABLE
from ..ffn import FeedForward
from ..moe import MixtureOfExperts
from ..plot import ACT_SHORT_LABELS, NORM_LABELS, PLACEMENT_SHORT_LABELS, QK_SHORT_LABELS, table_style
from ..reference import TOLERANCE as _TOLERANCE
from ..reference import (
    LAYER_ROWS,
    REFERENCES,
    TINY_CONFIGS,
    LayerRow,
    Reference,
    Row2026,
    compare_with_reference,
    from_hf,
    hf_reference,
)
from ..reference import ROWS_2026 as _REFERENCE_ROWS_2026
from ..reference import from_afmoe_layer  # noqa: F401  (Trinity's converter; the appendix calls it from here)
from ..reference.deepseek import deepseek_v4_wiring_check  # noqa: F401  (the appendix calls it from here)

#: Largest absolute difference (float32) of outputs and of input gradients for a row to count as verified or
#: reproduced (:data:`d2lmini.reference.TOLERANCE`), in every table of the zoo.
TOLERANCE = _TOLERANCE


# --------------------------------------------------------------------------- Arcee Trinity (AFMoE)


def compare_with_trinity(batch_size: int = 2, num_steps: int = 16, seed: int = 0, padded: bool = True) -> dict:
    """Arcee Trinity's layer and its d2lmini twin on one batch: the differences.

    :func:`d2lmini.reference.compare_with_reference` on a tiny seeded global
    ``AfmoeDecoderLayer`` (the tiny configuration ``"afmoe_global"``, called as
    ``AfmoeModel`` calls it), converted with :func:`from_afmoe_layer`: both get the same
    random batch (the second sequence padded to 5/8 of its length when ``padded``) and the
    same random read-out is backpropagated to the inputs. Only valid positions are compared.

    Returns:
        dict with ``max_abs_diff`` (outputs), ``max_abs_grad_diff`` (input gradients),
        ``max_abs_output`` and ``block``.

    Raises:
        ImportError: if ``transformers`` has no AFMoE model.

    Introduced in the chapter "The 2026 block".
    """
    from ..reference import compare_with_reference, hf_reference, tiny_config

    trinity = hf_reference("Arcee Trinity", "afmoe", "AfmoeDecoderLayer", "AfmoeConfig", tiny_config("afmoe_global"))
    return compare_with_reference(trinity, batch_size, num_steps, seed, padded)


# --------------------------------------------------------------------------- who uses what

#: The models of the "who uses what" table, in order: (model, reference layer name,
#: bibliography key, where its positions come from when its blocks have no RoPE).
#: A reference name is a key of :data:`d2lmini.reference.REFERENCES`, or
#: ``'AfmoeDecoderLayer'`` (:func:`compare_with_trinity`).
MODELS = (
    ("Transformer (2017)", "TransformerEncoderLayer(norm_first=False, activation='relu')",
     "vaswani2017attention", "sinusoidal, added to the input"),
    ("BERT", "BertLayer", "devlin2019bert", "learned, added to the input"),
    ("GPT-2", "GPT2Block", "radford2019language", "learned, added to the input"),
    ("Llama 3", "LlamaDecoderLayer", "grattafiori2024llama3", None),
    ("Qwen3", "Qwen3DecoderLayer", "yang2025qwen3", None),
    ("Gemma 3", "Gemma3DecoderLayer", "gemma2025gemma3", None),
    ("OLMo 2", "Olmo2DecoderLayer", "olmo2024olmo2", None),
    ("Arcee Trinity", "AfmoeDecoderLayer", "singh2026trinity", "none in global layers (RoPE in local ones)"),
)

def _describe_attention(att, gated: bool) -> str:
    """The ``attention`` column of :func:`describe`: kind (MHA, GQA or MQA), heads / key-value heads x
    head_dim, causal or not, then whichever it has of a sigmoid output gate, a logit scale other than
    ``1/sqrt(head_dim)``, a window, chunks, a soft-cap, query scaling ``(beta, period)`` and sinks."""
    kind = "MHA" if att.num_kv_heads == att.num_heads else "MQA" if att.num_kv_heads == 1 else "GQA"
    parts = [f"{kind} {att.num_heads}/{att.num_kv_heads} heads x {att.head_dim}",
             "causal" if att.causal else "bidirectional"]
    if gated:
        parts.append("sigmoid output gate")
    if att.scale is not None and abs(att.scale - att.head_dim ** -0.5) > 1e-12:
        parts.append(f"scale {att.scale:.4g}")
    if att.window is not None:
        parts.append(f"window {att.window}")
    if getattr(att, "chunk", None) is not None:
        parts.append(f"chunks of {att.chunk}")
    if getattr(att, "logit_softcap", None) is not None:  # Gemma 2 (d2lmini.reference.gemma.GemmaAttention)
        parts.append(f"soft-cap {att.logit_softcap:g}")
    if getattr(att, "query_scaling", None) is not None:  # Ministral 3, Llama 4 (reference.llama.LlamaVariantAttention)
        beta, period, offset = (*att.query_scaling, 0)[:3]
        p = f"(p + {offset})" if offset else "p"
        parts.append(f"query scaling 1 + {beta:g} log(1 + floor({p} / {period}))")
    if att.sinks is not None:
        parts.append("sinks")
    return ", ".join(parts)


def _describe_positions(att, positions_note: str | None) -> str:
    """The ``positions`` column of :func:`describe`: RoPE's base, the rotated fraction of each head where it
    is partial and the scaling where scaled; without RoPE, ``positions_note`` or ``'none in the layer'``."""
    if att.rope_theta is None:
        return positions_note or "none in the layer"
    out = f"RoPE, base {att.rope_theta:g}"
    if att.rotary_dim is not None:
        out += f", on {att.rotary_dim}/{att.head_dim} = {att.rotary_dim / att.head_dim:.0%} of each head"
    if att.rope_scaling is not None:
        out += f", {att.rope_scaling['rope_type']} scaling x{att.rope_scaling['factor']:g}"
    return out


def _describe_ffn(ffn) -> str:
    """The ``ffn`` column of :func:`describe`: a FeedForward's activation and width, or a mixture of experts."""
    if not isinstance(ffn, MixtureOfExperts):
        return f"{ACT_SHORT_LABELS[ffn.act]}, {ffn.W_1.out_features} hidden"
    router = ffn.router_kind + " router" + (" with bias" if getattr(ffn.router, "bias", None) is not None else "")
    shared = f", {ffn.num_shared_experts} shared" if ffn.num_shared_experts else ""
    return (f"MoE: {ffn.num_experts} {ACT_SHORT_LABELS[ffn.act]} experts of {ffn.experts[0].ffn_num_hiddens} "
            f"hidden, top-{ffn.top_k}{shared}, {router}")


def _describe_bias(block: TransformerBlock, att) -> str:
    """The ``bias`` column of :func:`describe`: ``'all'``, ``'none'``, or the parts with biases among
    ``'q, k, v'``, ``'o'``, ``'FFN'`` (every expert's, for a mixture of experts) and ``'router'``."""
    ffn = block.ffn
    moe = isinstance(ffn, MixtureOfExperts)
    parts = {"q, k, v": att.W_q.bias is not None, "o": block.attention.W_o.bias is not None,
             "FFN": (ffn.experts[0] if moe else ffn).W_1.bias is not None}
    if moe:
        parts["router"] = ffn.router.bias is not None
    if all(parts.values()):
        return "all"
    return ", ".join(part for part, on in parts.items() if on) or "none"


@shown_in("zoo")
def describe(block: TransformerBlock, positions_note: str | None = None) -> dict:
    """The descriptive columns of the zoo's tables, read from a block's modules rather than typed.

    The names are :mod:`d2lmini.plot`'s (:data:`~d2lmini.plot.NORM_LABELS`,
    :data:`~d2lmini.plot.PLACEMENT_SHORT_LABELS`, :data:`~d2lmini.plot.QK_SHORT_LABELS`,
    :data:`~d2lmini.plot.ACT_SHORT_LABELS`), the words the chapters' figures use.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` whose attention is a
            :class:`~d2lmini.attention.MultiHeadAttention` or a
            :class:`~d2lmini.attention.GatedAttention`, and whose FFN is a
            :class:`~d2lmini.ffn.FeedForward` or a :class:`~d2lmini.moe.MixtureOfExperts`.
        positions_note: where the model's positions come from when the block has no RoPE
            (e.g. ``'learned, added to the input'``); default ``'none in the layer'``.

    Returns:
        dict of short strings: ``norm`` (name and epsilon), ``placement``, ``qk_norm``
        (``'—'`` when none), ``attention`` (:func:`_describe_attention`), ``positions``
        (``'RoPE, base ...'`` with the rotated fraction of a partial RoPE and the scaling
        type and factor, or the note), ``ffn`` (activation and hidden width, or the mixture
        of experts: experts, activation, width, top-k, shared experts, router), ``bias``
        (``'none'``, ``'all'``, or those of ``'q, k, v'``, ``'o'``, ``'FFN'``, ``'router'``
        that have biases) and ``residual`` (the residual multiplier, or ``'1'``).

    Raises:
        TypeError: if ``block`` is not a TransformerBlock, or its attention or FFN (built by
            ``attn_factory``/``ffn_factory``) is not one of the modules above.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    attentions = (MultiHeadAttention, GatedAttention)
    ffns = (FeedForward, MixtureOfExperts)
    check_instance("block.attention", block.attention, attentions,
                   "a MultiHeadAttention or GatedAttention")
    check_instance("block.ffn", block.ffn, ffns, "a FeedForward or MixtureOfExperts")
    gated = isinstance(block.attention, GatedAttention)
    att = block.attention.attention if gated else block.attention  # inside a gate
    addnorm = block.addnorm1
    norms = (addnorm.norm_in, addnorm.norm_out, addnorm.norm_post)
    eps = getattr(next(m for m in norms if m is not None), "eps", None)
    norm = NORM_LABELS[block.norm] + ("" if eps is None else f" (eps {eps:g})")
    return {"norm": norm, "placement": PLACEMENT_SHORT_LABELS[block.placement],
            "qk_norm": QK_SHORT_LABELS[att.qk_norm],
            "attention": _describe_attention(att, gated),
            "positions": _describe_positions(att, positions_note),
            "ffn": _describe_ffn(block.ffn), "bias": _describe_bias(block, att),
            "residual": f"{addnorm.residual_multiplier:g}"}


def who_uses_what(seed: int = 0, num_steps: int = 16) -> list[dict]:
    """Configure a d2lmini block as each model of :data:`MODELS`, describe it, verify it.

    For every model with a reference layer class, a tiny random instance of that
    layer is converted into a d2lmini block and both are run on the same padded
    batch (:func:`d2lmini.reference.compare_with_reference`, or
    :func:`compare_with_trinity`); the table's descriptive columns are then read
    from that very block (:func:`describe`).

    Args:
        seed: seeds every reference layer and batch.
        num_steps: length of the test sequences.

    Returns:
        One dict per model: ``model``, ``cite``, ``layer``, the columns of
        :func:`describe`, ``max_abs_diff``, ``max_abs_grad_diff``,
        ``max_abs_output`` (``None`` when not verified) and ``status``
        (``'verified'``, ``'MISMATCH'`` or ``'not verified (...)'``).

    Raises:
        ImportError: if ``transformers`` is not installed (the Hugging Face rows need it).

    Introduced in the chapter "The 2026 block".
    """
    from ..reference import compare_with_reference

    rows = []
    with torch.random.fork_rng(devices=[]):
        for model, layer_name, cite, note in MODELS:
            row = {"model": model, "cite": cite, "layer": layer_name}
            try:
                result = (compare_with_trinity(num_steps=num_steps, seed=seed) if layer_name == "AfmoeDecoderLayer"
                          else compare_with_reference(layer_name, num_steps=num_steps, seed=seed))
            except ImportError:
                if layer_name != "AfmoeDecoderLayer":
                    raise
                row.update(describe_trinity_without_reference(note), max_abs_diff=None, max_abs_grad_diff=None,
                           max_abs_output=None, status="not verified (no reference layer)", layer="—")
                rows.append(row)
                continue
            row.update(describe(result["block"], note))
            ok = max(result["max_abs_diff"], result["max_abs_grad_diff"]) <= TOLERANCE
            row.update(max_abs_diff=result["max_abs_diff"], max_abs_grad_diff=result["max_abs_grad_diff"],
                       max_abs_output=result["max_abs_output"], status="verified" if ok else "MISMATCH")
            rows.append(row)
    return rows


def describe_trinity_without_reference(positions_note: str) -> dict:
    """:func:`describe` of a Trinity-like block built without a reference layer.

    Used when ``transformers`` has no ``AfmoeDecoderLayer``: the block is configured
    from the tiny configuration ``"afmoe_global"`` directly, so the row still describes a d2lmini block.
    """
    from ..reference import tiny_config

    c = tiny_config("afmoe_global")
    block = TransformerBlock(c["hidden_size"], c["num_attention_heads"], norm="rms", placement="sandwich",
                             attn_factory=lambda: GatedAttention(c["hidden_size"], c["num_attention_heads"],
                                                                 num_kv_heads=c["num_key_value_heads"],
                                                                 head_dim=c["head_dim"], causal=True,
                                                                 qk_norm="per_head"),
                             ffn_factory=lambda: MixtureOfExperts(c["hidden_size"], c["num_experts"],
                                                                  top_k=c["num_experts_per_tok"],
                                                                  ffn_num_hiddens=c["moe_intermediate_size"],
                                                                  router="sigmoid",
                                                                  num_shared_experts=c["num_shared_experts"]))
    return describe(block, positions_note)


def catalog_table(rows: list[dict]):
    """The "who uses what" table: a DataFrame indexed by model with the six descriptive columns.

    The attention column is headed "attention (test layer)": whether it says MHA or GQA
    depends on the tiny test instance's key/value heads, not on every released model.
    """
    import pandas as pd

    columns = {"norm": "norm", "placement": "placement", "qk_norm": "QK-norm", "ffn": "FFN",
               "attention": "attention (test layer)", "positions": "positions"}
    return pd.DataFrame([{"model": r["model"], **{label: r[key] for key, label in columns.items()}}
                         for r in rows]).set_index("model")


def fit_to_page(table, font_size: str = "0.9em"):
    """Style a wide DataFrame so it wraps inside the book's text column instead of scrolling.

    Args:
        table: a ``pandas.DataFrame``.
        font_size: CSS font size of the cells.

    Returns:
        A ``pandas.io.formats.style.Styler`` whose HTML table takes the column's full
        width, wraps long cells and aligns text to the left.
    """
    return (table_style(table).set_table_attributes('class="dataframe" style="width: 100%"')
            .set_table_styles([{"selector": "td, th",
                                "props": [("white-space", "normal"), ("text-align", "left"),
                                          ("font-size", font_size)]}]))


def verification_table(rows: list[dict]):
    """The verification table: reference layer, largest output and input-gradient differences, status."""
    import pandas as pd

    def fmt(value):
        return "—" if value is None else f"{value:.2g}"

    return pd.DataFrame([{"model": r["model"], "reference layer": r["layer"].split("(")[0],
                          "max |Δ| output": fmt(r["max_abs_diff"]),
                          "max |Δ| input grad": fmt(r["max_abs_grad_diff"]), "status": r["status"]}
                         for r in rows]).set_index("model")


# --------------------------------------------------------------------------- the 2026 table

#: The models of the 2026 table, oldest release first: the family modules' ``ROWS_2026``
#: (:data:`d2lmini.reference.ROWS_2026`), each a :class:`~d2lmini.reference.base.Row2026`.
ROWS_2026 = tuple(sorted(_REFERENCE_ROWS_2026, key=lambda row: row.year))  # release order (a stable sort)

#: The facts of each 2026 row that a configuration class does not hold, read from the model's
#: modeling file in ``transformers`` 5.24 (the decoder layer's and attention's ``__init__``):
#: the norms and where they sit, QK-norm, an output gate on the attention, sinks, NoPE layers.
MODELING = {row.model: row.modeling for row in ROWS_2026}

#: The released model that each row's configuration (class defaults plus ``report``) describes, read off
#: the layer count, width and expert count; ``None`` where the defaults match no released model (the family
#: module says why). Such a row shows the class's defaults and is left out of :func:`feature_counts`.
SIZES = {row.model: row.size for row in ROWS_2026}

#: Cells of a named size that still hold a class default the released model need not share.
CLASS_DEFAULT_CELLS = {row.model: row.class_default_cells for row in ROWS_2026 if row.class_default_cells}

#: DeepSeek-V4's RoPE labels (``rope_parameters``' keys) as the layers that use them: in
#: ``DeepseekV4Attention``, ``rope_layer_type = "main" if layer_type == "sliding_attention"
#: else "compress"``, so a CSA or HCA layer rotates all of its attention with "compress".
_ROPE_LABELS = {"main": "sliding-only layers", "compress": "CSA and HCA layers"}
#: The layer types that use each of DeepSeek-V4's RoPE labels.
_ROPE_LAYERS = {"main": ("sliding_attention",),
                "compress": ("compressed_sparse_attention", "heavily_compressed_attention")}


def config_2026(row: Row2026):
    """The configuration of ``row``: its class's defaults, with ``row.report`` set on top.

    Raises:
        ImportError / AttributeError: ``transformers`` lacks the class (see
            :func:`missing_from_transformers`).
    """
    import transformers

    name, _, sub = row.config.partition(".")
    config = getattr(transformers, name)()
    config = getattr(config, sub) if sub else config
    for key, value in row.report.items():
        setattr(config, key, value)
    return config


def _ratio(a: int, b: int) -> str:
    g = math.gcd(a, b) or 1
    return f"{a // g}:{b // g}"


def _layer_counts(config) -> dict:
    types = list(getattr(config, "layer_types", None) or [])
    return {t: types.count(t) for t in dict.fromkeys(types)}


def _first(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _rope_text(params: dict) -> str:
    text = f"RoPE θ = {params.get('rope_theta', 0):,.0f}"
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        text += f" on {params['partial_rotary_factor']:g} of each head"
    return text  # long-context scaling (YaRN) is left out: a class default carries it for some rows only


def describe_config(row: Row2026) -> dict:
    """The descriptive columns of a 2026 row, read from its configuration (:func:`config_2026`).

    Returns:
        dict of short strings: ``shape`` (layers and width), ``norm`` (type and placement,
        from :data:`MODELING`), ``residual`` (one stream, or ``n`` hyper-connected ones:
        ``hc_mult``), ``mixer`` (softmax, or hybrid with the count of linear-attention
        layers in ``layer_types``), ``attention`` (MHA/GQA/MQA/MLA from the head counts and
        ``kv_lora_rank``; the layer pattern from ``layer_types`` with the window or chunk;
        output gate, sinks and QK-norm from :data:`MODELING`), ``positions`` (the RoPE of
        each layer type from ``rope_parameters``: base and partial fraction, without
        long-context scaling; NoPE layers) and ``ffn`` (dense and its gated activation, or
        experts / active / shared, the dense layers first and the router), each cell of
        :data:`CLASS_DEFAULT_CELLS` with its note; ``size`` (:data:`SIZES`); ``local_global``
        (the ratio of sliding-window to global layers, or ``None``) and ``features`` (a dict
        feature -> bool, for :func:`feature_counts`: from the configuration and from the
        notes of :data:`MODELING`; RoPE is in every row, by inspection).
    """
    c, m = config_2026(row), MODELING[row.model]
    counts, n = _layer_counts(c), c.num_hidden_layers
    h, kv = c.num_attention_heads, c.num_key_value_heads
    linear = counts.get("linear_attention", 0)
    mixer = f"hybrid: {linear} Gated DeltaNet, {n - linear} softmax ({_ratio(linear, n - linear)})" if linear \
        else "softmax"
    if getattr(c, "kv_lora_rank", None):
        heads = f"MLA, {h} heads, latent {c.kv_lora_rank}"
    elif kv == 1:
        heads = f"MQA, {h} heads, one K/V head of {c.head_dim}"
    else:
        heads = f"GQA {h}/{kv}" if kv < h else f"MHA, {h} heads"
    parts = [heads]
    full = counts.get("full_attention", 0)
    if counts.get("sliding_attention") and full:
        parts.append(f"window {c.sliding_window}, local:global {_ratio(counts['sliding_attention'], full)}")
    if counts.get("chunked_attention"):
        parts.append(f"chunks of {c.attention_chunk_size}, chunked:global {_ratio(counts['chunked_attention'], full)}")
    if counts.get("compressed_sparse_attention"):  # the class's default layer pattern is V4-Pro's: no counts
        parts.append(f"compressed (CSA and HCA layers), window {c.sliding_window}")
    if counts.get("indexed_attention"):
        parts.append(f"sparse: top {c.index_topk} tokens (DSA)")
    parts += [label for key, label in (("gate", "output gate"), ("sinks", "sinks")) if m.get(key)]
    parts += [m["qk_norm"]] if m.get("qk_norm") else []
    ffn = _ffn(c, m)
    params = c.rope_parameters
    mla = bool(getattr(c, "kv_lora_rank", None))
    partial = any(p.get("partial_rotary_factor", 1.0) < 1.0  # or MLA's rotary slice of each head
                  for p in ([params] if "rope_theta" in params else params.values())) \
        or (mla and getattr(c, "qk_nope_head_dim", 0) > 0)
    qk = m.get("qk_norm", "")
    features = {"RMSNorm": m["norm"].startswith("RMSNorm"), "pre-norm": ", pre" in m["norm"],
                "fewer keys and values than MHA (GQA, MQA or MLA)": kv < h or mla,
                "fewer K/V heads than query heads (GQA, MQA)": kv < h and not mla, "latent K/V (MLA)": mla,
                "sliding-window and global layers": bool(counts.get("sliding_attention")),
                "chunked and global layers": bool(counts.get("chunked_attention")),
                "QK-norm (any form)": qk.startswith("QK-norm"),
                "QK-norm per head": "per head" in qk or "each query head" in qk,
                "RoPE (by inspection)": True, "partial RoPE (incl. MLA's rotary slice)": partial,
                "softmax layers without positions (NoPE)": bool(getattr(c, "no_rope_layers", None) or m.get("nope")),
                "SwiGLU": "SwiGLU" in ffn, "MoE": ffn.startswith("MoE"), "shared expert": "shared" in ffn,
                "sigmoid router": ffn.endswith("sigmoid router"),
                "MoE with a shared expert and a sigmoid router": "shared" in ffn and ffn.endswith("sigmoid router"),
                "linear attention (hybrid)": bool(linear), "attention output gate": bool(m.get("gate")),
                "sinks": bool(m.get("sinks")), "hyper-connections": bool(getattr(c, "hc_mult", None))}
    cells = {"shape": f"{n} layers, d = {c.hidden_size}", "norm": m["norm"], "ffn": ffn,
             "residual": f"{c.hc_mult} streams (mHC)" if getattr(c, "hc_mult", None) else "one stream",
             "mixer": mixer, "attention": "; ".join(parts), "positions": _positions(c, m, counts)}
    for key, note in CLASS_DEFAULT_CELLS.get(row.model, {}).items():  # after the one RoPE base, else at the end
        cells[key] = re.sub(r"(RoPE θ = [\d,]+)", rf"\1 ({note})", cells[key], count=1) \
            if cells[key].count("RoPE θ") == 1 else cells[key] + f" ({note})"
    return {**cells, "features": features, "size": SIZES[row.model],
            "local_global": _ratio(counts["sliding_attention"], full)
            if full and counts.get("sliding_attention") else None}


def _positions(c, m: dict, counts: dict) -> str:
    params = c.rope_parameters
    if "rope_theta" in params:
        text = _rope_text(params)
    else:  # one RoPE per layer type (or V4's main / compressed), of the layer types this pattern has
        texts = {kind: _rope_text(p) for kind, p in params.items()
                 if not counts or any(t in counts for t in _ROPE_LAYERS.get(kind, (kind,)))}
        text = next(iter(texts.values())) if len(set(texts.values())) == 1 else \
            "; ".join(f"{_ROPE_LABELS.get(kind, kind.replace('_attention', ''))}: {t}" for kind, t in texts.items())
    no_rope = getattr(c, "no_rope_layers", None)
    if no_rope:
        text += f"; NoPE in {no_rope.count(0)} of {len(no_rope)} layers"
    if m.get("nope"):
        text += f"; NoPE in the {counts.get('full_attention', 0)} {m['nope']}"
    if counts.get("linear_attention"):
        text += " (softmax layers); the Gated DeltaNet layers take order from their recurrence"
    return text


def _ffn(c, m: dict) -> str:
    act = m.get("act") or {"silu": "SwiGLU", "gelu_pytorch_tanh": "GeGLU"}.get(
        _first(c, "hidden_act", "hidden_activation"), "?")
    experts = _first(c, "n_routed_experts", "num_experts", "num_local_experts")
    if not experts:
        return f"dense {act}, width {c.intermediate_size}"
    router = _first(c, "scoring_func", default=m.get("router", "?")).replace("sqrtsoftplus", "sqrt-softplus")
    text = f"MoE, {experts} {act} experts, {_first(c, 'num_experts_per_tok', 'top_k_experts')} active"
    shared = _first(c, "n_shared_experts", "num_shared_experts", default=m.get("shared_experts", 0))
    shared = shared or (1 if getattr(c, "shared_expert_intermediate_size", None) else 0)
    text += f" + {shared} shared" if shared else ""
    kinds = list(getattr(c, "mlp_layer_types", None) or [])
    dense = _first(c, "first_k_dense_replace", "num_dense_layers", default=kinds.count("dense"))
    if dense:
        text += f"; first {dense} layer{'s' * (dense > 1)} dense"
    if kinds.count("hash_moe"):
        text += f"; first {kinds.count('hash_moe')} routed by token hash"
    return text + f"; {router} router"


def _check_zoo(*names: str):
    def check(seed: int) -> list[dict]:
        from ..reference import compare_with_reference

        return [compare_with_reference(row.reference(), seed=seed) for row in ZOO if row.name in names]
    return check


#: The checks of the 2026 table, by name: ``seed -> list of comparison results``; each family module
#: declares its own (``Row2026.verify``), or names the zoo's rows whose comparisons are the check.
CHECKS = {row.check: row.verify or _check_zoo(*row.zoo_rows) for row in ROWS_2026 if row.check}


@shown_in("zoo")
def verify_2026(row: Row2026, seed: int = 0) -> dict:
    """Reproduce ``row``'s layers with d2lmini where a check exists; report the largest differences.

    Each check (:data:`CHECKS`) builds tiny random instances of the model's own layer
    classes, converts each into d2lmini modules with the same weights and compares
    outputs and input gradients on a padded batch
    (:func:`d2lmini.reference.output_and_grad_differences`). A check whose class the
    installed ``transformers`` lacks is reported in ``status``, not raised.

    Returns:
        dict with ``max_abs_diff``, ``max_abs_grad_diff`` (``None`` when nothing ran) and
        ``status``: ``'verified'``, ``'MISMATCH'``, ``'not reproduced here'`` or
        ``'not in this transformers <version>'``.
    """
    if row.check is None:
        return {"max_abs_diff": None, "max_abs_grad_diff": None,
                "status": "not reproduced here"}
    try:
        results = CHECKS[row.check](seed)
    except (ImportError, AttributeError) as error:
        if missing_from_transformers(error) is None:
            raise  # a real failure, not an older transformers
        return {"max_abs_diff": None, "max_abs_grad_diff": None,
                "status": f"not in this transformers {transformers_version()}"}
    diff = max(r["max_abs_diff"] for r in results)
    grad = max(r["max_abs_grad_diff"] for r in results)
    status = "verified" if max(diff, grad) <= TOLERANCE else "MISMATCH"
    return {"max_abs_diff": diff, "max_abs_grad_diff": grad, "status": status}


def table_2026(seed: int = 0) -> list[dict]:
    """Every row of :data:`ROWS_2026`: :func:`describe_config` and :func:`verify_2026`.

    A row whose configuration class the installed ``transformers`` lacks keeps its name and
    says so in ``status``.

    Returns:
        One dict per row: ``model``, ``year``, ``cite``, ``check``, ``missing``, the columns
        of :func:`describe_config` and those of :func:`verify_2026`.

    Raises:
        ImportError: if ``transformers`` is not installed.
    """
    from transformers.utils import logging as hf_logging  # the table needs transformers; fails clearly without it


    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # not the notices that the tiny layers run transformers' PyTorch fallbacks
    try:
        with torch.random.fork_rng(devices=[]):
            return _table_2026_rows(seed)
    finally:
        hf_logging.set_verbosity(verbosity)


def _table_2026_rows(seed: int) -> list[dict]:
    done, rows = {}, []
    for row in ROWS_2026:
        out = {"model": row.model, "year": row.year, "cite": row.cite, "check": row.check, "missing": row.missing}
        try:
            out.update(describe_config(row))
        except (ImportError, AttributeError) as error:
            if missing_from_transformers(error) is None:
                raise
            out.update(status=f"not in this transformers {transformers_version()}", max_abs_diff=None,
                       max_abs_grad_diff=None)
            rows.append(out)
            continue
        if row.check not in done:  # Kimi K2.5 and DeepSeek-V3 share a layer class, not a check
            done[row.check] = verify_2026(row, seed)
        out.update(done[row.check])
        rows.append(out)
    return rows


#: The columns of the 2026 table, as :func:`frame_2026` heads them.
COLUMNS_2026 = {"shape": "layers", "norm": "norm", "residual": "residual", "mixer": "token mixer",
                "attention": "attention", "positions": "positions", "ffn": "FFN", "verified": "reproduced"}


def frame_2026(rows: list[dict]):
    """The 2026 table as a DataFrame indexed by model; the last column says what was verified and how closely."""
    import pandas as pd

    def verified(r):
        if r.get("max_abs_diff") is None:
            return r["status"] + (f": {r['missing']}" if r.get("missing") and r["status"] != "verified" else "")
        text = f"{r['check']}: {r['status']}, max |Δ| {max(r['max_abs_diff'], r['max_abs_grad_diff']):.1e}"
        return text + (f"; not reproduced: {r['missing']}" if r["missing"] else "")

    def name(r):
        size = r.get("size") or f"{r['model']}: class defaults, no released size"
        return f"{size} ({r['year']})"

    return pd.DataFrame([{"model": name(r),
                          **{label: (verified(r) if key == "verified" else r.get(key, "—"))
                             for key, label in COLUMNS_2026.items()}} for r in rows]).set_index("model")


def feature_counts(rows: list[dict]):
    """How many rows of the 2026 table have each feature of :func:`describe_config`, and which.

    Only rows that describe a released model (``size`` not ``None``, see :data:`SIZES`) are
    counted, so that no count rests on a configuration class's defaults.

    Returns:
        A DataFrame indexed by feature with ``rows`` (the count) and ``models``, most common first.
    """
    import pandas as pd

    described = [r for r in rows if "features" in r and r.get("size")]
    names = list(described[0]["features"]) if described else []
    table = pd.DataFrame([{"feature": f, "rows": sum(r["features"][f] for r in described),
                           "models": ", ".join(r["model"] for r in described if r["features"][f])} for f in names])
    return table.sort_values("rows", ascending=False, kind="stable").set_index("feature")


def the_2026_block(num_hiddens: int = 256, num_heads: int = 8, *, num_layers: int = 4, num_kv_heads: int = 2,
                   window: int = 64, local_global: str | None = None, qk_norm: str | None = None,
                   rope_theta: float = 1e4, num_experts: int = 8, top_k: int = 2, expert_hiddens: int = 128,
                   num_shared_experts: int = 1, router: str = "sigmoid") -> torch.nn.ModuleList:
    """A stack of ``num_layers`` 2026 blocks: the most common choice per column of the 2026 table.

    Pre-norm RMSNorm blocks with GQA (``num_kv_heads`` key/value heads), RoPE, ``qk_norm``
    (``None`` or a :class:`~d2lmini.block.TransformerBlock` variant) and a mixture of SwiGLU
    experts with shared experts; with ``local_global`` (e.g. ``'3:1'``), that many local layers
    with a sliding ``window`` per global layer, the local ones first; with ``None``, every layer
    global. The other arguments are those of :class:`~d2lmini.block.TransformerBlock` and
    :class:`~d2lmini.moe.MixtureOfExperts` (which check them).

    Raises:
        ValueError: ``local_global`` neither ``None`` nor of the form ``'3:1'``, or as the block and the mixture.
    """
    if local_global is not None and not (isinstance(local_global, str)
                                         and re.fullmatch(r"\d+:[1-9]\d*", local_global)):
        raise ValueError(f"local_global must be None or read 'local:global', e.g. '3:1', got {local_global!r}")
    local, full = (int(x) for x in (local_global or "0:1").split(":"))

    def moe():
        return MixtureOfExperts(num_hiddens, num_experts, top_k=top_k, ffn_num_hiddens=expert_hiddens, act="swiglu",
                                router=router, num_shared_experts=num_shared_experts)

    blocks = []
    for i in range(num_layers):
        is_local = i % (local + full) < local
        blocks.append(TransformerBlock(num_hiddens, num_heads, norm="rms", placement="pre", bias=False,
                                       num_kv_heads=num_kv_heads, rope_theta=rope_theta, qk_norm=qk_norm,
                                       causal=True, window=window if is_local else None, ffn_factory=moe))
    return torch.nn.ModuleList(blocks)


#: The rows of the block zoo that :func:`zoo_switches` puts side by side by default:
#: an encoder of 2018, a local layer of 2024 and a sliding-window layer of 2025.
ZOO_DECADE = ("BERT", "Gemma 2 (local)", "OLMo 3 (sliding)")

#: The settings :func:`block_switches` reads back, in order.
SWITCHES = ("norm", "placement", "act", "bias", "causal", "qk_norm", "rope_theta", "window", "logit_softcap",
            "scale", "residual_multiplier")


def block_switches(block: TransformerBlock) -> dict:
    """The settings of a block that choose a variant rather than a size, read back from its modules.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` with the default attention and FFN.

    Returns:
        dict ``setting -> value`` (the keys of :data:`SWITCHES`): ``norm``, ``placement``, ``act``,
        ``bias`` (``True``, ``False`` or ``'qkv'``), ``causal``, ``qk_norm``, ``rope_theta``, ``window``
        as :class:`~d2lmini.block.TransformerBlock` takes them; ``residual_multiplier`` as
        :meth:`~d2lmini.block.TransformerBlock.set_scales` takes it; the attention's ``scale`` (the
        logit scale; ``None``: ``1/sqrt(head_dim)``) and ``logit_softcap`` (Gemma 2's
        :class:`~d2lmini.reference.gemma.GemmaAttention`; ``None`` elsewhere).

    Raises:
        TypeError: if ``block`` is not a TransformerBlock.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    att = block.attention
    bias = att.W_q.bias is not None
    if bias and block.ffn.W_1.bias is None:
        bias = "qkv"
    values = (block.norm, block.placement, block.ffn.act, bias, att.causal, att.qk_norm, att.rope_theta, att.window,
              getattr(att, "logit_softcap", None), att.scale, block.addnorm1.residual_multiplier)
    return dict(zip(SWITCHES, values))


def zoo_switches(names=ZOO_DECADE, seed: int = 0):
    """Rows of the block zoo side by side, as the arguments their converted blocks hold.

    Each named row of :data:`ZOO` is built, converted and checked by
    :func:`zoo_table`; :func:`block_switches` then reads the arguments
    back from the converted block.

    Args:
        names: display names of zoo rows (default :data:`ZOO_DECADE`).
        seed: seeds the tiny layers and the check.

    Returns:
        ``(table, rows)``: a ``pandas.DataFrame`` with one line per argument and one
        column per model (values written as in Python, e.g. ``'rms'``, ``None``; a
        model whose layer class the installed ``transformers`` lacks has its status in
        every line), and the rows of :func:`zoo_table`.

    Raises:
        ValueError: if a name is not a row of the zoo (the message lists them).
    """
    import pandas as pd

    by_name = {row.name: row for row in ZOO}
    for name in names:
        if name not in by_name:
            raise ValueError(f"names: {name!r} is not a row of d2lmini.chapters.zoo.ZOO; rows: {sorted(by_name)}")
    rows = zoo_table(seed=seed, rows=[by_name[name] for name in names])

    def written(value):  # as in Python, with non-round floats to four digits
        return f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else repr(value)

    columns = {}
    for row in rows:
        header = f"{row['name']}, {row['year']}"
        if row["block"] is None:
            columns[header] = dict.fromkeys(SWITCHES, row["status"])
        else:
            columns[header] = {key: written(value) for key, value in block_switches(row["block"]).items()}
    return pd.DataFrame(columns).rename_axis("argument"), rows


# --------------------------------------------------------------------------- the zoo: every layer reproduced


@dataclass(frozen=True)
class ZooRow:
    """One row of the zoo: a model's layer, how to build it tiny and how its model calls it.

    Attributes:
        name: display name, e.g. ``'Gemma 2 (local)'``.
        family: the model family, e.g. ``'Gemma'``.
        year: the year the model was released.
        layer_class: the Hugging Face layer class, e.g. ``'Gemma2DecoderLayer'``
            (the key :func:`d2lmini.reference.from_hf` dispatches on).
        layer_idx: the layer's position in the tiny stack; it selects the layer type
            of models that alternate them.
        make: ``seed -> (layer, config)``: a tiny layer in eval mode, every parameter
            seeded-random (:func:`d2lmini.reference.randomize_`), and its config.
        call: ``(layer, config, X, valid_lens) -> output``: the layer run with its model's
            own masks, rotary tables and position ids ``0 .. n-1``.
        causal: whether the layer's self-attention is causal.
        note: what the model does outside the layer (so not in the block), or ``''``.
    """

    name: str
    family: str
    year: int
    layer_class: str
    layer_idx: int
    make: Callable
    call: Callable
    causal: bool = True
    note: str = ""

    def reference(self) -> Reference:
        """This row as a :class:`d2lmini.reference.Reference`, converted with :func:`~d2lmini.reference.from_hf`."""
        layer_idx = self.layer_idx
        return Reference(self.layer_class, self.name, self.make,
                         lambda layer, config: from_hf(layer, config, layer_idx), self.call, self.causal)


def hf_row(name: str, family: str, year: int, model_type: str, layer_class: str, config_class: str,
           config_kwargs: dict, *, layer_idx: int = 0, causal: bool = True, attn_implementation: str = "sdpa",
           unit_offset_norms: bool = False, rotary: str | bool = True, call_kwargs: dict | None = None,
           note: str = "") -> ZooRow:
    """A :class:`ZooRow` for a Hugging Face layer, made and called by :func:`~d2lmini.reference.hf_make`
    and :func:`~d2lmini.reference.hf_call`.

    Args:
        name, family, year, layer_class, layer_idx, causal, note: the row's fields.
        model_type, config_class, attn_implementation, unit_offset_norms, rotary, call_kwargs: as
            :class:`~d2lmini.reference.base.LayerRow` has them.
        config_kwargs: the tiny configuration, ``transformers.<config_class>(**config_kwargs)``.

    Returns:
        The row, made and called as :func:`~d2lmini.reference.hf_reference` makes and calls it.

    Raises:
        ImportError, AttributeError: only when the row is run, for a ``model_type``,
            ``layer_class`` or ``config_class`` the installed ``transformers`` lacks (reported by
            :func:`zoo_row`, not raised).
    """
    ref = hf_reference(name, model_type, layer_class, config_class, config_kwargs, layer_idx=layer_idx,
                       causal=causal, attn_implementation=attn_implementation, unit_offset_norms=unit_offset_norms,
                       rotary=rotary)
    call, kwargs = ref.call, dict(call_kwargs or {})
    if kwargs:  # e.g. Falcon's required alibi=None
        call = (lambda layer, config, X, valid_lens: ref.call(partial(layer, **kwargs), config, X, valid_lens))
    return ZooRow(name, family, year, layer_class, layer_idx, ref.make, call, causal, note)


def zoo_row_of(row: LayerRow) -> ZooRow:
    """The :class:`ZooRow` of a family's :class:`~d2lmini.reference.base.LayerRow`: :func:`hf_row` with its
    tiny configuration from :data:`~d2lmini.reference.tiny.TINY_CONFIGS`, or, for a row that is the harness's
    reference of its layer class, that :class:`~d2lmini.reference.Reference`'s own make and call."""
    if row.reference is not None:  # one object for the zoo and REFERENCES
        ref = REFERENCES[row.layer_class]
        return ZooRow(row.name, row.family, row.year, row.layer_class, row.layer_idx, ref.make, ref.call,
                      ref.causal, row.note)
    return hf_row(row.name, row.family, row.year, row.model_type, row.layer_class, row.config_class,
                  TINY_CONFIGS[row.tiny], layer_idx=row.layer_idx, causal=row.causal,
                  attn_implementation=row.attn_implementation, unit_offset_norms=row.unit_offset_norms,
                  rotary=row.rotary, call_kwargs=row.call_kwargs, note=row.note)


#: The rows of the zoo, oldest model first (within a year, in the order of :data:`d2lmini.reference.FAMILIES`):
#: every family's :data:`d2lmini.reference.LAYER_ROWS`.
ZOO: tuple[ZooRow, ...] = tuple(sorted((zoo_row_of(row) for row in LAYER_ROWS), key=lambda row: row.year))

def zoo_table(seed: int = 0, num_steps: int = 16, padded: bool = True, rows=None) -> list[dict]:
    """Build, convert, verify and describe every row of the zoo (:func:`zoo_row` for each).

    For each row, a tiny random instance of its layer is converted with
    :func:`d2lmini.reference.from_hf`, and both run on the same batch of two sequences
    (the second right-padded to 5/8 of ``num_steps`` when ``padded``) with the same
    random read-out backpropagated to the inputs
    (:func:`d2lmini.reference.compare_with_reference`; only valid positions compared).
    A row whose layer class the installed ``transformers`` lacks (an older release, as on
    Colab) is reported, not raised: see :func:`zoo_row`.

    Args:
        seed: seeds every layer and batch.
        num_steps: length of the test sequences (>= 2); the zoo's windows are 5.
        padded: whether to pad the second sequence.
        rows: the rows to run (default :data:`ZOO`).

    Returns:
        One dict per row, as :func:`zoo_row` returns it.

    Raises:
        ImportError: if ``transformers`` is not installed.
        TypeError / ValueError: bad ``seed``, ``num_steps`` or ``padded``.
    """
    seed = check_seed(seed)
    num_steps = check_int_at_least("num_steps", num_steps, 2)
    padded = check_bool("padded", padded)
    return [zoo_row(row, seed=seed, num_steps=num_steps, padded=padded) for row in (ZOO if rows is None else rows)]


@shown_in("zoo")
def zoo_row(row: ZooRow, seed: int = 0, num_steps: int = 16,
            padded: bool = True) -> dict:
    """One row of the zoo's table: the layer built tiny, converted, compared, described.

    Args:
        row: a :class:`ZooRow`.
        seed, num_steps, padded: as :func:`zoo_table` (which checks them).

    Returns:
        dict with ``name``, ``family``, ``year``, ``layer_class``, ``layer_idx``, ``note``,
        the columns of :func:`describe`, ``max_abs_diff`` (outputs), ``max_abs_grad_diff``
        (input gradients), ``max_abs_output`` (their scale), ``reproduced`` (both
        differences <= :data:`TOLERANCE`), ``status`` (``'reproduced'``, ``'MISMATCH'`` or
        ``'not in this transformers <version>'``) and ``block`` (the converted block). A
        row whose layer class the installed ``transformers`` lacks
        (:func:`missing_from_transformers`) has no :func:`describe` columns, ``None``
        for the differences and the block, and ``reproduced`` False.

    Raises:
        ImportError: if ``transformers`` is not installed.
    """
    out = {"name": row.name, "family": row.family, "year": row.year,
           "layer_class": row.layer_class, "layer_idx": row.layer_idx, "note": row.note}
    try:
        result = compare_with_reference(row.reference(), num_steps=num_steps, seed=seed,
                                        padded=padded)
    except (ImportError, AttributeError) as error:
        if missing_from_transformers(error) is None:
            raise  # a real failure, not an older transformers
        status = f"not in this transformers {transformers_version()}"
        return {**out, "max_abs_diff": None, "max_abs_grad_diff": None,
                "max_abs_output": None, "reproduced": False, "status": status,
                "block": None}
    diff, grad_diff = result["max_abs_diff"], result["max_abs_grad_diff"]
    reproduced = max(diff, grad_diff) <= TOLERANCE
    return {**out, **describe(result["block"]), "max_abs_diff": diff,
            "max_abs_grad_diff": grad_diff, "max_abs_output": result["max_abs_output"],
            "reproduced": reproduced, "block": result["block"],
            "status": "reproduced" if reproduced else "MISMATCH"}


def missing_from_transformers(error: BaseException) -> str | None:
    """What the installed ``transformers`` lacks, if ``error`` is about that; else ``None``.

    A row's layer can be newer than the installed release (Colab's preinstalled
    ``transformers`` can be older than the one this book pins). Building it then fails in
    one of three ways, each recognized here: its modeling module is missing
    (``ModuleNotFoundError`` for ``transformers.models.<model_type>...``), a name cannot be
    imported from ``transformers`` (``ImportError`` naming the package), or a class is
    missing from ``transformers`` or one of its modules (``AttributeError`` whose object
    is that module). Any other error -- including ``transformers`` not being installed at
    all -- returns ``None``, so the caller raises it.

    Args:
        error: the exception raised while building or calling a row's layer.

    Returns:
        The missing module or ``'<module>.<name>'``, or ``None``.
    """
    def ours(module: str | None) -> bool:
        return module is not None and (module == "transformers" or module.startswith("transformers."))

    if isinstance(error, ModuleNotFoundError):
        return error.name if ours(error.name) and error.name != "transformers" else None
    if isinstance(error, ImportError):
        return f"{error.name}.{getattr(error, 'name_from', None) or '?'}" if ours(error.name) else None
    obj = getattr(error, "obj", None)
    if isinstance(error, AttributeError) and isinstance(obj, types.ModuleType) and ours(obj.__name__):
        return f"{obj.__name__}.{error.name}"
    return None


def transformers_version() -> str:
    """The installed ``transformers`` release, e.g. ``'5.24.0'``.

    Raises:
        ImportError: if ``transformers`` is not installed.
    """
    import transformers

    return transformers.__version__


# --------------------------------------------------------------------------- the appendix's tables

#: Keys of :func:`zoo_row` that :func:`zoo_frame` shows in its own way or not at all;
#: every other key (the :func:`describe` columns, whatever they are) becomes a column.
_NOT_COLUMNS = ("name", "family", "year", "layer_class", "layer_idx", "note", "max_abs_diff", "max_abs_grad_diff",
                "max_abs_output", "reproduced", "status", "block")
_HEADERS = {"attention": "attention (test layer)", "positions": "positions (test layer)", "ffn": "FFN (test layer)",
            "bias": "biases", "residual": "residual scale"}


def zoo_frame(rows: list[dict]):
    """The zoo as the appendix prints it: one line per row of :func:`zoo_table`.

    Columns: ``model`` (the index), ``year``, the largest output and input-gradient
    differences (``'0'`` when exact, ``'—'`` when not measured) and the row's ``check``
    (:func:`zoo_row`'s status) first, so that a narrow page shows them; then
    ``layer class``, ``norm, placement``, every other descriptive column of the rows in
    their order (those :func:`describe` returns, whichever they are, the QK-norm within the
    attention's) and the ``note``
    (what the model does outside the layer).

    Args:
        rows: dicts as :func:`zoo_row` returns them.

    Returns:
        A ``pandas.DataFrame`` of strings and years.
    """
    import pandas as pd

    columns = list(dict.fromkeys(key for row in rows for key in row if key not in _NOT_COLUMNS))
    columns = [key for key in columns if key not in ("norm", "placement", "qk_norm")]

    def fmt(value):
        return "—" if value is None else "0" if value == 0 else f"{value:.1e}"

    lines = []
    for r in rows:
        line = {"model": r["name"], "year": r["year"], "max |Δ| output": fmt(r["max_abs_diff"]),
                "max |Δ| input grad": fmt(r["max_abs_grad_diff"]), "check": r["status"],
                "layer class": r["layer_class"],  # no family column: the model's name says it
                "norm, placement": f"{r['norm']}, {r['placement']}" if "norm" in r else "—"}
        line.update({_HEADERS.get(key, key.replace("_", " ")): r.get(key, "—") for key in columns})
        if r.get("qk_norm", "—") != "—":  # QK-norm belongs to the attention cell here
            line[_HEADERS["attention"]] += f", QK-norm {r['qk_norm']}"
        line["note"] = r["note"] or "—"
        lines.append(line)
    return pd.DataFrame(lines).set_index("model")


def block_features(block: TransformerBlock) -> dict[str, bool]:
    """Yes/no features of a converted block, for counting them over the zoo's years.

    Read from the block's modules (for a :class:`~d2lmini.attention.GatedAttention`, from
    the attention inside it): ``post-norm`` (the 2017 placement), ``parallel sublayers``
    (a ``'parallel...'`` placement), ``RMSNorm``, ``gated FFN`` (a GLU activation, in the
    experts too), ``mixture of experts``, ``biases`` (on the query projection), ``RoPE``,
    ``partial RoPE`` (on fewer than all of a head's features), ``QK-norm``, ``sliding window``,
    ``logit soft-cap``, ``attention sinks`` and ``gated attention`` (a sigmoid gate on the
    attention's output).

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock`.

    Raises:
        TypeError: if ``block`` is not a TransformerBlock.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    gated = isinstance(block.attention, GatedAttention)
    att, ffn = (block.attention.attention if gated else block.attention), block.ffn
    placement = PLACEMENT_TABLE[block.placement]
    return {"post-norm": placement.norm_post, "parallel sublayers": placement.parallel,
            "RMSNorm": block.norm == "rms", "gated FFN": ffn.act.startswith(("swiglu", "geglu")),
            "mixture of experts": isinstance(ffn, MixtureOfExperts), "biases": att.W_q.bias is not None,
            "RoPE": att.rope_theta is not None,
            "partial RoPE": att.rope_theta is not None and att.rotary_dim not in (None, att.head_dim),
            "QK-norm": att.qk_norm is not None, "sliding window": att.window is not None,
            "logit soft-cap": getattr(att, "logit_softcap", None) is not None, "attention sinks": att.sinks is not None,
            "gated attention": gated}


def features_by_year(rows: list[dict]):
    """How many rows of each year have each feature of :func:`block_features`.

    Rows without a block (layer class not in the installed ``transformers``) are left
    out; so are features no row has.

    Args:
        rows: dicts as :func:`zoo_row` returns them.

    Returns:
        A ``pandas.DataFrame`` indexed by year: ``rows`` (how many), then one column per
        feature with the count of that year's rows that have it.
    """
    import pandas as pd

    counted = [{"year": r["year"], "rows": 1, **block_features(r["block"])} for r in rows if r["block"] is not None]
    table = pd.DataFrame(counted).groupby("year").sum().astype(int)
    return table.loc[:, (table != 0).any()]
