"""Where the norm goes: the experiments of the chapter "Where the norm goes: post-LN, pre-LN and after".

* :func:`probe_placements` and :func:`depth_table` -- the depth experiment at
  initialization for every placement (the measurement itself is
  :func:`d2lmini.probes.probe_depth`); :func:`plot_placements` draws it for several
  placements at once;
* :func:`draw_placement_diagrams` -- one drawn block diagram per placement;
* :func:`train_placements`, :func:`train_placement_groups`, :func:`seed_losses`,
  :func:`training_table`, :func:`plot_training` and :func:`d2lmini.data.frequency_loss` -- post-LN
  against pre-LN in training: small character language models of one depth and peak learning
  rate, the seeds of each configuration trained in lockstep, the configurations spread over two
  worker processes, with or without learning-rate warm-up (Xiong et al., 2020);
* :class:`DepthExplorer`, :func:`depth_explorer` and :func:`depth_explorer_static` --
  the depth, placement and norm sliders, live and pre-computed.
"""

from __future__ import annotations

import math

from .._checks import (check_choice, check_seeds, check_instance, check_int_in, check_int_sequence, check_positive_float,
                       check_positive_int)
from .._shown import shown_in
from ..data import CharCorpus, python_reference_corpus
from ..norms import COMPARED_NORMS
from ..placements import PLACEMENT_TABLE
from ..plot import (NORM_LABELS, PLACEMENT_COLORS, PLACEMENT_FORMULAS, PLACEMENT_LABELS, STYLE, WEIGHT_COLORS,
                    figure_png, new_figure, plot_depth_probes, styled_figure)
from ..probes import (ATTENTION_WEIGHTS, HYPER_PLACEMENT, PROBED_PLACEMENTS, DepthProbe, probe_depth,
                      probe_memory_bytes)
from ..train import TrainResult, evaluate, run_in_workers, seeded_tiny_lm, train_models
from ..widgets import StaticTwin, round_frame_values


def probe_placements(depth: int = 32, placements=PROBED_PLACEMENTS, **kwargs) -> dict[str, DepthProbe]:
    """:func:`probe_depth` for several placements with everything else equal.

    ``'sandwich_scaled'`` is the depth-scaled sandwich: ``'sandwich'`` whose
    sublayer-output norms start with gain ``1/sqrt(depth)``.

    Args:
        depth: blocks in every stack.
        placements: names from :data:`PROBED_PLACEMENTS`.
        **kwargs: passed to :func:`probe_depth` (``norm``, ``seed``, ``dtype``, sizes).

    Returns:
        ``{placement: DepthProbe}`` in the order given.

    Raises:
        ValueError: for an unknown placement name.
    """
    probes = {}
    for name in placements:
        check_choice("placements", name, PROBED_PLACEMENTS)
        if name == "sandwich_scaled":
            probes[name] = probe_depth("sandwich", depth=depth, sublayer_norm_gain=1 / math.sqrt(depth), **kwargs)
        else:
            probes[name] = probe_depth(name, depth=depth, **kwargs)
    return probes


def depth_table(probes, ks=(8, 16, 32)):
    """A pandas DataFrame of the measurements of several probes at depths ``ks``.

    Args:
        probes: iterable of :class:`DepthProbe`.
        ks: depths (block indices) to report; each must be <= every probe's depth.

    Returns:
        ``pandas.DataFrame`` indexed by (placement, k) with columns stream RMS,
        token spread, the gradient norms of block k's ``W_q`` and ``W_v`` and its
        q,k : v,o ratio (:meth:`DepthProbe.qk_vo_ratio`, which uses all four).

    Raises:
        ValueError: if a ``k`` exceeds a probe's depth.
    """
    import pandas as pd  # the book has pandas; the package itself does not need it

    columns = {"stream_rms": "stream RMS", "token_spread": "token spread",
               "grad_W_q": "‖∇W_q‖", "grad_W_v": "‖∇W_v‖", "qk_vo_ratio": "q,k : v,o"}
    rows = [probe.at(k) for probe in probes for k in ks]
    frame = pd.DataFrame(rows).set_index(["placement", "k"])
    return frame[list(columns)].rename(columns=columns)


