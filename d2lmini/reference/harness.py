"""The comparison harness: tiny random reference layers, called as their models call them, against their d2lmini twins.

Not a family: it builds a tiny randomly initialized layer (:func:`hf_make`, :func:`randomize_`;
no download), calls it with its model's own masks and rotary tables (:func:`hf_call`), converts it
(:func:`~d2lmini.reference.base.from_hf`) and reports the largest output and input-gradient
differences on a padded batch (:func:`compare_with_reference`,
:func:`output_and_grad_differences`); :data:`REFERENCES` holds the references the tests and the
zoo check by name.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .._checks import check_bool, check_choice, check_instance
from .._shown import shown_in
from ..attention import valid_lens_mask
from .base import from_hf, layer_type_of
from .pytorch import from_torch_decoder_layer, from_torch_encoder_layer
from .tiny import TINY_CONFIGS


def additive_mask(valid_lens: torch.Tensor | None, num_steps: int, causal: bool, dtype=torch.float32,
                  batch_size: int | None = None) -> torch.Tensor:
    """A float mask ``(b, 1, n, n)``: 0 where attention is allowed, the dtype's minimum elsewhere.

    This is the explicit mask Hugging Face layers take (valid for both SDPA and eager
    attention): the boolean :func:`d2lmini.attention.valid_lens_mask` of the keys
    (positions >= ``valid_lens[b]`` are masked), with ``causal`` also every key after
    the query, turned into an additive mask.

    Args:
        valid_lens: ``None`` (no padding) or ``(b,)`` integer lengths in ``[0, n]``.
        num_steps: ``n``, queries and keys.
        causal: whether to mask the keys after each query as well.
        dtype: of the mask (the layer's dtype).
        batch_size: ``b`` when ``valid_lens`` is ``None`` (default 1).

    Raises:
        TypeError / ValueError: bad ``valid_lens`` (see :func:`~d2lmini.attention.valid_lens_mask`).
    """
    allowed = torch.ones(num_steps, num_steps, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if valid_lens is None:
        allowed = allowed.expand(batch_size or 1, -1, -1)
    else:
        allowed = allowed & valid_lens_mask(valid_lens, num_steps)[:, None, :]  # (b, n, n)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def randomize_(module: nn.Module, seed: int, unit_offset_norms: bool = False) -> nn.Module:
    """Give every parameter of ``module`` a seeded random value in place, so that no weight is a default 0 or 1.

    The one randomizer of the tests, the zoo and the chapters' comparisons: a matrix (2 or more
    dimensions) is drawn uniform in ``±sqrt(6 / (rows + columns))`` (Xavier-sized, any layout), a bias
    uniform in ``±0.1``, any other vector (a norm gain) around 1 -- or around 0 with
    ``unit_offset_norms``, for gains stored as ``w`` in ``1 + w`` (Gemma, Qwen3.5). The draws come
    from a generator seeded with ``seed``, so the global random state is left alone and the same
    seed gives the same weights on any machine.

    Args:
        module: any ``nn.Module``.
        seed: an int.
        unit_offset_norms: whether vectors that are not biases are centred at 0 instead of 1.

    Returns:
        ``module`` itself.

    Raises:
        TypeError: ``module`` not an ``nn.Module``.
    """
    check_instance("module", module, nn.Module, "an nn.Module")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                bound = math.sqrt(6.0 / (p.shape[0] + p.shape[-1]))  # Xavier-uniform-sized, any layout
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
            elif name.endswith("bias"):
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * 0.1)
            else:  # a norm gain: around 1 (or around 0 where it is stored as w in 1 + w)
                centre = 0.0 if unit_offset_norms else 1.0
                p.copy_(centre + (torch.rand(p.shape, generator=gen) - 0.5) * 0.5)
    return module


@dataclass
class Reference:
    """One reference layer: how to make a tiny one, convert it, and call it.

    Attributes:
        name: the layer class, e.g. ``'LlamaDecoderLayer'``.
        model: the model or paper it stands for, e.g. ``'Llama 3'``.
        make: ``seed -> (layer, config)``, a tiny randomly initialized layer in eval mode.
        convert: ``(layer, config) -> d2lmini block``.
        call: ``(layer, config, X, valid_lens) -> output``; passes explicit masks.
        causal: whether the layer's self-attention is causal.
        needs_transformers: whether ``transformers`` must be installed.
        memory: for decoder layers with cross-attention, the encoder length (else 0).
    """

    name: str
    model: str
    make: Callable
    convert: Callable
    call: Callable
    causal: bool
    needs_transformers: bool = True
    memory: int = 0


def _padding(valid_lens: torch.Tensor | None, num_steps: int) -> torch.Tensor | None:
    """The key-padding mask of ``nn.Transformer*`` layers, ``(b, n)``: ``True`` at padding (masked)."""
    return None if valid_lens is None else ~valid_lens_mask(valid_lens, num_steps)


def _torch_encoder(norm_first: bool, activation: str):
    def make(seed):
        torch.manual_seed(seed)
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, dropout=0.0, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        return randomize_(layer, seed).eval(), None

    def call(layer, config, X, valid_lens):
        return layer(X, src_key_padding_mask=_padding(valid_lens, X.shape[1]))

    return make, call


def _torch_decoder_make(seed):
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(64, 4, dim_feedforward=256, dropout=0.0, batch_first=True)
    return randomize_(layer, seed).eval(), None


def hf_make(model_type: str, layer_class: str, config_class: str, config_kwargs: dict, *, layer_idx: int = 0,
            attn_implementation: str = "sdpa", unit_offset_norms: bool = False) -> Callable:
    """A ``make(seed) -> (layer, config)`` for a tiny random Hugging Face layer (no download).

    The layer is ``transformers.models.<model_type>.modeling_<model_type>.<layer_class>``
    built from ``transformers.<config_class>(**config_kwargs)`` at position ``layer_idx``
    of the stack, in eval mode, every parameter seeded-random (:func:`randomize_`; norm
    gains stored as ``w`` in ``1 + w`` centred at 0 when ``unit_offset_norms``).

    Args:
        model_type: the folder under ``transformers/models`` (e.g. ``'gemma2'``).
        layer_class, config_class: class names in the modeling module and in ``transformers``.
        config_kwargs: the tiny configuration.
        layer_idx: the layer's position in the stack (passed to the layer's constructor).
        attn_implementation: ``'sdpa'`` or ``'eager'`` (``'eager'`` where SDPA cannot run
            the layer, e.g. Gemma 2's logit soft-capping).
        unit_offset_norms: whether the layer's norm gains are stored as ``w`` in ``1 + w``.

    Raises:
        ImportError: at call time, without ``transformers``.
    """

    def make(seed):
        import importlib

        import transformers as tf

        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        torch.manual_seed(seed)
        config = getattr(tf, config_class)(**copy.deepcopy(config_kwargs))  # configs edit nested dicts in place
        config._attn_implementation = attn_implementation
        config._experts_implementation = "eager"  # MoE layers (Trinity, gpt-oss): the plain loop over experts
        layer = getattr(modeling, layer_class)(config, layer_idx=layer_idx)
        return randomize_(layer, seed, unit_offset_norms=unit_offset_norms).eval(), config

    return make


_MASKS = ("causal", "sliding", "bidirectional", "recurrent", "chunked")


def hf_call(model_type: str, layer_class: str, *, layer_idx: int = 0, causal: bool = True,
            mask: str | None = None, rotary: str | None | bool = True, materialize_mask: bool = False) -> Callable:
    """A ``call(layer, config, X, valid_lens)`` running a Hugging Face layer as its model would.

    Builds what the model's ``forward`` builds for layer ``layer_idx`` of a batch ``X``
    ``(b, n, d)`` right-padded to ``valid_lens``: the 2-D padding mask (1 at real tokens)
    turned into the layer's attention mask by ``transformers.masking_utils`` --
    ``create_bidirectional_mask`` for an encoder (``causal=False``),
    ``create_recurrent_attention_mask`` (the 2-D padding mask itself) for a linear-attention
    layer (``config.layer_types[layer_idx] == 'linear_attention'``, Qwen3.5's Gated DeltaNet),
    ``create_sliding_window_causal_mask`` for a sliding layer (``config.layer_types[layer_idx]
    == 'sliding_attention'``, or, in a model without layer types, ``config.sliding_window``
    set, as Mistral and StarCoder2 decide), ``create_chunked_causal_mask`` for a chunked layer
    (``config.layer_types[layer_idx] == 'chunked_attention'``, Llama 4), ``create_causal_mask``
    otherwise -- position ids
    ``0 .. n-1`` and, for a layer with RoPE, the rotary tables of the model's own
    ``<Prefix>RotaryEmbedding(config)`` (with the layer type where its ``forward`` takes one).

    Args:
        model_type, layer_class: as :func:`hf_make`.
        layer_idx: the layer's position in the stack.
        causal: ``False`` for an encoder layer.
        mask: ``None`` (the rule above), or ``'causal'``, ``'sliding'``, ``'bidirectional'``, ``'recurrent'``,
            ``'chunked'``.
        rotary: ``True``: the modeling module's ``<Prefix>RotaryEmbedding`` if it has one
            (``<Prefix>`` is ``layer_class`` without ``DecoderLayer``); a class name; or
            ``False``/``None``: no rotary tables.
        materialize_mask: build the causal, sliding or chunked mask even without padding
            (``allow_is_causal_skip=False``), as a model whose layer reads the mask itself
            does (GLM-5's sparse-attention indexer); by default ``masking_utils`` may leave
            it to the kernel's causal flag.

    Returns:
        The callable; it returns the layer's output ``(b, n, d)``.

    Raises:
        ValueError: for a ``mask`` other than those above (at once); TypeError: a non-bool
            ``materialize_mask``; ``ImportError``/``AttributeError``
            at call time for a ``model_type``/``layer_class``/``rotary`` the installed
            ``transformers`` lacks.
    """
    if mask is not None:
        check_choice("mask", mask, _MASKS)
    check_bool("materialize_mask", materialize_mask)

    def call(layer, config, X, valid_lens):
        import importlib
        import inspect

        from transformers import masking_utils

        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        batch_size, num_steps, _ = X.shape
        padding = None if valid_lens is None else valid_lens_mask(valid_lens, num_steps).long()
        position_ids = torch.arange(num_steps, device=X.device)[None].expand(batch_size, -1)
        kind = mask
        if kind is None:
            layer_type = layer_type_of(config, layer_idx)
            sliding = (layer_type == "sliding_attention" if layer_type is not None
                       else getattr(config, "sliding_window", None) is not None)
            kind = "bidirectional" if not causal else "sliding" if sliding else "causal"
            kind = "recurrent" if layer_type == "linear_attention" else kind
            kind = "chunked" if layer_type == "chunked_attention" else kind
        if kind == "recurrent":
            attention_mask = masking_utils.create_recurrent_attention_mask(config=config, inputs_embeds=X,
                                                                           attention_mask=padding)
        elif kind == "bidirectional":
            attention_mask = masking_utils.create_bidirectional_mask(config=config, inputs_embeds=X,
                                                                     attention_mask=padding)
        else:
            build = {"sliding": masking_utils.create_sliding_window_causal_mask,
                     "chunked": masking_utils.create_chunked_causal_mask}.get(kind, masking_utils.create_causal_mask)
            skip = {"allow_is_causal_skip": False} if materialize_mask else {}
            attention_mask = build(config=config, inputs_embeds=X, attention_mask=padding, cache=None,
                                   position_ids=position_ids, **skip)
        kwargs = {"attention_mask": attention_mask}
        name = rotary
        if name is True:
            name = layer_class.replace("DecoderLayer", "") + "RotaryEmbedding"
            name = name if hasattr(modeling, name) else None
        if name:
            module = getattr(modeling, name)(config).to(X.device)
            extra = ()
            if "layer_type" in inspect.signature(module.forward).parameters:
                extra = (layer_type_of(config, layer_idx),)
            kwargs.update(position_embeddings=module(X, position_ids, *extra), position_ids=position_ids)
        out = layer(X, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return call


def hf_reference(model: str, model_type: str, layer_class: str, config_class: str, config_kwargs: dict, *,
                 layer_idx: int = 0, causal: bool = True, attn_implementation: str = "sdpa",
                 unit_offset_norms: bool = False, mask: str | None = None,
                 rotary: str | None | bool = True) -> Reference:
    """A :class:`Reference` for a Hugging Face layer: :func:`hf_make`, :func:`from_hf`, :func:`hf_call`.

    Args:
        model: the model it stands for (``Reference.model``), e.g. ``'Gemma 2 (local)'``.
        model_type, layer_class, config_class, config_kwargs: as :func:`hf_make`.
        layer_idx, attn_implementation, unit_offset_norms: as :func:`hf_make`.
        causal, mask, rotary: as :func:`hf_call`.
    """
    make = hf_make(model_type, layer_class, config_class, config_kwargs, layer_idx=layer_idx,
                   attn_implementation=attn_implementation, unit_offset_norms=unit_offset_norms)
    call = hf_call(model_type, layer_class, layer_idx=layer_idx, causal=causal, mask=mask, rotary=rotary)
    return Reference(layer_class, model, make, lambda layer, config: from_hf(layer, config, layer_idx), call,
                     causal)


#: Largest absolute difference (float32) of outputs and of input gradients for a reference layer to count as
#: reproduced (the zoo's tables).
TOLERANCE = 1e-5


#: The Hugging Face layers in :data:`REFERENCES`, by layer class: ``(model, model_type, config class, tiny
#: configuration)``, the tiny configuration a key of :data:`~d2lmini.reference.tiny.TINY_CONFIGS`. Filled by
#: :func:`register_references` from the family rows that name a ``reference``.
HF_TINY: dict[str, tuple] = {}


def _build_references() -> dict[str, Reference]:
    refs = {}
    for norm_first in (False, True):
        for activation in ("relu", "gelu"):
            make, call = _torch_encoder(norm_first, activation)
            name = f"TransformerEncoderLayer(norm_first={norm_first}, activation={activation!r})"
            refs[name] = Reference(name, "PyTorch, " + ("pre-LN" if norm_first else "post-LN, Transformer (2017)"),
                                   make, lambda layer, config: from_torch_encoder_layer(layer), call,
                                   causal=False, needs_transformers=False)

    def decoder_call(layer, config, X, valid_lens, memory, memory_valid_lens):
        n = X.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = masked, as nn.Transformer* expects
        return layer(X, memory, tgt_mask=causal, tgt_key_padding_mask=_padding(valid_lens, n),
                     memory_key_padding_mask=_padding(memory_valid_lens, memory.shape[1]))

    refs["TransformerDecoderLayer"] = Reference(
        "TransformerDecoderLayer", "PyTorch, encoder-decoder Transformer (2017)", _torch_decoder_make,
        lambda layer, config: from_torch_decoder_layer(layer), decoder_call, causal=True,
        needs_transformers=False, memory=12)
    return refs


#: Every reference layer d2lmini is checked against, by name: PyTorch's layers here, the Hugging Face
#: layers of the family rows added by :func:`register_references` (when :mod:`d2lmini.reference` is imported).
REFERENCES: dict[str, Reference] = _build_references()


def register_references(rows) -> None:
    """Add to :data:`REFERENCES` and :data:`HF_TINY` every row that names a ``reference``, keyed by layer class.

    Args:
        rows: :class:`~d2lmini.reference.base.LayerRow` objects (those of
            :data:`d2lmini.reference.LAYER_ROWS`), in the order the references are listed.

    Raises:
        ValueError: if two rows name a reference for the same layer class.
    """
    for row in rows:
        if row.reference is None:
            continue
        if row.layer_class in HF_TINY:
            raise ValueError(f"rows: two references for {row.layer_class}")
        HF_TINY[row.layer_class] = (row.reference, row.model_type, row.config_class, row.tiny)
        REFERENCES[row.layer_class] = hf_reference(row.reference, row.model_type, row.layer_class, row.config_class,
                                                   TINY_CONFIGS[row.tiny], causal=row.causal,
                                                   unit_offset_norms=row.unit_offset_norms)


def compare_with_reference(name: str, batch_size: int = 2, num_steps: int = 16, seed: int = 0,
                           padded: bool = True) -> dict:
    """Run a reference layer and its d2lmini twin on one batch; return the differences.

    Builds the tiny reference ``REFERENCES[name]`` (seeded random weights, eval mode,
    float32), converts it with its ``from_*`` function, feeds both the same random
    batch -- with the second sequence padded to 5/8 of its length when ``padded`` --
    and backpropagates the same random read-out of the outputs to the inputs. Only
    valid (non-padded) positions are compared.

    Args:
        name: a key of :data:`REFERENCES`, or a :class:`Reference` object (for a
            reference kept elsewhere, e.g. Arcee Trinity in :mod:`d2lmini.chapters.zoo`).
        batch_size, num_steps: the batch's shape (batch >= 1, steps >= 2).
        seed: seeds the weights and the inputs.
        padded: whether to pad the second sequence (``valid_lens``).

    Returns:
        dict with ``max_abs_diff`` (outputs), ``max_abs_grad_diff`` (gradients with
        respect to the input), ``max_abs_output`` (scale of the outputs) and ``block``.

    Raises:
        KeyError: for an unknown ``name`` (the message lists the known ones).
        ImportError: if the reference needs ``transformers`` and it is not installed.
    """
    if isinstance(name, Reference):
        ref = name
    elif name in REFERENCES:
        ref = REFERENCES[name]
    else:
        raise KeyError(f"unknown reference {name!r}; known: {sorted(REFERENCES)}")
    layer, config = ref.make(seed)
    block = ref.convert(layer, config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    d = block.num_hiddens
    X = torch.randn(batch_size, num_steps, d, generator=gen)
    R = torch.randn(batch_size, num_steps, d, generator=gen)
    valid_lens = None
    if padded and batch_size > 1:
        valid_lens = torch.full((batch_size,), num_steps)
        valid_lens[1] = max(1, num_steps * 5 // 8)
    extra_ref, extra_ours = (), ()
    if ref.memory:
        memory = torch.randn(batch_size, ref.memory, d, generator=gen)
        memory_valid_lens = None if valid_lens is None else torch.full((batch_size,), ref.memory).index_fill_(0, torch.tensor([1]), ref.memory // 2)
        extra_ref, extra_ours = (memory, memory_valid_lens), (memory, memory_valid_lens)
    keep = torch.ones(batch_size, num_steps, 1, dtype=torch.bool)  # (b, n, 1): the positions compared
    if valid_lens is not None:
        keep = valid_lens_mask(valid_lens, num_steps)[..., None]
    runs = (lambda Z: ref.call(layer, config, Z, valid_lens, *extra_ref),
            lambda Z: block(Z, *extra_ours, valid_lens) if ref.memory else block(Z, valid_lens))
    return {**output_and_grad_differences(runs, X, R, keep), "block": block}


@shown_in("zoo")
def output_and_grad_differences(
    runs, X: torch.Tensor, R: torch.Tensor, keep: torch.Tensor
) -> dict:
    """Feed two implementations the same input; compare their outputs and input gradients.

    Each of the two ``runs`` maps a ``(b, n, d)`` input to a ``(b, n, d)`` output (or a
    tuple that starts with it). Each gets its own copy of ``X``, and the same random
    read-out ``R`` of its output, restricted to the positions ``keep`` (``(b, n, 1)``
    bool), is backpropagated to that copy.

    Returns:
        dict with ``max_abs_diff`` (outputs, at the kept positions), ``max_abs_grad_diff``
        (gradients with respect to the input) and ``max_abs_output`` (the first run's scale).
    """
    outputs, grads = [], []
    for run in runs:
        # grad mode: nn.TransformerEncoderLayer takes its exact path
        Z = X.clone().requires_grad_(True)
        Y = run(Z)
        Y = Y[0] if isinstance(Y, tuple) else Y
        (Y * R * keep).sum().backward()
        outputs.append(Y.detach())
        grads.append(Z.grad)
    keep = keep.expand_as(outputs[0])
    return {
        "max_abs_diff": float((outputs[0] - outputs[1])[keep].abs().max()),
        "max_abs_grad_diff": float((grads[0] - grads[1]).abs().max()),
        "max_abs_output": float(outputs[0][keep].abs().max()),
    }
