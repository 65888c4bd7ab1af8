"""Per-thread nesting of CPU intervals: which event is the parent of which, and which interval encloses a point.

The rule is torch's own (`EventList._populate_cpu_children`): on one (pid, tid), events sorted by start and
then by longest first; an event is a child of the nearest open event that it fits inside (it starts before
that event ends and ends no later). Events that only partly overlap are not nested.

    tid 1:  [aten::linear 0..10 [aten::t 1..2] [aten::addmm 3..9 [aten::copy_ 4..5]]]
    event            parent          depth
    aten::linear     -               0
    aten::t          aten::linear    1
    aten::addmm      aten::linear    1
    aten::copy_      aten::addmm     2

The stack walk cannot be built with column operations: the compiled scanner's `nest` (_scan.c) walks the events
in C; where it is not built, the same walk runs here over plain integer lists, about 0.4 s per million events
(tests hold the two to the same answer). So does torch's merge of repeated nodes (`collapse_repeated`, the C
scanner's `collapse`; in Python about 0.5 s per million events). Everything else here is vectorized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from stepscope.analyze._native import scan as _scan

IntArray = npt.NDArray[np.int64]


def _thread_starts(frame: pl.DataFrame) -> pl.Series:
    """True at each row that starts a (pid, tid) of a frame in nesting order."""
    new = (pl.col("pid") != pl.col("pid").shift()) | (pl.col("tid") != pl.col("tid").shift())
    return frame.select(new.fill_null(True).alias("n"))["n"]


def sort_for_nesting(events: pl.DataFrame) -> pl.DataFrame:
    """Events in nesting order: by pid, tid, start, then longest first (a parent before its children)."""
    return events.sort(
        pl.col("pid"), pl.col("tid"), pl.col("ts_ns"), pl.col("dur_ns"), descending=[False, False, False, True],
        nulls_last=True, maintain_order=True,
    )


def parent_index(events: pl.DataFrame) -> tuple[IntArray, IntArray]:
    """Parent row (-1 for none) and depth of each row of a frame already in `sort_for_nesting` order.

    The frame needs pid, tid, ts_ns, dur_ns. Returns two int64 arrays aligned with its rows. A row without a start
    or a duration (a damaged event, which `info` warns of) nests nothing and is in nothing: parent -1, depth 0.
    """
    timed = events.select(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null()).to_series()
    if not timed.all():
        rows = timed.arg_true().to_numpy().astype(np.int64)
        sub_parent, sub_depth = parent_index(events.filter(timed))
        parent = np.full(events.height, -1, dtype=np.int64)
        depth = np.zeros(events.height, dtype=np.int64)
        parent[rows] = np.where(sub_parent >= 0, rows[np.maximum(sub_parent, 0)], -1)
        depth[rows] = sub_depth
        return parent, depth
    if _scan is not None:
        return _nest_compiled(events)
    return _nest_python(events)


def _nest_compiled(events: pl.DataFrame) -> tuple[IntArray, IntArray]:
    n = events.height
    start = events["ts_ns"].cast(pl.Int64).to_numpy().astype(np.int64, copy=False)
    end = (events["ts_ns"] + events["dur_ns"]).cast(pl.Int64).to_numpy().astype(np.int64, copy=False)
    new_thread = _thread_starts(events).cast(pl.UInt8).to_numpy()
    parent = np.empty(n, dtype=np.int64)
    depth = np.empty(n, dtype=np.int64)
    _scan.nest(np.ascontiguousarray(start), np.ascontiguousarray(end), new_thread, parent, depth)
    return parent, depth


def _nest_python(events: pl.DataFrame) -> tuple[IntArray, IntArray]:
    n = events.height
    start = events["ts_ns"].to_list()
    end = (events["ts_ns"] + events["dur_ns"]).to_list()
    new_thread = _thread_starts(events).to_list()
    parent = [-1] * n
    depth = [0] * n
    stack: list[int] = []
    for i in range(n):
        if new_thread[i]:
            stack.clear()
        s, e = start[i], end[i]
        while stack:
            top = stack[-1]
            top_end = end[top]
            if s >= top_end or e > top_end:  # torch: this cannot be a parent
                stack.pop()
            else:
                parent[i] = top
                break
        depth[i] = len(stack)
        stack.append(i)
    return np.asarray(parent, dtype=np.int64), np.asarray(depth, dtype=np.int64)


def collapse_repeated(
    parent: IntArray, name_codes: IntArray, lifted: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_], IntArray, IntArray]:
    """torch's `_remove_dup_nodes`: a child with its parent's name, where the parent has no other child, is dropped.

    Its children become the parent's and its `lifted` value (torch: its kernels) replaces the parent's.
    Rows must be in nesting order (each parent before its children: a ValueError otherwise). Returns (new parent
    index, removed mask, lifted values, new depth). The compiled scanner's `collapse` walks the rows in C; where it
    is not built, the same walk runs here over plain lists (tests hold the two to the same answer).

        aten::to (1 child) -> aten::to -> aten::_to_copy     becomes     aten::to -> aten::_to_copy
    """
    parent, name_codes, lifted = (np.ascontiguousarray(a, dtype=np.int64) for a in (parent, name_codes, lifted))
    if not len(parent) == len(name_codes) == len(lifted):
        raise ValueError("collapse: every array must have one length")
    if (parent >= np.arange(len(parent))).any():
        raise ValueError("collapse: a parent row must come before its children")
    if _scan is not None:
        return _collapse_compiled(parent, name_codes, lifted)
    return _collapse_python(parent, name_codes, lifted)


def _collapse_compiled(
    parent: IntArray, name_codes: IntArray, lifted: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_], IntArray, IntArray]:
    n = len(parent)
    par, lift, depth = (np.empty(n, dtype=np.int64) for _ in range(3))
    removed = np.empty(n, dtype=np.uint8)
    _scan.collapse(parent, name_codes, lifted, par, removed, lift, depth)
    return par, removed.view(np.bool_), lift, depth


def _collapse_python(
    parent: IntArray, name_codes: IntArray, lifted: IntArray
) -> tuple[IntArray, npt.NDArray[np.bool_], IntArray, IntArray]:
    n = len(parent)
    par = parent.tolist()
    names = name_codes.tolist()
    lift = lifted.tolist()
    nchild = np.bincount(parent[parent >= 0], minlength=n).tolist() if n else []
    removed = [False] * n
    depth = [0] * n
    eff = list(range(n))  # where a row's children go: itself, or (if removed) its surviving parent
    for i in range(n):
        p = par[i]
        if p < 0:
            continue
        p = eff[p]
        par[i] = p
        depth[i] = depth[p] + 1
        if names[p] == names[i] and nchild[p] == 1:
            removed[i] = True
            eff[i] = p
            nchild[p] = nchild[i]
            lift[p] = lift[i]
    return (np.asarray(par, dtype=np.int64), np.asarray(removed, dtype=np.bool_),
            np.asarray(lift, dtype=np.int64), np.asarray(depth, dtype=np.int64))


def subtree_sum(parent: IntArray, depth: IntArray, values: IntArray) -> IntArray:
    """Each row's value plus all its descendants' (vectorized level by level, deepest first)."""
    total = values.astype(np.int64, copy=True)
    if len(total) == 0:
        return total
    for d in range(int(depth.max()), 0, -1):
        rows = np.flatnonzero((depth == d) & (parent >= 0))
        np.add.at(total, parent[rows], total[rows])
    return total


def children_sum(parent: IntArray, values: IntArray, keep: npt.NDArray[np.bool_] | None = None) -> IntArray:
    """Per row, the sum of `values` over its direct children (rows with keep False are ignored)."""
    out = np.zeros(len(parent), dtype=np.int64)
    mask = parent >= 0 if keep is None else (parent >= 0) & keep
    np.add.at(out, parent[mask], values[mask])
    return out


@dataclass(frozen=True, eq=False)
class Nested:
    """Intervals nested once for any number of `enclosing` lookups: in `sort_for_nesting` order, their threads
    (each one's rows together), starts, ends and parents (`parent_index`) as arrays, and the columns kept of them
    (`rows`, in the same order). Only these are held, not the frame they came from."""

    #: pid, tid and each one's number (`thread`), in nesting order
    threads: pl.DataFrame
    #: where each thread's rows begin, and the number of rows (its last element)
    bounds: IntArray
    starts: IntArray
    ends: IntArray
    #: each row's parent row, -1 for none
    parents: IntArray
    #: the columns kept of the intervals, one row each, in nesting order
    rows: pl.DataFrame

    @classmethod
    def of(cls, events: pl.DataFrame, keep: tuple[str, ...] = ()) -> Nested:
        """`events` (pid, tid, ts_ns, dur_ns non-null) nested, keeping their columns `keep`."""
        ordered = sort_for_nesting(events)
        parent, _ = parent_index(ordered)
        return cls.ordered(ordered, parent, keep)

    @classmethod
    def ordered(cls, intervals: pl.DataFrame, parent: IntArray, keep: tuple[str, ...] = ()) -> Nested:
        """`intervals` already in `sort_for_nesting` order with their `parent_index`."""
        new_thread = _thread_starts(intervals)
        starts = intervals["ts_ns"].cast(pl.Int64).to_numpy()
        return cls(threads=intervals.filter(new_thread).select("pid", "tid").with_row_index("thread"),
                   bounds=np.append(np.flatnonzero(new_thread.to_numpy()), intervals.height).astype(np.int64),
                   starts=starts, ends=starts + intervals["dur_ns"].cast(pl.Int64).to_numpy(),
                   parents=np.asarray(parent, dtype=np.int64), rows=intervals.select(keep))

    @property
    def height(self) -> int:
        """The number of intervals."""
        return len(self.starts)

    def enclosing(self, points: pl.DataFrame) -> pl.Series:
        """For each point (pid, tid, ts_ns), the row of the innermost interval enclosing it (start <= ts <= end, on
        the same pid and tid); null where none does. The last interval of its thread to start at or before the
        point is the innermost candidate (a binary search in the thread's rows, which the nesting order keeps
        together and by start); where it ended already, walk up its parents (vectorized: one step per nesting
        level for all points at once)."""
        if self.height == 0 or points.height == 0:
            return pl.Series("interval_row", [None] * points.height, dtype=pl.Int64)
        pts = (points.select("pid", "tid", "ts_ns")
               .join(self.threads, on=["pid", "tid"], how="left", maintain_order="left")
               .select(thread=pl.when(pl.col("ts_ns").is_not_null()).then(pl.col("thread").cast(pl.Int64))
                       .fill_null(-1), ts_ns=pl.col("ts_ns").cast(pl.Int64).fill_null(0)))
        thread, t = pts["thread"].to_numpy(), pts["ts_ns"].to_numpy()
        row = np.full(len(t), -1, dtype=np.int64)
        order = np.argsort(thread, kind="stable")
        present, at = np.unique(thread[order], return_index=True)
        for th, group in zip(present.tolist(), np.split(order, at[1:]), strict=True):
            if th >= 0:
                lo, hi = int(self.bounds[th]), int(self.bounds[th + 1])
                k = np.searchsorted(self.starts[lo:hi], t[group], side="right") - 1
                row[group] = np.where(k >= 0, k + lo, -1)
        while True:
            open_rows = row >= 0
            bad = open_rows.copy()
            bad[open_rows] = self.ends[row[open_rows]] < t[open_rows]
            if not bad.any():
                break
            row[bad] = self.parents[row[bad]]
        return pl.Series("interval_row", row, dtype=pl.Int64).replace(-1, None)


def innermost_enclosing(intervals: pl.DataFrame, points: pl.DataFrame) -> pl.Series:
    """For each point (pid, tid, ts_ns), the row index in `intervals` of the innermost interval enclosing it
    (`Nested.enclosing`). `intervals` must be in `sort_for_nesting` order with its `parent_index` result in a
    `parent` column."""
    return Nested.ordered(intervals, intervals["parent"].to_numpy()).enclosing(points)
