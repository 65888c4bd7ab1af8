"""How well CPU and GPU overlap: utilization, CPU busy, both-at-once, launch latency, queue depth, syncs.

Over the analysis window (gaps.py): GPU busy = union of GPU work on all devices; CPU busy = union of CPU
ops on the threads that launch GPU work (the main/autograd threads); both = the time both run at once
(|CPU| + |GPU| - |CPU ∪ GPU|). Launch latency = GPU start - start of the runtime call that launched it,
per stream. Queue depth per stream counts launched-but-unfinished work: +1 at the launch call, -1 when the
GPU work ends; its time-weighted distribution shows whether the CPU keeps the GPU fed (depth 0 most of
the time: the GPU waits on the CPU). Synchronizing runtime calls are listed with where in Python (or
which op) they came from: in a trace with steps, the calls the steps made (starting inside a step's CPU
span, as `summary` counts them; not the profiler harness's own syncs between steps), else every one. A
CPU-only trace has `gpu_events` 0, GPU shares None, and CPU busy over every thread with ops, measured over
the CPU's own span.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.blame import innermost, is_sync_runtime, nested, python_lines
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import cpu_spans, with_step


@dataclass(frozen=True, kw_only=True)
class OverlapResult:
    """Headline shares over the window, and tables of launch latency, queue depth and sync calls."""

    gpu_events: int
    window_ns: int
    gpu_busy_fraction: float | None
    cpu_busy_fraction: float | None
    both_busy_fraction: float | None
    gpu_only_fraction: float | None
    cpu_only_fraction: float | None
    sync_calls: int  # the sync calls that overlap the window
    sync_ns: int  # their time inside the window (overlapping calls once): what `summary`'s sync share divides
    launch_latency: pl.DataFrame
    queue_depth: pl.DataFrame
    sync_sources: pl.DataFrame


def _length(frame: pl.DataFrame) -> int:
    """Summed length of (start_ns, end_ns) intervals (disjoint ones: the time they cover)."""
    return int((frame["end_ns"] - frame["start_ns"]).sum() or 0) if frame.height else 0


def _union(frame: pl.DataFrame) -> pl.DataFrame:
    """`intervals.union` of an eager (start_ns, end_ns) frame."""
    return intervals.union(frame.lazy(), start="start_ns", end="end_ns").collect(engine="in-memory")


def _clip(frame: pl.DataFrame, window: pl.DataFrame) -> pl.DataFrame:
    """`intervals.clip` of eager frames: the union of `frame` inside `window`."""
    return intervals.clip(frame.lazy(), window.lazy()).collect(engine="in-memory")


def _window(frames: TraceFrames) -> pl.DataFrame:
    """The analysis window as disjoint (start_ns, end_ns); on a CPU-only trace, the CPU's own span."""
    window = _union(frames.analysis_window().select("start_ns", "end_ns"))
    if window.height == 0:
        window = frames.trace.cpu.select(start_ns=pl.col("ts_ns").min(),
                                         end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).max()).collect(
                                             engine="in-memory").drop_nulls()
    return window


