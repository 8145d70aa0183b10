"""The block zoo: released models' layers, each reproduced by one d2lmini block.

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
raising. The appendix "The Block Zoo" prints the table with :func:`zoo_frame` and
counts features by year with :func:`features_by_year`.

Adding a model: one :class:`ZooRow` built with :func:`hf_row` (a tiny config in
:data:`d2lmini.reference.tiny.TINY_CONFIGS`, whose windows are shorter than the test
sequence of 16 steps), a converter in
:data:`d2lmini.reference.HF_CONVERTERS`, and, for a new block feature, a column in
:func:`describe`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

from ._checks import check_bool, check_instance, check_int_at_least, check_seed
from ._shown import shown_in
from .attention import GatedAttention, MultiHeadAttention
from .block import TransformerBlock
from .ffn import FeedForward
from .moe import MixtureOfExperts
from .reference import TOLERANCE as _TOLERANCE
from .reference import (
    REFERENCES,
    TINY_CONFIGS,
    Reference,
    compare_with_reference,
    from_hf,
    hf_reference,
)

#: Largest absolute difference (float32) of outputs and of input gradients for a row to count as reproduced
#: (:data:`d2lmini.reference.TOLERANCE`, shared with the 2026 table above it).
TOLERANCE = _TOLERANCE


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
           unit_offset_norms: bool = False, rotary: str | bool = True, note: str = "") -> ZooRow:
    """A :class:`ZooRow` for a Hugging Face layer, made and called by :func:`~d2lmini.reference.hf_make`
    and :func:`~d2lmini.reference.hf_call`.

    Args:
        name, family, year, layer_class, layer_idx, causal, note: the row's fields.
        model_type: the folder under ``transformers/models`` (e.g. ``'gemma2'``).
        config_class, config_kwargs: the tiny configuration, ``transformers.<config_class>(**config_kwargs)``.
        attn_implementation: ``'sdpa'``, or ``'eager'`` where SDPA cannot run the layer.
        unit_offset_norms: whether the norm gains are stored as ``w`` in ``1 + w`` (Gemma).
        rotary: the rotary class, as :func:`~d2lmini.reference.hf_call` takes it (default: the one
            named after the layer class; GPT-NeoX's and GPT-J's are named otherwise).

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
    return ZooRow(name, family, year, layer_class, layer_idx, ref.make, ref.call, causal, note)


def _from_references(name: str, family: str, year: int, layer_class: str, note: str = "") -> ZooRow:
    """A row for one of the Hugging Face layers already in :data:`d2lmini.reference.REFERENCES`."""
    ref = REFERENCES[layer_class]
    return ZooRow(name, family, year, layer_class, 0, ref.make, ref.call, ref.causal, note)


_LEARNED = "learned absolute positions, added to the input (outside the layer)"
_TRINITY_NOTE = "gated attention, MoE FFN (sigmoid router, shared expert)"
_INTERLEAVED = "interleaved RoPE pairs (2l, 2l+1), converted by permuting the rows of W_q and W_k"
_T = TINY_CONFIGS  # every row's tiny configuration, by name (d2lmini.reference.tiny)


def _without_alibi(row: ZooRow) -> ZooRow:
    """``row`` calling its layer with ``alibi=None``, the required argument of ``FalconDecoderLayer``
    (``FalconModel`` passes ``None`` for its RoPE models)."""
    call = row.call
    return replace(row, call=lambda layer, config, X, valid_lens: call(partial(layer, alibi=None), config, X,
                                                                       valid_lens))

