"""GPU busy time, the analysis window, and every idle gap with the CPU activity blamed for it.

Definitions:
- **busy** per device: the union of its kernel, memcpy and memset intervals, all streams.
- **window** (`window="steps"`, the default): the union of the ProfilerStep windows (each step extended to
  the end of the GPU work it launched; `steps.step_windows`), the same for every device; without steps, or
  with `window="trace"`, a device's first to last GPU event.
- **gap**: a maximal interval inside the window where the device does nothing.

**Blame.** At the gap's midpoint, on the thread that launched the GPU event right after the gap (the main
thread holding the ProfilerStep spans when that is unknown): the innermost CPU op (`blamed_op`), the
innermost Python frame (`blamed_python`, with_stack traces) and the innermost runtime call.

**Cause** — ordered rules, the first that holds wins:

    host_sync           the runtime call at the midpoint synchronizes (cudaDeviceSynchronize,
                        cudaStreamSynchronize, cudaEventSynchronize, a synchronous cudaMemcpy, hip…), or
                        the op is one that reads a value back (aten::item, aten::_local_scalar_dense,
                        aten::nonzero)
    data_loading        the thread is inside a DataLoader annotation or a dataloader iterator's __next__
    communication_wait  the next GPU event is a collective (nccl/rccl kernel) or the op is a c10d/nccl op
    memcpy_wait         the gap ends with a memcpy (the GPU waited for the data to arrive)
    launch_overhead     the next GPU event's launch call started after the gap began: the CPU was late
    other               none of the above (e.g. the launch came early but the stream waited on another)

For example, a `.item()` in forward:

    kernel A ends at 100 µs; aten::item (100..180) -> cudaStreamSynchronize (105..178); kernel B at 185
    -> gap 100..185, midpoint 142.5: runtime cudaStreamSynchronize, op aten::_local_scalar_dense: host_sync
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from stepscope.analyze.nesting import innermost_enclosing, parent_index, sort_for_nesting
from stepscope.analyze.schema import GPU_KINDS, Kind
from stepscope.analyze.steps import step_windows
from stepscope.analyze.trace import Trace

WindowKind = Literal["steps", "trace"]


class GapCause(str, enum.Enum):
    """Why the GPU was idle (see the module docstring for the ordered rules)."""

    HOST_SYNC = "host_sync"
    DATA_LOADING = "data_loading"
    COMMUNICATION_WAIT = "communication_wait"
    MEMCPY_WAIT = "memcpy_wait"
    LAUNCH_OVERHEAD = "launch_overhead"
    OTHER = "other"


SYNC_RUNTIME = r"(?i)(Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^hipMemcpy$|^cuMemcpyDtoH|^cuMemcpyHtoD$|Wait)"
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
DATA_LOADING = r"(DataLoader|_next_data|dataloader\.py.*__next__|enumerate\(DataLoader\))"
COMMUNICATION = r"(?i)(nccl|rccl|c10d::|record_param_comms|all_reduce|allreduce|all_gather|reduce_scatter)"
HISTOGRAM_EDGES_NS = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)


@dataclass(frozen=True, kw_only=True)
class GapsResult:
    """Per-device busy/window/utilization, every idle gap with blame and cause, idle by cause, a histogram.

    In `gaps`, at_ns is the gap's start since the window began; start_ts / end_ts are on the trace's clock (ns).
    """

    window_kind: str
    devices_with_gpu_work: int
    busy_ns: int
    window_ns: int
    idle_ns: int
    busy_fraction: float | None
    gaps_total: int
    min_gap_ns: int
    devices: pl.DataFrame
    idle_by_cause: pl.DataFrame
    gaps: pl.DataFrame
    histogram: pl.DataFrame


def short_name(name: pl.Expr) -> pl.Expr:
    """A kernel's name without return type, template arguments and parameter list, for tables.

        void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, …>(int, …)
        -> at::native::vectorized_elementwise_kernel
    """
    cpp = name.str.contains("::") | name.str.starts_with("void ")
    return pl.when(cpp).then(name.str.replace(r"^void ", "").str.replace(r"[<(].*$", "")).otherwise(name)


def union(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Maximal disjoint intervals of start_ns/end_ns per group (cumulative-max rule).

        [0,10] [5,12] [20,25]  ->  [0,12] [20,25]
    """
    if frame.height == 0:
        return frame.select(*by, "start_ns", "end_ns")
    if not by:
        return union(frame.with_columns(_all=pl.lit(0)), ["_all"]).drop("_all")
    return (
        frame.sort(*by, "start_ns")
        .with_columns(prev_end=pl.col("end_ns").cum_max().shift(1).over(by))
        .with_columns(run=(pl.col("prev_end").is_null() | (pl.col("start_ns") > pl.col("prev_end"))).cum_sum().over(by))
        .group_by(*by, "run").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())
        .drop("run").sort(*by, "start_ns")
    )


