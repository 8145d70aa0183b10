"""Beyond softmax attention: shorter reach, sinks, gates, positions and a recurrent mixer.

The experiments of the chapter "Beyond softmax attention". Each is deterministic for a given seed:

* :func:`receptive_field` and :func:`receptive_field_by_depth` -- which input positions
  can change the last token's output after ``L`` blocks of sliding-window (local) and
  global attention, from the exact zeros of a gradient;
* :func:`sink_share` and :func:`sink_sweep` -- the attention mass a learned sink logit
  (gpt-oss) absorbs, measured through the module's own forward pass;
* :func:`~d2lmini.reference.from_qwen3_5_attention` -- Qwen3.5's gated attention as a d2lmini
  :class:`~d2lmini.attention.GatedAttention`;
* :func:`rope_settings_table` -- RoPE's wavelengths under different bases, partial
  rotation and YaRN scaling; :func:`layer_patterns` -- the local/global, NoPE and
  linear/full layer patterns read from the pinned ``transformers`` configurations;
* :func:`stack_state_bytes` -- what a stack of Gated DeltaNet and attention layers keeps
  between decoding steps as the context grows;
* :func:`compare_with_hf` and the ``verify_*`` functions -- d2lmini's modules against
  Hugging Face ``transformers`` 5.24 layers (``DeepseekV3Attention``, ``Qwen3_5Attention``,
  ``Qwen3_5GatedDeltaNet``), same weights, same input; each returns
  ``{"status": "not available in this transformers"}`` where the installed
  ``transformers`` lacks the class.

Shapes use the legend b = batch, n = num_steps, d = num_hiddens, h = heads.
"""

from __future__ import annotations

import importlib
import math

import torch
from torch import nn

from .._checks import check_int_at_least, check_positive_int
from .._checks import check_seed as _check_seed
from .._shown import shown_in
from ..attention import (
    GatedAttention,
    MultiHeadAttention,
    rope_frequencies,
    valid_lens_mask,
)
from ..block import TransformerBlock
from ..deltanet import GatedDeltaNet, inference_state_bytes
from ..plot import styled_figure
from ..reference import (
    from_deepseek_v3_attention,
    from_qwen3_5_attention,
    from_qwen3_5_gated_deltanet,
    hf_call,
    hf_make,
    output_and_grad_differences,
    randomize_,
    tiny_config,
)
from ..seeding import seeded

#: What a verification returns where the installed ``transformers`` lacks the layer class.
NOT_AVAILABLE = {"status": "not available in this transformers"}

# --------------------------------------------------------------------------- verification


def _available(model_type: str, class_name: str) -> bool:
    """Whether ``transformers.models.<model_type>.modeling_<model_type>`` exists and has ``class_name``."""
    try:
        modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError:
        return False
    return hasattr(modeling, class_name)


def compare_with_hf(hf_run, ours_run, num_hiddens: int, valid_lens=None, *, num_steps: int = 16,
                    seed: int = 0) -> dict:
    """Largest output and input-gradient differences of a Hugging Face layer and its d2lmini twin.

    Both runs map the same batch ``X`` (2, n, d) to an output; the same random read-out
    ``R`` of that output, at the real (unpadded) positions, is backpropagated to ``X``.
    Returns ``max_abs_diff``, ``max_abs_grad_diff``, ``max_abs_output`` and ``max_abs_grad``.
    """
    gen = torch.Generator().manual_seed(_check_seed(seed))
    X = torch.randn(2, num_steps, num_hiddens, generator=gen)
    R = torch.randn(X.shape, generator=gen)
    keep = (torch.ones(2, num_steps, 1, dtype=torch.bool) if valid_lens is None
            else valid_lens_mask(valid_lens, num_steps)[..., None])
    result = output_and_grad_differences([hf_run, ours_run], X, R, keep)
    Z = X.clone().requires_grad_(True)
    (ours_run(Z) * R * keep).sum().backward()
    return dict(result, max_abs_grad=float(Z.grad.abs().max()), status="verified")


