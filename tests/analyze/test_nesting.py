"""Per-thread nesting: the stack walk against a brute-force definition, the merge rule, enclosing lookups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze import load, nesting
from stepscope.analyze._columns import scanner_available
from stepscope.analyze._native import scan
from stepscope.analyze.blame import NestedFrame, innermost, is_library_frame, nested, source_frames
from stepscope.analyze.nesting import (
    children_sum,
    collapse_repeated,
    innermost_enclosing,
    parent_index,
    sort_for_nesting,
    subtree_sum,
)


def _frame(rows: list[tuple[str, int, int]]) -> pl.DataFrame:
    """rows: (tid, ts, dur)."""
    return pl.DataFrame({"pid": ["1"] * len(rows), "tid": [r[0] for r in rows],
                         "ts_ns": [r[1] for r in rows], "dur_ns": [r[2] for r in rows]})


def test_parent_and_depth_follow_containment() -> None:
    # GIVEN linear 0..10 holding t 1..2 and addmm 3..9 holding copy_ 4..5; another thread's event overlapping
    f = sort_for_nesting(_frame([("1", 3, 6), ("1", 0, 10), ("1", 4, 1), ("1", 1, 1), ("2", 2, 5)]))
    parent, depth = parent_index(f)
    starts = f["ts_ns"].to_list()
    named = {starts[i] if f["tid"][i] == "1" else -1: (starts[parent[i]] if parent[i] >= 0 else None, depth[i])
             for i in range(f.height)}
    assert named == {0: (None, 0), 1: (0, 1), 3: (0, 1), 4: (3, 2), -1: (None, 0)}


def test_partial_overlap_is_not_nesting() -> None:
    f = sort_for_nesting(_frame([("1", 0, 10), ("1", 5, 10)]))
    parent, _ = parent_index(f)
    assert parent.tolist() == [-1, -1]


def test_equal_intervals_nest_in_order() -> None:
    # torch sorts by (start, -end): of two identical spans the first one written is the parent
    f = sort_for_nesting(_frame([("1", 0, 10), ("1", 0, 10)]))
    parent, depth = parent_index(f)
    assert parent.tolist() == [-1, 0] and depth.tolist() == [0, 1]


def _brute_parent(rows: list[tuple[int, int]]) -> list[int]:
    """Innermost earlier-sorted interval containing each one (torch's rule, quadratic)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], -(rows[i][0] + rows[i][1]), i))
    pos = {i: k for k, i in enumerate(order)}
    out = []
    for k, i in enumerate(order):
        s, e = rows[i][0], rows[i][0] + rows[i][1]
        best = -1
        for j in order[:k]:
            js, je = rows[j][0], rows[j][0] + rows[j][1]
            if js <= s and s < je and e <= je:
                best = pos[j]  # later in sort order among containers = innermost
        out.append(best)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=25))
def test_stack_walk_equals_brute_force_on_properly_nested_or_not(rows: list[tuple[int, int]]) -> None:
    f = sort_for_nesting(_frame([("1", s, d) for s, d in rows]))
    parent, _ = parent_index(f)
    brute = _brute_parent(rows)
    # the stack walk may only lose a parent that a partially-overlapping sibling popped; where intervals
    # nest properly both agree, and any parent found really contains the child
    ts, end = f["ts_ns"].to_numpy(), (f["ts_ns"] + f["dur_ns"]).to_numpy()
    for i, p in enumerate(parent):
        if p >= 0:
            assert ts[p] <= ts[i] < end[p] and end[i] <= end[p]
    laminar = all(not (a[0] < b[0] < a[0] + a[1] < b[0] + b[1]) for a in rows for b in rows)
    if laminar:
        assert parent.tolist() == brute


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["1", "2", "3"]), st.integers(0, 60), st.integers(0, 25)), max_size=40))
def test_the_compiled_walk_is_the_python_walk(rows: list[tuple[str, int, int]]) -> None:
    # GIVEN events on several threads, nested, overlapping or equal THEN the C walk gives the Python walk's answer
    if not scanner_available():
        pytest.skip("the compiled scanner is not built here")
    f = sort_for_nesting(_frame(rows))
    compiled, python = nesting._nest_compiled(f), nesting._nest_python(f)
    assert compiled[0].tolist() == python[0].tolist() and compiled[1].tolist() == python[1].tolist()
    assert parent_index(f)[0].tolist() == python[0].tolist()