def draw_placement_diagrams(placements=("post", "pre", "post_sublayer", "sandwich", "sandwich_scaled")):
    """Block diagrams of one residual sublayer for each norm placement, side by side.

    Each panel draws the residual stream as a vertical arrow (input at the bottom),
    the branch through the sublayer ``F`` on the right, the addition ``+`` where the
    branch rejoins the stream, and a norm box ``N`` wherever the placement puts one:
    on the stream after the addition (post-LN), before ``F`` (pre-LN), after ``F``
    inside the branch (Swin Transformer V2, OLMo 2), or both (sandwich). The depth-scaled sandwich marks
    its output norm's small initial gain ``gamma_0``.

    Args:
        placements: keys of :data:`PLACEMENT_FORMULAS`, one panel each.

    Returns:
        A ``matplotlib.figure.Figure``.

    Raises:
        ValueError: for an unknown placement name.
    """
    from matplotlib.patches import FancyBboxPatch

    for p in placements:
        check_choice("placements", p, PLACEMENT_FORMULAS)
    stream_x, branch_x, add_y = 0.3, 0.72, 0.72

    def box(ax, x, y, text, color, width=0.34, height=0.1):
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.01,rounding_size=0.02",
                                    facecolor=color, edgecolor="0.2", linewidth=1.0, zorder=3))
        ax.text(x, y, text, ha="center", va="center", fontsize=10, zorder=4,
                color="white" if color != "0.92" else "black")

    def arrow(ax, start, end):
        ax.annotate("", xy=end, xytext=start, zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="0.25", linewidth=1.2, shrinkA=0, shrinkB=0))

    with styled_figure(len(placements), width=1.75 * len(placements), height=3.4) as (fig, axes):
        for ax, placement in zip(axes if len(placements) > 1 else [axes], placements):
            color, norms = PLACEMENT_COLORS[placement], PLACEMENT_TABLE[placement]
            has_in, has_out = norms.norm_in, norms.norm_out
            top = 0.81 if norms.norm_post else 0.97
            arrow(ax, (stream_x, 0.04), (stream_x, add_y - 0.03))
            arrow(ax, (stream_x, add_y + 0.03), (stream_x, top))
            if norms.norm_post:
                box(ax, stream_x, 0.86, "N", color, width=0.3)
                arrow(ax, (stream_x, 0.91), (stream_x, 0.99))
            # the branch: out of the stream, up through its boxes, back into the addition
            ax.plot([stream_x, branch_x], [0.14, 0.14], color="0.25", linewidth=1.2, zorder=2)
            stages = (["N"] if has_in else []) + ["F"] + (["N_out"] if has_out else [])
            ys = {1: [0.43], 2: [0.31, 0.53], 3: [0.26, 0.43, 0.60]}[len(stages)]
            previous = 0.14
            for stage, y in zip(stages, ys):
                arrow(ax, (branch_x, previous), (branch_x, y - 0.05))
                label = "F" if stage == "F" else ("N$_{\\gamma_0}$" if stage == "N_out" and placement == "sandwich_scaled"
                                                  else "N")
                box(ax, branch_x, y, label, "0.92" if stage == "F" else color)
                previous = y + 0.05
            ax.plot([branch_x, branch_x], [previous, add_y], color="0.25", linewidth=1.2, zorder=2)
            arrow(ax, (branch_x, add_y), (stream_x + 0.06, add_y))
            ax.text(stream_x, add_y, "+", ha="center", va="center", fontsize=11, zorder=4,
                    bbox=dict(boxstyle="circle,pad=0.15", facecolor="white", edgecolor="0.2"))
            ax.text(0.5, -0.06, PLACEMENT_LABELS[placement], ha="center", va="top", fontsize=9.5,
                    color=color, fontweight="bold", transform=ax.transAxes)
            ax.text(0.5, -0.16, PLACEMENT_FORMULAS[placement], ha="center", va="top", fontsize=9,
                    transform=ax.transAxes)
            ax.set(xlim=(0, 1), ylim=(0, 1))
            ax.axis("off")
    return fig


#: The character model of the chapter's training experiment (:class:`~d2lmini.train.TinyLM`
#: arguments besides ``num_layers`` and ``placement``): the 2017 ingredients -- LayerNorm, a
#: ReLU FFN, biases -- at the recipe's width 64 with 4 heads (:data:`d2lmini.train.RECIPE_MODEL`).
TRAINING_MODEL = dict(num_hiddens=64, num_heads=4, norm="layer", act="relu", bias=True)

@shown_in("ch04")
def train_placements(corpus: CharCorpus | None, num_layers: int, lr: float,
                     runs=(("post", 1.0), ("pre", 1.0)), warmup_steps: int = 0,
                     seeds=(0, 1), num_steps: int = 100, batch_size: int = 8,
                     seq_len: int = 64, clip_norm: float | None = 1.0,
                     eval_batches: int = 32) -> list[TrainResult]:
    """Train one :data:`TRAINING_MODEL` language model per ``(placement, rate multiple)`` of ``runs`` and seed.

    Each seed draws the initial weights and the batches (the placement moves norms, which
    draw nothing, so the runs of one seed start alike); all models train in one lockstep of
    :func:`d2lmini.train.train_models` (AdamW, betas (0.9, 0.95), a linear warm-up over
    ``warmup_steps``, then cosine decay to a tenth; every model's gradient clipped to norm
    ``clip_norm``). Model ``i`` trains at its multiple of the scheduled rate (a power of two
    gives exactly the run alone at that peak rate). Each model is then scored on held-out
    text (:func:`d2lmini.train.evaluate`).

    Args:
        corpus: the data, or None for :func:`d2lmini.data.python_reference_corpus`.
        num_layers: blocks in every model; lr: the peak learning rate.
        runs: ``(placement, multiple of lr)`` pairs, placements ``'post'`` or ``'pre'``.
        warmup_steps, num_steps, batch_size, seq_len, clip_norm: as in :func:`d2lmini.train.train_models`.
        seeds: distinct ints; every run trains once per seed.
        eval_batches: held-out batches of ``(batch_size, seq_len)`` for the final score.

    Returns:
        One :class:`~d2lmini.train.TrainResult` per run and seed (runs outermost); ``config`` holds
        its ``placement``, ``num_layers``, peak ``lr`` (the multiple applied), ``warmup_steps``,
        ``seed`` and ``clip_norm``; ``val_loss`` its one final validation loss (nats per
        character, NaN if it diverged).

    Raises:
        ValueError / TypeError: for an unknown placement, repeated seeds or invalid sizes, rates or steps.
    """
    pairs = _run_pairs(runs, seeds)  # one (placement, rate multiple, seed) per model
    corpus = python_reference_corpus() if corpus is None else corpus
    models = [seeded_tiny_lm(corpus.vocab_size, seed, max_len=seq_len,
                             num_layers=num_layers, placement=placement,
                             **TRAINING_MODEL) for placement, _, seed in pairs]
    log = train_models(models, corpus, [seed for *_, seed in pairs], num_steps,
                       batch_size, seq_len, lr, warmup_steps, schedule="cosine",
                       betas=(0.9, 0.95), clip_norm=clip_norm, stop_on_divergence=False,
                       lr_scales=[scale for _, scale, _ in pairs])
    results = []
    for (placement, scale, seed), model, losses in zip(pairs, models, log.losses):
        diverged = not all(math.isfinite(loss) for loss in losses)
        val = (math.nan if diverged
               else evaluate(model, corpus, batch_size, seq_len, eval_batches))
        config = dict(placement=placement, num_layers=num_layers, lr=lr * scale,
                      warmup_steps=warmup_steps, seed=seed, num_steps=num_steps,
                      clip_norm=clip_norm, **TRAINING_MODEL)
        results.append(TrainResult(config, losses, [num_steps], [val],
                                   [r * scale for r in log.lr], diverged, log.seconds))
    return results