#: The rows of the zoo, oldest model first.
ZOO: tuple[ZooRow, ...] = (
    _from_references("BERT", "BERT", 2018, "BertLayer", note=_LEARNED),
    _from_references("GPT-2", "GPT", 2019, "GPT2Block", note=_LEARNED),
    hf_row("Mistral 7B", "Mistral", 2023, "mistral", "MistralDecoderLayer", "MistralConfig",
           _T["mistral"]),
    hf_row("OLMo", "OLMo", 2024, "olmo", "OlmoDecoderLayer", "OlmoConfig", _T["olmo"]),
    hf_row("StarCoder2", "StarCoder", 2024, "starcoder2", "Starcoder2DecoderLayer", "Starcoder2Config",
           _T["starcoder2"]),
    _from_references("Llama 3", "Llama", 2024, "LlamaDecoderLayer"),
    hf_row("Qwen2", "Qwen", 2024, "qwen2", "Qwen2DecoderLayer", "Qwen2Config",
           _T["qwen2"]),
    hf_row("Gemma 2 (local)", "Gemma", 2024, "gemma2", "Gemma2DecoderLayer", "Gemma2Config", _T["gemma2"],
           layer_idx=0, attn_implementation="eager", unit_offset_norms=True,
           note="embeddings scaled by sqrt(d); final-logit soft-capping (outside the layer)"),
    hf_row("Gemma 2 (global)", "Gemma", 2024, "gemma2", "Gemma2DecoderLayer", "Gemma2Config", _T["gemma2"],
           layer_idx=1, attn_implementation="eager", unit_offset_norms=True,
           note="embeddings scaled by sqrt(d); final-logit soft-capping (outside the layer)"),
    hf_row("Ministral 8B (sliding)", "Mistral", 2024, "ministral", "MinistralDecoderLayer", "MinistralConfig",
           _T["ministral"], layer_idx=1),
    hf_row("Ministral 8B (full)", "Mistral", 2024, "ministral", "MinistralDecoderLayer", "MinistralConfig",
           _T["ministral"], layer_idx=0),
    hf_row("Granite 3.0", "Granite", 2024, "granite", "GraniteDecoderLayer", "GraniteConfig",
           _T["granite"],
           note="embedding_multiplier and logits_scaling act on the embeddings and logits (outside the layer)"),
    _from_references("OLMo 2", "OLMo", 2024, "Olmo2DecoderLayer"),
    hf_row("Gemma 3 (local)", "Gemma", 2025, "gemma3", "Gemma3DecoderLayer", "Gemma3TextConfig", _T["gemma3_sliding"],
           layer_idx=0, unit_offset_norms=True, note="embeddings scaled by sqrt(d) (outside the layer)"),
    _from_references("Gemma 3 (global)", "Gemma", 2025, "Gemma3DecoderLayer",
                     note="embeddings scaled by sqrt(d) (outside the layer)"),
    _from_references("Qwen3", "Qwen", 2025, "Qwen3DecoderLayer"),
    hf_row("SmolLM3 (RoPE)", "SmolLM", 2025, "smollm3", "SmolLM3DecoderLayer", "SmolLM3Config", _T["smollm3"],
           layer_idx=0),
    hf_row("SmolLM3 (NoPE)", "SmolLM", 2025, "smollm3", "SmolLM3DecoderLayer", "SmolLM3Config", _T["smollm3"],
           layer_idx=3, note="every fourth layer has no positional encoding"),
    hf_row("OLMo 3 (sliding)", "OLMo", 2025, "olmo3", "Olmo3DecoderLayer", "Olmo3Config", _T["olmo3"], layer_idx=0),
    hf_row("OLMo 3 (full)", "OLMo", 2025, "olmo3", "Olmo3DecoderLayer", "Olmo3Config", _T["olmo3"], layer_idx=3),
    hf_row("Ministral 3", "Mistral", 2025, "ministral3", "Ministral3DecoderLayer", "Ministral3Config", _T["ministral3"]),
    hf_row("Arcee Trinity (local)", "Arcee", 2025, "afmoe", "AfmoeDecoderLayer", "AfmoeConfig", _T["afmoe"],
           layer_idx=0, note=_TRINITY_NOTE),
    hf_row("Arcee Trinity (global)", "Arcee", 2025, "afmoe", "AfmoeDecoderLayer", "AfmoeConfig", _T["afmoe"],
           layer_idx=1, note=_TRINITY_NOTE + "; no position encoding in global layers"),
    hf_row("gpt-oss", "gpt-oss", 2025, "gpt_oss", "GptOssDecoderLayer", "GptOssConfig", _T["gpt_oss"], layer_idx=0,
           attn_implementation="eager", note="sliding layer; the full-attention layers alternate with it"),
    hf_row("gpt-oss (full)", "gpt-oss", 2025, "gpt_oss", "GptOssDecoderLayer", "GptOssConfig", _T["gpt_oss"],
           layer_idx=1, attn_implementation="eager", note="full-attention layer"),
    # Parallel attention + FFN, partial and interleaved RoPE.
    hf_row("Phi-2", "Phi", 2023, "phi", "PhiDecoderLayer", "PhiConfig",
           _T["phi"]),
    hf_row("Phi-3 mini", "Phi", 2024, "phi3", "Phi3DecoderLayer", "Phi3Config",
           _T["phi3"]),
    hf_row("Phi-4-mini", "Phi", 2025, "phi3", "Phi3DecoderLayer", "Phi3Config",
           _T["phi4_mini"],
           note="Phi3DecoderLayer with partial_rotary_factor=0.75"),
    hf_row("GPT-NeoX", "GPT-NeoX", 2022, "gpt_neox", "GPTNeoXLayer", "GPTNeoXConfig",
           _T["gpt_neox"],
           rotary="GPTNeoXRotaryEmbedding"),
    hf_row("GPT-J", "GPT-J", 2021, "gptj", "GPTJBlock", "GPTJConfig",
           _T["gptj"], rotary="GPTJRotaryEmbedding",
           note=_INTERLEAVED),
    _without_alibi(hf_row("Falcon-7B", "Falcon", 2023, "falcon", "FalconDecoderLayer", "FalconConfig",
                          _T["falcon"],
                          attn_implementation="eager",  # SDPA does not broadcast the single key/value head
                          note="Falcon-40B/180B (new_decoder_architecture) convert to 'parallel_two_norms'")),
    hf_row("Command R", "Cohere", 2024, "cohere", "CohereDecoderLayer", "CohereConfig",
           _T["cohere"],
           note=_INTERLEAVED + "; logit_scale multiplies the logits (outside the layer)"),
    hf_row("StableLM 2", "StableLM", 2024, "stablelm", "StableLmDecoderLayer", "StableLmConfig",
           _T["stablelm"]),
)
ZOO = tuple(sorted(ZOO, key=lambda row: row.year))  # the table reads in release order (a stable sort)

