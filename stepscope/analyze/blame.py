"""Who was on the CPU at a moment: the helpers that gaps, overlap, transfers and summary share.

`innermost` finds the innermost CPU op / Python frame / runtime call enclosing given points on given threads;
`source_frames` keeps the Python frames that name a source line; `is_sync_runtime` tells a runtime call that
blocks the host; `short_name` trims a kernel name for tables.
"""

from __future__ import annotations

import polars as pl

from stepscope.analyze.nesting import innermost_enclosing, parent_index, sort_for_nesting
from stepscope.analyze.trace import Trace


def is_sync_runtime(name: pl.Expr) -> pl.Expr:
    """True for a runtime/driver call that blocks the host until the GPU catches up.

        cudaStreamSynchronize, hipDeviceSynchronize, cuCtxSynchronize, cudaMemcpy, hipMemcpyWithStream -> True
        cudaMemcpyAsync, cudaStreamWaitEvent (a GPU-side wait), cudaLaunchKernel                          -> False
    """
    name = name.fill_null("")
    return name.str.contains("(?i)synchronize") | (
        name.str.contains("(?i)^(cuda|hip|cu)memcpy") & ~name.str.contains("(?i)async"))


def short_name(name: pl.Expr) -> pl.Expr:
    """A kernel's name without return type, template arguments and parameter list, for tables.

        void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, …>(int, …)
        -> at::native::vectorized_elementwise_kernel
    """
    cpp = name.str.contains("::") | name.str.starts_with("void ")
    return pl.when(cpp).then(name.str.replace(r"^void ", "").str.replace(r"[<(].*$", "")).otherwise(name)


def innermost(frame: pl.LazyFrame, points: pl.DataFrame) -> pl.DataFrame:
    """name, event_id of the innermost event of `frame` enclosing each point (pid, tid, ts_ns); nulls where none.

    One row per point, in the points' order. Only events that enclose some point take part (found by an
    as-of join: the first point at or after an event's start lies before its end); an enclosing event's
    ancestors enclose the point too, so the nesting among those is the full nesting. The nesting walk is
    nesting.py's (one place, measured there).
    """
    empty = pl.DataFrame({"name": [None] * points.height, "event_id": [None] * points.height},
                         schema={"name": pl.String, "event_id": pl.Int64})
    if points.height == 0:
        return empty
    marks = points.select("pid", "tid", p_ts="ts_ns").drop_nulls().sort("p_ts")
    iv = (
        frame.filter(pl.col("dur_ns").is_not_null())
        .select("pid", "tid", "ts_ns", "dur_ns", "name", "event_id").sort("ts_ns")
        .join_asof(marks.lazy(), left_on="ts_ns", right_on="p_ts", by=["pid", "tid"], strategy="forward",
                   check_sortedness=False)
        .filter(pl.col("p_ts") <= pl.col("ts_ns") + pl.col("dur_ns")).drop("p_ts").collect()
    )
    if iv.height == 0:
        return empty
    iv = sort_for_nesting(iv)
    parent, _ = parent_index(iv)
    rows = innermost_enclosing(iv.with_columns(parent=pl.Series(parent)), points)
    return pl.DataFrame({"name": iv["name"].gather(rows), "event_id": iv["event_id"].gather(rows)})


def source_frames(trace: Trace) -> pl.LazyFrame:
    """Python frames that name a source line (``model.py(42): forward``), not C builtins.

        <built-in method copy_ of Tensor object at 0x7f…>   -> skipped (it says nothing about where)
        train.py(88): train_step                            -> kept
    """
    return trace.python.filter(pl.col("name").str.contains(r"\(\d+\): "))