def train_placement_groups(groups, num_workers: int = 2) -> list[TrainResult]:
    """:func:`train_placements` once per dict of ``groups``, the groups spread over worker processes.

    Every group (e.g. one placement at one depth and rate, all its seeds in one lockstep) runs
    in one of ``num_workers`` processes of one torch thread (:func:`d2lmini.train.run_in_workers`)
    on :func:`d2lmini.data.python_reference_corpus`; the numbers are the same whatever
    ``num_workers``.

    Args:
        groups: a list of dicts of :func:`train_placements` arguments besides ``corpus``.
        num_workers: processes, ``>= 1``.

    Returns:
        The results of all groups, concatenated in the order of ``groups``.

    Raises:
        TypeError / ValueError: as :func:`d2lmini.train.run_in_workers` and :func:`train_placements`.
    """
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
        raise TypeError(f"groups must be a list of dicts of train_placements arguments, got {groups!r}")
    if any("corpus" in group for group in groups):
        raise TypeError("groups train on python_reference_corpus(); leave 'corpus' out of them")
    jobs = [dict(group, corpus=None) for group in groups]
    return [result for results in run_in_workers(train_placements, jobs, num_workers) for result in results]


def _run_pairs(runs, seeds) -> list[tuple]:
    """For :func:`train_placements`: one ``(placement, rate multiple, seed)`` per run and seed,
    run by run, after checking ``runs`` and ``seeds``."""
    _check_runs(runs)
    seeds = check_seeds(seeds)
    return [(placement, scale, seed) for placement, scale in runs for seed in seeds]


def _check_runs(runs) -> None:
    """Raise unless ``runs`` is a non-empty sequence of ``(placement, positive multiple)`` pairs."""
    if isinstance(runs, (str, bytes)) or not isinstance(runs, (list, tuple)) or not runs:
        raise TypeError(f"runs must be a non-empty sequence of (placement, rate multiple) pairs, got {runs!r}")
    for run in runs:
        if not isinstance(run, (list, tuple)) or len(run) != 2:
            raise TypeError(f"every entry of runs must be a (placement, rate multiple) pair, got {run!r}")
        check_choice("runs placement", run[0], ("post", "pre"))
        check_positive_float("runs rate multiple", run[1])


#: Short names of the two placements the training experiment compares.
PLACEMENT_SHORT = {"post": "post-LN", "pre": "pre-LN"}


def _by_depth(results) -> dict[int, list[TrainResult]]:
    """``{num_layers: [results]}`` in the order the depths first appear; checks the type."""
    if not isinstance(results, (list, tuple)) or not all(isinstance(r, TrainResult) for r in results):
        raise TypeError(f"results must be a list of TrainResult (from train_placements), got {type(results).__name__}")
    groups = {}
    for result in results:
        groups.setdefault(result.config["num_layers"], []).append(result)
    return groups


def seed_losses(results) -> dict[tuple, list[float]]:
    """The final validation losses of :func:`train_placements` runs, grouped over seeds.

    Args:
        results: a list of :class:`~d2lmini.train.TrainResult` from :func:`train_placements`.

    Returns:
        ``{(blocks, peak rate, warm-up steps, placement): [loss per seed]}``, seeds in the order trained.

    Raises:
        TypeError: if ``results`` is not such a list.
        ValueError: if two results share a placement, a configuration and a seed.
    """
    groups, seen = {}, set()
    for depth, group in _by_depth(results).items():
        for result in group:
            config = result.config
            key = (depth, config["lr"], config["warmup_steps"], config["placement"])
            if key + (config.get("seed"),) in seen:
                raise ValueError(f"results holds two {PLACEMENT_SHORT[config['placement']]} runs of {depth} blocks "
                                 f"at peak rate {config['lr']:g} with {config['warmup_steps']} warm-up steps "
                                 f"and seed {config.get('seed')}")
            seen.add(key + (config.get("seed"),))
            groups.setdefault(key, []).append(result.val_loss[-1])
    return groups


