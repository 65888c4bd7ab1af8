"""The one step-window rule, and the analysis window built on it: where GPU idle time counts.

Every analysis that asks "which step is this in?" or "over which span is this a share?" takes its answer
from here: steps, gaps, overlap, transfers, summary and the timeline figure alike.

**Step window** (tb_plugin's rule): a step starts where its ``ProfilerStep#N`` span starts (or where the
previous step's window ended, if later) and ends at the later of its CPU end and the end of the last GPU
work it launched. GPU work belongs to the step whose CPU span holds its launch (runtime call); GPU work with
no launch link belongs to the step whose CPU span holds its start. This is what ``reference_figures.py``'s
``step_busy_us`` clips to.

    step 1 CPU [0, 100), its last kernel ends at 130; step 2 CPU [100, 200)
      -> windows [0, 130) and [130, 200)   (a step starts no earlier than the previous one ends)

GPU work launched before the trace began (by the warm-up step the profiler discarded, typically) has no
launch link and a correlation id below every recorded launch's: CUPTI and roctracer number API calls in
the order they are made. It belongs to no step, and it stands for the previous step: the first step starts
no earlier than it ends. So does the GPU work launched in an inferred set-up iteration that is left out
(`iterations.Warmup`). In a GPU-bound loop the CPU runs steps ahead of the GPU, so this queued work can
fill the first step's CPU span and more (`queued_until`).

    warm-up kernels (launched before the trace) run until 10.7 ms; step 2 CPU [0, 2.7 ms), its kernels end
    at 27.2 ms  ->  step 2's window [10.7, 27.2 ms), not [0, 27.2 ms)

The step spans are the trace's ``ProfilerStep#N`` spans, or, in a trace without them, the iterations inferred
from the loop's repeating structure, the set-up iteration left out (`stepscope.analyze.iterations`); the rule
does not tell them apart.

**The tail** (tb_plugin drops it too): trailing steps that launched no GPU work, where an earlier step did, are
left out (`idle_tail`; only where GPU work is linked to its launch calls). Without a schedule, ``prof.step()``
at the end of each iteration opens one more ``ProfilerStep#N`` that runs until the profiler stops: a span of the
loop's exit, not an iteration. A step whose GPU work the profiler did not capture is as little one to measure.

    step 1 CPU [0, 9.3 ms) launched 16 kernels; step 2 CPU [9.3, 9.35 ms) launched nothing
      -> step 2 left out: one step, 9.3 ms, not a mean of 4.7 ms over two

**Analysis window** (``window="steps"``, the default): the union of the step windows, the same for every
device; without steps (or with ``window="trace"``) a device's first to last GPU event.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze._text import duration, numbered
from stepscope.analyze.trace import Trace

WindowKind = Literal["steps", "trace"]

STEP_WINDOW_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "start_ns": pl.Int64(), "cpu_start_ns": pl.Int64(), "cpu_end_ns": pl.Int64(),
    "end_ns": pl.Int64(), "wall_ns": pl.Int64(), "cpu_ns": pl.Int64(), "pid": pl.String(), "tid": pl.String(),
}


def gpu_by_step(launches: pl.DataFrame, profiler_steps: pl.DataFrame) -> pl.DataFrame:
    """GPU events (`Trace.launches()` rows with a duration) with the step whose CPU span launched them.

    `profiler_steps` is `Trace.steps` collected. The key is the launch call's start, else the GPU event's
    own start; events outside every step's CPU span are dropped, and so is work launched before the trace
    began (`launched_before_trace`), wherever it runs.
    """
    spans = profiler_steps.select("step", s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).sort("s")
    gpu = launches.filter(pl.col("dur_ns").is_not_null() & ~launched_before_trace(launches)).select(
        "gpu_event_id", "kind", "name", "ts_ns", "dur_ns", "launch_ts_ns", "launch_tid", "launch_pid")
    key = pl.coalesce("launch_ts_ns", "ts_ns").alias("key")
    return (
        gpu.with_columns(key).sort("key")
        .join_asof(spans, left_on="key", right_on="s", strategy="backward")
        .filter(pl.col("key") < pl.col("e"))
        .drop("key", "s", "e")
    )


def launched_before_trace(launches: pl.DataFrame) -> pl.Expr:
    """Over `launches` (`Trace.launches()` collected): whether a GPU event was launched before the trace began.
    No launch link, and a correlation id below every recorded launch's (API calls are numbered in the order
    they are made). False throughout where nothing is linked: a trace without runtime events says nothing."""
    linked = launches.filter(pl.col("launch_ts_ns").is_not_null())["correlation"].min()
    if linked is None:
        return pl.lit(False)
    return (pl.col("launch_ts_ns").is_null() & (pl.col("correlation") < linked)).fill_null(False)


def queued_expr(launches: pl.DataFrame, setup: tuple[int, int] | None = None) -> pl.Expr:
    """Over `launches`: whether a GPU event is work the first step waits for: launched before the trace began
    (`launched_before_trace`), or inside the set-up iteration left out of the inferred steps (`setup`: its CPU
    span, `iterations.Warmup`), which stands for the previous step the same way."""
    queued = launched_before_trace(launches)
    if setup is None:
        return queued
    key = pl.coalesce("launch_ts_ns", "ts_ns")
    return queued | ((key >= setup[0]) & (key < setup[1])).fill_null(False)


def queued_until(launches: pl.DataFrame, setup: tuple[int, int] | None = None) -> int | None:
    """The end of the GPU work the first step waits for (`queued_expr`); None without any."""
    ends = launches.filter(queued_expr(launches, setup) & pl.col("dur_ns").is_not_null()).select(
        (pl.col("ts_ns") + pl.col("dur_ns")).max()).item()
    return int(ends) if ends is not None else None


def step_windows(profiler_steps: pl.DataFrame, launched: pl.DataFrame, *,
                 queued_until_ns: int | None = None) -> pl.DataFrame:
    """step, start_ns, cpu_start_ns, cpu_end_ns, end_ns, wall_ns, cpu_ns, pid, tid: one row per ProfilerStep.

    `profiler_steps` is `Trace.steps` collected, `launched` is `gpu_by_step(...)` of the same trace,
    `queued_until_ns` its `queued_until(...)` (the first step starts no earlier). Windows are disjoint and
    sorted; `end_ns` is never before `cpu_end_ns`. No rows when the trace has no steps.
    """
    if profiler_steps.height == 0:
        return pl.DataFrame(schema=STEP_WINDOW_SCHEMA)
    gpu_end = launched.group_by("step").agg(gpu_end=(pl.col("ts_ns") + pl.col("dur_ns")).max())
    w = (
        profiler_steps.join(gpu_end, on="step", how="left", maintain_order="left")
        .with_columns(end_ns=pl.max_horizontal("end_ns", "gpu_end"))
        .with_columns(start_ns=pl.max_horizontal("ts_ns", pl.col("end_ns").shift(1, fill_value=queued_until_ns)))
        .with_columns(end_ns=pl.max_horizontal("end_ns", "start_ns"))
    )
    return w.select(
        "step", "start_ns", cpu_start_ns="ts_ns", cpu_end_ns=pl.col("ts_ns") + pl.col("dur_ns"), end_ns="end_ns",
        wall_ns=pl.col("end_ns") - pl.col("start_ns"), cpu_ns="dur_ns", pid="pid", tid="tid",
    ).cast(STEP_WINDOW_SCHEMA)  # type: ignore[arg-type]


def idle_tail(spans: pl.DataFrame, launched: pl.DataFrame) -> pl.DataFrame:
    """The trailing step spans (rows of `spans`, `iterations.SPAN_SCHEMA`) that launched no GPU work while an
    earlier one did (module docstring); `launched` is `gpu_by_step(...)` over the same spans. None where no span
    launched any (a CPU-only trace), where the last one did, or where no GPU event is linked to its launch call:
    GPU work then belongs to the span holding its start, and a GPU-bound loop's last kernels start after the last
    span's CPU side ended, so nothing tells a tail there.

        spans 1, 2, 3; GPU work launched in 1 and 2  ->  span 3
    """
    ordered = spans.sort("ts_ns")
    if not launched["launch_ts_ns"].is_not_null().any():
        return ordered.clear()
    busy = ordered["step"].is_in(launched["step"].unique().implode()).arg_true()
    return ordered.clear() if busy.len() == 0 else ordered.slice(int(busy[-1]) + 1)


def tail_text(tail: pl.DataFrame) -> str:
    """`idle_tail`'s spans in one sentence: "step 2 (49.1 µs): no GPU work launched, unlike the steps before (…)"."""
    walls = ", ".join(duration(d) for d in tail.sort("ts_ns")["dur_ns"])
    return (f"{numbered('step', tail['step'])} ({walls}): no GPU work launched, unlike the steps before (the span a "
            "last prof.step() opens until the profiler stops, or work the profiler missed)")


