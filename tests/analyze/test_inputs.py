"""inputs.resolve: every kind of input, told apart by one rule (content where cheap), and one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import pytest
from builders import kernel, step, trace, write_trace
from click.testing import CliRunner

from stepscope.analyze import ingest_trace
from stepscope.analyze.inputs import (
    Dataset,
    IngestedTrace,
    MemoryTimeline,
    RunDir,
    Snapshot,
    TraceBatch,
    TraceFile,
    expect_trace,
    find_trace_files,
    resolve,
    sniff,
)
from stepscope.cli import cli
from stepscope.errors import InputError, UsageError


def _doc(rank: int | None = None) -> dict[str, object]:
    doc = trace(step(1, ts=0, dur=100), kernel("k", ts=10, dur=20))
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
    return doc


def _snapshot(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    return path


def _raw_memory_timeline(path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps([[-1, 1, 512, 7], [5000, 2, 256, 4]]).encode()))
    return path


# ------------------------------------------------------------------------------------------------- files


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_trace_file(tmp_path: Path, gz: bool) -> None:
    path = write_trace(tmp_path, _doc(), "t.pt.trace.json", gz=gz)
    assert resolve(path) == TraceFile(path=path)
    assert resolve(path, batch=True) == TraceFile(path=path)  # a file stays a file


def test_a_bare_event_array_is_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc()["traceEvents"]))
    assert resolve(path) == TraceFile(path=path)


def test_a_snapshot_pickle_by_content_whatever_its_name(tmp_path: Path) -> None:
    assert resolve(_snapshot(tmp_path / "rank0.pickle")) == Snapshot(path=tmp_path / "rank0.pickle")
    assert resolve(_snapshot(tmp_path / "dump.bin")) == Snapshot(path=tmp_path / "dump.bin")


@pytest.mark.parametrize("name", ["w.memory_timeline.raw.json.gz", "anything.json.gz"])
def test_a_raw_memory_timeline_by_content(tmp_path: Path, name: str) -> None:
    path = _raw_memory_timeline(tmp_path / name)
    assert resolve(path) == MemoryTimeline(path=path)


def test_a_plain_memory_timeline_by_content(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps([[1, 2], [[0] * 9, [0] * 9]]))
    assert resolve(path) == MemoryTimeline(path=path)


def test_unreadable_content_falls_back_to_the_name(tmp_path: Path) -> None:
    # GIVEN files whose first bytes say nothing (corrupt gzip, empty): the name decides, and the reader that
    # opens them later says exactly what is wrong
    broken_trace = tmp_path / "a.pt.trace.json.gz"
    broken_trace.write_bytes(b"\x1f\x8bnope")
    broken_timeline = tmp_path / "w.memory_timeline.raw.json.gz"
    broken_timeline.write_bytes(b"not gzip")
    assert sniff(broken_trace) == "trace" and sniff(broken_timeline) == "memory_timeline"


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("notes.txt", b"hello", "not a Chrome trace (.json / .json.gz), CUDA memory snapshot"),
    ("m.html", b"<html><body></body></html>", "an HTML page"),
])
def test_a_file_of_no_known_kind_is_one_line_input_error(tmp_path: Path, name: str, content: bytes,
                                                         needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        resolve(path)
    assert str(info.value).startswith(f"{path}: ") and needle in str(info.value) and "\n" not in str(info.value)


def test_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        resolve(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no trace"):
        resolve(tmp_path / "empty")


# ------------------------------------------------------------------------------------------- directories


def test_an_ingested_directory(tmp_path: Path) -> None:
    src = write_trace(tmp_path / "raw", _doc())
    ingest_trace(src, tmp_path / "ingested")
    assert resolve(tmp_path / "ingested") == IngestedTrace(path=tmp_path / "ingested")


def test_a_directory_of_one_trace_is_that_trace_unless_batch(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "d", _doc(), "only.json")
    assert resolve(tmp_path / "d") == TraceFile(path=path)
    assert resolve(tmp_path / "d", batch=True) == TraceBatch(path=tmp_path / "d", traces=(path,))


def test_a_directory_of_traces_skips_side_files(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "d", _doc(), "a.json")
    b = write_trace(tmp_path / "d" / "sub", _doc(), "b.json.gz", gz=True)
    _raw_memory_timeline(tmp_path / "d" / "timeline.json.gz")  # a trace's name, a memory timeline's content
    _snapshot(tmp_path / "d" / "snap.pickle")
    (tmp_path / "d" / "notes.txt").write_text("x")
    inp = resolve(tmp_path / "d")
    assert inp == TraceBatch(path=tmp_path / "d", traces=(a, b))
    assert find_trace_files([tmp_path / "d"]) == [a, b]
    with pytest.raises(UsageError, match="pass one trace file"):
        expect_trace(inp)


def test_a_capture_run_with_a_manifest_and_two_ranks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r0 = write_trace(run, _doc(0), "rank0.1700000000000000000.pt.trace.json.gz", gz=True)
    r1 = write_trace(run, _doc(1), "rank1.1700000000000000500.pt.trace.json.gz", gz=True)
    for rank, path in ((0, r0), (1, r1)):
        (run / f"manifest.rank{rank}.json").write_text(json.dumps({
            "status": "ok", "distributed": {"rank": rank},
            "files": [{"name": path.name, "kind": "trace", "cycle": 0}]}))
    snap = _snapshot(run / "rank0.memory_snapshot.pickle")
    timeline = _raw_memory_timeline(run / "rank0.memory_timeline.raw.json.gz")
    inp = resolve(run)
    assert isinstance(inp, RunDir)
    assert [(r.rank, r.windows) for r in inp.ranks] == [(0, (r0,)), (1, (r1,))]
    assert inp.manifests == (run / "manifest.rank0.json", run / "manifest.rank1.json")
    assert inp.snapshots == (snap,) and inp.memory_timelines == (timeline,)
    assert resolve(run, batch=True) == inp  # a run stays a run


def test_several_windows_of_one_rank_are_pooled_in_time_order(tmp_path: Path) -> None:
    # GIVEN repeat=2: one file per profiler window, the later one first by name but second by export time
    run = tmp_path / "run"
    late = write_trace(run, _doc(), "rank0.1700000000000009999.pt.trace.json", gz=False)
    early = write_trace(run, _doc(), "rank0.17000000000000001.pt.trace.json", gz=False)
    (run / "manifest.json").write_text(json.dumps({"status": "ok"}))
    inp = resolve(run)
    assert isinstance(inp, RunDir) and [(r.rank, r.windows) for r in inp.ranks] == [(0, (early, late))]
    assert inp.traces == (early, late)


def test_the_manifest_cycle_orders_windows_before_names_and_mtimes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = write_trace(run, _doc(), "host_1.b.pt.trace.json")
    second = write_trace(run, _doc(), "host_1.a.pt.trace.json")
    os.utime(first, ns=(2_000_000_000, 2_000_000_000))
    os.utime(second, ns=(1_000_000_000, 1_000_000_000))
    (run / "manifest.json").write_text(json.dumps({"status": "ok", "files": [
        {"name": first.name, "kind": "trace", "cycle": 0}, {"name": second.name, "kind": "trace", "cycle": 1}]}))
    inp = resolve(run)
    assert isinstance(inp, RunDir) and inp.ranks[0].windows == (first, second)


def test_rank_sub_directories_make_a_run_without_a_manifest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r0 = write_trace(run / "rank_0", _doc(), "host.json")
    r1 = write_trace(run / "rank_1", _doc(), "host.json")
    inp = resolve(run)
    assert isinstance(inp, RunDir) and [(r.rank, r.windows) for r in inp.ranks] == [(0, (r0,)), (1, (r1,))]
    assert inp.manifests == ()
    with pytest.raises(UsageError, match=r"is a capture run \(2 ranks, 2 traces\)"):
        expect_trace(inp)


def test_a_dataset_from_stepscope_ingest(tmp_path: Path) -> None:
    write_trace(tmp_path / "raw", _doc(0), "a.json")
    write_trace(tmp_path / "raw", _doc(1), "b.json")
    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "raw"), "-o", str(tmp_path / "ds"), "-j", "1", "-q"])
    assert res.exit_code == 0, res.output
    inp = resolve(tmp_path / "ds")
    assert isinstance(inp, Dataset)
    assert sorted(t.rank for t in inp.traces) == ["0", "1"]
    assert all(t.trace_id.startswith(("a-", "b-")) and t.path.is_dir() for t in inp.traces)


def test_a_snapshot_or_timeline_asked_for_as_a_trace_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="use `stepscope snapshot`"):
        expect_trace(resolve(_snapshot(tmp_path / "s.pickle")))
    with pytest.raises(UsageError, match="use `stepscope memory-timeline`"):
        expect_trace(resolve(_raw_memory_timeline(tmp_path / "m.raw.json.gz")))