def training_table(results):
    """The final validation losses of :func:`train_placements` runs, post-LN beside pre-LN, over seeds.

    Args:
        results: a list of :class:`~d2lmini.train.TrainResult` from :func:`train_placements`.

    Returns:
        ``pandas.DataFrame`` indexed by (blocks, peak rate, warm-up steps), deepest and highest
        rate first, then the shortest warm-up, with columns ``'post-LN'`` and ``'pre-LN'`` (the mean
        validation loss over seeds, nats per character) and ``'post-LN seed range'`` and
        ``'pre-LN seed range'`` (largest minus smallest over seeds; left out when every
        configuration trained one seed); NaN where that placement was not trained in that
        configuration. The columns' name says they hold the final validation loss.

    Raises:
        TypeError: if ``results`` is not such a list.
        ValueError: if two results share a placement, a configuration and a seed.
    """
    import pandas as pd

    rows = {}  # (blocks, peak rate, warm-up steps) -> {column: value}
    losses_by_run = seed_losses(results)
    for (depth, lr, warmup, placement), losses in losses_by_run.items():
        row = rows.setdefault((depth, lr, warmup), {})
        row[PLACEMENT_SHORT[placement]] = sum(losses) / len(losses)
        row[PLACEMENT_SHORT[placement] + " seed range"] = max(losses) - min(losses)
    keys = sorted(rows, key=lambda key: (-key[0], -key[1], key[2]))
    index = pd.MultiIndex.from_tuples(keys, names=["blocks", "peak rate", "warm-up steps"])
    columns = list(PLACEMENT_SHORT.values())
    if any(len(losses) > 1 for losses in losses_by_run.values()):  # one seed has no range
        columns += [name + " seed range" for name in PLACEMENT_SHORT.values()]
    table = pd.DataFrame([rows[key] for key in keys], index=index, columns=columns)
    table.columns.name = "final validation loss"  # shown above the columns: which loss they hold
    return table


def plot_training(results, reference: float | None = None, window: int = 20):
    """Training-loss curves of :func:`train_placements` runs, one panel per depth.

    Colours are the placements'; the runs at the highest peak rate of all are solid, those at a
    lower rate dotted (so that the legend tells the rates apart), and a warmed-up run dash-dotted (its warm-up's end
    marked by a grey vertical line). Post-LN is drawn wide and pale under pre-LN, so curves that
    coincide stay visible. Every seed is drawn, with one legend entry per placement, rate and
    warm-up; the panels share one legend above them.

    Args:
        results: a list of :class:`~d2lmini.train.TrainResult` from :func:`train_placements`.
        reference: a loss to mark with a dotted horizontal line (e.g. :func:`frequency_loss`), or None.
        window: moving-average window in steps.

    Returns:
        A ``matplotlib.figure.Figure``.

    Raises:
        TypeError: if ``results`` is not such a list.
    """
    window = check_positive_int("window", window)
    groups = _by_depth(results)
    handles = {}  # legend label -> line, over all panels
    with styled_figure(len(groups), width=4.3 * len(groups), height=3.6) as (fig, axes):
        axes = axes if len(groups) > 1 else [axes]
        top_rate = max(result.config["lr"] for group in groups.values() for result in group)
        for ax, (depth, group) in zip(axes, groups.items()):
            for result in group:
                config = result.config
                style = "-." if config["warmup_steps"] else ":" if config["lr"] < top_rate else "-"
                wide = config["placement"] == "post"
                curve = result.smoothed(window)
                label = (f"{PLACEMENT_SHORT[config['placement']]}, peak rate {config['lr']:g}"
                         + (f", warm-up {config['warmup_steps']}" if config["warmup_steps"] else ""))
                (line,) = ax.plot(range(1, len(curve) + 1), curve, color=PLACEMENT_COLORS[config["placement"]],
                                  linestyle=style, linewidth=2.6 if wide else 1.3, alpha=0.55 if wide else 1.0,
                                  label=label)
                handles.setdefault(label, line)
                if config["warmup_steps"]:
                    ax.axvline(config["warmup_steps"], color="0.6", linewidth=0.8)
            if reference is not None:
                handles["frequencies alone"] = ax.axhline(reference, color="0.3", linestyle=":", linewidth=1.0)
            rates = sorted({result.config["lr"] for result in group}, reverse=True)
            ax.set(xlabel="training step",
                   title=f"{depth} blocks, peak rate{'s' * (len(rates) > 1)} " + " and ".join(f"{r:g}" for r in rates))
            ax.grid(True, alpha=0.3)
        low = min(ax.get_ylim()[0] for ax in axes)
        high = max(ax.get_ylim()[1] for ax in axes)
        for ax in axes:
            ax.set_ylim(low, high)  # one scale for both panels
        axes[0].set_ylabel(f"training loss (nats/char, {window}-step mean)")
        # Long legend handles: at a short length a wide dash-dotted line shows as one solid dash.
        fig.legend(list(handles.values()), list(handles), loc="outside upper center", ncol=3, frameon=False,
                   fontsize=8.5, handlelength=4)
    return fig