def cpu_spans(profiler_steps: pl.DataFrame) -> pl.DataFrame:
    """step, start_ns, end_ns: the steps' CPU spans, for `with_step` on CPU-side events (ops and their FLOPs,
    allocations), which belong to the step whose CPU span holds them. Its window can begin after them: in a
    GPU-bound loop the CPU runs ahead, and a step's ops run while the GPU still works on earlier steps."""
    return profiler_steps.select("step", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))


def with_step(frame: pl.DataFrame, windows: pl.DataFrame, *, at: str = "start_ns") -> pl.DataFrame:
    """`frame` plus a `step` column: the step whose (disjoint) window holds `frame[at]`; null outside all.

        windows [0, 130) step 1, [130, 200) step 2; at = 120, 150, 250  ->  step 1, 2, null
    """
    if windows.height == 0:
        return frame.with_columns(step=pl.lit(None, pl.Int64))
    w = windows.select("step", _w_start="start_ns", _w_end="end_ns").sort("_w_start")
    return (frame.sort(at).join_asof(w, left_on=at, right_on="_w_start", strategy="backward")
            .with_columns(step=pl.when(pl.col(at) < pl.col("_w_end")).then("step"))
            .drop("_w_start", "_w_end"))


def analysis_window(trace: Trace, windows: pl.DataFrame, *, window: WindowKind = "steps") -> pl.LazyFrame:
    """device, start_ns, end_ns: disjoint window pieces per GPU device (no rows for a CPU-only trace).

    `windows` is `step_windows(...)` of the trace. `window="steps"`: every device gets the union of the step
    windows when the trace has steps, otherwise its own first GPU event start to last GPU event end;
    `window="trace"`: always the latter.
    """
    gpu = trace.gpu.filter(pl.col("device").is_not_null() & pl.col("dur_ns").is_not_null()).select(
        "device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    if window == "steps" and windows.height:
        merged = intervals.union(windows.lazy(), start="start_ns", end="end_ns")
        return (gpu.select("device").unique().join(merged, how="cross")
                .select("device", "start_ns", "end_ns").sort("device", "start_ns"))
    return (gpu.group_by("device").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())
            .sort("device"))