def test_collapse_merges_single_same_name_child_and_lifts_its_value() -> None:
    # to -> to -> _to_copy, plus a sibling chain where the parent has two children (kept)
    parent = np.array([-1, 0, 1, -1, 3, 3])
    names = np.array([1, 1, 2, 1, 1, 2])
    lifted = np.array([5, 7, 0, 1, 2, 3])
    new_parent, removed, lift, depth = collapse_repeated(parent, names, lifted)
    assert removed.tolist() == [False, True, False, False, False, False]
    assert new_parent[2] == 0 and depth[2] == 1
    assert lift[0] == 7  # the child's kernels replace the parent's


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 40), st.integers(0, 2), st.integers(0, 9)), max_size=40))
def test_the_compiled_collapse_is_the_python_collapse(rows: list[tuple[int, int, int]]) -> None:
    # GIVEN forests in nesting order (each row's parent an earlier row, or none), with few names so that chains of
    # one same-name child are common THEN the C walk gives the Python walk's answer
    if not scanner_available():
        pytest.skip("the compiled scanner is not built here")
    parent = np.array([p % i if i and p >= 0 else -1 for i, (p, _, _) in enumerate(rows)], dtype=np.int64)
    names = np.array([r[1] for r in rows], dtype=np.int64)
    lifted = np.array([r[2] for r in rows], dtype=np.int64)
    given = parent.copy(), lifted.copy()
    compiled = nesting._collapse_compiled(parent, names, lifted)
    python = nesting._collapse_python(parent, names, lifted)
    assert [a.tolist() for a in compiled] == [a.tolist() for a in python]
    assert [a.tolist() for a in collapse_repeated(parent, names, lifted)] == [a.tolist() for a in python]
    assert parent.tolist() == given[0].tolist() and lifted.tolist() == given[1].tolist()  # inputs left alone


def test_collapse_refuses_rows_out_of_nesting_order() -> None:
    with pytest.raises(ValueError, match="a parent row must come before its children"):
        collapse_repeated(np.array([-1, 2, 0]), np.array([1, 1, 1]), np.array([0, 0, 0]))
    if scan is not None:  # the C walk checks for itself as well (a parent past the rows would read out of bounds)
        out = [np.zeros(2, np.int64) for _ in range(4)]
        with pytest.raises(ValueError, match="a parent row must come before its children"):
            scan.collapse(np.array([-1, 5]), out[0], out[1], out[2], np.zeros(2, np.uint8), out[3], out[1])


def test_subtree_and_children_sums() -> None:
    parent = np.array([-1, 0, 0, 2])
    depth = np.array([0, 1, 1, 2])
    vals = np.array([1, 2, 3, 4])
    assert subtree_sum(parent, depth, vals).tolist() == [10, 2, 7, 4]
    assert children_sum(parent, vals).tolist() == [5, 0, 4, 0]


def test_innermost_enclosing_walks_up_past_finished_children() -> None:
    iv = sort_for_nesting(_frame([("1", 0, 100), ("1", 10, 10), ("1", 12, 2), ("2", 0, 100)]))
    parent, _ = parent_index(iv)
    iv = iv.with_columns(parent=pl.Series(parent))
    pts = pl.DataFrame({"pid": ["1"] * 5, "tid": ["1", "1", "1", "1", "3"], "ts_ns": [13, 50, 20, 200, 5]})
    rows = innermost_enclosing(iv, pts).to_list()
    starts = [iv["ts_ns"][r] if r is not None else None for r in rows]
    assert starts == [12, 0, 10, None, None]  # end is inclusive (20 is inside 10..20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["1", "2", "3"]), st.integers(0, 60), st.integers(0, 25)), max_size=40),
       st.lists(st.tuples(st.sampled_from(["1", "2", "3", "4"]), st.one_of(st.none(), st.integers(-5, 90))),
                max_size=30))