#: Line styles that keep the five placements apart where their curves coincide.
PLACEMENT_STYLES = {"post": dict(linestyle="-"), "pre": dict(linestyle="-", linewidth=2.8, alpha=0.5),
                    "post_sublayer": dict(linestyle="--"), "sandwich": dict(linestyle=":", linewidth=2.0),
                    "sandwich_scaled": dict(linestyle="-.")}


def plot_placements(probes):
    """:func:`d2lmini.plot.plot_depth_probes` for several placements, each with its own line style.

    Pre-LN is drawn wide and pale, the sandwich dotted on top of it, the others dashed or
    dash-dotted (:data:`PLACEMENT_STYLES`), so that curves which coincide stay visible.

    Args:
        probes: ``{placement: DepthProbe}`` from :func:`probe_placements`.

    Returns:
        A ``matplotlib.figure.Figure``.

    Raises:
        TypeError: if ``probes`` is not a dict.
    """
    check_instance("probes", probes, dict, "a dict {placement: DepthProbe}")
    return plot_depth_probes(probes.values(), styles=[PLACEMENT_STYLES.get(p, {}) for p in probes])


#: The stream counts of the mHC explorer's streams slider (chapter "Beyond one residual stream").
EXPLORED_STREAMS = (1, 2, 4, 8)


def _check_explorer_placements(placements, norms, streams):
    """The explorers' placements, norms and stream counts, checked; mHC needs ``norms == ('rms',)``."""
    placements = tuple(check_choice("placements", p, PROBED_PLACEMENTS + (HYPER_PLACEMENT,)) for p in placements)
    norms = tuple(check_choice("norms", n, COMPARED_NORMS) for n in norms)
    if not placements or not norms:
        raise ValueError("placements and norms must each name at least one option")
    if HYPER_PLACEMENT in placements:
        if norms != ("rms",):
            raise ValueError(f"mHC blocks use RMSNorm: with placement {HYPER_PLACEMENT!r} pass norms=('rms',), "
                             f"got {norms}")
        streams = tuple(check_int_sequence("streams", streams, minimum=1, distinct=True))
    return placements, norms, streams


def _probe_one(placement: str, norm: str, depth: int, num_streams: int, probe_kwargs: dict) -> DepthProbe:
    """One configuration of the explorers: :func:`probe_placements`, or mHC with ``num_streams`` streams."""
    if placement == HYPER_PLACEMENT:
        return probe_depth(HYPER_PLACEMENT, norm=norm, depth=depth, num_streams=num_streams, **probe_kwargs)
    return probe_placements(depth, (placement,), norm=norm, **probe_kwargs)[placement]


def _probe_config(placement: str, norm: str, depth: int, probe_kwargs: dict) -> dict:
    """The ``config`` of the :class:`DepthProbe` that :func:`_probe_one` returns for one configuration (not mHC)."""
    import inspect

    parameters = inspect.signature(probe_depth).parameters
    config = {name: probe_kwargs.get(name, parameter.default) for name, parameter in parameters.items()
              if name not in ("device", "num_streams")}
    scaled = placement == "sandwich_scaled"
    config.update(placement="sandwich" if scaled else placement, norm=norm, depth=depth,
                  sublayer_norm_gain=1 / math.sqrt(depth) if scaled else None)
    config["dtype"] = str(config["dtype"]).replace("torch.", "")
    return config


#: Labels of the placements in an mHC explorer, where every stack uses RMSNorm (so pre-LN is not GPT-2's).
HYPER_EXPLORER_LABELS = {**PLACEMENT_LABELS, "pre": "pre-LN (RMSNorm)"}


def _config_label(placement: str, num_streams: int) -> str:
    return f"mHC, {num_streams} streams" if placement == HYPER_PLACEMENT else HYPER_EXPLORER_LABELS[placement]


def _reference(placement: str, num_streams: int) -> tuple[str, int]:
    """The configuration drawn dashed beside ``placement`` in an mHC explorer: pre-LN beside mHC, else mHC."""
    return ("pre", num_streams) if placement == HYPER_PLACEMENT else (HYPER_PLACEMENT, num_streams)