def _cpu_busy(frames: TraceFrames, gpu: pl.DataFrame, window: pl.DataFrame) -> pl.DataFrame:
    """CPU ops of the threads that launch GPU work (else the ProfilerStep threads, else every thread with
    ops), clipped to the window: (start_ns, end_ns)."""
    trace = frames.trace
    threads = gpu.select("pid", "tid").drop_nulls().unique()
    if threads.height == 0:
        threads = frames.profiler_steps.select("pid", "tid").unique()
    if threads.height == 0:  # no launches and no steps (a CPU-only capture): every thread with ops
        threads = trace.cpu_ops.select("pid", "tid").unique().collect(engine="in-memory")
    cpu = (trace.cpu_ops.select("pid", "tid", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
           .collect(engine="in-memory").join(threads, on=["pid", "tid"], how="semi"))
    return _clip(cpu.select("start_ns", "end_ns").drop_nulls(), window)


def _launch_latency(gpu: pl.DataFrame) -> pl.DataFrame:
    """Per (device, stream): launches and p50/p95/p99/max of GPU start - launch call start."""
    return (
        gpu.filter(pl.col("launch_ns").is_not_null())
        .with_columns(latency_ns=pl.col("start_ns") - pl.col("launch_ns"))
        .group_by("device", "stream").agg(
            launches=pl.len(), p50_ns=pl.col("latency_ns").quantile(0.5), p95_ns=pl.col("latency_ns").quantile(0.95),
            p99_ns=pl.col("latency_ns").quantile(0.99), max_ns=pl.col("latency_ns").max())
        .sort("device", "stream")
    )


def _queue_depth(gpu: pl.DataFrame) -> pl.DataFrame:
    """Per (device, stream): max and time-weighted mean depth, and the share of time at each depth bucket.

    +1 at each launch call, -1 where its GPU work ends; a depth holds until the next edge on the stream:

        launches at 0 and 2, work ends at 5 and 9 -> depth 1 on [0, 2), 2 on [2, 5), 1 on [5, 9)
    """
    launched = gpu.filter(pl.col("launch_ns").is_not_null())
    edges = pl.concat([
        launched.select("device", "stream", t="launch_ns", d=pl.lit(1)),
        launched.select("device", "stream", t="end_ns", d=pl.lit(-1)),
    ]).sort("device", "stream", "t", "d")
    if edges.height == 0:
        return pl.DataFrame()
    depth = (
        edges.with_columns(depth=pl.col("d").cum_sum().over("device", "stream"))
        .with_columns(held_ns=(pl.col("t").shift(-1).over("device", "stream") - pl.col("t")).fill_null(0))
        .with_columns(bucket=pl.when(pl.col("depth") <= 0).then(pl.lit("0"))
                      .when(pl.col("depth") == 1).then(pl.lit("1"))
                      .when(pl.col("depth") <= 4).then(pl.lit("2-4"))
                      .when(pl.col("depth") <= 16).then(pl.lit("5-16")).otherwise(pl.lit(">16")))
    )
    return (
        depth.group_by("device", "stream").agg(
            max_depth=pl.col("depth").max(),
            mean_depth=(pl.col("depth").clip(lower_bound=0) * pl.col("held_ns")).sum() / pl.col("held_ns").sum(),
            **{f"depth_{b}_fraction": pl.col("held_ns").filter(pl.col("bucket") == b).sum() / pl.col("held_ns").sum()
               for b in ("0", "1", "2-4", "5-16", ">16")})
        .sort("device", "stream")
    )


def sync_calls(trace: Trace) -> pl.DataFrame:
    """Synchronizing runtime calls (pid, tid, ts_ns, dur_ns, name) with the user's Python line and the op
    enclosing each (`python`: `blame.python_lines`; `op`; null where none)."""
    syncs = trace.runtime.filter(is_sync_runtime(pl.col("name"))).select(
        "pid", "tid", "ts_ns", "dur_ns", "name").collect(engine="in-memory")
    points = syncs.select("pid", "tid", "ts_ns")
    return syncs.with_columns(python=python_lines(trace, points)[0],
                              op=innermost(nested(trace, "cpu_ops"), points)["name"])


def _sync_sources(syncs: pl.DataFrame) -> pl.DataFrame:
    """Sync calls and their time per (runtime call name, source), most time first; the source is the Python
    frame, else the op, else "(no enclosing op)"."""
    return (
        syncs.with_columns(source=pl.coalesce("python", "op", pl.lit("(no enclosing op)")))
        .group_by("name", "source").agg(calls=pl.len(), total_ns=pl.col("dur_ns").sum())
        .sort("total_ns", "name", "source", descending=[True, False, False])
    )


def _in_window(frames: TraceFrames, syncs: pl.DataFrame, window: pl.DataFrame) -> pl.DataFrame:
    """The sync calls that overlap the window (disjoint start_ns, end_ns), as `summary` counts them; where the trace
    has steps, of those a step's CPU span issued (the profiler harness's syncs before and after them are not the
    steps', even where one waits in the last step's window for its GPU work)."""
    if frames.profiler_steps.height:
        syncs = with_step(syncs, cpu_spans(frames.profiler_steps), at="ts_ns").filter(
            pl.col("step").is_not_null()).drop("step")
    if syncs.height == 0 or window.height == 0:
        return syncs.clear()
    hit = (syncs.with_row_index("_i").lazy()
           .join_where(window.lazy().select(w_start="start_ns", w_end="end_ns"),
                       pl.col("ts_ns") < pl.col("w_end"), pl.col("ts_ns") + pl.col("dur_ns") > pl.col("w_start"))
           .select("_i").unique().collect(engine="in-memory")["_i"])
    return syncs.with_row_index("_i").filter(pl.col("_i").is_in(hit.implode())).drop("_i")


def cpu_gpu_overlap(source: Source) -> OverlapResult:
    """Utilization, CPU busy, overlap, launch latency per stream, queue depth per stream, sync calls."""
    frames = frames_of(source)
    gpu = frames.launches.select("device", "stream", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                                 launch_ns="launch_ts_ns", pid="launch_pid", tid="launch_tid")
    window = _window(frames)
    window_ns = _length(window)
    gpu_busy = _clip(gpu.select("start_ns", "end_ns").drop_nulls(), window)
    cpu_busy = _cpu_busy(frames, gpu, window)
    g, c = _length(gpu_busy), _length(cpu_busy)
    either = _length(_union(pl.concat([gpu_busy, cpu_busy]))) if g or c else 0
    both = g + c - either

    def share(value: int) -> float | None:
        return value / window_ns if window_ns else None

    syncs = _in_window(frames, sync_calls(frames.trace), window)
    # their time inside the window the shares divide by (as summary's sync share)
    blocked = _length(_clip(syncs.select("ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
                            .rename({"ts_ns": "start_ns"}), window)) if syncs.height else 0
    return OverlapResult(
        gpu_events=gpu.height,
        window_ns=window_ns,
        gpu_busy_fraction=share(g) if gpu.height else None, cpu_busy_fraction=share(c),
        both_busy_fraction=share(both) if gpu.height else None,
        gpu_only_fraction=share(g - both) if gpu.height else None, cpu_only_fraction=share(c - both),
        sync_calls=syncs.height, sync_ns=blocked,
        launch_latency=_launch_latency(gpu), queue_depth=_queue_depth(gpu), sync_sources=_sync_sources(syncs),
    )