def verify_mla(seed: int = 0) -> dict:
    """:class:`~d2lmini.mla.MultiHeadLatentAttention` against ``DeepseekV3Attention`` (tiny, random, padded batch).

    Builds the Hugging Face layer with every parameter randomized (``reference.hf_make``),
    converts it (:func:`~d2lmini.reference.deepseek.from_deepseek_v3_attention`, which also reorders
    DeepSeek's interleaved rotary features) and compares with :func:`compare_with_hf` on a
    batch of lengths 16 and 11. Returns its dict, or :data:`NOT_AVAILABLE`.
    """
    if not _available("deepseek_v3", "DeepseekV3Attention"):
        return dict(NOT_AVAILABLE)
    layer, config = hf_make("deepseek_v3", "DeepseekV3Attention", "DeepseekV3Config", tiny_config("deepseek_v3"))(seed)
    ours = from_deepseek_v3_attention(layer, config)
    call = hf_call("deepseek_v3", "DeepseekV3Attention", rotary="DeepseekV3RotaryEmbedding")
    valid = torch.tensor([16, 11])
    return compare_with_hf(lambda Z: call(layer, config, Z, valid), lambda Z: ours(Z, Z, Z, valid),
                           config.hidden_size, valid, seed=seed)


# --------------------------------------------------------------------------- 2. sliding windows


def layer_patterns() -> dict:
    """Layer patterns of six models, read from the default configurations of the installed ``transformers``.

    Returns:
        ``{model: (what, pattern)}`` where ``pattern`` is a string with one letter per layer
        of the first eight: Gemma 3 and gpt-oss ``L`` (sliding window, local) / ``G`` (global),
        with their windows; SmolLM3 and Llama 4 ``R`` (RoPE) / ``N`` (no position encoding,
        NoPE); Qwen3-Next and Qwen3.5 ``D`` (Gated DeltaNet, linear attention) / ``F`` (full attention).
        A model whose configuration class is missing is left out.
    """
    import transformers as tf

    letters = {"sliding_attention": "L", "full_attention": "G", "linear_attention": "D"}
    out = {}
    if hasattr(tf, "Gemma3TextConfig"):
        c = tf.Gemma3TextConfig()
        out["Gemma 3"] = (f"local/global, window {c.sliding_window}", "".join(letters[t] for t in c.layer_types[:8]))
    if hasattr(tf, "GptOssConfig"):
        c = tf.GptOssConfig()
        out["gpt-oss"] = (f"local/global, window {c.sliding_window}", "".join(letters[t] for t in c.layer_types[:8]))
    for name, cls in (("SmolLM3", "SmolLM3Config"), ("Llama 4", "Llama4TextConfig")):
        if hasattr(tf, cls):
            out[name] = ("RoPE/NoPE", "".join("R" if r else "N" for r in getattr(tf, cls)().no_rope_layers[:8]))
    for name, cls in (("Qwen3-Next", "Qwen3NextConfig"), ("Qwen3.5", "Qwen3_5TextConfig")):
        if hasattr(tf, cls):
            types = getattr(tf, cls)().layer_types[:8]
            out[name] = ("Gated DeltaNet/full", "".join(letters[t] for t in types).replace("G", "F"))
    return out


def local_global_stack(pattern: str, depth: int, *, window: int, num_hiddens: int = 16, num_heads: int = 2,
                       seed: int = 0) -> nn.ModuleList:
    """``depth`` causal pre-LN blocks; block ``l`` is local (``window``) if ``pattern[l % len(pattern)] == 'L'``, else global.

    Raises:
        ValueError: a ``pattern`` that is empty or holds letters other than ``L`` and ``G``.
    """
    if not pattern or set(pattern) - {"L", "G"}:
        raise ValueError(f"pattern must be a non-empty string of 'L' (local) and 'G' (global), got {pattern!r}")
    check_positive_int("depth", depth)
    with seeded(seed):
        return nn.ModuleList(TransformerBlock(num_hiddens, num_heads, causal=True,
                                              window=window if pattern[i % len(pattern)] == "L" else None)
                             for i in range(depth))


