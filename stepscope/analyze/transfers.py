"""Host/device copies: bandwidth, pageable vs pinned, sync vs async, and how much of each stalled the GPU.

Per copy (a memcpy event): direction from its name (`Memcpy HtoD (Pageable -> Device)` -> HtoD, pageable),
bytes, duration, achieved GB/s, whether the host waited for it (`sync`: the call that issued it was
synchronous, cudaMemcpy / hipMemcpy rather than the …Async variants, or the issuing thread's next runtime
call is a synchronize that ends after the copy does: what torch's `.to(device)` / `.cpu()` without
`non_blocking` does, cudaMemcpyAsync then cudaStreamSynchronize), `exposed_ns` — the part of the copy not
overlapped by any kernel on the same device (the GPU had nothing else to do) — and `cpu_blocked_ns`, for a
copy the host waited for, the issuing call's duration plus that synchronize's (the host waited that long;
from pageable memory the issuing call itself stages the data). The Python line is the innermost Python frame
on the launching thread around the issuing call (with_stack), else the op that issued it. A copy to or from
host memory whose name does not say pageable or pinned (AMD's `Memcpy HtoD (Host -> Device)`) has neither, and
a pageable count over it is None (`blame.host_memory_unsaid`), never a 0 that reads as "all pinned".

    kernels [0, 10] [20, 30] µs; copy [5, 25] µs  ->  exposed 10 µs (the [10, 20] stretch)
    cudaMemcpyAsync [0, 35] µs, copy [35, 40], cudaStreamSynchronize [36, 48]  ->  sync, cpu_blocked 47 µs
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.blame import host_memory_unsaid, is_sync_runtime, python_lines
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.schema import Kind
from stepscope.analyze.window import with_step

DIRECTION = r"(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|HtoA|AtoH)"


@dataclass(frozen=True, kw_only=True)
class TransfersResult:
    """Every copy, totals per direction and per step, and the worst copies by exposed time."""

    copies_total: int
    copy_time_ns: int
    exposed_ns: int
    copied_bytes: int | None  # None where a copy's size is unknown (no `bytes` arg: AMD's): never a partial sum
    pageable_copies: int | None  # None where a host copy's name does not say pageable or pinned (AMD's)
    sync_copies: int
    cpu_blocked_ns: int
    by_direction: pl.DataFrame
    by_step: pl.DataFrame
    worst: pl.DataFrame
    copies: pl.DataFrame


def covered_ns(spans: pl.DataFrame, busy: pl.DataFrame) -> pl.Series:
    """For each span (device, start_ns, end_ns), the length covered by `busy` (disjoint intervals per device).

    A prefix sum of busy lengths makes covered(s, e) = F(e) - F(s), where F(t) is the busy time before t.
    """
    if spans.height == 0:
        return pl.Series("covered_ns", [], dtype=pl.Int64)
    length = pl.col("end_ns") - pl.col("start_ns")
    b = busy.sort("device", "start_ns").with_columns(before=length.cum_sum().over("device") - length)

    def f(col: str) -> pl.Series:
        pts = spans.with_row_index("i").select("i", "device", t=pl.col(col)).sort("device", "t")
        got = pts.join_asof(b, left_on="t", right_on="start_ns", by="device", strategy="backward",
                            check_sortedness=False)
        value = pl.col("before") + pl.min_horizontal(pl.col("t"), pl.col("end_ns")) - pl.col("start_ns")
        return got.sort("i").select(pl.when(pl.col("start_ns").is_null()).then(0).otherwise(value)).to_series()

    return (f("end_ns") - f("start_ns")).alias("covered_ns")


def _waited_for(copies: pl.DataFrame, runtime: pl.DataFrame) -> pl.DataFrame:
    """`copies` (launches rows with start_ns / end_ns) plus `sync` (null without an issuing call) and
    `cpu_blocked_ns` (module docstring): a synchronous issuing call, or a synchronize that is the issuing
    thread's next runtime call and ends after the copy."""
    after = pl.col("launch_ts_ns") + pl.col("launch_dur_ns")
    following = runtime.select(launch_pid="pid", launch_tid="tid", _next_ts="ts_ns", _next_dur="dur_ns",
                               _next="name").sort("_next_ts")
    joined = (copies.with_row_index("_row").with_columns(_after=after).sort("_after")
              .join_asof(following, left_on="_after", right_on="_next_ts", by=["launch_pid", "launch_tid"],
                         strategy="forward", check_sortedness=False)
              .sort("_row"))
    issued_sync = is_sync_runtime(pl.col("runtime_name"))
    waited = (~issued_sync & is_sync_runtime(pl.col("_next"))
              & (pl.col("_next_ts") + pl.col("_next_dur") >= pl.col("end_ns"))).fill_null(False)
    return joined.with_columns(
        sync=pl.when(pl.col("runtime_name").is_not_null()).then(issued_sync | waited),
        cpu_blocked_ns=pl.when(pl.col("runtime_name").is_not_null() & issued_sync).then(pl.col("launch_dur_ns"))
        .when(pl.col("runtime_name").is_not_null() & waited).then(pl.col("launch_dur_ns") + pl.col("_next_dur"))
        .otherwise(pl.lit(0, pl.Int64)),
    ).drop("_row", "_after", "_next_ts", "_next_dur", "_next")


