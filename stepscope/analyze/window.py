"""The analysis window: where GPU idle time counts.

With ``ProfilerStep#N`` spans the window is the union of the steps, each extended to the end of the GPU
work launched inside it (a GPU event whose launching runtime call starts inside the step); this is what
``reference_figures.py``'s ``step_busy_us`` clips to. Without steps (or with ``window="trace"``) it is the
first to the last GPU event of each device.

    step 1 CPU [0, 100), its last kernel ends at 130; step 2 CPU [100, 200)
      -> windows [0, 130) and [130, 200)   (a step starts no earlier than the previous one ends)
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.steps import step_windows as _step_windows
from stepscope.analyze.trace import Trace

WindowKind = Literal["steps", "trace"]


def step_windows(trace: Trace) -> pl.LazyFrame:
    """step, start_ns, cpu_end_ns, end_ns, dur_ns: one row per ProfilerStep (none when the trace has none).

    Windows are disjoint and sorted; `cpu_end_ns` is where the step's CPU span ended, `end_ns` where the
    GPU work it launched ended (never before `cpu_end_ns`).
    """
    return _step_windows(trace).lazy().select("step", "start_ns", "cpu_end_ns", "end_ns",
                                              dur_ns=pl.col("end_ns") - pl.col("start_ns"))


def analysis_window(trace: Trace, *, window: WindowKind = "steps",
                    steps: pl.DataFrame | None = None) -> pl.LazyFrame:
    """device, start_ns, end_ns: disjoint window pieces per GPU device (no rows for a CPU-only trace).

    `window="steps"`: every device gets the union of the step windows when the trace has steps, otherwise
    its own first GPU event start to last GPU event end; `window="trace"`: always the latter. `steps` is
    `step_windows(trace).collect()` when the caller already has it.
    """
    gpu = trace.gpu.filter(pl.col("device").is_not_null() & pl.col("dur_ns").is_not_null()).select(
        "device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    if window == "steps":
        steps = step_windows(trace).collect() if steps is None else steps
        if steps.height:
            merged = intervals.union(steps.lazy(), start="start_ns", end="end_ns")
            return (gpu.select("device").unique().join(merged, how="cross")
                    .select("device", "start_ns", "end_ns").sort("device", "start_ns"))
    return (gpu.group_by("device").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())
            .sort("device"))
