"""The streaming snapshot reader: the same tables as a full unpickle, whatever shape the pickle has.

The oracle is the old path, kept here only: pickle's C unpickler (restricted to plain data) builds every
object, then snapshot.py converts the plain lists as it always did.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from snapshot_builder import TORCH, USER, block, entry, segment

from stepscope.analyze import snapshot_read as snapshot
from stepscope.analyze._snapshot_stream import read_traces
from stepscope.analyze.snapshot_read import SnapshotTables, read_snapshot
from stepscope.errors import SnapshotFormatError


class _PlainOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _oracle(path: Path) -> SnapshotTables:
    """The tables the old reader made: unpickle everything, then convert the lists."""
    with open(path, "rb") as fh:
        data = _PlainOnly(fh).load()
    traces: list[Any]
    settings_: dict[str, Any]
    if isinstance(data, list):
        fmt, segments, traces, settings_ = "legacy segment list", data, [], {}
    else:
        fmt, segments = "snapshot dict", data.get("segments") or []
        traces, settings_ = data.get("device_traces") or [], data.get("allocator_settings") or {}
    interner = snapshot._Interner()
    events = snapshot._events_table(traces, interner)
    blocks, segs = snapshot._segment_tables(segments, interner)
    return SnapshotTables(source=str(path), format=fmt, events=events, blocks=blocks, segments=segs,
                          frames=interner.table(),
                          allocator_settings={k: v for k, v in settings_.items()
                                              if isinstance(v, (int, float, str, bool))})


def _streamed(path: Path, **options: Any) -> SnapshotTables:
    """read_snapshot with reader options (piece size, fast path on or off)."""
    original = snapshot.read_traces  # type: ignore[attr-defined]
    snapshot.read_traces = lambda fh, p, stack_of: read_traces(  # type: ignore[attr-defined,assignment,misc]
        fh, p, stack_of, **options)
    try:
        return read_snapshot(path)
    finally:
        snapshot.read_traces = original  # type: ignore[attr-defined]


def _assert_same(got: SnapshotTables, expected: SnapshotTables) -> None:
    def text_actions(events: pl.DataFrame) -> pl.DataFrame:
        return events.with_columns(pl.col("action").cast(pl.String))

    assert_frame_equal(text_actions(got.events), text_actions(expected.events))
    for name in ("blocks", "segments", "frames"):
        assert_frame_equal(getattr(got, name), getattr(expected, name))
    assert (got.format, got.allocator_settings) == (expected.format, expected.allocator_settings)


def _frame(file: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": "".join(file), "line": line, "name": "".join(name)}  # join: a new str object each time


FRAME_POOL = [_frame(TORCH, 1750, "_call_impl"), _frame(USER, 54, "forward"), _frame(USER, 90, "train_step"),
              _frame("/venv/lib/python3.11/site-packages/einops/_backends.py", 291, "einsum")]


def _frames_value(kind: str, shared: list[list[dict[str, Any]]], i: int) -> Any:
    """A frames value of each shape torch (and older or odd writers) produce."""
    if kind == "shared list":  # torch: one list per distinct traceback, referenced again and again
        return shared[i % len(shared)]
    if kind == "new list of shared frames":
        return [FRAME_POOL[(i + k) % len(FRAME_POOL)] for k in range(1 + i % 3)]
    if kind == "new list of new frames":
        return [_frame(USER, 10 + i % 5, "forward"), _frame(TORCH, 1, "_call_impl")]
    if kind == "empty":
        return []
    if kind == "absent":
        return "absent"
    return None


ODD_INTS: list[Any] = [True, 1.5, "12", "x", 2**63, -(2**63), 2**70, None]


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """Small random snapshots with the shapes torch writes, plus odd values the old reader tolerated."""
    shared = [[FRAME_POOL[k] for k in range(1 + s % 4)] for s in range(3)]
    odd_action = ("alloc",)  # referenced again and again: a memo reference to something not a string
    metadata = [FRAME_POOL[1]]  # a list first met as another key's value, later used as frames
    traces: list[Any] = []
    actions = {a: "".join(a) for a in ("alloc", "free_requested", "free_completed", "segment_alloc", "oom")}
    for _ in range(draw(st.integers(1, 2))):
        trace = []
        for i in range(draw(st.integers(0, 30))):
            action = actions[draw(st.sampled_from(sorted(actions)))]
            size = draw(st.sampled_from([0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40, -1, -(2**40)]))
            e = entry(action, draw(st.integers(0, 2**48)), size, t=1_700_000_000_000_000 + i)
            kind = draw(st.sampled_from(["shared list", "new list of shared frames", "new list of new frames",
                                         "empty", "absent", "none"]))
            value = _frames_value(kind, shared, i)
            if value == "absent":
                del e["frames"]
            else:
                e["frames"] = value
            if draw(st.booleans()):
                e["compile_context"] = "".join("N/A")  # a new string per entry, as torch writes it
            if draw(st.integers(0, 9)) == 0:
                e["user_metadata"] = "m" * draw(st.sampled_from([0, 5, 40, 300]))
            if action == "oom":
                e["device_free"] = draw(st.integers(0, 2**40))
            if draw(st.integers(0, 14)) == 0:  # an odd value where an integer belongs
                e[draw(st.sampled_from(["addr", "size", "stream", "time_us"]))] = draw(st.sampled_from(ODD_INTS))
            if draw(st.integers(0, 29)) == 0:
                e["action"] = draw(st.sampled_from([5, None, 2.5, odd_action]))
            if draw(st.integers(0, 14)) == 0:
                e[draw(st.sampled_from(["user_metadata", "frames"]))] = metadata
            if draw(st.integers(0, 19)) == 0:
                del e["time_us"]
            trace.append(e)
        traces.append(trace if bool(trace) or draw(st.booleans()) else None)
    blocks = [block(64 * k, 64, draw(st.sampled_from(["active_allocated", "inactive"])), shared[k % 3])
              for k in range(draw(st.integers(0, 4)))]
    return {"segments": [segment(0, blocks)] if blocks else [], "device_traces": traces,
            "allocator_settings": {"expandable_segments": False, "max_split_size": -1, "x": [1]}}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=snapshots(), protocol=st.integers(2, 5))
def test_streamed_tables_equal_a_full_unpickle(tmp_path: Path, data: dict[str, Any], protocol: int) -> None:
    # GIVEN a random snapshot pickled at protocol 2-5
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    expected = _oracle(path)
    # THEN the fast path, the general path alone, and tiny read pieces all give the old reader's tables
    _assert_same(read_snapshot(path), expected)
    _assert_same(_streamed(path, fast=False), expected)
    _assert_same(_streamed(path, piece_bytes=13), expected)


def _long_trace(entries: int) -> dict[str, Any]:
    """A trace long enough for many protocol frames (64 KiB) and APPENDS batches (1000 entries)."""
    shared = [[FRAME_POOL[k % 4], FRAME_POOL[(k + 1) % 4]] for k in range(50)]
    actions = {a: "".join(a) for a in ("alloc", "free_completed", "oom")}
    trace = []
    for i in range(entries):
        e = entry(actions["alloc" if i % 3 else "free_completed"], 2**33 + 512 * i, 512 << (i % 20), t=10**15 + i,
                  stack=shared[i % 50] if i % 7 else [FRAME_POOL[i % 4]], compile_context="".join("N/A"))
        if i % 997 == 0:
            e = entry(actions["oom"], 0, 2**30, t=10**15 + i, device_free=i)  # another key order
        trace.append(e)
    return {"segments": [segment(0, [block(0, 512, "active_allocated", shared[0])])], "device_traces": [trace]}


@pytest.mark.parametrize("piece_bytes", [1, 7, 4096, 1 << 20])
def test_entries_split_by_frames_and_read_pieces(tmp_path: Path, piece_bytes: int) -> None:
    # GIVEN 5000 entries: frame headers and read pieces fall inside entries
    path = tmp_path / "long.pickle"
    path.write_bytes(pickle.dumps(_long_trace(5000), protocol=4))
    # THEN every piece size gives the same tables as a full unpickle
    _assert_same(_streamed(path, piece_bytes=piece_bytes), _oracle(path))


def test_a_frames_list_shared_by_many_entries_is_one_stack(tmp_path: Path) -> None:
    # GIVEN 2000 entries and a block that all reference the same frames list object (torch shares tracebacks)
    stack = [FRAME_POOL[0], FRAME_POOL[1]]
    trace = [entry("alloc", 512 * i, 512, t=i, stack=stack) for i in range(2000)]
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment(0, [block(0, 512, "active_allocated", stack)])],
                                   "device_traces": [trace]}, protocol=4))
    tables = read_snapshot(path)
    # THEN every row (and the block) names the one user frame
    assert tables.events["frame_id"].unique().to_list() == tables.blocks["frame_id"].to_list()
    assert tables.frames.select("frame", "frame_id").rows() == [("model.py:54 forward", 0)]
    _assert_same(tables, _oracle(path))


def test_truncated_at_every_offset_is_one_clear_error(tmp_path: Path) -> None:
    raw = pickle.dumps(_long_trace(12), protocol=4)
    path = tmp_path / "cut.pickle"
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        with pytest.raises(SnapshotFormatError) as info:
            read_snapshot(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message
        assert ("not a pickle file" if cut == 0 else "truncated pickle") in message


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_code_deep_inside_a_trace_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    # GIVEN a long trace whose 3000th entry's frames would call os.system (the fast path reads around it)
    marker = tmp_path / "pwned"
    data = _long_trace(4000)
    data["device_traces"][0][3000]["frames"] = [_Evil(marker)]
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    with pytest.raises(SnapshotFormatError, match="refusing to load (os|posix).system"):
        read_snapshot(path)
    assert not marker.exists()


@pytest.mark.parametrize(("traces", "needle"), [
    ([[1, 2]], "malformed snapshot entry"),
    ([[{"action": "alloc", "frames": "not a list"}, {"action": "alloc", "frames": 5}]], "malformed snapshot entry"),
])
def test_malformed_entries_are_one_clear_error(tmp_path: Path, traces: list[Any], needle: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": traces}, protocol=4))
    with pytest.raises(SnapshotFormatError, match=needle):
        read_snapshot(path)


def test_one_trace_listed_twice_reads_as_the_old_reader_did(tmp_path: Path) -> None:
    # GIVEN device_traces naming the same list object twice (the old reader emptied it for the first)
    trace = [entry("alloc", 0, 512, t=1), entry("alloc", 512, 512, t=2)]
    path = tmp_path / "twice.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace, trace]}, protocol=4))
    _assert_same(read_snapshot(path), _oracle(path))
    assert read_snapshot(path).events["device"].to_list() == [0, 0]


def test_references_to_values_made_earlier_in_the_same_batch(tmp_path: Path) -> None:
    # GIVEN entries whose later rows name, by memo reference, values that earlier rows of the same run made:
    # a new action string, a new frames list, a list first met under another key, a tuple as an action
    shared = [FRAME_POOL[0], FRAME_POOL[1]]
    trace = [entry("alloc", 0, 512, t=0, stack=shared), entry("alloc", 512, 512, t=1, stack=shared)]
    late_action, late_frames, metadata = "".join("segment_map"), [FRAME_POOL[1], FRAME_POOL[0]], [FRAME_POOL[1]]
    tuple_action = ("x",)
    for i in range(2, 40):
        e = entry("alloc", 512 * i, 512, t=i, stack=shared, compile_context="".join("N/A"), user_metadata="")
        if i >= 10:
            e["action"] = late_action
        if i >= 12:
            e["frames"] = late_frames
        if i == 15:
            e["user_metadata"] = metadata
        if i >= 16:
            e["frames"] = metadata
        if i in (20, 30):
            e["action"] = tuple_action
        trace.append(e)
    path = tmp_path / "refs.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    # THEN the tables are the old reader's
    _assert_same(read_snapshot(path), _oracle(path))
    _assert_same(_streamed(path, fast=False), _oracle(path))
