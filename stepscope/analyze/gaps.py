"""GPU busy time, the analysis window, and every idle gap with the CPU activity blamed for it.

Definitions:
- **busy** per device: the union of its kernel, memcpy and memset intervals, all streams.
- **window** (`window="steps"`, the default): the union of the ProfilerStep windows (each step extended to
  the end of the GPU work it launched; `window.step_windows`), the same for every device; without steps, or
  with `window="trace"`, a device's first to last GPU event (`window.analysis_window`).
- **gap**: a maximal interval inside the window where the device does nothing (`intervals.subtract`).

**Blame: the innermost activity at the gap's midpoint** (chosen over "longest overlap": one point gives
one call stack, so op, Python frame and runtime call are consistent with each other). The thread is the
one that launched the GPU event right after the gap; where that is unknown, the main thread (the one
holding the ProfilerStep spans). Reported: the innermost CPU op (`blamed_op`), Python frame
(`blamed_python`, with_stack traces: the innermost frame of the user's code naming a source line,
`file.py(N): fn`, so C builtins such as `<built-in method item …>` are skipped and a frame inside torch or
the standard library never hides the user's line that called it; that library frame is `blamed_library`,
see `blame.python_lines`) and runtime call (`blamed_runtime`) enclosing the midpoint.

**Cause** — ordered rules, the first that holds wins:

    host_sync           the runtime call at the midpoint synchronizes (…Synchronize on CUDA/HIP/driver, a
                        synchronous cudaMemcpy / hipMemcpy / hipMemcpyWithStream, not …Async), or a cuda_sync
                        event (Stream/Event/Context Sync, not Stream Wait Event) on the device covers the
                        midpoint, or the op reads a value back (aten::item, aten::_local_scalar_dense,
                        aten::nonzero, aten::is_nonzero), or the op is a copy that issued a DtoH memcpy
                        (`.cpu()` / `.to("cpu")` -> aten::copy_); and, after data_loading and
                        communication_wait, a gap that began while the blamed thread sat in a synchronizing
                        call, which returned during it (the host waited for the GPU to run dry, then had to
                        launch again)
    data_loading        the thread is inside an event named like a DataLoader (enumerate(DataLoader)…,
                        _next_data, dataloader.py … __next__)
    communication_wait  the next GPU event is a collective (nccl/rccl kernel) or the op is a
                        c10d:: / nccl: / record_param_comms op
    memcpy_wait         the gap ends with a host copy (HtoD / DtoH …, not DtoD / PtoP, which are device
                        work like a kernel) issued before the gap began (a copy issued later was the CPU
                        being late: launch_overhead), or the op is a copy that issued an HtoD memcpy (the
                        copy waits for host data)
    launch_overhead     the next GPU event's launch call started after the gap began (the CPU was late),
                        or the gap is shorter than BACK_TO_BACK_NS (2 µs) between back-to-back launches
    other               none of the above (e.g. the launch came early but the stream waited on another)

Before/after, a `.item()` in forward:

    kernel A ends at 100 µs; aten::item (100..180) > aten::_local_scalar_dense (101..179)
      > cudaStreamSynchronize (103..178); kernel B launched at 182 runs at 185
    -> gap 100..185 (85 µs), midpoint 142.5: runtime cudaStreamSynchronize, op aten::_local_scalar_dense,
       cause host_sync

A slow Python loop between two kernels:

    kernel A ends at 100 µs; the next launch (cudaLaunchKernel) starts at 180, kernel B runs at 185
    -> gap 100..185, nothing syncing or loading at the midpoint, launched after the gap began: launch_overhead
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze._text import duration
from stepscope.analyze.blame import innermost, is_sync_runtime, nested, python_lines, short_name
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.loading import exposed_data_loading, exposed_in_window
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import WindowKind, with_step


class GapCause(str, enum.Enum):
    """Why the GPU was idle (see the module docstring for the ordered rules)."""

    HOST_SYNC = "host_sync"
    DATA_LOADING = "data_loading"
    COMMUNICATION_WAIT = "communication_wait"
    MEMCPY_WAIT = "memcpy_wait"
    LAUNCH_OVERHEAD = "launch_overhead"
    OTHER = "other"


SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::_copy_from", "aten::_copy_from_and_resize")
DATA_LOADING = r"(DataLoader|_next_data|dataloader\.py.*__next__)"
COMMUNICATION = r"(?i)(nccl|rccl|c10d::|record_param_comms|all_reduce|allreduce|all_gather|reduce_scatter)"
#: a gap shorter than this between launches already queued is the GPU's own launch overhead
BACK_TO_BACK_NS = 2_000
HISTOGRAM_EDGES_NS = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
HISTOGRAM_LABELS = ("< 1 µs", "1–10 µs", "10–100 µs", "0.1–1 ms", "1–10 ms", "10–100 ms", ">= 100 ms")


@dataclass(frozen=True, kw_only=True)
class GapsResult:
    """Per-device busy/window/utilization, every idle gap with blame and cause, idle by cause, a histogram.

    `gaps` columns: device, step, since_start_ns (the gap's start since the window began), dur_ns, cause,
    blamed_op, blamed_python, blamed_library, blamed_runtime, prev_kernel, next_kernel, tid (the blamed thread),
    start_ns and end_ns (on the trace's clock). Totals (`idle_ns`, `idle_by_cause`, `histogram`) count every
    gap, whatever `min_gap_ns` and `top` leave in `gaps`.
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
    data_loading_exposed_ns: int | None = None
    note: str | None = None  # where the cause table's data_loading row reads less than data_loading_exposed


def _gpu(frames: TraceFrames, device: int | None) -> pl.DataFrame:
    """GPU events with a device, start and duration (of `device` alone when given), with their launch."""
    gpu = (
        frames.launches.lazy()
        .filter(pl.col("device").is_not_null() & pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
        .select("kind", "name", "device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                launch_ts_ns="launch_ts_ns", launch_pid="launch_pid", launch_tid="launch_tid",
                op_event_id="op_event_id", gpu_event_id="gpu_event_id")
    )
    return (gpu if device is None else gpu.filter(pl.col("device") == device)).collect(engine="in-memory")


def _neighbours(gaps: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """prev_kernel (the GPU event ending at the gap's start), next_* (the one starting at its end).

    Where several end at the start (or start at the end) on different streams, the one first in the trace is
    next and the one last in the trace is prev (by event id): a tie never goes to whichever the sort put first,
    which changed from run to run (a gap's cause with it)."""
    by_start = gpu.sort("device", "start_ns", "gpu_event_id").select(
        "device", next_start="start_ns", next_kernel="name", next_kind="kind", next_launch_ts_ns="launch_ts_ns",
        launch_pid="launch_pid", launch_tid="launch_tid")
    by_end = gpu.sort("device", "end_ns", "gpu_event_id").select("device", prev_end="end_ns", prev_kernel="name")
    return (
        gaps.sort("device", "end_ns")
        .join_asof(by_start, left_on="end_ns", right_on="next_start", by="device", strategy="forward",
                   check_sortedness=False)
        .sort("device", "start_ns")
        .join_asof(by_end, left_on="start_ns", right_on="prev_end", by="device", strategy="backward",
                   check_sortedness=False)
        .drop("next_start", "prev_end")
    )


def _blame(frames: TraceFrames, gaps: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Add next/prev GPU event, the blamed thread, its innermost op / Python frame / runtime call, cause."""
    trace = frames.trace
    g = _neighbours(gaps, gpu)
    main_pid, main_tid = frames.main_thread or (None, None)
    g = g.with_columns(
        pid=pl.coalesce("launch_pid", pl.lit(main_pid, pl.String)),
        tid=pl.coalesce("launch_tid", pl.lit(main_tid, pl.String)),
        mid_ns=(pl.col("start_ns") + pl.col("end_ns")) // 2,
    ).with_row_index("gap")
    points = g.select(pl.col("pid", "tid").fill_null(""), ts_ns="mid_ns")
    op = innermost(nested(trace, "cpu_ops"), points)
    user_line, library_line = python_lines(trace, points)
    g = g.with_columns(blamed_op=op["name"], blamed_op_id=op["event_id"], blamed_python=user_line,
                       blamed_library=library_line, blamed_runtime=innermost(nested(trace, "runtime"), points)["name"])

    def gaps_inside(events: pl.LazyFrame, on: list[str]) -> pl.Series:
        """Gap rows whose midpoint lies in one of `events` (matched on `on`): the events are merged per
        group first, so an as-of join on the last span starting at or before the midpoint is exact."""
        spans = intervals.union(events.filter(pl.col("dur_ns").is_not_null())
                                .with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns")), by=on).collect(
                                    engine="in-memory")
        if spans.height == 0:
            return pl.Series("gap", [], dtype=pl.UInt32)
        spans = spans.select(*on, e_start="start_ns", e_end="end_ns").sort("e_start")
        found = (g.select("gap", *on, "mid_ns").drop_nulls(on).sort("mid_ns")
                 .join_asof(spans, left_on="mid_ns", right_on="e_start", by=on, strategy="backward",
                            check_sortedness=False))
        return found.filter(pl.col("mid_ns") <= pl.col("e_end"))["gap"]

    loading = gaps_inside(trace.events.filter(pl.col("name").str.contains(DATA_LOADING)), ["pid", "tid"])
    after_sync = _after_a_sync(trace, g)
    syncing = gaps_inside(trace.syncs.filter(~pl.col("name").str.contains("(?i)wait")), ["device"])
    copy_ops = gpu.filter(pl.col("kind") == Kind.MEMCPY.value).select(
        "op_event_id", dtoh=pl.col("name").str.contains("DtoH"), htod=pl.col("name").str.contains("HtoD"))
    dtoh_ops = copy_ops.filter("dtoh")["op_event_id"].drop_nulls().implode()
    htod_ops = copy_ops.filter("htod")["op_event_id"].drop_nulls().implode()
    a_copy = pl.col("blamed_op").is_in(list(COPY_OPS))
    cause = (
        pl.when(is_sync_runtime(pl.col("blamed_runtime")) | pl.col("gap").is_in(syncing.implode())
                | pl.col("blamed_op").is_in(list(SYNC_OPS)) | (a_copy & pl.col("blamed_op_id").is_in(dtoh_ops)))
        .then(pl.lit(GapCause.HOST_SYNC.value))
        .when(pl.col("gap").is_in(loading.implode())).then(pl.lit(GapCause.DATA_LOADING.value))
        .when(pl.col("next_kernel").fill_null("").str.contains(COMMUNICATION)
              | pl.col("blamed_op").fill_null("").str.contains(COMMUNICATION))
        .then(pl.lit(GapCause.COMMUNICATION_WAIT.value))
        .when(pl.col("gap").is_in(after_sync.implode())).then(pl.lit(GapCause.HOST_SYNC.value))
        .when(((pl.col("next_kind") == Kind.MEMCPY.value) & ~pl.col("next_kernel").str.contains("DtoD|PtoP")
               & ~(pl.col("next_launch_ts_ns") > pl.col("start_ns")).fill_null(False))
              | (a_copy & pl.col("blamed_op_id").is_in(htod_ops)))
        .then(pl.lit(GapCause.MEMCPY_WAIT.value))
        .when((pl.col("next_launch_ts_ns") > pl.col("start_ns")) | (pl.col("dur_ns") < BACK_TO_BACK_NS))
        .then(pl.lit(GapCause.LAUNCH_OVERHEAD.value))
        .otherwise(pl.lit(GapCause.OTHER.value))
    )
    return g.with_columns(cause=cause).drop("gap", "mid_ns", "next_launch_ts_ns", "next_kind", "blamed_op_id")


def _after_a_sync(trace: Trace, g: pl.DataFrame) -> pl.Series:
    """Gap rows that began while the blamed thread sat in a synchronizing call, which returned during the gap:
    the host was waiting for the GPU when it ran dry, and only then went on to launch the next work (an `.item()`
    per layer on a GPU: without the sync the CPU would have queued that work long before). A sync that began
    after the GPU ran dry (one at the end of a failed step, say) did not keep the work from it."""
    syncs = trace.runtime.filter(is_sync_runtime(pl.col("name")) & pl.col("dur_ns").is_not_null()).select(
        "pid", "tid", sync_start="ts_ns", sync_end=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory")
    if syncs.height == 0:
        return pl.Series("gap", [], dtype=pl.UInt32)
    found = (g.select("gap", "pid", "tid", "start_ns", "end_ns").drop_nulls(["pid", "tid"]).sort("end_ns")
             .join_asof(syncs.sort("sync_end"), left_on="end_ns", right_on="sync_end", by=["pid", "tid"],
                        strategy="backward", check_sortedness=False))
    return found.filter((pl.col("sync_start") <= pl.col("start_ns")) & (pl.col("sync_end") >= pl.col("start_ns")))[
        "gap"]


def _histogram(dur_ns: pl.Series) -> pl.DataFrame:
    """Gap count and idle time per log-10 length bin (bucket, gaps, idle_ns)."""
    values = dur_ns.to_numpy().astype(np.int64)
    bins = np.searchsorted(np.array(HISTOGRAM_EDGES_NS), values, side="right")
    n = len(HISTOGRAM_LABELS)
    return pl.DataFrame({"bucket": list(HISTOGRAM_LABELS),
                         "gaps": np.bincount(bins, minlength=n).astype(np.int64),
                         "idle_ns": np.bincount(bins, weights=values, minlength=n).astype(np.int64)})


def _unblamed(gaps: pl.DataFrame) -> pl.DataFrame:
    """`_blame`'s text columns, all null: for a trace with no gaps, so the columns exist either way."""
    return gaps.with_columns(pl.lit(None, pl.String).alias(c) for c in (
        "prev_kernel", "next_kernel", "launch_pid", "launch_tid", "pid", "tid", "blamed_op", "blamed_python",
        "blamed_library", "blamed_runtime", "cause"))


def _per_device(windows: pl.DataFrame, busy: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """device, window_ns, busy_ns, idle_ns, busy_fraction, gaps, longest_gap_ns; one row per device with a
    window (0 busy, 0 idle where it has none)."""

    def total(frame: pl.DataFrame, name: str) -> pl.DataFrame:
        return frame.group_by("device").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias(name))

    return (
        total(windows, "window_ns")
        .join(total(busy, "busy_ns"), on="device", how="left", maintain_order="left")
        .join(gaps.group_by("device").agg(gaps=pl.len().cast(pl.Int64), idle_ns=pl.col("dur_ns").sum(),
                                          longest_gap_ns=pl.col("dur_ns").max()), on="device", how="left",
              maintain_order="left")
        .with_columns(pl.col("busy_ns", "idle_ns", "gaps").fill_null(0))
        .with_columns(busy_fraction=pl.col("busy_ns") / pl.col("window_ns"))
        .select("device", "window_ns", "busy_ns", "idle_ns", "busy_fraction", "gaps", "longest_gap_ns")
        .sort("device")
    )


def _idle_by_cause(gaps: pl.DataFrame, per_device: pl.DataFrame) -> pl.DataFrame:
    """device, cause, gaps, idle_ns, idle_fraction (of the device's idle time); most idle first per device."""
    return (
        gaps.group_by("device", "cause").agg(gaps=pl.len().cast(pl.Int64), idle_ns=pl.col("dur_ns").sum())
        .join(per_device.select("device", all_idle="idle_ns"), on="device")
        .with_columns(idle_fraction=pl.col("idle_ns") / pl.col("all_idle")).drop("all_idle")
        .sort("device", "idle_ns", descending=[False, True])
    )


def _gaps_table(gaps: pl.DataFrame, windows: pl.DataFrame, min_gap_ns: int) -> pl.DataFrame:
    """The `gaps` table of GapsResult: gaps of at least min_gap_ns, longest first, since_start_ns counted
    from the first window's start, kernel names shortened."""
    first = windows["start_ns"].min() if windows.height else 0
    return gaps.filter(pl.col("dur_ns") >= min_gap_ns).sort(  # longest first; equal ones in time order
        "dur_ns", "start_ns", "device", descending=[True, False, False]).select(
        "device", "step", since_start_ns=pl.col("start_ns") - pl.lit(first, pl.Int64), dur_ns="dur_ns",
        cause="cause",
        blamed_op="blamed_op", blamed_python="blamed_python", blamed_library="blamed_library",
        blamed_runtime="blamed_runtime", prev_kernel=short_name(pl.col("prev_kernel")),
        next_kernel=short_name(pl.col("next_kernel")), tid="tid",
        start_ns="start_ns", end_ns="end_ns")


def gpu_gaps(source: Source, *, min_gap_ns: int = 0, window: WindowKind = "steps", device: int | None = None,
             top: int | None = None) -> GapsResult:
    """Busy, window, utilization and idle gaps (with blame and cause) per device. See the module docstring.

    `min_gap_ns` and `top` only trim the `gaps` table (longest first); every total counts every gap.
    """
    frames = frames_of(source)
    gpu = _gpu(frames, device)
    steps = frames.step_windows
    windows = frames.analysis_window(window)
    if device is not None:
        windows = windows.filter(pl.col("device") == device)
    busy = intervals.clip(intervals.union(gpu.lazy(), by=["device"], start="start_ns", end="end_ns"),
                          windows.lazy(), by=["device"]).collect(engine="in-memory")
    gaps = (intervals.subtract(windows.lazy(), busy.lazy(), by=["device"]).collect(engine="in-memory")
            .with_columns(dur_ns=pl.col("end_ns") - pl.col("start_ns")))
    gaps = _blame(frames, gaps, gpu) if gaps.height else _unblamed(gaps)
    gaps = with_step(gaps, steps)
    per_device = _per_device(windows, busy, gaps)
    shown = _gaps_table(gaps, windows, min_gap_ns)
    totals = per_device.select(pl.col("busy_ns", "window_ns", "idle_ns").sum()).row(0, named=True)
    window_ns = int(totals["window_ns"] or 0)
    kind: str = window if steps.height or window == "trace" else "trace (no ProfilerStep)"
    if kind == "steps" and frames.iterations.inferred:
        kind = f"steps ({frames.iterations.source})"
    return GapsResult(
        window_kind=kind,
        devices_with_gpu_work=per_device.height,
        busy_ns=int(totals["busy_ns"] or 0),
        window_ns=window_ns,
        idle_ns=int(totals["idle_ns"] or 0),
        busy_fraction=int(totals["busy_ns"] or 0) / window_ns if window_ns else None,
        gaps_total=gaps.height,
        min_gap_ns=min_gap_ns,
        devices=per_device,
        idle_by_cause=_idle_by_cause(gaps, per_device),
        gaps=shown.head(top) if top else shown,
        histogram=_histogram(gaps["dur_ns"]),
        data_loading_exposed_ns=(exposed := _exposed_loading(frames, windows, window)),
        note=_loading_note(exposed, gaps, window_ns),
    )


def _loading_note(exposed: int | None, gaps: pl.DataFrame, window_ns: int) -> str | None:
    """Why the cause table's data_loading row can read less than `data_loading exposed` (resnet50 num_workers=4:
    10 µs against 7.12 ms, its 45 ms gap a memcpy_wait that began with 4.3 ms of DataLoader): the one counts every
    idle ns under the DataLoader, the other gives each gap one cause.
    Said where the row reads under half of it, and it is over 0.1% of the window."""
    caused = int(gaps.filter(pl.col("cause") == GapCause.DATA_LOADING.value)["dur_ns"].sum() or 0) if gaps.height else 0
    if exposed is None or caused >= exposed / 2 or exposed <= 0.001 * window_ns:
        return None
    return (f"data loading exposed ({duration(exposed)}) counts every idle moment under the DataLoader; the cause "
            "table gives each gap one cause (where its launching thread was at its midpoint, what ended it), so its "
            f"data_loading row reads {duration(caused)}: the rest lies in gaps that began in the DataLoader and were "
            "mostly spent waiting for something else (a copy, a launch)")


def _exposed_loading(frames: TraceFrames, windows: pl.DataFrame, window: WindowKind) -> int | None:
    """`loading.exposed_data_loading` summed over the step spans (as `steps` counts it) with the default window,
    else `loading.exposed_in_window` over the analysis window's extent; None where there is neither."""
    spans = frames.step_windows
    if window == "steps" and spans.height:
        return int(exposed_data_loading(frames.trace, spans)["data_loading_exposed_ns"].sum())
    if windows.height == 0:
        return None
    return exposed_in_window(frames.trace, int(windows["start_ns"].min()), int(windows["end_ns"].max()))  # type: ignore[arg-type]


__all__ = ["BACK_TO_BACK_NS", "GapCause", "GapsResult", "gpu_gaps"]