def clip(intervals: pl.DataFrame, windows: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The parts of `intervals` inside `windows` (both disjoint per group): interval joins by overlap."""
    if intervals.height == 0 or windows.height == 0:
        return intervals.head(0).select(*by, "start_ns", "end_ns")
    w = windows.select(*by, w_start="start_ns", w_end="end_ns")
    joined = intervals.join(w, on=by, how="inner") if by else intervals.join(w, how="cross")
    return (
        joined.filter((pl.col("start_ns") < pl.col("w_end")) & (pl.col("end_ns") > pl.col("w_start")))
        .select(*by, start_ns=pl.max_horizontal("start_ns", "w_start"), end_ns=pl.min_horizontal("end_ns", "w_end"))
    )


def complement(busy: pl.DataFrame, windows: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The parts of each window not covered by `busy` (busy already clipped to the windows)."""
    # per window: sorted busy pieces inside it; gaps are between consecutive pieces and at both ends
    w = windows.select(*by, w_start="start_ns", w_end="end_ns").with_row_index("window")
    inside = (busy.join(w, on=by, how="inner") if by else busy.join(w, how="cross")).filter(
        (pl.col("start_ns") >= pl.col("w_start")) & (pl.col("end_ns") <= pl.col("w_end")))
    points = pl.concat([
        inside.select("window", *by, a="end_ns", b=pl.lit(None, pl.Int64)),
        w.select("window", *by, a="w_start", b=pl.lit(None, pl.Int64)),
    ]).sort("window", "a")
    starts = inside.select("window", s="start_ns")
    ends_of_gaps = pl.concat([starts, w.select("window", s="w_end")]).sort("window", "s")
    # each gap starts at a busy end (or the window start) and ends at the next busy start (or window end)
    left = points.unique(subset=["window", "a"], keep="first").sort("window", "a")
    gaps = left.join_asof(ends_of_gaps, left_on="a", right_on="s", by="window", strategy="forward",
                          check_sortedness=False)
    return gaps.filter(pl.col("s") > pl.col("a")).select(*by, start_ns="a", end_ns="s")


def _windows(steps: pl.DataFrame, gpu: pl.DataFrame, window: WindowKind) -> pl.DataFrame:
    """device, start_ns, end_ns: the analysis window per device (`steps` from steps.step_windows)."""
    devices = gpu.select("device").unique()
    if window == "steps" and steps.height:
        merged = union(steps.select("start_ns", "end_ns"), [])
        return devices.join(merged, how="cross").select("device", "start_ns", "end_ns")
    return gpu.group_by("device").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())