def _in_units(num_bytes: int) -> str:
    """``num_bytes`` in GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes / 2**10:.1f} KiB"


class DepthExplorer:
    """Depth x placement x norm explorer for the chapters "Where the norm goes" and "Beyond one residual stream".

    Controls: a depth slider ``L`` (1 to ``max_depth``), a placement dropdown and
    a norm toggle. For the chosen stack it shows, per depth, the stream RMS, the
    token spread and the gradient norms of every block's ``W_q, W_k, W_v, W_o``
    (:func:`d2lmini.probes.probe_depth`). Each (placement, norm, depth) is probed and
    drawn once; moving back to it shows the cached picture.

    The controls only take values in their range (the slider clamps, the dropdown and toggle
    refuse other values). A configuration that cannot be drawn -- one that would need more
    than ``max_bytes`` of memory (:func:`d2lmini.probes.probe_memory_bytes`), or one the probe
    rejects -- is not computed: the explorer's message area says why, the last picture stays,
    and the kernel goes on. The initial configuration is checked when the explorer is made.

    With ``'mhc'`` among ``placements`` (manifold-constrained hyper-connections,
    :class:`~d2lmini.hyper.HyperConnectedBlock`; RMSNorm only, so ``norm='rms'``), a
    streams slider picks the number of streams ``n``, and the stream RMS and token spread
    panels also draw, dashed, the other configuration for comparison: pre-LN beside mHC,
    mHC with ``n`` streams beside the other placements.

    Args:
        max_depth: largest depth on the slider (default 64).
        depth: initial depth (default 32).
        placement: initial placement, one of ``placements``.
        norm: initial norm, ``'layer'`` or ``'rms'``.
        placements: the dropdown's options, from :data:`d2lmini.probes.PROBED_PLACEMENTS`
            (the four placements and ``'sandwich_scaled'``, the depth-scaled sandwich) and ``'mhc'``.
        streams: the streams slider's stops (used with ``'mhc'`` only).
        num_streams: the initial number of streams, one of ``streams``.
        max_bytes: the most memory one configuration may take (default 2 GiB).
        **probe_kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, seed, dtype, ...).

    Attributes:
        depth_slider, placement_dropdown, norm_toggle: the controls; ``streams_slider``
            too with ``'mhc'`` (else ``None``).
        image: the ``ipywidgets.Image`` the figure is drawn into.
        message: an ``ipywidgets.HTML`` under the figure: empty, or why the chosen
            configuration cannot be drawn.
        widget: the whole explorer (an ``ipywidgets.VBox``); displaying the
            explorer displays it.

    Raises:
        ValueError: for an initial value outside the allowed ones, ``'mhc'`` with a norm other than
            ``'rms'``, or an initial configuration that cannot be drawn (see above).
        TypeError: for a keyword that :func:`~d2lmini.probes.probe_depth` does not take.
    """

    def __init__(self, max_depth: int = 64, depth: int = 32, *, placement: str = "post", norm: str = "layer",
                 placements=PROBED_PLACEMENTS, streams=EXPLORED_STREAMS, num_streams: int = 4,
                 max_bytes: int = 2 * 2**30, **probe_kwargs):
        import inspect

        import ipywidgets as widgets

        max_depth = check_positive_int("max_depth", max_depth)
        check_int_in("depth", depth, 1, max_depth)
        hyper = HYPER_PLACEMENT in placements
        placements, norms, streams = _check_explorer_placements(placements, ("rms",) if hyper else COMPARED_NORMS,
                                                                streams)
        check_choice("placement", placement, placements)
        check_choice("norm", norm, norms)
        allowed = (set(inspect.signature(probe_depth).parameters)
                   - {"placement", "norm", "depth", "sublayer_norm_gain", "num_streams"})
        unknown = sorted(set(probe_kwargs) - allowed)
        if unknown:
            raise TypeError(f"unknown probe_depth arguments {unknown}; allowed: {sorted(allowed)}")
        self.max_depth = max_depth
        self.max_bytes = check_positive_int("max_bytes", max_bytes)
        self.probe_kwargs = probe_kwargs
        self._cache = {}   # (placement, norm, depth) or, for mHC, (placement, norm, depth, streams) -> DepthProbe
        self._frames = {}  # (placement, norm, depth[, streams]) -> PNG bytes
        self.depth_slider = widgets.IntSlider(value=depth, min=1, max=max_depth, description="depth L",
                                              continuous_update=False)
        labels = HYPER_EXPLORER_LABELS if hyper else PLACEMENT_LABELS
        self.placement_dropdown = widgets.Dropdown(
            options=[(labels[p], p) for p in placements], value=placement,
            description="placement")
        self.norm_toggle = widgets.ToggleButtons(options=[(NORM_LABELS[n], n) for n in norms],
                                                 value=norm, description="norm")
        self.streams_slider = None
        controls = [self.depth_slider, self.placement_dropdown, self.norm_toggle]
        if hyper:
            if num_streams not in streams:
                raise ValueError(f"num_streams must be one of streams={streams}, got {num_streams!r}")
            self.streams_slider = widgets.SelectionSlider(options=list(streams), value=num_streams,
                                                          description="streams n", continuous_update=False)
            controls.append(self.streams_slider)
        self.image = widgets.Image(format="png")
        self.message = widgets.HTML(value="")
        self.fig, self.axes = new_figure(3, width=10.0, height=3.4)
        for control in controls:
            control.observe(self._on_change, names="value")
        top = [self.placement_dropdown, self.depth_slider] + ([self.streams_slider] if hyper else [])
        self.widget = widgets.VBox([widgets.HBox(top), self.norm_toggle, self.image, self.message])
        self.image.value = self.frame(*self._chosen())  # a bad initial configuration raises here

    def probe(self, placement: str, norm: str, depth: int, num_streams: int | None = None):
        """The (cached) :class:`~d2lmini.probes.DepthProbe` for one configuration (``num_streams``: mHC only)."""
        key = (placement, norm, depth) if placement != HYPER_PLACEMENT else (placement, norm, depth, num_streams)
        if key not in self._cache:
            self._check_memory(placement, depth, num_streams)
            self._cache[key] = _probe_one(placement, norm, depth, num_streams, self.probe_kwargs)
        return self._cache[key]

    def _check_memory(self, placement: str, depth: int, num_streams: int | None) -> None:
        import inspect

        defaults = inspect.signature(probe_depth).parameters
        sizes = {name: self.probe_kwargs.get(name, defaults[name].default)
                 for name in ("num_hiddens", "num_heads", "num_steps", "dtype")}
        streams = num_streams if placement == HYPER_PLACEMENT else 1
        needed = probe_memory_bytes(depth, num_streams=streams or 1, **sizes)
        if needed > self.max_bytes:
            raise ValueError(f"depth {depth} with these sizes needs about {_in_units(needed)}, over this "
                             f"explorer's {_in_units(self.max_bytes)} (max_bytes): choose a smaller depth")

    def _chosen(self) -> tuple:
        """The controls' values: (placement, norm, depth, streams or None)."""
        streams = None if self.streams_slider is None else self.streams_slider.value
        return self.placement_dropdown.value, self.norm_toggle.value, self.depth_slider.value, streams

    def _on_change(self, change) -> None:
        self.update()

    def frame(self, placement: str, norm: str, depth: int, num_streams: int | None = None) -> bytes:
        """The PNG picture of one configuration, drawn once and then cached."""
        key = (placement, norm, depth) if self.streams_slider is None else (placement, norm, depth, num_streams)
        if key not in self._frames:
            self._draw(placement, norm, depth, num_streams)
            self._frames[key] = figure_png(self.fig)
        return self._frames[key]

    def update(self) -> None:
        """Show the picture for the controls' current values; if it cannot be drawn, say why instead."""
        import html

        try:
            picture = self.frame(*self._chosen())
        except (ValueError, TypeError, RuntimeError, MemoryError) as error:  # the kernel must go on
            self.message.value = (f'<span style="color: #b00020;">This configuration cannot be drawn: '
                                  f'{html.escape(str(error))}</span>')
            return
        self.message.value = ""
        self.image.value = picture

    def _draw(self, placement: str, norm: str, depth: int, num_streams: int | None = None) -> None:
        import matplotlib

        result = self.probe(placement, norm, depth, num_streams)
        color = PLACEMENT_COLORS[placement]
        ks = range(depth + 1)
        blocks = range(1, depth + 1)
        with matplotlib.rc_context(STYLE):
            for ax in self.axes:
                ax.clear()
            rms, spread, grads = self.axes
            rms.plot(ks, result.stream_rms, color=color)
            rms.set(xlabel="depth k", ylabel="stream RMS", title="Size of the stream",
                    ylim=(0, max(1.5, 1.15 * max(result.stream_rms))))
            spread.semilogy(ks, result.token_spread, color=color)
            spread.set(xlabel="depth k", ylabel="token spread", title="Token spread", ylim=(1e-6, 2.0))
            if self.streams_slider is not None:  # the other configuration, dashed, for comparison
                other, n = _reference(placement, num_streams)
                reference = self.probe(other, norm, depth, n)
                for ax, values in ((rms, reference.stream_rms), (spread, reference.token_spread)):
                    ax.lines[0].set_label(_config_label(placement, num_streams))
                    ax.plot(ks, values, color=PLACEMENT_COLORS[other], linestyle="--", label=_config_label(other, n))
                    ax.legend(loc="lower left", fontsize=8)
                rms.set_ylim(0, max(1.5, 1.15 * max(result.stream_rms + reference.stream_rms)))
            for name in ATTENTION_WEIGHTS:
                grads.semilogy(blocks, result.grad_norms[name], color=WEIGHT_COLORS[name], label=name,
                               linestyle="--" if name in ("W_k", "W_o") else "-",
                               marker="." if depth < 16 else None)
            grads.set(xlabel="depth k", ylabel="gradient norm", title="Gradient per block")
            grads.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
            for ax in self.axes:
                ax.set_xlim(0, self.max_depth)
                ax.grid(True, alpha=0.3)
            name = (_config_label(placement, num_streams) if self.streams_slider is not None
                    else PLACEMENT_LABELS[placement])
            self.fig.suptitle(f"{name}, {NORM_LABELS[norm]}, "
                              f"L = {depth}: RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                              f"top-block q,k/v,o gradient ratio {result.qk_vo_ratio(depth):.1e}", fontsize=10)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def depth_explorer(**kwargs) -> DepthExplorer:
    """Make a :class:`DepthExplorer` (see there for the arguments); display it to use it."""
    return DepthExplorer(**kwargs)


def depth_explorer_static(depths=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), placements=PROBED_PLACEMENTS,
                          norms=COMPARED_NORMS, depth: int = 32, placement: str = "post", norm: str = "layer",
                          streams=EXPLORED_STREAMS, num_streams: int = 4, known=(), **probe_kwargs) -> StaticTwin:
    """The static twin of :class:`DepthExplorer`: the same three panels on a grid of depths.

    Each (placement, norm, depth) on the grid is probed once with
    :func:`d2lmini.chapters.ch04_norm_placement.probe_placements` and its curves are embedded; the page
    redraws them when a control moves. With ``'mhc'`` among ``placements`` the norm control
    gives way to a streams slider (mHC uses RMSNorm: ``norms`` must be ``('rms',)``), every
    (placement, depth, streams) is a frame, and the first two panels also draw the other
    configuration dashed, as :class:`DepthExplorer` does.

    Args:
        depths: the depth slider's stops.
        placements, norms: the dropdowns' options (with a single norm there is no norm control).
        depth, placement, norm: the initial values.
        streams, num_streams: the streams slider's stops and initial value (with ``'mhc'`` only).
        known: :class:`~d2lmini.probes.DepthProbe` results already measured (e.g. a chapter's
            depth-32 probes). One whose ``config`` is exactly what this twin would probe for its
            (placement, norm, depth) -- same sizes, seed and dtype -- is used for that frame
            instead of probing again; any other is ignored. Probes are deterministic, so the
            frames are the same either way.
        **probe_kwargs: passed to :func:`~d2lmini.probes.probe_depth` (sizes, seed, dtype).

    Returns:
        A :class:`StaticTwin` (display it, or call ``to_html()``).

    Raises:
        ValueError: for an unknown placement or norm, or ``'mhc'`` with ``norms`` other than ``('rms',)``.
        TypeError: if ``known`` holds something other than a ``DepthProbe``.
    """
    placements, norms, streams = _check_explorer_placements(placements, norms, streams)
    hyper = HYPER_PLACEMENT in placements
    cache = {}
    for result in known:
        check_instance("known", result, DepthProbe, "a DepthProbe")
        key = (result.key, result.config["norm"], result.depth)
        if result.key != HYPER_PLACEMENT and result.config == _probe_config(*key, probe_kwargs):
            cache[key + (None,)] = result

    def probe(p, n, L, s):
        key = (p, n, L, s if p == HYPER_PLACEMENT else None)
        if key not in cache:
            cache[key] = _probe_one(p, n, L, s, probe_kwargs)
        return cache[key]

    frames = {}
    for p in placements:
        for n in norms:
            for L in depths:
                for s in (streams if hyper else (None,)):
                    result = probe(p, n, L, s)
                    grads = [dict(y=round_frame_values(result.grad_norms[w]), x0=1, color=WEIGHT_COLORS[w], label=w,
                                  dash=w in ("W_k", "W_o")) for w in ATTENTION_WEIGHTS]
                    panels = [[dict(y=round_frame_values(result.stream_rms), x0=0, color=PLACEMENT_COLORS[p])],
                              [dict(y=round_frame_values(result.token_spread), x0=0, color=PLACEMENT_COLORS[p])],
                              grads]
                    if hyper:  # the other configuration, dashed, in the first two panels
                        other, s_other = _reference(p, s)
                        reference = probe(other, n, L, s_other)
                        for panel, values, mine in ((panels[0], reference.stream_rms, result.stream_rms),
                                                    (panels[1], reference.token_spread, result.token_spread)):
                            panel[0]["label"] = _config_label(p, s)
                            panel.append(dict(y=round_frame_values(values), x0=0, color=PLACEMENT_COLORS[other],
                                              dash=True, label=_config_label(other, s_other)))
                    name = _config_label(p, s) if hyper else PLACEMENT_LABELS[p]
                    key = f"{p}|{L}|{s}" if hyper else f"{p}|{L}|{n}" if len(norms) > 1 else f"{p}|{L}"
                    frames[key] = dict(
                        title=(f"{name}, {NORM_LABELS[n]}, L = {L}: "
                               f"RMS {result.stream_rms[-1]:.2f}, spread {result.token_spread[-1]:.1e}, "
                               f"q,k/v,o gradient ratio {result.qk_vo_ratio(L):.1e}"),
                        panels=panels)
    controls = [
        dict(name="placement", label="placement", type="select",
             options=[[p, (HYPER_EXPLORER_LABELS if hyper else PLACEMENT_LABELS)[p]] for p in placements],
             value=placement),
        dict(name="depth", label="depth L", type="range", values=list(depths), value=depth),
        dict(name="streams", label="streams n", type="range", values=list(streams), value=num_streams) if hyper else
        dict(name="norm", label="norm", type="select", options=[[n, NORM_LABELS[n]] for n in norms], value=norm),
    ]
    if not hyper and len(norms) == 1:  # one norm: no control that cannot move
        controls.pop()
    panels = [dict(title="Size of the stream", xlabel="depth k", ylabel="stream RMS", log=False,
                   xmin=0, xmax=max(depths), ymin=0),
              dict(title="Token spread", xlabel="depth k", ylabel="token spread", log=True,
                   xmin=0, xmax=max(depths), ymin=1e-6, ymax=1.0),
              dict(title="Gradient per block", xlabel="block k", ylabel="gradient norm", log=True,
                   xmin=0, xmax=max(depths))]
    return StaticTwin(controls, panels, frames=frames, width=960, height=320,
                      description="Stream RMS, token spread and per-block gradient norms of a fresh stack")
