"""What the Perfetto export (`stepscope export`) lays over a trace: the analyses' answers as timed rows.

Every table here is a view of a result the bundle (`bundle.TraceAnalysis`) already computed, put on the
trace's own clock (ns) so that `reports.perfetto` only has to write it:

- `steps`: the step windows (`window.step_windows`, as `steps` reports them);
- `phases`: each step's CPU span cut into exclusive phase segments by `steps`' rule (data loading, optimizer,
  backward, forward, the first in that order that covers an instant wins; what none covers is left out), so
  the segments of a (step, phase) add up to that step's `<phase>_ns`;
- `gaps`: every idle gap of `gaps.gpu_gaps` with its cause and blame (they add up to its idle total per device);
- `copies`: the host/device copies not entirely hidden by a kernel on their device (`exposed_ns` > 0);
- `syncs`: the synchronizing runtime calls, with the op and Python line that made them;
- counters: GPU busy share per step, launch queue depth per stream, allocated/reserved memory per device;
- `critical_path`: each step's critical path (`critical_path.critical_path`), its segments tiling the step
  window, each with its kind (CPU, launch overhead, kernel, copy, sync wait, data loading, idle).

    step 1 CPU [0, 100): DataLoader [0, 30), aten::conv [30, 60), ConvBackward (autograd thread) [55, 80),
    Optimizer.step [80, 100)
    -> phases: data_loading [0, 30), forward [30, 55), backward [55, 80), optimizer [80, 100)
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze import steps as _steps
from stepscope.analyze.blame import python_lines
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.overlap import sync_calls
from stepscope.analyze.schema import Kind
from stepscope.analyze.summary import SummaryResult
from stepscope.analyze.transfers import covered_ns
from stepscope.errors import UsageError

StepRange = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Annotations:
    """The added tracks of one trace, times on its own clock in ns (see the module docstring for each table).

    `window_ns`: (start, end) of the steps asked for (`--steps`), None for the whole trace; every table is then
    limited to what overlaps it, cut at its edges.
    """

    window_ns: tuple[int, int] | None
    steps: pl.DataFrame  # step, start_ns, end_ns, cpu_start_ns, cpu_end_ns, wall_ns, gpu_busy_fraction, outlier
    phases: pl.DataFrame  # step, phase, start_ns, end_ns
    gaps: pl.DataFrame  # device, step, start_ns, end_ns, cause, blamed_op, blamed_python, ... (gaps.GapsResult)
    copies: pl.DataFrame  # device, stream, name, start_ns, end_ns, exposed_ns, bytes, sync, op, python_line
    syncs: pl.DataFrame  # pid, tid, name, start_ns, end_ns, op, python
    verdict: SummaryResult
    step_verdicts: pl.DataFrame  # summary's per-step table (verdict, runner_up, margin, evidence), start_ns
    utilization: pl.DataFrame  # ts_ns, busy_percent (per step, at its start)
    queue_depth: pl.DataFrame  # device, stream, ts_ns, depth
    memory: pl.DataFrame  # device_name, ts_ns, allocated_bytes, reserved_bytes
    critical_path: pl.DataFrame  # step, seq, name, kind, category, lane, start_ns, end_ns (absolute), edge_type


def phase_segments(bundle: TraceAnalysis) -> pl.DataFrame:
    """step, phase, start_ns, end_ns: each step's CPU span cut by `steps`' phase rule (module docstring).

    Neighbouring segments of one phase are merged, so a phase reads as few slices as it can.
    """
    schema = {"step": pl.Int64, "phase": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}
    windows = bundle.frames.step_windows
    if windows.height == 0:
        return pl.DataFrame(schema=schema)
    segs = _steps.phase_segments(windows, _steps.phase_intervals(bundle.trace, windows))
    named = segs.filter(pl.col("phase").is_not_null()).sort("step", "b")
    run = ((pl.col("phase") != pl.col("phase").shift()) | (pl.col("b") != pl.col("b_end").shift())
           | (pl.col("step") != pl.col("step").shift())).fill_null(True).cum_sum()
    return (named.with_columns(run=run).group_by("run")
            .agg(pl.col("step").first(), pl.col("phase").first(), start_ns=pl.col("b").min(),
                 end_ns=pl.col("b_end").max())
            .drop("run").sort("step", "start_ns").cast(schema))  # type: ignore[arg-type]


def queue_depth(bundle: TraceAnalysis) -> pl.DataFrame:
    """device, stream, ts_ns, depth: launched-but-unfinished GPU work per stream after each change (`overlap`'s
    rule: +1 at the launch call, -1 where the work ends); one row per instant where the depth changes."""
    gpu = bundle.frames.launches.filter(pl.col("launch_ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    edges = pl.concat([
        gpu.select("device", "stream", ts_ns="launch_ts_ns", d=pl.lit(1, pl.Int64)),
        gpu.select("device", "stream", ts_ns=pl.col("ts_ns") + pl.col("dur_ns"), d=pl.lit(-1, pl.Int64)),
    ]).sort("device", "stream", "ts_ns", "d")
    return (edges.with_columns(depth=pl.col("d").cum_sum().over("device", "stream").clip(lower_bound=0))
            .group_by("device", "stream", "ts_ns", maintain_order=True).agg(pl.col("depth").last())
            .sort("device", "stream", "ts_ns"))


def exposed_copies(bundle: TraceAnalysis) -> pl.DataFrame:
    """Copies with a part no kernel on their device overlaps (`transfers`' exposed rule), with the op and the
    user's Python line that issued them: device, stream, name, start_ns, end_ns, exposed_ns, bytes, sync, op,
    python_line."""
    trace = bundle.trace
    copies = (bundle.frames.launches.lazy().filter(pl.col("kind") == Kind.MEMCPY.value)
              .join(trace.memcpy.select(gpu_event_id="event_id", bytes="bytes"), on="gpu_event_id", how="left",
                    maintain_order="left")
              .with_columns(start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory"))
    kernels = trace.kernels.filter(pl.col("device").is_not_null()).select(
        "device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    busy = intervals.union(kernels, by=["device"], start="start_ns", end="end_ns").collect(engine="in-memory")
    copies = copies.with_columns(covered_ns(copies.select("device", "start_ns", "end_ns"), busy))
    points = copies.select(pid=pl.col("launch_pid").fill_null(""), tid=pl.col("launch_tid").fill_null(""),
                           ts_ns=pl.col("launch_ts_ns").fill_null(0))
    return (copies.with_columns(python_line=python_lines(trace, points)[0])
            .select("device", "stream", "name", "start_ns", "end_ns",
                    exposed_ns=pl.col("dur_ns") - pl.col("covered_ns"),
                    bytes=pl.col("bytes").cast(pl.Int64), runtime="runtime_name", op="op_name",
                    python_line="python_line")
            .filter(pl.col("exposed_ns") > 0).sort("start_ns"))


def _memory(bundle: TraceAnalysis) -> pl.DataFrame:
    """The bundle's memory timeline (`memory.memory_timeline`) on the trace's clock."""
    timeline = bundle.memory.timeline
    if timeline.height == 0:
        return pl.DataFrame(schema={"device_name": pl.String, "ts_ns": pl.Int64, "allocated_bytes": pl.Int64,
                                    "reserved_bytes": pl.Int64})
    origin = bundle.trace.events.select(pl.col("ts_ns").min()).collect(
        engine="in-memory").item() or 0  # memory_timeline's origin
    return timeline.select("device_name", ts_ns=pl.col("offset_ns") + origin, allocated_bytes="allocated_bytes",
                           reserved_bytes="reserved_bytes")


def step_window(bundle: TraceAnalysis, steps: StepRange) -> tuple[int, int]:
    """(start, end) in ns of steps first..last (their windows' union extent); UsageError naming the steps the
    trace holds when it has none of them."""
    windows = bundle.frames.step_windows
    chosen = windows.filter(pl.col("step").is_between(*steps))
    if chosen.height == 0:
        held = windows["step"].to_list()
        have = f"steps {held[0]}..{held[-1]}" if held else "no steps"
        raise UsageError(f"no step in {steps[0]}..{steps[1]} in this trace ({have})",
                         path=bundle.trace.meta.source.path or bundle.trace.directory)
    return int(chosen["start_ns"].min()), int(chosen["end_ns"].max())  # type: ignore[arg-type]


def _within(frame: pl.DataFrame, window: tuple[int, int] | None) -> pl.DataFrame:
    """Rows of (start_ns, end_ns) overlapping `window`, cut at its edges (all rows when it is None)."""
    if window is None:
        return frame
    lo, hi = window
    return (frame.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
            .with_columns(start_ns=pl.max_horizontal("start_ns", pl.lit(lo)),
                          end_ns=pl.min_horizontal("end_ns", pl.lit(hi))))


def _points_within(frame: pl.DataFrame, window: tuple[int, int] | None) -> pl.DataFrame:
    if window is None:
        return frame
    return frame.filter(pl.col("ts_ns").is_between(window[0], window[1], closed="left"))


def path_segments(bundle: TraceAnalysis, steps: pl.DataFrame) -> pl.DataFrame:
    """Each step's critical-path segments on the trace's clock: step, seq, name, kind, category, lane, start_ns,
    end_ns, edge_type (`critical_path`'s segments start at their step window's start)."""
    schema = {"step": pl.Int64, "seq": pl.Int64, "name": pl.String, "kind": pl.String, "category": pl.String,
              "lane": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64, "edge_type": pl.String}
    if steps.height == 0:
        return pl.DataFrame(schema=schema)
    segments = bundle.critical_path.segments
    return (segments.join(steps.select("step", window_ns="start_ns"), on="step")
            .select("step", "seq", "name", "kind", "category", "lane",
                    start_ns=pl.col("window_ns") + pl.col("start_ns"),
                    end_ns=pl.col("window_ns") + pl.col("start_ns") + pl.col("dur_ns"), edge_type="edge_type")
            .cast(schema).sort("step", "seq"))  # type: ignore[arg-type]


def trace_annotations(bundle: TraceAnalysis, *, steps: StepRange | None = None) -> Annotations:
    """The added tracks of `bundle`'s trace (of steps first..last only, with `steps`)."""
    window = step_window(bundle, steps) if steps is not None else None
    table = bundle.steps.steps
    if table.height:
        table = table.select("step", "start_ns", "end_ns", "cpu_start_ns", "cpu_end_ns", "wall_ns",
                             "gpu_busy_fraction", "outlier")
        if steps is not None:
            table = table.filter(pl.col("step").is_between(*steps))
    phases = phase_segments(bundle)
    if steps is not None:
        phases = phases.filter(pl.col("step").is_between(*steps))
    per_step = bundle.verdict.per_step
    step_verdicts = (per_step.join(table.select("step", "start_ns"), on="step")
                     if per_step.height and table.height else pl.DataFrame())
    utilization = (table.filter(pl.col("gpu_busy_fraction").is_not_null())
                   .select(ts_ns="start_ns", busy_percent=pl.col("gpu_busy_fraction") * 100)
                   if table.height else pl.DataFrame(schema={"ts_ns": pl.Int64, "busy_percent": pl.Float64}))
    syncs = sync_calls(bundle.trace).select("pid", "tid", "name", start_ns="ts_ns",
                                              end_ns=pl.col("ts_ns") + pl.col("dur_ns"), op="op", python="python")
    return Annotations(
        window_ns=window, steps=table, phases=phases,
        gaps=_within(bundle.gaps.gaps.filter(pl.col("cause").is_not_null()), window),
        copies=_within(exposed_copies(bundle), window), syncs=_within(syncs.drop_nulls("end_ns"), window),
        verdict=bundle.verdict, step_verdicts=step_verdicts, utilization=utilization,
        queue_depth=_points_within(queue_depth(bundle), window), memory=_points_within(_memory(bundle), window),
        critical_path=_within(path_segments(bundle, table), window),
    )


__all__ = ["Annotations", "StepRange", "trace_annotations", "exposed_copies", "path_segments", "phase_segments",
           "queue_depth", "step_window"]
