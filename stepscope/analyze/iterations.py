"""Iterations without ProfilerStep: step spans inferred from the loop's repeating structure, and the set-up.

A trace recorded without a schedule (a plain ``with profile():`` around a loop, torch's autograd-profiler
examples) has no ``ProfilerStep#N``. The loop still leaves one marker per iteration on its main thread; the
strongest signal found, in this order, gives the iteration spans, which then go through the one step-window
rule (`window.step_windows`) exactly as ProfilerStep spans do, so steps, gaps, overlap, transfers, memory and
the verdict all get per-iteration figures without knowing where the spans came from:

    signal           marker (on the main thread)                                          anchored at
    optimizer_step   outermost ``Optimizer.step#…`` annotations of one name (the most      its end
                     frequent; ties: the one ending last, e.g. an EMA after the optimizer)
    optimizer_ops    runs of ``aten::_foreach_*`` (not ``_foreach_zero_``: that is          its end
                     zero_grad) / ``aten::_fused_adam…`` ops with no backward op
                     (``autograd::engine::evaluate_function: …``) starting between them
    dataloader       ``enumerate(DataLoader)#…__next__`` annotations                      its start
    annotation       outermost user annotations of one name (the most frequent; ties:      its start
                     the first seen), the signals above and ProfilerStep excluded
    module           outermost ``nn.Module: X`` frames of one name (same choice)          its start

A signal counts from MIN_MARKERS markers; where a one-per-iteration signal (optimizer, DataLoader) appears
once, the trace holds one iteration and nothing is inferred (a weaker signal's repeats there, say three
all-reduce annotations, are not iterations). The main thread is the one with the most outermost CPU-op time outside the
autograd engine's nodes (`main_thread`). "Outermost" is among the signal's
own events on that thread: the 25 ``GraphModule`` calls inside one vLLM forward are one forward, not 25.

**End-anchored** (the optimizer ends the iteration): iteration k runs from the end of marker k-1 to the end
of marker k; the first from the main thread's first event. **Start-anchored**: from the start of marker k
to the start of marker k+1; the last to the end of the main thread's last op or annotation (Python frames such
as the profiler's own ``__exit__`` do not extend it). A last DataLoader call with no op after it opens no
iteration: it is the ``StopIteration`` that ends a ``for`` loop (or the batch a ``break`` left unused).

    main thread: [setup 0-50][fwd 50-70][bwd 70-90][Optimizer.step 90-100][fwd 100-120][bwd][Optimizer.step 140-150]
    -> optimizer_step, iterations 1 [0, 100), 2 [100, 150)

**Set-up** (warm-up): the first of at least two inferred iterations is one-time set-up when its span is at
least WARMUP_RATIO times the median of the others (stream/event creation, ``cudaMalloc``, cuDNN autotuning,
lazy module initialization, a model built inside the profiled block); it is reported (`Warmup`, with the
set-up calls found in it) and left out of the spans, so no steady-state figure counts it. ProfilerStep
traces are left as they are: a schedule's warm-up steps are already outside them, and `steps` flags a slow
step as an outlier.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import polars as pl

from stepscope.analyze._text import duration
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import STEP_NAME_PATTERN, Trace

MIN_MARKERS = 2
WARMUP_RATIO = 2.0

OPTIMIZER_STEP_PATTERN = r"^Optimizer\.step#"
OPTIMIZER_OPS_PATTERN = r"^aten::(_foreach_\w+|_fused_(adam|adamw|sgd|adagrad)\w*)$"
ZERO_GRAD_OPS_PATTERN = r"^aten::_foreach_zero_$"
BACKWARD_OP_PATTERN = r"^autograd::engine::evaluate_function: "
DATALOADER_NEXT_PATTERN = r"^enumerate\(DataLoader\)#"
MODULE_PREFIX = "nn.Module: "
#: annotations that are another signal's, the profiler's own, a collective's (torch names every one), or the step
NOT_ITERATION_ANNOTATIONS = (rf"^(Optimizer\.|enumerate\(DataLoader\)#|\[pytorch\|profiler|nccl:|gloo:|c10d::)|"
                             rf"{STEP_NAME_PATTERN}")

#: one-time set-up calls: stream/event creation, allocation, cuDNN autotuning, module loading, handles
SETUP_CALL_PATTERN = (
    r"^(cudaStreamCreate|cudaEventCreate|cudaFree$|cudaMalloc|cudaHostAlloc|cudaHostRegister|cudnnFind|"
    r"cudnnCreate|cublasCreate|cublasLtCreate|cuModuleLoad|cuLibraryLoad|cudaGetDeviceProperties|"
    r"cudaFuncGetAttributes|cuModuleGetFunction|hipStreamCreate|hipEventCreate|hipFree$|hipMalloc|"
    r"hipHostMalloc|hipModuleLoad|miopenFind)"
)

SPAN_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "ts_ns": pl.Int64(), "dur_ns": pl.Int64(), "end_ns": pl.Int64(), "pid": pl.String(),
    "tid": pl.String(), "event_id": pl.Int64(),
}


class Signal(str, enum.Enum):
    """Where a trace's step spans come from (strongest inferred signal first)."""

    PROFILER_STEP = "profiler_step"
    OPTIMIZER_STEP = "optimizer_step"
    OPTIMIZER_OPS = "optimizer_ops"
    DATALOADER = "dataloader"
    ANNOTATION = "annotation"
    MODULE = "module"