_NORMS = {"layer": "LayerNorm", "rms": "RMSNorm", "layer_no_bias": "LayerNorm without bias",
          "layer_nonparametric": "LayerNorm without gain or bias"}
_PLACEMENTS = {"post": "post-norm", "pre": "pre-norm", "post_sublayer": "norm on sublayer output",
               "sandwich": "sandwich", "parallel": "parallel, one shared norm",
               "parallel_two_norms": "parallel, two norms"}
_QK_NORMS = {"per_head": "per head", "projection": "over the projection",
             "per_head_distinct": "per head, distinct gains", "l2": "per head, no gain, after RoPE (L2)"}


def _describe_positions(att) -> str:
    """The ``positions`` column of :func:`describe` for a :class:`~d2lmini.attention.MultiHeadAttention`."""
    if att.rope_theta is None:
        return "none in the layer"
    out = f"RoPE, base {att.rope_theta:g}"
    if att.rotary_dim is not None:
        out += f", on {att.rotary_dim}/{att.head_dim} = {att.rotary_dim / att.head_dim:.0%} of each head"
    if att.rope_scaling is not None:
        out += f", {att.rope_scaling['rope_type']} scaling x{att.rope_scaling['factor']:g}"
    return out


def _describe_ffn(ffn) -> str:
    """The ``ffn`` column of :func:`describe`: a FeedForward's activation and width, or a mixture of experts."""
    if not isinstance(ffn, MixtureOfExperts):
        return f"{ffn.act}, {ffn.W_1.out_features} hidden"
    router = ffn.router_kind + " router" + (" with bias" if getattr(ffn.router, "bias", None) is not None else "")
    shared = f", {ffn.num_shared_experts} shared" if ffn.num_shared_experts else ""
    return (f"MoE: {ffn.num_experts} {ffn.act} experts of {ffn.experts[0].ffn_num_hiddens} hidden, "
            f"top-{ffn.top_k}{shared}, {router}")


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