@shown_in("ch11")
def receptive_field(
    blocks, num_steps: int, *, position: int = -1, seed: int = 0
) -> torch.Tensor:
    """Which input positions can change the output at ``position``: a bool vector of length ``n``.

    Runs a random batch of one sequence through ``blocks`` and backpropagates a random
    read-out of the output at ``position`` to the input. A masked key gets a softmax
    weight of exactly 0, so a position the output cannot depend on gets a gradient of
    exactly 0 -- no threshold is needed.
    """
    num_hiddens = blocks[0].num_hiddens
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(1, num_steps, num_hiddens, generator=gen).requires_grad_(True)
    Y = X
    for block in blocks:
        Y = block(Y)
    readout = torch.randn(num_hiddens, generator=gen)
    (Y[0, position] @ readout).backward()
    return X.grad[0].abs().sum(dim=-1) > 0


def receptive_field_by_depth(patterns: dict, *, window: int, num_steps: int, max_depth: int,
                             seed: int = 0) -> dict:
    """``{name: [field size after 1, 2, ..., max_depth blocks]}`` for each local/global ``pattern``.

    The field size is the number of input positions that can change the last token's
    output (:func:`receptive_field`), out of ``num_steps``.
    """
    check_int_at_least("max_depth", max_depth, 1)
    out = {}
    for name, pattern in patterns.items():
        stack = local_global_stack(pattern, max_depth, window=window, seed=seed)
        out[name] = [int(receptive_field(stack[:depth], num_steps, seed=seed).sum())
                     for depth in range(1, max_depth + 1)]
    return out


def reach_matrix(blocks, num_steps: int, seed: int = 0) -> torch.Tensor:
    """``(n, n)`` bool: row ``i`` is :func:`receptive_field` of output position ``i``."""
    return torch.stack([receptive_field(blocks, num_steps, position=i, seed=seed) for i in range(num_steps)])


def plot_receptive_field(matrix: torch.Tensor, by_depth: dict, *, window: int, num_steps: int, depth: int):
    """Figure: the reach matrix of ``depth`` local blocks (left) and the field size against depth (right)."""
    with styled_figure(2, width=9.5, height=3.4) as (fig, (left, right)):
        left.imshow(matrix.numpy(), cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest")
        left.set_xlabel("input position")
        left.set_ylabel("output position")
        left.set_title(f"{depth} local blocks, window {window}", fontsize=10)
        styles = ["-", "--", "-.", ":", "-"]
        colors = ["#c0392b", "#7d3c98", "#2471a3", "#1e8449", "#7f8c8d"]
        for (name, sizes), ls, color in zip(by_depth.items(), styles, colors):
            right.plot(range(1, len(sizes) + 1), sizes, ls, marker="o", ms=3, color=color, label=name)
        right.axhline(num_steps, color="black", lw=0.6, ls=":")
        right.set_xlabel("depth (blocks)")
        right.set_ylabel("positions reaching the last token")
        right.legend(fontsize=8, loc="lower right")
    return fig


# --------------------------------------------------------------------------- 3. attention sinks


@shown_in("ch11")
def sink_share(attention: MultiHeadAttention, X: torch.Tensor) -> torch.Tensor:
    """The share of every query's softmax that goes to the sink, ``(h, n)``, measured through ``forward``.

    Every value is made a vector of ones (``W_v`` = 0 with bias 1) and ``W_o`` the
    identity, so each output feature of head ``i`` is the total weight on real keys,
    ``1 - p_sink``. Needs ``bias=True`` and ``num_heads * head_dim == d``.
    """
    a = attention
    if (
        a.W_v.bias is None
        or a.num_heads * a.head_dim != a.num_hiddens
        or a.num_kv_heads != a.num_heads
    ):
        raise ValueError("sink_share needs bias=True, num_kv_heads == num_heads "
                         "and num_heads * head_dim == d")
    with torch.no_grad():
        a.W_v.weight.zero_()
        a.W_v.bias.fill_(1.0)
        a.W_o.weight.copy_(torch.eye(a.num_hiddens))
        a.W_o.bias.zero_()
        out = a(X, X, X)[0]  # (n, h * head_dim)
    return 1 - out[:, :: a.head_dim].T  # the first feature of each head


def sink_sweep(sink_logits, *, num_steps: int = 64, num_hiddens: int = 16, num_heads: int = 2,
               seed: int = 0) -> dict:
    """:func:`sink_share` of a tiny causal attention with sinks, for every sink logit in ``sink_logits``.

    Returns:
        ``{"sink_logits": list, "share": tensor (len(sink_logits), n)}`` -- the share
        averaged over heads, for every query position -- and ``"mean_exp_logit"``: the mean
        over heads of ``exp(logit)`` of the real keys at the last query (which, times the
        number of keys, is the softmax denominator the sink competes with).
    """
    with seeded(seed):
        attention = MultiHeadAttention(num_hiddens, num_heads, bias=True, causal=True, sinks=True)
        X = torch.randn(1, num_steps, num_hiddens)
    shares = []
    for s in sink_logits:
        with torch.no_grad():
            attention.sinks.fill_(float(s))
        shares.append(sink_share(attention, X).mean(dim=0))
    with torch.no_grad():
        q, k = attention.queries_and_keys(X, X)
        logits = (q[0, :, -1] @ k[0].transpose(-1, -2)) * attention.logit_scale  # (h, n)
    return {"sink_logits": list(sink_logits), "share": torch.stack(shares),
            "mean_exp_logit": float(logits.exp().mean())}


def plot_sink_sweep(sweep: dict, positions=(1, 8, 64)):
    """Figure: the sink's share against its logit, for queries at a few positions (1-based)."""
    with styled_figure(1, width=6.5, height=3.0) as (fig, ax):
        s = sweep["sink_logits"]
        for p, color in zip(positions, ["#c0392b", "#7d3c98", "#2471a3"]):
            ax.plot(s, sweep["share"][:, p - 1], marker="o", ms=3, color=color, label=f"query {p} ({p} key{'s' if p != 1 else ''})")
            ax.plot(s, [math.exp(x) / (math.exp(x) + p) for x in s], ":", color=color, lw=1)
        ax.set_xlabel("sink logit $s$")
        ax.set_ylabel("share of attention on the sink")
        ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------- 4. gated attention

#: A tiny Qwen3.5 text model with one full-attention layer: GQA 4/2, head_dim 16, rotary_dim 4.
TINY_QWEN3_5 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=80,
                    num_hidden_layers=1, layer_types=["full_attention"], rms_norm_eps=1e-5,
                    max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.25})