def test_innermost_enclosing_is_the_last_enclosing_interval_in_nesting_order(
        rows: list[tuple[str, int, int]], points: list[tuple[str, int | None]]) -> None:
    # GIVEN intervals on three threads (nested, overlapping, equal, empty) and points on those threads, on a
    # thread with none, and without a time
    iv = sort_for_nesting(_frame(rows))
    parent, _ = parent_index(iv)
    iv = iv.with_columns(parent=pl.Series(parent, dtype=pl.Int64))
    pts = pl.DataFrame({"pid": ["1"] * len(points), "tid": [p[0] for p in points], "ts_ns": [p[1] for p in points]},
                       schema={"pid": pl.String, "tid": pl.String, "ts_ns": pl.Int64})
    # WHEN looked up THEN each point gets, by definition, the enclosing interval latest in nesting order (start,
    # then longest first: the one that started last, the shortest of those), None where none encloses it
    tids, starts, ends = iv["tid"].to_list(), iv["ts_ns"].to_list(), (iv["ts_ns"] + iv["dur_ns"]).to_list()
    expected = [max((r for r in range(iv.height) if tids[r] == tid and t is not None and starts[r] <= t <= ends[r]),
                    default=None) for tid, t in points]
    assert innermost_enclosing(iv, pts).to_list() == expected


SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "item_in_forward_cuda"


def _innermost_by_scan(events: pl.DataFrame, points: pl.DataFrame) -> pl.DataFrame:
    """Per point (its row order): the (ts_ns, dur_ns) of the innermost event enclosing it, by definition: of the
    events on its thread with start <= ts <= end, the one that starts last, the shortest of those (nulls: none)."""
    return (
        points.with_row_index("point")
        .join(events.select("pid", "tid", e_ts="ts_ns", e_dur="dur_ns"), on=["pid", "tid"], how="left")
        .with_columns(inside=pl.col("ts_ns").is_between(pl.col("e_ts"), pl.col("e_ts") + pl.col("e_dur")))
        .with_columns(pl.when(pl.col("inside")).then(pl.col(c)).alias(c) for c in ("e_ts", "e_dur"))
        .sort("point", "e_ts", pl.col("e_dur"), descending=[False, False, True], nulls_last=False)
        .group_by("point", maintain_order=True).agg(pl.col("e_ts", "e_dur").last())
        .sort("point").select(ts_ns="e_ts", dur_ns="e_dur")
    )


@pytest.mark.parametrize("frame", ["cpu_ops", "runtime", "python", "user_python"])
def test_a_trace_frame_nested_once_answers_as_the_definition_does(frame: NestedFrame) -> None:
    # GIVEN a real capture (CPU ops, runtime calls, Python frames of torch's and of the user's) and points on its
    # threads: every event's start, middle and end, and the moment just after it
    trace = load(next(SAMPLE.glob("*.pt.trace.json.gz")))
    lazy = {"cpu_ops": trace.cpu_ops, "runtime": trace.runtime, "python": source_frames(trace),
            "user_python": source_frames(trace).filter(~is_library_frame(pl.col("name")))}[frame]
    events = lazy.filter(pl.col("dur_ns").is_not_null()).collect()
    assert events.height >= 5  # (the user's own frames are the fewest: 7)
    points = pl.concat([events.select("pid", "tid", ts_ns=at) for at in (
        pl.col("ts_ns"), pl.col("ts_ns") + pl.col("dur_ns") // 2, pl.col("ts_ns") + pl.col("dur_ns"),
        pl.col("ts_ns") + pl.col("dur_ns") + 1)]).sample(fraction=1.0, shuffle=True, seed=7)
    # WHEN looked up in the nesting kept on the trace, and in the frame nested for these points alone
    index = nested(trace, frame)
    found = innermost(index, points)
    again = innermost(lazy, points)
    # THEN both name, for every point, the event the definition picks (start and duration; equal spans may differ
    # only in which of them is named), and the nesting is built once per trace
    picked = found.join(events.select("event_id", "ts_ns", "dur_ns"), on="event_id", how="left",
                        maintain_order="left").select("ts_ns", "dur_ns")
    assert picked.equals(_innermost_by_scan(events, points))
    assert found.equals(again)
    assert index.height == events.height and nested(trace, frame) is index
