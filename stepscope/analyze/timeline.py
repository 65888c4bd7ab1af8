"""The data behind the GPU timeline strip: one step's GPU work per device and stream, and its idle gaps.

The step shown is the one asked for, else the median-duration step among those that launched GPU work
(the lower median, so a real step is shown, not an average); its span is the step's window
(`window.step_windows`), the same span the steps table and the gaps use. A trace without ProfilerSteps
shows its whole GPU span. Times are offsets from the span's start.

    steps with GPU work lasting 180, 175, 190, 166 ms  ->  the 175 ms one
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.gaps import GapsResult, gpu_gaps
from stepscope.analyze.kernels import category_expr
from stepscope.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class GpuTimeline:
    """One span of the GPU timeline.

    `events`: kind, name, category, device, stream, offset_ns, dur_ns (every GPU event overlapping the span);
    `idle`: device, cause, offset_ns, dur_ns (the idle gaps of `gaps` overlapping it). `step` is None when
    the span is the whole trace; `cpu_ns` is then None too.
    """

    step: int | None
    start_ns: int
    length_ns: int
    cpu_ns: int | None
    events: pl.DataFrame
    idle: pl.DataFrame


def median_step(windows: pl.DataFrame, launched: pl.DataFrame) -> int:
    """Row of `windows` (step windows) holding the median-wall step among those that launched GPU work
    (`launched`: `gpu_by_step` rows; all steps when none did). The lower median; ties keep step order."""
    with_gpu = windows.with_row_index("_row").join(launched.select("step").unique(), on="step", how="semi")
    candidates = with_gpu if with_gpu.height else windows.with_row_index("_row")
    ordered = candidates.sort("wall_ns", "_row")
    return int(ordered["_row"][(ordered.height - 1) // 2])


def gpu_timeline(source: Source, *, step: int | None = None, gaps: GapsResult | None = None) -> GpuTimeline | None:
    """The timeline of one step (see the module docstring); None when the trace has no GPU work.

    `gaps` is `gpu_gaps(...)` of the trace when the caller has it (every gap). Raises `UsageError` for a
    step the trace does not hold.
    """
    frames = frames_of(source)
    gpu = frames.trace.gpu.filter(pl.col("dur_ns").is_not_null()).select(
        "kind", "name", "device", "stream", "ts_ns", "dur_ns").with_columns(category=category_expr()).collect()
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
                raise UsageError(f"no step {step} in this trace (steps: {', '.join(map(str, windows['step']))})")
        step, start, end, cpu_ns = (int(row[c][0]) for c in ("step", "start_ns", "end_ns", "cpu_ns"))
    else:
        step = None
        start, end = int(gpu["ts_ns"].min()), int((gpu["ts_ns"] + gpu["dur_ns"]).max())  # type: ignore[arg-type]
    events = gpu.filter((pl.col("ts_ns") + pl.col("dur_ns") > start) & (pl.col("ts_ns") < end)).select(
        "kind", "name", "category", "device", "stream", offset_ns=pl.col("ts_ns") - start, dur_ns="dur_ns")
    table = (gpu_gaps(frames) if gaps is None else gaps).gaps
    idle = table.filter((pl.col("end_ns") > start) & (pl.col("start_ns") < end) & pl.col("cause").is_not_null()
                        ).select("device", "cause", offset_ns=pl.col("start_ns") - start, dur_ns="dur_ns")
    return GpuTimeline(step=step, start_ns=start, length_ns=end - start, cpu_ns=cpu_ns, events=events, idle=idle)
