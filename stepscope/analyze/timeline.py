"""The data behind the GPU timeline strip: one step's GPU work per device and stream, and its idle gaps.

The step shown is the one asked for, else the median-duration step among those that launched GPU work
(the lower median, so a real step is shown, not an average); its span is the step's window
(`window.step_windows`), the same span the steps table and the gaps use. A trace without ProfilerSteps
shows its whole GPU span. Times are offsets from the span's start.

    steps with GPU work lasting 180, 175, 190, 166 ms  ->  the 175 ms one

A step's timeline also carries the step's critical path (`critical_path.path_segments`: the same segments
`stepscope critical-path` finds), which tiles the span. The graph is built over the whole trace, not the step's
window alone: the typical launch latency and the edges from work queued before the window shape the path, so
a graph of the window alone can find a different one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from stepscope.analyze._text import numbers
from stepscope.analyze.critical_path import path_segments
from stepscope.analyze.depgraph import build_graph, replay
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.gaps import GapsResult, gpu_gaps
from stepscope.analyze.kernels import category_expr
from stepscope.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class GpuTimeline:
    """One span of the GPU timeline.

    `events`: kind, name, category, device, stream, offset_ns, dur_ns (every GPU event overlapping the span);
    `idle`: device, cause, offset_ns, dur_ns (the idle gaps of `gaps` overlapping it). `step` is None when
    the span is the whole trace; `cpu_ns` is then None too. `path`: name, kind (`depgraph.PathKind`), category
    (of kernels and copies), offset_ns, dur_ns: the step's critical path in order, tiling the span; None where it
    was not found, and `path_note` then says why.
    """

    step: int | None
    start_ns: int
    length_ns: int
    cpu_ns: int | None
    events: pl.DataFrame
    idle: pl.DataFrame
    path: pl.DataFrame | None = None
    path_note: str | None = None


def median_step(windows: pl.DataFrame, launched: pl.DataFrame) -> int:
    """Row of `windows` (step windows) holding the median-wall step among those that launched GPU work
    (`launched`: `gpu_by_step` rows; all steps when none did). The lower median; ties keep step order."""
    with_gpu = windows.with_row_index("_row").join(launched.select("step").unique(), on="step", how="semi")
    candidates = with_gpu if with_gpu.height else windows.with_row_index("_row")
    ordered = candidates.sort("wall_ns", "_row")
    return int(ordered["_row"][(ordered.height - 1) // 2])


def step_path(frames: TraceFrames, step: int, segments: Callable[[], pl.DataFrame] | None = None
              ) -> tuple[pl.DataFrame | None, str | None]:
    """The critical path of `step` (name, kind, category, offset_ns, dur_ns; see `GpuTimeline`), or None and
    why not; `segments`: every step's path segments (`critical_path`'s), where the caller has them (a bundle),
    else found here. A graph that cannot be built or walked is a note, not an error: the timeline is drawn
    without it."""
    try:
        if segments is not None:
            found = segments()
        else:
            graph = build_graph(frames)
            found = path_segments(graph, replay(graph, graph.measured_weights()))
    except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - the timeline goes on without it
        first_line = (str(exc).splitlines() or [""])[0][:120]
        return None, f"critical path not found ({type(exc).__name__}: {first_line})"
    path = found.filter(pl.col("step") == step).sort("seq").select(
        "name", "kind", "category", offset_ns="start_ns", dur_ns="dur_ns")
    if path.height == 0:
        return None, f"no critical path for step {step} (nothing in its window on the dependency graph)"
    return path, None


def gpu_timeline(source: Source, *, step: int | None = None, gaps: GapsResult | None = None,
                 with_path: bool = True, segments: Callable[[], pl.DataFrame] | None = None) -> GpuTimeline | None:
    """The timeline of one step (see the module docstring); None when the trace has no GPU work.

    `gaps` is `gpu_gaps(...)` of the trace when the caller has it (every gap); `with_path`: also find the
    step's critical path (`step_path`, from `segments` where the caller has them). Raises `UsageError` for a
    step the trace does not hold.
    """
    frames = frames_of(source)
    gpu = frames.trace.gpu.filter(pl.col("dur_ns").is_not_null()).select(
        "kind", "name", "device", "stream", "ts_ns", "dur_ns").with_columns(category=category_expr()).collect(
            engine="in-memory")
    if gpu.height == 0:
        return None
    windows = frames.step_windows
    cpu_ns: int | None = None
    if windows.height:
        if step is None:
            row = windows.slice(median_step(windows, frames.gpu_by_step), 1)
        else:
            row = windows.filter(pl.col("step") == step)
            if row.height == 0:
                raise UsageError(f"no step {step} in this trace (steps: {numbers(windows['step'])})")
        step, start, end, cpu_ns = (int(row[c][0]) for c in ("step", "start_ns", "end_ns", "cpu_ns"))
    else:
        step = None
        start, end = int(gpu["ts_ns"].min()), int((gpu["ts_ns"] + gpu["dur_ns"]).max())  # type: ignore[arg-type]
    events = gpu.filter((pl.col("ts_ns") + pl.col("dur_ns") > start) & (pl.col("ts_ns") < end)).select(
        "kind", "name", "category", "device", "stream", offset_ns=pl.col("ts_ns") - start, dur_ns="dur_ns")
    table = (gpu_gaps(frames) if gaps is None else gaps).gaps
    idle = table.filter((pl.col("end_ns") > start) & (pl.col("start_ns") < end) & pl.col("cause").is_not_null()
                        ).select("device", "cause", offset_ns=pl.col("start_ns") - start, dur_ns="dur_ns")
    path, note = None, None
    if with_path:
        path, note = (step_path(frames, step, segments) if step is not None
                      else (None, "no steps in this trace: the critical path is found per step"))
    return GpuTimeline(step=step, start_ns=start, length_ns=end - start, cpu_ns=cpu_ns, events=events, idle=idle,
                       path=path, path_note=note)
