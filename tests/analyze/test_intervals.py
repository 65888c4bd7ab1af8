"""Interval math against brute force over integer points (half-open intervals)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=15)


def _frame(pairs: list[tuple[int, int]], start: str = "start_ns", end: str = "end_ns") -> pl.LazyFrame:
    return pl.LazyFrame({start: [s for s, _ in pairs], end: [s + d for s, d in pairs]},
                        schema={start: pl.Int64, end: pl.Int64})


def _points(pairs: list[tuple[int, int]]) -> set[int]:
    return {x for s, d in pairs for x in range(s, s + d)}


def _covered(frame: pl.LazyFrame) -> set[int]:
    rows = frame.collect()
    return {x for s, e in zip(rows["start_ns"], rows["end_ns"], strict=True) for x in range(s, e)}


def _disjoint_sorted(frame: pl.LazyFrame) -> bool:
    rows = frame.collect()
    s, e = rows["start_ns"].to_list(), rows["end_ns"].to_list()
    return all(a < b for a, b in zip(s, e, strict=True)) and all(e[i] < s[i + 1] for i in range(len(s) - 1))


def test_union_examples() -> None:
    u = iv.union(_frame([(0, 10), (5, 7), (12, 3), (20, 5)], "ts_ns")).collect()
    assert u.rows() == [(0, 15), (20, 25)]
    assert iv.union_length(_frame([(0, 10), (5, 7)], "ts_ns")).collect().item() == 12


def test_clip_subtract_examples() -> None:
    a, w = _frame([(0, 12), (20, 5)]), _frame([(8, 14)])
    assert iv.clip(a, w).collect().rows() == [(8, 12), (20, 22)]
    assert iv.subtract(a, w).collect().rows() == [(0, 8), (22, 25)]


def test_grouped() -> None:
    f = pl.LazyFrame({"device": [1, 0, 0], "ts_ns": [3, 0, 5], "end_ns": [7, 4, 9]})
    assert iv.union_length(f, by=["device"]).collect().rows() == [(0, 8), (1, 4)]
    w = pl.LazyFrame({"device": [0, 1], "start_ns": [2, 0], "end_ns": [6, 4]})
    busy = iv.union(f, by=["device"])
    assert iv.subtract(w, busy, by=["device"]).collect().sort("device").rows() == [(0, 4, 5), (1, 0, 3)]


@settings(max_examples=60, deadline=None)
@given(spans)
def test_union_length_equals_brute_force(pairs: list[tuple[int, int]]) -> None:
    f = _frame(pairs, "ts_ns")
    assert _covered(iv.union(f)) == _points(pairs)
    assert _disjoint_sorted(iv.union(f))
    got = iv.union_length(f).collect()["length_ns"].item()
    assert (got or 0) == len(_points(pairs))


@settings(max_examples=60, deadline=None)
@given(spans, spans)
def test_busy_within_window_and_busy_plus_idle_is_window(busy: list[tuple[int, int]],
                                                         window: list[tuple[int, int]]) -> None:
    b, w = _frame(busy), _frame(window)
    clipped, idle = iv.clip(b, w), iv.subtract(w, b)
    assert _covered(clipped) == _points(busy) & _points(window)
    assert _covered(clipped) <= _points(window)
    assert _covered(idle) == _points(window) - _points(busy)
    assert len(_covered(clipped)) + len(_covered(idle)) == len(_points(window))
    assert _disjoint_sorted(idle) and _disjoint_sorted(clipped)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 20)), max_size=20), spans)
def test_grouped_is_each_group_alone(rows: list[tuple[int, int, int]], window: list[tuple[int, int]]) -> None:
    # GIVEN intervals on three devices THEN `by` gives, per device, what that device's intervals alone give with
    # by=() (which windows over no key at all), for union, clip and subtract
    f = pl.LazyFrame({"device": [d for d, _, _ in rows], "start_ns": [s for _, s, _ in rows],
                      "end_ns": [s + n for _, s, n in rows]}, schema={"device": pl.Int64, "start_ns": pl.Int64,
                                                                      "end_ns": pl.Int64})
    w = _frame(window)
    wd = w.join(pl.LazyFrame({"device": [0, 1, 2]}), how="cross")
    grouped = {"union": iv.union(f, by=["device"], start="start_ns"), "clip": iv.clip(f, wd, by=["device"]),
               "subtract": iv.subtract(f, wd, by=["device"])}
    for device in (0, 1, 2):
        alone = f.filter(pl.col("device") == device).drop("device")
        expect = {"union": iv.union(alone, start="start_ns"), "clip": iv.clip(alone, w),
                  "subtract": iv.subtract(alone, w)}
        for name, frame in grouped.items():
            got = frame.filter(pl.col("device") == device).drop("device").collect()
            assert got.rows() == expect[name].collect().rows(), name
