"""Vectorized interval math on LazyFrames (half-open [start_ns, end_ns) intervals, grouped by `by`).

Every function returns a LazyFrame with columns ``by..., start_ns, end_ns`` (or ``by..., length_ns``)
whose intervals are disjoint, non-empty and sorted. Nothing loops over rows in Python.

    union:      [0,10) [5,12) [20,25)            ->  [0,12) [20,25)
    clip:       [0,12) [20,25)  inside [8,22)    ->  [8,12) [20,22)
    subtract:   [0,12) [20,25)  minus  [8,22)    ->  [0,8) [22,25)
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

_ALL = "__intervals_all"


def _keys(by: Sequence[str]) -> list[str]:
    return list(by) if by else [_ALL]


def _prepare(frame: pl.LazyFrame, by: Sequence[str], start: str, end: str) -> pl.LazyFrame:
    cols = [pl.col(c) for c in by] if by else [pl.lit(0).alias(_ALL)]
    return frame.select(*cols, pl.col(start).cast(pl.Int64).alias("start_ns"),
                        pl.col(end).cast(pl.Int64).alias("end_ns")).filter(pl.col("end_ns") > pl.col("start_ns"))


def _grouped(keys: list[str]) -> list[str]:
    """The keys to sort and window by: none for the one group of `by=()` (its constant column), since a sort or a
    window over a constant key costs polars several times the plain one (5.4 s against 0.8 s for a union of 10M
    intervals)."""
    return [] if keys == [_ALL] else keys


def _over(expr: pl.Expr, keys: list[str]) -> pl.Expr:
    """`expr` per group of `keys` (over the whole frame for the one group of `by=()`)."""
    grouped = _grouped(keys)
    return expr.over(grouped) if grouped else expr


def _union(frame: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    # cumulative-max rule: a new run starts where an interval begins after every earlier one has ended
    prev_end = _over(pl.col("end_ns").cum_max().shift(1), keys)
    return (
        frame.sort(*_grouped(keys), "start_ns")
        .with_columns(_prev=prev_end)
        .with_columns(_run=_over((pl.col("_prev").is_null() | (pl.col("start_ns") > pl.col("_prev")))
                                 .cast(pl.Int64).cum_sum(), keys))
        .group_by(*keys, "_run").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())
        .drop("_run").sort(*_grouped(keys), "start_ns")
    )


def _finish(frame: pl.LazyFrame, by: Sequence[str]) -> pl.LazyFrame:
    return frame.drop(_ALL) if not by else frame


def union(frame: pl.LazyFrame, *, by: Sequence[str] = (), start: str = "ts_ns",
          end: str = "end_ns") -> pl.LazyFrame:
    """Maximal disjoint intervals covering `frame`'s [start, end) per `by` group (touching ones merge).

        [0,10) [5,12) [12,15) [20,25)  ->  [0,15) [20,25)
    """
    keys = _keys(by)
    return _finish(_union(_prepare(frame, by, start, end), keys), by)


def union_length(frame: pl.LazyFrame, *, by: Sequence[str] = (), start: str = "ts_ns",
                 end: str = "end_ns") -> pl.LazyFrame:
    """by..., length_ns: the total length covered by the union per group (overlaps counted once)."""
    u = union(frame, by=by, start=start, end=end)
    length = (pl.col("end_ns") - pl.col("start_ns")).sum().alias("length_ns")
    return u.group_by(*by).agg(length).sort(*by) if by else u.select(length)


def _sweep(a: pl.LazyFrame, b: pl.LazyFrame, by: Sequence[str], *, keep_b: bool) -> pl.LazyFrame:
    """Segments covered by `a` and (keep_b) or not (not keep_b) by `b`: one sort over the boundaries."""
    keys = _keys(by)
    ua = _union(_prepare(a, by, "start_ns", "end_ns"), keys)
    ub = _union(_prepare(b, by, "start_ns", "end_ns"), keys)
    events = pl.concat([
        ua.select(*keys, pos="start_ns", da=pl.lit(1), db=pl.lit(0)),
        ua.select(*keys, pos="end_ns", da=pl.lit(-1), db=pl.lit(0)),
        ub.select(*keys, pos="start_ns", da=pl.lit(0), db=pl.lit(1)),
        ub.select(*keys, pos="end_ns", da=pl.lit(0), db=pl.lit(-1)),
    ])
    state = (
        events.group_by(*keys, "pos").agg(pl.col("da").sum(), pl.col("db").sum())
        .sort(*_grouped(keys), "pos")
        .with_columns(ca=_over(pl.col("da").cum_sum(), keys), cb=_over(pl.col("db").cum_sum(), keys),
                      nxt=_over(pl.col("pos").shift(-1), keys))
    )
    wanted = (pl.col("ca") > 0) & ((pl.col("cb") > 0) if keep_b else (pl.col("cb") == 0))
    pieces = state.filter(wanted & pl.col("nxt").is_not_null()).select(*keys, start_ns="pos", end_ns="nxt")
    return _finish(_union(pieces, keys), by)


def clip(intervals: pl.LazyFrame, windows: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """The parts of `intervals` (start_ns, end_ns) inside `windows` (start_ns, end_ns), merged.

        [0,12) [20,25) clipped to [8,22)  ->  [8,12) [20,22)
    """
    return _sweep(intervals, windows, by, keep_b=True)


def subtract(a: pl.LazyFrame, b: pl.LazyFrame, *, by: Sequence[str] = ()) -> pl.LazyFrame:
    """The parts of `a` not covered by `b` (e.g. idle = window minus busy).

        [0,12) [20,25) minus [8,22)  ->  [0,8) [22,25)
    """
    return _sweep(a, b, by, keep_b=False)