def verify_sinks(seed: int = 0) -> dict:
    """Attention sinks against gpt-oss: the appendix's ``GptOssDecoderLayer`` row, converted and compared.

    The tiny gpt-oss layer (:data:`d2lmini.chapters.zoo.ZOO`, row ``'gpt-oss (sliding)'``: attention with a
    learned sink per head, YaRN, a sliding window, biases, and its mixture of experts) is
    converted by :func:`d2lmini.reference.from_hf` into a block whose attention is
    ``MultiHeadAttention(..., sinks=True)`` and compared on a padded batch
    (:func:`d2lmini.chapters.zoo.zoo_row`). Returns ``max_abs_diff``, ``max_abs_grad_diff`` and
    ``status``, or :data:`NOT_AVAILABLE`.
    """
    from .zoo import ZOO, zoo_row

    result = zoo_row(next(row for row in ZOO if row.name == "gpt-oss (sliding)"), seed=seed)
    if result["max_abs_diff"] is None:
        return dict(NOT_AVAILABLE)
    return {"max_abs_diff": result["max_abs_diff"], "max_abs_grad_diff": result["max_abs_grad_diff"],
            "status": "verified" if result["reproduced"] else "MISMATCH"}


def verify_gated_attention(seed: int = 0) -> dict:
    """:func:`~d2lmini.reference.from_qwen3_5_attention` against ``Qwen3_5Attention`` (tiny, random, padded batch).

    GQA 4/2, QK-norm, partial RoPE (a quarter of each head), every parameter randomized
    (norm gains around 0, stored as ``w`` in ``1 + w``). Returns :func:`compare_with_hf`'s
    dict, or :data:`NOT_AVAILABLE`.
    """
    if not _available("qwen3_5", "Qwen3_5Attention"):
        return dict(NOT_AVAILABLE)
    attn, config = hf_make("qwen3_5", "Qwen3_5Attention", "Qwen3_5TextConfig", TINY_QWEN3_5,
                           unit_offset_norms=True)(seed)
    ours = from_qwen3_5_attention(attn, config).eval()
    call = hf_call("qwen3_5", "Qwen3_5Attention", rotary="Qwen3_5TextRotaryEmbedding")
    valid = torch.tensor([16, 11])
    return compare_with_hf(lambda Z: call(attn, config, Z, valid), lambda Z: ours(Z, Z, Z, valid),
                           config.hidden_size, valid, seed=seed)