def _gpu(trace: Trace) -> pl.DataFrame:
    return (
        trace.launches()
        .select("gpu_event_id", "kind", "name", "device", "stream", start_ns="ts_ns",
                end_ns=pl.col("ts_ns") + pl.col("dur_ns"), launch_ts_ns="launch_ts_ns", launch_pid="launch_pid",
                launch_tid="launch_tid", op_name="op_name")
        .filter(pl.col("device").is_not_null() & pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
        .collect()
    )


def _blame(trace: Trace, gaps: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Add next/prev GPU event, the blamed thread, its innermost op / Python frame / runtime call, cause."""
    by_start = gpu.sort("device", "start_ns").select(
        "device", "start_ns", next_kernel="name", next_kind="kind", next_launch_ts_ns="launch_ts_ns",
        launch_pid="launch_pid", launch_tid="launch_tid")
    by_end = gpu.sort("device", "end_ns").select("device", "end_ns", prev_kernel="name")
    g = (
        gaps.sort("device", "end_ns")
        .join_asof(by_start, left_on="end_ns", right_on="start_ns", by="device", strategy="forward",
                   check_sortedness=False, suffix="_next")
        .sort("device", "start_ns")
        .join_asof(by_end, left_on="start_ns", right_on="end_ns", by="device", strategy="backward",
                   check_sortedness=False, suffix="_prev")
        .drop("start_ns_next", "end_ns_prev", strict=False)
        .sort("device", "start_ns")
    )
    steps = trace.steps.collect()
    main = steps.group_by("pid", "tid").agg(n=pl.len()).sort("n", descending=True).head(1)
    main_pid, main_tid = (main["pid"][0], main["tid"][0]) if main.height else (None, None)
    g = g.with_columns(
        pid=pl.coalesce("launch_pid", pl.lit(main_pid, pl.String)),
        tid=pl.coalesce("launch_tid", pl.lit(main_tid, pl.String)),
        ts_ns=(pl.col("start_ns") + pl.col("end_ns")) // 2,
    )
    points = g.select("pid", "tid", "ts_ns").with_columns(pl.col("pid", "tid").fill_null(""))
    for label, frame in (("blamed_op", trace.cpu_ops), ("blamed_python", trace.python),
                         ("blamed_runtime", trace.runtime)):
        iv = sort_for_nesting(frame.select("pid", "tid", "ts_ns", "dur_ns", "name")
                              .filter(pl.col("dur_ns").is_not_null()).collect())
        if iv.height:
            parent, _ = parent_index(iv)
            iv = iv.with_columns(parent=pl.Series(parent))
            rows = innermost_enclosing(iv, points)
            g = g.with_columns(iv["name"].gather(rows).alias(label))
        else:
            g = g.with_columns(pl.lit(None, pl.String).alias(label))
    loading = (trace.events.filter(pl.col("name").str.contains(DATA_LOADING) & pl.col("dur_ns").is_not_null())
               .select("pid", "tid", l_start="ts_ns", l_end=pl.col("ts_ns") + pl.col("dur_ns")).collect())
    in_loading = (
        g.with_row_index("gap").join(loading, on=["pid", "tid"], how="inner")
        .filter((pl.col("l_start") <= pl.col("ts_ns")) & (pl.col("l_end") >= pl.col("ts_ns")))
        .select("gap").unique()
    )
    g = g.with_row_index("gap").with_columns(loading=pl.col("gap").is_in(in_loading["gap"].implode()))
    cause = (
        pl.when(pl.col("blamed_runtime").fill_null("").str.contains(SYNC_RUNTIME)
                | pl.col("blamed_op").is_in(list(SYNC_OPS)))
        .then(pl.lit(GapCause.HOST_SYNC.value))
        .when(pl.col("loading")).then(pl.lit(GapCause.DATA_LOADING.value))
        .when(pl.col("next_kernel").fill_null("").str.contains(COMMUNICATION)
              | pl.col("blamed_op").fill_null("").str.contains(COMMUNICATION))
        .then(pl.lit(GapCause.COMMUNICATION_WAIT.value))
        .when(pl.col("next_kind") == Kind.MEMCPY.value).then(pl.lit(GapCause.MEMCPY_WAIT.value))
        .when(pl.col("next_launch_ts_ns") > pl.col("start_ns")).then(pl.lit(GapCause.LAUNCH_OVERHEAD.value))
        .otherwise(pl.lit(GapCause.OTHER.value))
    )
    return g.with_columns(cause=cause).drop("gap", "loading", "ts_ns", "next_launch_ts_ns", "next_kind")


def gpu_gaps(trace: Trace, *, min_gap_ns: int = 0, window: WindowKind = "steps", device: int | None = None,
             top: int | None = None) -> GapsResult:
    """Busy, window, utilization and idle gaps (with blame and cause) per device. See the module docstring."""
    gpu = _gpu(trace)
    if device is not None:
        gpu = gpu.filter(pl.col("device") == device)
    step_table = step_windows(trace)
    windows = _windows(step_table, gpu, window) if gpu.height else pl.DataFrame(
        schema={"device": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    busy = clip(union(gpu.select("device", "start_ns", "end_ns"), ["device"]), windows, ["device"])
    gaps = complement(busy, windows, ["device"]).with_columns(dur_ns=pl.col("end_ns") - pl.col("start_ns"))
    gaps = _blame(trace, gaps, gpu) if gaps.height else gaps.with_columns(
        [pl.lit(None, pl.String).alias(c) for c in ("next_kernel", "launch_pid", "launch_tid", "prev_kernel", "pid",
                                                      "tid", "blamed_op", "blamed_python", "blamed_runtime",
                                                      "cause")])
    sw = step_table.select("step", w_start="start_ns", w_end="end_ns")
    if sw.height and gaps.height:
        located = gaps.with_row_index("gap").join(sw, how="cross").filter(
            (pl.col("start_ns") >= pl.col("w_start")) & (pl.col("start_ns") < pl.col("w_end"))
        ).select("gap", "step")
        gaps = gaps.with_row_index("gap").join(located, on="gap", how="left").drop("gap")
    else:
        gaps = gaps.with_columns(step=pl.lit(None, pl.Int64))
    per_device = (
        windows.group_by("device").agg(window_ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
        .join(busy.group_by("device").agg(busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum()), on="device",
              how="left")
        .join(gaps.group_by("device").agg(gaps=pl.len(), idle_ns=pl.col("dur_ns").sum(),
                                          longest_gap_ns=pl.col("dur_ns").max()), on="device", how="left")
        .with_columns(pl.col("busy_ns", "idle_ns", "gaps").fill_null(0))
        .with_columns(busy_fraction=pl.col("busy_ns") / pl.col("window_ns"))
        .select("device", "window_ns", "busy_ns", "idle_ns", "busy_fraction", "gaps", "longest_gap_ns")
        .sort("device")
    )
    by_cause = (
        gaps.group_by("device", "cause").agg(gaps=pl.len(), idle_ns=pl.col("dur_ns").sum())
        .join(per_device.select("device", total="idle_ns"), on="device")
        .with_columns(idle_fraction=pl.col("idle_ns") / pl.col("total")).drop("total")
        .sort("device", "idle_ns", descending=[False, True])
    ) if gaps.height else pl.DataFrame(schema={"device": pl.Int64, "cause": pl.String, "gaps": pl.UInt32,
                                               "idle_ns": pl.Int64, "idle_fraction": pl.Float64})
    edges = np.array(HISTOGRAM_EDGES_NS)
    labels = ["< 1 µs", "1–10 µs", "10–100 µs", "0.1–1 ms", "1–10 ms", "10–100 ms", ">= 100 ms"]
    bins = np.searchsorted(edges, gaps["dur_ns"].to_numpy(), side="right") if gaps.height else np.array([], int)
    histogram = pl.DataFrame({"bucket": labels, "gaps": np.bincount(bins, minlength=len(labels)).tolist(),
                              "idle_ns": [int(gaps["dur_ns"].to_numpy()[bins == i].sum()) if gaps.height else 0
                                          for i in range(len(labels))]})
    first = int(windows["start_ns"].min()) if windows.height else 0  # type: ignore[arg-type]
    shown = gaps.filter(pl.col("dur_ns") >= min_gap_ns).sort("dur_ns", descending=True).select(
        "device", "step", at_ns=pl.col("start_ns") - first, dur_ns="dur_ns", cause="cause",
        blamed_op="blamed_op", blamed_python="blamed_python", blamed_runtime="blamed_runtime",
        prev_kernel=short_name(pl.col("prev_kernel")), next_kernel=short_name(pl.col("next_kernel")), tid="tid",
        start_ts="start_ns", end_ts="end_ns")
    totals = per_device.select(pl.col("busy_ns", "window_ns", "idle_ns").sum()).row(0, named=True)
    return GapsResult(
        window_kind=window if step_table.height or window == "trace" else "trace (no ProfilerStep)",
        devices_with_gpu_work=per_device.height,
        busy_ns=int(totals["busy_ns"] or 0),
        window_ns=int(totals["window_ns"] or 0),
        idle_ns=int(totals["idle_ns"] or 0),
        busy_fraction=(totals["busy_ns"] / totals["window_ns"]) if totals["window_ns"] else None,
        gaps_total=gaps.height,
        min_gap_ns=min_gap_ns,
        devices=per_device,
        idle_by_cause=by_cause,
        gaps=shown.head(top) if top else shown,
        histogram=histogram,
    )


__all__ = ["GPU_KINDS", "GapCause", "GapsResult", "clip", "complement", "gpu_gaps", "short_name", "union"]