#: signals with exactly one marker per training iteration: where one of them appears once, the trace holds one
#: iteration, and a weaker signal's repeats (three all-reduce annotations, a module called twice) are not iterations
ONE_PER_ITERATION = (Signal.OPTIMIZER_STEP, Signal.OPTIMIZER_OPS, Signal.DATALOADER)

_DESCRIPTION = {
    Signal.OPTIMIZER_STEP: "Optimizer.step annotations", Signal.OPTIMIZER_OPS: "optimizer ops",
    Signal.DATALOADER: "DataLoader __next__ calls", Signal.ANNOTATION: "repeated top-level annotations",
    Signal.MODULE: "repeated top-level module calls",
}


@dataclass(frozen=True, kw_only=True)
class Warmup:
    """The first inferred iteration, found to be one-time set-up and left out of the step spans.

    `setup_ns` is its span beyond the median of the others; `setup_calls` the one-time set-up calls in it
    (name, calls, total_ns; any thread), most time first: what the set-up was, where the trace says."""

    step: int
    wall_ns: int
    median_ns: int
    setup_ns: int
    setup_calls: pl.DataFrame

    @property
    def text(self) -> str:
        """One line: "first iteration: 4.4 s of set-up, excluded (4.6 s against a median of 210 ms; cudnnFind… ×12)"."""
        calls = ", ".join(f"{n} ×{c}" for n, c in self.setup_calls.select("name", "calls").head(3).iter_rows())
        return (f"first iteration: {duration(self.setup_ns)} of set-up, excluded ({duration(self.wall_ns)} against "
                f"a median of {duration(self.median_ns)}{'; ' + calls if calls else ''})")


@dataclass(frozen=True, kw_only=True)
class Iterations:
    """A trace's step spans and where they come from.

    `spans`: every iteration (SPAN_SCHEMA: step, ts_ns, dur_ns, end_ns, pid, tid, event_id: the CPU span on the
    main thread and the marker's event), the set-up one included; `steady` the ones the step windows use.
    `signal` is None where the trace has neither ProfilerStep nor a usable repeating structure."""

    signal: Signal | None
    marker: str | None
    markers: int
    spans: pl.DataFrame
    warmup: Warmup | None

    @property
    def inferred(self) -> bool:
        """Whether the spans were inferred (no ProfilerStep in the trace) rather than read."""
        return self.signal not in (None, Signal.PROFILER_STEP)

    @property
    def steady(self) -> pl.DataFrame:
        """The spans without the set-up iteration: what `window.step_windows` turns into step windows."""
        return self.spans if self.warmup is None else self.spans.filter(pl.col("step") != self.warmup.step)

    @property
    def source(self) -> str:
        """In words: "ProfilerStep", "inferred from Optimizer.step annotations (Optimizer.step#SGD.step)", "none"."""
        if self.signal is None:
            return "none"
        if self.signal is Signal.PROFILER_STEP:
            return "ProfilerStep"
        return f"inferred from {_DESCRIPTION[self.signal]} ({self.marker})"


