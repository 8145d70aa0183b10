"""Timing harness for the norms of the chapter "RMSNorm": medians measured in a fresh process.

Kept apart from the chapter's experiments: it knows about clocks, threads, allocator
settings and subprocesses, none of which is the subject of the book.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import KW_ONLY, dataclass, field

import torch
from torch import nn

from ._checks import (check_bool, check_choice, check_instance, check_nonnegative_int, check_positive_int, check_seed,
                      check_sequence)
from .norms import DEFAULT_EPS, LayerNormByHand, RMSNorm
from .seeding import seeded

#: The epsilon of the timed RMSNorms.
EPS = DEFAULT_EPS["rms"]


#: Clocks :func:`time_norms` can read: CPU time of the calling thread, or wall-clock time.
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}


def machine_description() -> dict:
    """Where a timing ran: processor, machine, torch version, threads and load.

    ``platform.processor()`` is often empty on Linux; the ``model name`` line of
    ``/proc/cpuinfo`` is used then.

    Introduced in the chapter "RMSNorm".

    Returns:
        A dict with keys ``"processor"``, ``"machine"``, ``"torch"`` (strings),
        ``"threads"``, ``"cpu_count"`` (ints) and ``"load_avg_1min"`` (a float, or
        ``None`` where the system does not report it).
    """
    processor = platform.processor()
    if not processor:
        try:
            with open("/proc/cpuinfo") as f:
                processor = next((line.split(":", 1)[1].strip() for line in f
                                  if line.startswith("model name")), "")
        except OSError:
            processor = ""
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"processor": processor or "unknown", "machine": platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count() or 0, "load_avg_1min": load}

#: The packages whose releases :func:`build_environment` reports.
BUILD_PACKAGES = ("torch", "jupyter-book", "myst-nb", "transformers", "numpy", "d2lmini")


def build_environment(packages=BUILD_PACKAGES) -> dict:
    """What a build of the book ran on: Python, the releases of ``packages``, CPU, GPU, threads.

    Shown on the book's execution statistics page; the machine part is
    :func:`machine_description`.

    Args:
        packages: distribution names; one that is not installed reads ``"not installed"``.

    Returns:
        An ordered dict of strings: ``"Python"``, one entry per package, ``"CPU"``,
        ``"GPU"`` and ``"torch threads"``.
    """
    import importlib.metadata

    def release(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    machine = machine_description()
    return {"Python": platform.python_version(), **{name: release(name) for name in packages},
            "CPU": f"{machine['processor']}, {machine['machine']} ({machine['cpu_count']} logical cores)",
            "GPU": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "torch threads": str(machine["threads"])}


#: Operations :func:`forward_ops` leaves out: memory bookkeeping and dtype casts that
#: touch no data here, and the wrappers that only dispatch to the real kernels.
BOOKKEEPING_OPS = {"aten::to", "aten::_to_copy", "aten::empty", "aten::empty_strided", "aten::view",
                   "aten::result_type", "aten::fill_", "aten::copy_", "aten::type_as",
                   "aten::detach", "aten::reshape", "aten::expand", "aten::as_strided"}


WRAPPER_OPS = {"aten::rms_norm", "aten::_fused_rms_norm", "aten::layer_norm"}


def forward_ops(norm: nn.Module, X: torch.Tensor) -> list[str]:
    """The PyTorch operations a norm's forward runs, outermost first, in call order.

    Records one forward pass (under ``torch.no_grad()``) with PyTorch's profiler and
    keeps each ATen operation that is not bookkeeping (:data:`BOOKKEEPING_OPS`) or a
    dispatch wrapper (:data:`WRAPPER_OPS`) and not called from inside one already kept:
    a fused kernel appears once (``native_layer_norm``), a composed norm as its
    sequence of elementwise operations and reductions (``pow``, ``mean``, ...).
    The ``aten::`` prefix is removed.

    Introduced in the chapter "RMSNorm".

    Args:
        norm: a module mapping ``(*, d)`` to ``(*, d)``.
        X: an input for it.

    Returns:
        A list of operation names.

    Raises:
        TypeError: if ``norm`` is not an ``nn.Module`` or ``X`` not a tensor.
    """
    check_instance("norm", norm, nn.Module, "a torch.nn.Module")
    check_instance("X", X, torch.Tensor, "a torch.Tensor")
    try:  # the legacy CPU profiler starts in milliseconds, Kineto's first start takes seconds
        with torch.autograd.profiler.profile(use_kineto=False) as prof, torch.no_grad():
            norm(X)
    except (TypeError, RuntimeError):  # pragma: no cover - a PyTorch without the legacy profiler
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            norm(X)
    kept, names = set(), []
    events = getattr(prof, "function_events", None)  # the legacy profiler's; may be empty
    if events is None:
        events = prof.events()
    for event in sorted(events, key=lambda e: e.time_range.start):
        if not event.name.startswith("aten::") or event.name in BOOKKEEPING_OPS | WRAPPER_OPS:
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            inside = inside or id(parent) in kept
            parent = parent.cpu_parent
        if not inside:
            kept.add(id(event))
            names.append(event.name.removeprefix("aten::"))
    return names


@dataclass
class NormTiming:
    """The result of :func:`time_norms`.

    Introduced in the chapter "RMSNorm".

    Attributes:
        shape: the input's shape ``(batch, num_steps, num_hiddens)``.
        repeats: timed rounds per mode (each round runs every norm once, alternating).
        times_ms: mode (``"forward"``, ``"forward_backward"``) -> norm key (see
            :data:`TIMED_NORMS`) -> median time in milliseconds.
        machine: :func:`machine_description` of the process that measured.
        clock: ``"thread"`` (CPU time of the timing thread) or ``"wall"``.
        page_faults: mode -> norm key -> median number of minor page faults per call
            (Linux only; ``None`` elsewhere). Zero means the time is the norm's own work.
        fresh_process: whether the measurement ran in a fresh Python process.
        ops: norm key -> :func:`forward_ops` of that norm (empty if not recorded).
    """

    shape: tuple[int, ...]
    repeats: int
    _: KW_ONLY
    times_ms: dict[str, dict[str, float]]
    machine: dict
    clock: str = "thread"
    page_faults: dict | None = None
    fresh_process: bool = False
    ops: dict[str, list[str]] = field(default_factory=dict)

    def ratio(self, numerator: str, denominator: str, mode: str = "forward") -> float:
        """``times_ms[mode][numerator] / times_ms[mode][denominator]``.

        Raises:
            KeyError: naming the mode or norm if it was not timed.
        """
        if mode not in self.times_ms:
            raise KeyError(f"mode must be one of {tuple(self.times_ms)}, got {mode!r}")
        times = self.times_ms[mode]
        for key in (numerator, denominator):
            if key not in times:
                raise KeyError(f"norm must be one of {tuple(times)}, got {key!r}")
        return times[numerator] / times[denominator]

    def table(self):
        """A pandas DataFrame of the median times (ms): one row per norm, one column per mode."""
        import pandas as pd

        keys = list(next(iter(self.times_ms.values())))
        return pd.DataFrame({f"{mode.replace('_', ' + ')} (ms)": [times[k] for k in keys]
                             for mode, times in self.times_ms.items()},
                            index=[TIMED_NORMS[k] for k in keys])


#: Environment of the fresh process :func:`time_norms` measures in: glibc's malloc
#: keeps freed blocks (up to 256 MiB) instead of handing them back to the system.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def time_norms(shape=(4, 256, 1024), repeats: int = 31, warmup: int = 3, num_threads: int = 1,
               clock: str = "thread", fresh_process: bool = True, seed: int = 0) -> NormTiming:
    """Median forward and forward + backward times of four norms, measured in one run.

    The norms (:data:`TIMED_NORMS`): ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``
    (PyTorch's own), :class:`d2lmini.RMSNorm`, and :class:`LayerNormByHand`, a LayerNorm
    written with the same operations as ``d2lmini.RMSNorm``. All run in float32 on the
    CPU, on the same input. Every round runs each norm once in turn, so all four see
    the same machine state; the median over ``repeats`` rounds is kept. Forward runs
    under ``torch.no_grad()``; forward + backward computes the gradient with respect
    to the input and the parameters for a fixed random output gradient.

    The numbers are times on whatever machine runs this (see
    :func:`machine_description`); on a shared machine they are noisy, and only ratios
    measured in the same run are worth comparing. Two precautions make them
    repeatable on a busy machine:

    * ``clock="thread"`` measures the CPU time of the calling thread
      (``time.thread_time``), which leaves out the time the operating system gives to
      other processes. It counts all of a norm's work only with one intra-op thread,
      so ``num_threads=1`` is the default. ``clock="wall"`` reads ``time.perf_counter``.
    * glibc's ``malloc`` hands large freed blocks back to the system, and the next
      allocation pays page faults for fresh zeroed pages; which norm pays depends on
      the order of the calls, and the kernel time can exceed the norm's arithmetic.
      With ``fresh_process=True`` the measurement runs in a new Python process whose
      malloc keeps freed memory (:data:`MALLOC_ENV`); the median page faults per call
      are recorded so you can check (Linux). The fresh process also lists each norm's
      :func:`forward_ops` (the profiler's messages stay in that process).

    Introduced in the chapter "RMSNorm".

    Args:
        shape: input shape ``(batch, num_steps, num_hiddens)``, positive ints.
        repeats: timed rounds per mode (>= 1; odd gives a true median).
        warmup: untimed rounds before timing, >= 0.
        num_threads: ``torch.set_num_threads`` for the measurement, >= 1 (restored
            afterwards when measuring in this process).
        clock: ``"thread"`` (CPU time of this thread) or ``"wall"`` (wall clock).
        fresh_process: measure in a new Python process (about a second or two to start)
            instead of this one.
        seed: seeds the input (the global RNG is left untouched).

    Returns:
        A :class:`NormTiming`.

    Raises:
        TypeError / ValueError: for a shape that is not three positive ints, or bad
            ``repeats``/``warmup``/``num_threads``/``clock``/``fresh_process``/``seed``
            (TypeError for a value of the wrong kind, e.g. ``warmup=1.5``; ValueError for
            one out of range, e.g. ``warmup=-1``).
        RuntimeError: if the fresh process fails (its error output is included).
    """
    shape = tuple(check_sequence("shape", shape, check_positive_int, "positive ints"))
    if len(shape) != 3:
        raise ValueError(f"shape must be three positive ints (batch, num_steps, num_hiddens), got {shape!r}")
    repeats = check_positive_int("repeats", repeats)
    warmup = check_nonnegative_int("warmup", warmup)
    num_threads = check_positive_int("num_threads", num_threads)
    check_choice("clock", clock, CLOCKS)
    check_bool("fresh_process", fresh_process)
    seed = check_seed(seed)
    config = {"shape": list(shape), "repeats": repeats, "warmup": warmup,
              "num_threads": num_threads, "clock": clock, "seed": seed, "ops": fresh_process}
    if fresh_process:
        result = _measure_in_fresh_process(config)
    else:
        threads_before = torch.get_num_threads()
        try:
            result = _measure(config)
        finally:
            torch.set_num_threads(threads_before)
    return NormTiming(shape=shape, repeats=repeats, times_ms=result["times_ms"],
                      machine=result["machine"], clock=clock, page_faults=result["page_faults"],
                      fresh_process=fresh_process, ops=result["ops"])


def _measure_in_fresh_process(config: dict) -> dict:
    import json
    import subprocess
    import sys

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **MALLOC_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    code = ("import json, sys; from d2lmini.timing import _measure; "
            "print(json.dumps(_measure(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(config)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the timing process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _thread_faults():
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    except (ImportError, AttributeError, OSError):
        return None


def median_times(norms: dict, step, repeats: int, warmup: int, now) -> tuple[dict, dict]:
    """Time ``step(norm)`` for every norm in ``norms``, in turn, and keep the medians.

    ``warmup`` untimed rounds, then ``repeats`` timed rounds, each of which calls every
    norm once, so all of them see the same state of the machine; ``now`` is the clock
    (:data:`CLOCKS`). Returns ``{key: median milliseconds}`` and ``{key: median page
    faults per call}`` (``None`` where the system does not count them); an error of
    ``step`` propagates. Chapter "RMSNorm" (whose speed-up Zhang & Sennrich, 2019 report).
    """
    samples = {key: [] for key in norms}
    fault_counts = {key: [] for key in norms}
    for _ in range(warmup):
        for norm in norms.values():
            step(norm)
    for _ in range(repeats):
        for key, norm in norms.items():
            faults_before = _thread_faults()
            start = now()
            step(norm)
            samples[key].append(now() - start)
            if faults_before is not None:
                fault_counts[key].append(_thread_faults() - faults_before)
    times_ms = {key: 1e3 * statistics.median(v) for key, v in samples.items()}
    return times_ms, {key: statistics.median(v) if v else None for key, v in fault_counts.items()}


def _measure(config: dict) -> dict:
    """Run one timing described by ``config`` in this process (see :func:`time_norms`)."""
    torch.set_num_threads(config["num_threads"])
    shape, now = tuple(config["shape"]), CLOCKS[config["clock"]]
    d = shape[-1]
    norms = {"layer_torch": nn.LayerNorm(d), "rms_torch": nn.RMSNorm(d, eps=EPS),
             "rms_d2lmini": RMSNorm(d, eps=EPS), "layer_by_hand": LayerNormByHand(d)}
    with seeded(config["seed"]):
        X, grad = torch.randn(*shape), torch.randn(*shape)

    def forward(norm):
        with torch.no_grad():
            norm(X)

    def forward_backward(norm):
        Z = X.detach().requires_grad_(True)
        norm(Z).backward(grad)
        norm.zero_grad(set_to_none=True)

    times_ms, faults = {}, {}
    for mode, step in (("forward", forward), ("forward_backward", forward_backward)):
        times_ms[mode], faults[mode] = median_times(norms, step, config["repeats"], config["warmup"], now)
    if all(v is None for mode in faults.values() for v in mode.values()):
        faults = None
    ops = {key: forward_ops(norm, X) for key, norm in norms.items()} if config.get("ops") else {}
    return {"times_ms": times_ms, "page_faults": faults, "machine": machine_description(), "ops": ops}


#: The norms :func:`time_norms` times, by key, with a label for tables and prose.
TIMED_NORMS = {
    "layer_torch": "torch.nn.LayerNorm",
    "rms_torch": "torch.nn.RMSNorm",
    "rms_d2lmini": "d2lmini.RMSNorm",
    "layer_by_hand": "LayerNormByHand",
}