def transfers(source: Source, *, top: int | None = 10) -> TransfersResult:
    """All copies with bandwidth, pinned/pageable, sync/async, exposed stall and CPU time blocked."""
    frames = frames_of(source)
    trace = frames.trace
    copies = (
        frames.launches.lazy().filter(pl.col("kind") == Kind.MEMCPY.value)
        .join(trace.memcpy.select(gpu_event_id="event_id", bytes="bytes"), on="gpu_event_id", how="left",
              maintain_order="left")
        .collect(engine="in-memory")
    )
    kernels = trace.kernels.select("device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")).collect(
        engine="in-memory")
    busy = intervals.union(kernels.lazy().filter(pl.col("device").is_not_null()), by=["device"], start="start_ns",
                           end="end_ns").collect(engine="in-memory")
    copies = copies.with_columns(
        direction=pl.col("name").str.extract(DIRECTION).fill_null("other"),
        # null where the name does not say (AMD: "Memcpy HtoD (Host -> Device)")
        pageable=pl.when(pl.col("name").str.contains("Pageable|Pinned")).then(pl.col("name").str.contains("Pageable")),
        pinned=pl.when(pl.col("name").str.contains("Pageable|Pinned")).then(pl.col("name").str.contains("Pinned")),
        start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
    )
    copies = _waited_for(copies, trace.runtime.filter(pl.col("dur_ns").is_not_null()).select(
        "pid", "tid", "ts_ns", "dur_ns", "name").collect(engine="in-memory"))
    copies = copies.with_columns(covered_ns(copies.select("device", "start_ns", "end_ns"), busy))
    points = copies.select(pid=pl.col("launch_pid").fill_null(""), tid=pl.col("launch_tid").fill_null(""),
                           ts_ns=pl.col("launch_ts_ns").fill_null(0))
    copies = copies.with_columns(python_line=python_lines(trace, points)[0])
    copies = with_step(copies, frames.step_windows)
    copies = copies.with_columns(pl.col("bytes").cast(pl.Int64))
    table = copies.sort("start_ns", "gpu_event_id").select(  # copies that start together in trace order
        "device", "stream", "step", "direction", size_bytes="bytes", dur_ns="dur_ns",
        gbps=pl.col("bytes") / pl.col("dur_ns"),
        name="name",
        pageable="pageable", pinned="pinned", sync="sync",
        exposed_ns=pl.col("dur_ns") - pl.col("covered_ns"),
        cpu_blocked_ns="cpu_blocked_ns",
        runtime="runtime_name", op="op_name", python_line="python_line", start_ns="start_ns",
    )
    pageable = pl.when(~host_memory_unsaid(pl.col("name")).any()).then(pl.col("pageable").sum())  # exact or null
    # exact or null: a copy without its size (AMD's memcpy events carry no `bytes`) leaves the total unknown
    copied = pl.when(pl.col("size_bytes").null_count() == 0).then(pl.col("size_bytes").sum())
    by_direction = table.group_by("direction").agg(
        copies=pl.len(), copied_bytes=copied, dur_ns=pl.col("dur_ns").sum(),
        exposed_ns=pl.col("exposed_ns").sum(), pageable=pageable, sync=pl.col("sync").sum(),
        cpu_blocked_ns=pl.col("cpu_blocked_ns").sum(),
    ).with_columns(gbps=pl.col("copied_bytes") / pl.col("dur_ns")).sort("dur_ns", "direction",
                                                                       descending=[True, False])
    by_step = table.filter(pl.col("step").is_not_null()).group_by("step", "direction").agg(
        copies=pl.len(), copied_bytes=copied, dur_ns=pl.col("dur_ns").sum(),
        exposed_ns=pl.col("exposed_ns").sum()).sort("step", "direction")
    worst = table.sort("exposed_ns", descending=True, maintain_order=True).head(
        top if top is not None else table.height).select(
        "direction", "size_bytes", "dur_ns", "exposed_ns", "gbps", "pageable", "sync", "cpu_blocked_ns", "step",
        where=pl.coalesce("python_line", "op", "runtime"))
    return TransfersResult(
        copies_total=table.height,
        copy_time_ns=int(table["dur_ns"].sum() or 0),
        exposed_ns=int(table["exposed_ns"].sum() or 0),
        copied_bytes=table.select(copied).item() if table.height else 0,
        pageable_copies=table.select(pageable).item() if table.height else 0,
        sync_copies=int(table["sync"].sum() or 0),
        cpu_blocked_ns=int(table["cpu_blocked_ns"].sum() or 0),
        by_direction=by_direction,
        by_step=by_step,
        worst=worst,
        copies=table.drop("start_ns"),
    )