def main_thread(trace: Trace) -> tuple[str, str] | None:
    """(pid, tid) of the thread with the most outermost forward CPU-op time; None without CPU ops.

    Outermost ops only, so nesting does not count twice, and not the autograd engine's nodes
    (``autograd::engine::evaluate_function: …``, ops with a ``Fwd thread id``): a GPU run's backward thread
    holds more op time than the loop's own thread (every gradient's all-reduce runs there), and a CPU run's
    backward shares the loop's thread.
    """
    ends = pl.col("ts_ns") + pl.col("dur_ns")
    top = (
        trace.cpu_ops.filter(pl.col("dur_ns").is_not_null())
        .select("pid", "tid", "name", "fwd_thread_id", "ts_ns", "dur_ns")
        .sort(["pid", "tid", "ts_ns", "dur_ns"], descending=[False, False, False, True])
        .filter(~(pl.col("ts_ns") < ends.shift(1).cum_max().over("pid", "tid")).fill_null(False))
        .filter(pl.col("fwd_thread_id").is_null() & ~pl.col("name").str.contains(BACKWARD_OP_PATTERN))
        .group_by("pid", "tid").agg(ns=pl.col("dur_ns").sum(), n=pl.len())
        .sort("ns", "n", "pid", "tid", descending=[True, True, False, False]).head(1).collect(engine="in-memory")
    )
    return (str(top["pid"][0]), str(top["tid"][0])) if top.height else None


def _outermost(events: pl.DataFrame) -> pl.DataFrame:
    """The events (ts_ns, dur_ns, …; one thread) not inside an earlier-starting one of them, by start.

        a [0, 100) holds b [10, 20); c [100, 150) touches a  ->  a, c
    """
    ends = pl.col("ts_ns") + pl.col("dur_ns")
    return (events.sort(["ts_ns", "dur_ns"], descending=[False, True])
            .filter(~(pl.col("ts_ns") < ends.shift(1).cum_max()).fill_null(False)))


def _one_name(markers: pl.DataFrame, *, last: bool) -> pl.DataFrame:
    """The markers of the most frequent name; ties: the name seen last (`last`) or first."""
    if markers.height == 0:
        return markers
    by = markers.group_by("name").agg(n=pl.len(), at=pl.col("end_ns").max() if last else pl.col("ts_ns").min())
    best = by.sort(["n", "at"], descending=[True, last]).row(0, named=True)["name"]
    return markers.filter(pl.col("name") == best)


def _optimizer_runs(ops: pl.DataFrame, backward_starts: np.ndarray) -> pl.DataFrame:
    """Optimizer ops (outermost, by start) grouped into one marker per optimizer step: a new run begins where a
    backward op started since the previous op. name, ts_ns, end_ns, event_id per run."""
    if ops.height == 0:
        return ops.select("name", "ts_ns", "end_ns", "event_id")
    seen = np.searchsorted(backward_starts, ops["ts_ns"].to_numpy(), side="right")
    return (
        ops.with_columns(run=pl.Series(seen).rle_id())
        .group_by("run").agg(pl.col("name").first(), pl.col("ts_ns").min(), pl.col("end_ns").max(),
                             pl.col("event_id").first())
        .sort("ts_ns").drop("run")
    )


