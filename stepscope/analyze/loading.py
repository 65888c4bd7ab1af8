"""Exposed data loading: the one definition `steps`, `gaps` and `summary` all report.

**Data loading** is the time inside DataLoader ``__next__`` annotations (``enumerate(DataLoader)#…``, any
thread); **exposed** data loading is the part of it during which no GPU work runs on any device (what the
GPU does not hide, whichever step's work that is). Both are counted per step span (the CPU span of a
ProfilerStep or inferred iteration, `window.step_windows`): a loading interval belongs to the span holding
its start and is clipped to it. Without steps, the analysis window (first to last GPU event) is the span, and
each interval is clipped to it on both sides.

    step CPU span [0, 100): DataLoader 0-30 and 60-70; kernels 20-40 and 65-90
    -> data loading 40, exposed 20 (0-20) + 5 (60-65) = 25

`gaps.gpu_gaps` reports the trace's total (`data_loading_exposed_ns`), `steps.step_breakdown` the per-step
figures that sum to it, and the verdict's `data_loading_fraction` is that total over the step time. (The gaps'
``data_loading`` cause is another figure: idle gaps blamed on loading, a whole gap to its one cause.)
"""

from __future__ import annotations

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.trace import Trace

DATALOADER_PATTERN = r"^enumerate\(DataLoader\)#"

EXPOSED_SCHEMA: dict[str, pl.DataType] = {"step": pl.Int64(), "data_loading_exposed_ns": pl.Int64()}


def merge(frame: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """`intervals.union` on (by..., s, e) columns: disjoint merged intervals, same column names."""
    return intervals.union(frame, by=by, start="s", end="e").rename({"start_ns": "s", "end_ns": "e"})


def busy_before(times: pl.DataFrame, merged: pl.DataFrame, col: str) -> pl.Series:
    """For each time in times[col], the length of the disjoint `merged` (s, e) intervals before it."""
    m = merged.sort("s").select(
        _s="s", _e="e", _cum=(pl.col("e") - pl.col("s")).cum_sum() - (pl.col("e") - pl.col("s")))
    hit = times.select(col).with_row_index("_i").sort(col).join_asof(
        m, left_on=col, right_on="_s", strategy="backward")
    val = (pl.col("_cum") + pl.min_horizontal(pl.col(col), "_e") - pl.col("_s")).fill_null(0)
    return hit.sort("_i").select(val)[:, 0]


def exposed(cpu: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Per step: length of the union of `cpu` (step, s, e) intervals not covered by any `gpu` (s, e) interval.
    step, data_loading_exposed_ns (steps without cpu intervals: no row)."""
    if cpu.height == 0:
        return pl.DataFrame(schema=EXPOSED_SCHEMA)
    c = merge(cpu.lazy(), ["step"]).collect(engine="in-memory")
    g = merge(gpu.lazy(), []).collect(engine="in-memory")
    hidden = busy_before(c, g, "e") - busy_before(c, g, "s")
    return c.with_columns(hidden=hidden).group_by("step").agg(
        data_loading_exposed_ns=(pl.col("e") - pl.col("s") - pl.col("hidden")).sum()).cast(
        EXPOSED_SCHEMA)  # type: ignore[arg-type]


def loading_intervals(trace: Trace, spans: pl.DataFrame) -> pl.DataFrame:
    """step, s, e: the DataLoader intervals, each in the span (step, cpu_start_ns, cpu_end_ns) holding its start,
    clipped to that span's end."""
    loaders = (trace.cpu.filter(pl.col("name").str.contains(DATALOADER_PATTERN) & pl.col("dur_ns").is_not_null())
               .select(s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory").sort("s"))
    return (
        loaders.join_asof(spans.select("step", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns"), left_on="s",
                          right_on="cpu_start_ns", strategy="backward")
        .filter(pl.col("s") < pl.col("cpu_end_ns"))
        .select("step", "s", e=pl.min_horizontal("e", "cpu_end_ns"))
    )


def _gpu(trace: Trace) -> pl.DataFrame:
    return trace.gpu.filter(pl.col("dur_ns").is_not_null()).select(
        s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory")


def exposed_data_loading(trace: Trace, spans: pl.DataFrame) -> pl.DataFrame:
    """step, data_loading_exposed_ns for each span (step, cpu_start_ns, cpu_end_ns) holding data loading."""
    return exposed(loading_intervals(trace, spans), _gpu(trace))


def exposed_in_window(trace: Trace, start_ns: int, end_ns: int) -> int:
    """Exposed data loading inside [start_ns, end_ns) (a trace without steps: its analysis window), each
    DataLoader interval clipped to it on both sides."""
    loading = (
        trace.cpu.filter(pl.col("name").str.contains(DATALOADER_PATTERN) & pl.col("dur_ns").is_not_null())
        .select(step=pl.lit(0, pl.Int64), s=pl.max_horizontal("ts_ns", pl.lit(start_ns)),
                e=pl.min_horizontal(pl.col("ts_ns") + pl.col("dur_ns"), pl.lit(end_ns)))
        .filter(pl.col("s") < pl.col("e")).collect(engine="in-memory")
    )
    return int(exposed(loading, _gpu(trace))["data_loading_exposed_ns"].sum())


__all__ = ["DATALOADER_PATTERN", "busy_before", "exposed", "exposed_data_loading", "exposed_in_window",
           "loading_intervals", "merge"]