# --------------------------------------------------------------------------- 5. positions

#: RoPE settings compared in the chapter: base, head size, rotated features, scaling.
ROPE_SETTINGS = {
    "RoFormer / Llama 2": dict(theta=1e4, head_dim=128, rotary_dim=None),
    "Llama 3": dict(theta=5e5, head_dim=128, rotary_dim=None),
    # theta: Qwen3_5TextConfig's default (rope_parameters' rope_theta 10,000), a class default
    "Qwen3.5 (partial)": dict(theta=1e4, head_dim=256, rotary_dim=64),
    "gpt-oss, unscaled": dict(theta=1.5e5, head_dim=64, rotary_dim=None),
    "gpt-oss, YaRN x32": dict(theta=1.5e5, head_dim=64, rotary_dim=None,
                              scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                       "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
}


@shown_in("ch11")
def rope_settings_table(settings: dict, context: int) -> list[dict]:
    """Wavelengths of RoPE's rotated pairs under each setting, from ``rope_frequencies``.

    A pair's wavelength is the number of positions it takes to turn once, ``2 pi / inv_freq``.
    A pair whose wavelength exceeds ``context`` never completes a turn within it.
    """
    rows = []
    for name, s in settings.items():
        dim = s["rotary_dim"] or s["head_dim"]
        inv_freq, attention_factor = rope_frequencies(dim, s["theta"], s.get("scaling"))
        wavelength = 2 * math.pi / inv_freq.double()
        rows.append(
            {
                "setting": name,
                "rotated": f"{dim} of {s['head_dim']}",
                "pairs": dim // 2,
                "shortest": float(wavelength.min()),
                "longest": float(wavelength.max()),
                f"pairs > {context:,}": int((wavelength > context).sum()),
                "attention factor": attention_factor,
            }
        )
    return rows


def rope_wavelengths(setting: dict) -> torch.Tensor:
    """The wavelength (positions per turn) of every rotated pair of one :data:`ROPE_SETTINGS` entry, float64.

    ``setting`` holds ``theta`` and ``head_dim``, and optionally ``rotary_dim`` (``None``: the whole
    head) and ``scaling`` (a ``rope_parameters`` dict that :func:`~d2lmini.attention.rope_frequencies`
    accepts). Raises ``ValueError`` on a missing or unknown key, so that a scaling under another
    name is not silently ignored."""
    if not isinstance(setting, dict):
        raise TypeError(f"setting must be a dict like ROPE_SETTINGS' entries, got {type(setting).__name__}")
    allowed, required = ("theta", "head_dim", "rotary_dim", "scaling"), ("theta", "head_dim")
    unknown, missing = sorted(set(setting) - set(allowed)), [k for k in required if k not in setting]
    if unknown or missing:
        raise ValueError(f"setting: unknown keys {unknown}, missing keys {missing}; a setting has the keys "
                         f"{', '.join(allowed)} (the scaling dict goes under 'scaling')")
    inv_freq, _ = rope_frequencies(setting.get("rotary_dim") or setting["head_dim"], setting["theta"],
                                   setting.get("scaling"))
    return 2 * math.pi / inv_freq.double()


def plot_rope_wavelengths(settings: dict, names, *, context: int):
    """Figure: wavelength of every pair (log scale) for the settings ``names``, with the context marked."""
    with styled_figure(1, width=7.0, height=3.2) as (fig, ax):
        for name, color, ls in zip(names, ["#7f8c8d", "#2471a3", "#c0392b", "#1e8449"], ["-", "--", "-", "-."]):
            w = rope_wavelengths(settings[name])
            ax.plot(range(len(w)), w, ls, color=color, label=name)
        ax.axhline(context, color="black", lw=0.7, ls=":")
        ax.text(0, context * 1.3, f"original context {context:,}", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("rotated pair $i$")
        ax.set_ylabel("wavelength (positions per turn)")
        ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------- 6. Gated DeltaNet


def verify_gated_deltanet(seed: int = 0) -> dict:
    """:class:`~d2lmini.deltanet.GatedDeltaNet` against ``Qwen3_5GatedDeltaNet`` (tiny, random, 70 tokens).

    Two key heads, four value heads, heads of 8 (keys) and 6 (values) features, every
    parameter randomized, decays spread over (0, 1) (``A_log``, ``dt_bias``), run in float32
    on 70 tokens so that Hugging Face's chunked form crosses a chunk boundary (64 tokens);
    its forward uses the chunked form on its torch path, ours the loop
    :func:`~d2lmini.deltanet.gated_delta_rule`. Returns :func:`compare_with_hf`'s dict, or
    :data:`NOT_AVAILABLE`.
    """
    if not _available("qwen3_5", "Qwen3_5GatedDeltaNet"):
        return dict(NOT_AVAILABLE)
    import transformers as tf
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    d = 32
    config = tf.Qwen3_5TextConfig(hidden_size=d, linear_num_key_heads=2, linear_num_value_heads=4,
                                  linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                  vocab_size=16)
    with seeded(seed):
        layer = hf.Qwen3_5GatedDeltaNet(config, 0)
    randomize_(layer, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=gen) * 3 - 2)
        layer.dt_bias.copy_(torch.rand(layer.dt_bias.shape, generator=gen) * 2 - 1)
        layer.conv1d.weight.mul_(3)
    layer.eval()
    ours = from_qwen3_5_gated_deltanet(layer)
    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # its notes that the optional fused kernels are not installed
    try:
        return compare_with_hf(lambda Z: layer(Z), lambda Z: ours(Z), d, num_steps=70, seed=seed)
    finally:
        tf.logging.set_verbosity(verbosity)


def qwen3_5_mixers(window: int = 4096) -> dict:
    """Qwen3.5's two mixers at the size of ``Qwen3_5TextConfig``'s defaults, and a windowed attention, on the meta device.

    Width 4,096 (``transformers`` 5.24): Gated DeltaNet with 16 key heads and 32 value heads
    of 128; gated attention with 16 query heads and 4 key/value heads of 256; plus, for
    comparison, the same attention with a sliding window of ``window`` tokens.

    Returns:
        ``{"linear_attention", "full_attention", "sliding_attention": module}``.

    Raises:
        ValueError / TypeError: ``window`` not an int >= 1.
    """
    window = check_positive_int("window", window)
    with torch.device("meta"):
        return {"linear_attention": GatedDeltaNet(4096, num_k_heads=16, num_v_heads=32, head_k_dim=128,
                                                  head_v_dim=128),
                "full_attention": GatedAttention(4096, 16, num_kv_heads=4, head_dim=256, causal=True),
                "sliding_attention": GatedAttention(4096, 16, num_kv_heads=4, head_dim=256, causal=True,
                                                    window=window)}


@shown_in("ch11")
def stack_state_bytes(
    layer_types: list, mixers: dict, lengths, *, dtype=torch.bfloat16
) -> list[int]:
    """Bytes a stack of layers keeps between decoding steps after each number of tokens in ``lengths``.

    Layer ``l`` is the mixer ``mixers[layer_types[l]]``; each layer's share is
    :func:`~d2lmini.deltanet.inference_state_bytes` (a Gated DeltaNet's constant state, an
    attention's key/value cache of ``min(n, window)`` tokens), for one sequence.
    """
    per_kind = {
        kind: [inference_state_bytes(mixers[kind], n, dtype=dtype) for n in lengths]
        for kind in set(layer_types)
    }
    return [sum(per_kind[kind][i] for kind in layer_types) for i in range(len(lengths))]


def plot_state_bytes(lengths, stacks: dict, per_layer: dict):
    """Figure: per-layer state (left) and whole-stack state (right) against the context length, log-log."""
    colors = ["#c0392b", "#2471a3", "#1e8449", "#7d3c98"]
    with styled_figure(2, width=9.5, height=3.3) as (fig, (left, right)):
        for (name, values), color in zip(per_layer.items(), colors):
            left.plot(lengths, [v / 2**20 for v in values], marker="o", ms=3, color=color, label=name)
        for (name, values), color in zip(stacks.items(), colors):
            right.plot(lengths, [v / 2**30 for v in values], marker="o", ms=3, color=color, label=name)
        for ax, unit in ((left, "MiB per layer"), (right, "GiB, 32 layers")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens in the context")
            ax.set_ylabel(unit)
            ax.legend(fontsize=8)
    return fig