def _signals(trace: Trace, pid: str, tid: str) -> list[tuple[Signal, pl.DataFrame]]:
    """Each inferred signal's markers on the main thread (name, ts_ns, end_ns, event_id), strongest first."""
    on_main = (pl.col("pid") == pid) & (pl.col("tid") == tid) & pl.col("dur_ns").is_not_null()
    cols = ("name", "kind", "ts_ns", "dur_ns", "event_id")
    cpu = trace.cpu.filter(on_main).select(*cols).collect(engine="in-memory")
    annotations = cpu.filter(pl.col("kind") == Kind.USER_ANNOTATION.value)

    def markers(frame: pl.DataFrame) -> pl.DataFrame:
        return _outermost(frame).select("name", "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                                        event_id="event_id")

    # Optimizer.step and DataLoader annotations were cpu ops in older traces: any CPU kind counts
    optimizer = _one_name(markers(cpu.filter(pl.col("name").str.contains(OPTIMIZER_STEP_PATTERN))), last=True)
    ops = markers(cpu.filter(pl.col("kind") == Kind.CPU_OP.value)).filter(
        pl.col("name").str.contains(OPTIMIZER_OPS_PATTERN) & ~pl.col("name").str.contains(ZERO_GRAD_OPS_PATTERN))
    backward = (trace.cpu_ops.filter(pl.col("name").str.contains(BACKWARD_OP_PATTERN)).select("ts_ns")
                .collect(engine="in-memory")["ts_ns"].drop_nulls().sort().to_numpy())
    loader = markers(cpu.filter(pl.col("name").str.contains(DATALOADER_NEXT_PATTERN)))
    named = _one_name(markers(annotations.filter(~pl.col("name").str.contains(NOT_ITERATION_ANNOTATIONS))),
                      last=False)
    modules = _one_name(markers(cpu.filter((pl.col("kind") == Kind.PYTHON_FUNCTION.value)
                                           & pl.col("name").str.starts_with(MODULE_PREFIX))), last=False)
    op_starts = cpu.filter(pl.col("kind") == Kind.CPU_OP.value)["ts_ns"].sort().to_numpy()
    loader = _loader_groups(loader, op_starts)
    runs = _optimizer_runs(ops, backward)
    return [(Signal.OPTIMIZER_STEP, _per_loader_interval(optimizer, loader)),
            (Signal.OPTIMIZER_OPS, _per_loader_interval(runs, loader)),
            (Signal.DATALOADER, loader), (Signal.ANNOTATION, named), (Signal.MODULE, modules)]


def _regular_groups(group: np.ndarray) -> bool:
    """Whether `group` (each marker's group id, ascending from 0) forms groups of one size k >= 2, but for the
    last group, which may be smaller (a loop's last fetch: the StopIteration)."""
    sizes = np.bincount(group)
    return len(sizes) >= MIN_MARKERS and sizes[0] >= 2 and bool((sizes[:-1] == sizes[0]).all()) \
        and sizes[-1] <= sizes[0]


def _loader_groups(loader: pl.DataFrame, op_starts: np.ndarray) -> pl.DataFrame:
    """DataLoader markers (by start) with the calls of one iteration merged: consecutive calls with no CPU op
    starting between them, where that makes groups of one size k >= 2 (`_regular_groups`): a loop over
    ``zip(loader_a, loader_b)`` fetches twice per iteration. One marker per group (its first call's start, its last
    call's end); `children` per marker: the CPU ops inside its calls (a ``StopIteration`` fetch has none).

        calls 0-10, 10-20 | ops | 100-110, 110-120 | ops  ->  markers 0-20, 100-120
    """
    m = loader.sort("ts_ns")
    starts, ends = m["ts_ns"].to_numpy(), m["end_ns"].to_numpy()
    inside = np.searchsorted(op_starts, ends, side="left") - np.searchsorted(op_starts, starts, side="left")
    m = m.with_columns(children=pl.Series(inside, dtype=pl.Int64))
    if m.height < 2:
        return m
    # an op between call i's end and call i+1's start: call i+1 starts a new iteration
    between = np.searchsorted(op_starts, starts[1:], side="left") > np.searchsorted(op_starts, ends[:-1], side="left")
    group = np.concatenate([[0], np.cumsum(between)])
    if not _regular_groups(group):
        return m
    return (m.with_columns(group=pl.Series(group)).group_by("group", maintain_order=True)
            .agg(pl.col("name").first(), pl.col("ts_ns").first(), pl.col("end_ns").max(), pl.col("event_id").first(),
                 pl.col("children").sum())
            .drop("group"))


def _per_loader_interval(optimizer: pl.DataFrame, loader: pl.DataFrame) -> pl.DataFrame:
    """Optimizer markers, the last of each interval between DataLoader fetches where every interval holds the same
    number k >= 2 of them (a GAN's discriminator and generator steps, two optimizers of one class): one per
    iteration. Unchanged without such a regular pattern (gradient accumulation fetches several times per step)."""
    if optimizer.height < 2 or loader.height < MIN_MARKERS:
        return optimizer
    m = optimizer.sort("end_ns")
    interval = np.searchsorted(loader.sort("ts_ns")["ts_ns"].to_numpy(), m["ts_ns"].to_numpy(), side="right")
    if interval[0] == 0 or not _regular_groups(interval - interval[0]) or len(np.unique(interval)) != \
            interval[-1] - interval[0] + 1:
        return m
    return m.with_columns(interval=pl.Series(interval)).group_by("interval", maintain_order=True).last().drop(
        "interval")


def _spans(signal: Signal, markers: pl.DataFrame, thread_start: int, thread_ends: pl.DataFrame) -> pl.DataFrame:
    """step (1, 2, …), ts_ns, end_ns, event_id: the iterations the markers bound (module docstring)."""
    if signal in (Signal.OPTIMIZER_STEP, Signal.OPTIMIZER_OPS):
        spans = markers.sort("end_ns").select(ts_ns=pl.col("end_ns").shift(1).fill_null(thread_start),
                                              end_ns="end_ns", event_id="event_id")
    else:
        m = markers.sort("ts_ns")
        last_start, last_marker_end = int(m["ts_ns"][-1]), int(m["end_ns"][-1])
        tail = thread_ends.filter((pl.col("ts_ns") >= last_start) & pl.col("op"))
        last_end = max(last_marker_end, int(tail["end_ns"].max() or last_start))  # type: ignore[arg-type]
        spans = m.select("ts_ns", end_ns=pl.col("ts_ns").shift(-1).fill_null(last_end), event_id="event_id")
        body_after = tail.filter(pl.col("ts_ns") >= last_marker_end).height > 0
        # the StopIteration fetch: no op after it, or none inside it where the other fetches run ops (collate)
        empty_fetch = "children" in m.columns and int(m["children"][-1]) == 0 and \
            float(m["children"].head(-1).median() or 0) >= 1  # type: ignore[arg-type]
        if signal is Signal.DATALOADER and spans.height > 1 and (not body_after or empty_fetch):
            spans = spans.head(-1)
    return spans.with_columns(end_ns=pl.max_horizontal("end_ns", "ts_ns")).with_row_index("step", offset=1)


def _warmup(trace: Trace, spans: pl.DataFrame) -> Warmup | None:
    """The first span, when it is at least WARMUP_RATIO times the median of the others (module docstring)."""
    if spans.height < 2:
        return None
    walls = spans["dur_ns"]
    median = float(walls[1:].median() or 0.0)  # type: ignore[arg-type]
    first = spans.row(0, named=True)
    if median <= 0 or first["dur_ns"] < WARMUP_RATIO * median:
        return None
    inside = (pl.col("ts_ns") >= first["ts_ns"]) & (pl.col("ts_ns") < first["end_ns"])
    calls = (
        trace.events.filter(inside & pl.col("name").str.contains(SETUP_CALL_PATTERN))
        .group_by("name").agg(calls=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum().cast(pl.Int64))
        .sort(["total_ns", "name"], descending=[True, False]).collect(engine="in-memory")
    )
    return Warmup(step=int(first["step"]), wall_ns=int(first["dur_ns"]), median_ns=int(median),
                  setup_ns=int(first["dur_ns"] - median), setup_calls=calls)


def iterations(trace: Trace, profiler_steps: pl.DataFrame) -> Iterations:
    """The step spans of `trace`: its ProfilerStep spans (`profiler_steps`, `Trace.steps` collected) when it has
    any, else iterations inferred from the strongest repeating signal on the main thread, the set-up iteration
    found and set aside (module docstring); no spans where neither exists."""
    if profiler_steps.height:
        return Iterations(signal=Signal.PROFILER_STEP, marker="ProfilerStep#N", markers=profiler_steps.height,
                          spans=profiler_steps.select(list(SPAN_SCHEMA)).cast(SPAN_SCHEMA),  # type: ignore[arg-type]
                          warmup=None)
    none = Iterations(signal=None, marker=None, markers=0, spans=pl.DataFrame(schema=SPAN_SCHEMA), warmup=None)
    thread = main_thread(trace)
    if thread is None:
        return none
    pid, tid = thread
    found = next(((s, m) for s, m in _signals(trace, pid, tid)
                  if m.height >= MIN_MARKERS or (m.height and s in ONE_PER_ITERATION)), None)
    if found is None or found[1].height < MIN_MARKERS:
        return none
    signal, markers = found
    ends = trace.cpu.filter((pl.col("pid") == pid) & (pl.col("tid") == tid) & pl.col("dur_ns").is_not_null()).select(
        "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"), op=pl.col("kind") != Kind.PYTHON_FUNCTION.value).collect(
            engine="in-memory")
    thread_start = int(ends["ts_ns"].min())  # type: ignore[arg-type]
    spans = (
        _spans(signal, markers, thread_start, ends)
        .select("step", "ts_ns", dur_ns=pl.col("end_ns") - pl.col("ts_ns"), end_ns="end_ns", pid=pl.lit(pid),
                tid=pl.lit(tid), event_id="event_id")
        .cast(SPAN_SCHEMA)  # type: ignore[arg-type]
    )
    return Iterations(signal=signal, marker=str(markers["name"][0]), markers=markers.height, spans=spans,
                      warmup=_warmup(trace, spans))


__all__ = ["Iterations", "Signal", "Warmup", "iterations", "main_thread"]