def describe(block: TransformerBlock) -> dict:
    """The zoo's descriptive columns, read from a converted block's modules.

    Args:
        block: a :class:`~d2lmini.block.TransformerBlock` whose attention is a
            :class:`~d2lmini.attention.MultiHeadAttention` or a
            :class:`~d2lmini.attention.GatedAttention`, and whose FFN is a
            :class:`~d2lmini.ffn.FeedForward` or a :class:`~d2lmini.moe.MixtureOfExperts`.

    Returns:
        dict of short strings: ``norm`` (type and epsilon), ``placement``, ``attention``
        (heads / key-value heads x head_dim, causal or not, a sigmoid output gate, QK-norm,
        a logit scale other than ``1/sqrt(head_dim)``, window, soft-cap, query scaling
        ``(beta, period)``, sinks), ``positions`` (``'RoPE, base ...'`` with the rotated
        fraction of each head where it is partial and the scaling type and factor where
        scaled, or ``'none in the layer'``), ``ffn`` (activation and hidden width, or for a
        mixture of experts: experts, their activation and width, top-k, shared experts,
        router and whether it has a bias), ``bias`` (``'none'``, ``'all'``, or those of
        ``'q, k, v'``, ``'o'``, ``'FFN'`` and, for a mixture of experts, ``'router'`` that have
        biases, e.g. ``'FFN'`` for GPT-J, ``'q, k, v, o'`` for Llama with ``attention_bias`` only)
        and ``residual`` (the residual multiplier, or ``'1'``).

    Raises:
        TypeError: if ``block`` is not a TransformerBlock, or its attention or FFN (built by
            ``attn_factory``/``ffn_factory``) is not one of the modules above.
    """
    check_instance("block", block, TransformerBlock, "a d2lmini TransformerBlock")
    check_instance("block.attention", block.attention, (MultiHeadAttention, GatedAttention),
                   "a MultiHeadAttention or GatedAttention")
    check_instance("block.ffn", block.ffn, (FeedForward, MixtureOfExperts), "a FeedForward or MixtureOfExperts")
    gated = isinstance(block.attention, GatedAttention)
    att = block.attention.attention if gated else block.attention  # the MultiHeadAttention inside
    ffn, addnorm = block.ffn, block.addnorm1
    norm = next(m for m in (addnorm.norm_in, addnorm.norm_out, addnorm.norm_post) if m is not None)
    eps = getattr(norm, "eps", None)
    attention = [f"{att.num_heads}/{att.num_kv_heads} heads x {att.head_dim}",
                 "causal" if att.causal else "bidirectional"]
    if gated:
        attention.append("sigmoid output gate")
    if att.qk_norm is not None:
        attention.append(f"QK-norm {_QK_NORMS[att.qk_norm]}")
    if att.scale is not None and abs(att.scale - att.head_dim ** -0.5) > 1e-12:
        attention.append(f"scale {att.scale:.4g}")
    if att.window is not None:
        attention.append(f"window {att.window}")
    if getattr(att, "chunk", None) is not None:
        attention.append(f"chunks of {att.chunk}")
    if getattr(att, "logit_softcap", None) is not None:  # Gemma 2 (d2lmini.reference.gemma.GemmaAttention)
        attention.append(f"soft-cap {att.logit_softcap:g}")
    if getattr(att, "query_scaling", None) is not None:  # Ministral 3, Llama 4 (reference.llama.LlamaVariantAttention)
        beta, period, offset = (*att.query_scaling, 0)[:3]
        p = f"(p + {offset})" if offset else "p"
        attention.append(f"query scaling 1 + {beta:g} log(1 + floor({p} / {period}))")
    if att.sinks is not None:
        attention.append("sinks")
    bias = _describe_bias(block, att)
    return {"norm": _NORMS[block.norm] + ("" if eps is None else f" (eps {eps:g})"),
            "placement": _PLACEMENTS[block.placement], "attention": ", ".join(attention),
            "positions": _describe_positions(att), "ffn": _describe_ffn(ffn), "bias": bias,
            "residual": f"{addnorm.residual_multiplier:g}"}


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
    their order (those :func:`describe` returns, whichever they are) and the ``note``
    (what the model does outside the layer).

    Args:
        rows: dicts as :func:`zoo_row` returns them.

    Returns:
        A ``pandas.DataFrame`` of strings and years.
    """
    import pandas as pd

    columns = list(dict.fromkeys(key for row in rows for key in row if key not in _NOT_COLUMNS))
    columns = [key for key in columns if key not in ("norm", "placement")]

    def fmt(value):
        return "—" if value is None else "0" if value == 0 else f"{value:.1e}"

    lines = []
    for r in rows:
        line = {"model": r["name"], "year": r["year"], "max |Δ| output": fmt(r["max_abs_diff"]),
                "max |Δ| input grad": fmt(r["max_abs_grad_diff"]), "check": r["status"],
                "layer class": r["layer_class"],  # no family column: the model's name says it
                "norm, placement": f"{r['norm']}, {r['placement']}" if "norm" in r else "—"}
        line.update({_HEADERS.get(key, key.replace("_", " ")): r.get(key, "—") for key in columns})
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
    return {"post-norm": block.placement == "post", "parallel sublayers": block.placement.startswith("parallel"),
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
