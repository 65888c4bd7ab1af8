"""A collection's data: page names, members that never stop at a bad trace, the straggler, the run's facts."""

from __future__ import annotations

import json
from pathlib import Path

from builders import kernel, runtime, step, trace, write_trace

from stepscope.analyze.collection import Member, members, page_names, run_facts, side_files, straggler
from stepscope.analyze.inputs import RunDir, TraceBatch, resolve


def _rank(directory: Path, rank: int, step_us: int) -> Path:
    doc = trace(step(1, ts=0, dur=step_us), step(2, ts=step_us, dur=step_us),
                runtime("cudaLaunchKernel", ts=1, dur=1, correlation=1), kernel("k", ts=2, dur=5, correlation=1),
                runtime("cudaLaunchKernel", ts=step_us + 1, dur=1, correlation=2),  # each step launches work
                kernel("k", ts=step_us + 2, dur=5, correlation=2),
                distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"})
    path: Path = write_trace(directory, doc, name=f"rank{rank}.pt.trace.json")
    return path


def test_members_go_on_past_a_bad_trace_and_name_it_in_one_line(tmp_path: Path) -> None:
    # GIVEN a good trace and a truncated one
    good = _rank(tmp_path / "in", 0, 100)
    bad = tmp_path / "in" / "broken.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X"')
    # WHEN the members are opened
    found = list(members([(bad, "broken"), (good, "good")], cache_dir=tmp_path / "cache"))
    # THEN the bad one is a member with its one-line failure naming the file, and the good one is analysed
    assert [m.name for m in found] == ["broken", "good"]
    assert found[0].bundle is None and found[0].failure and str(bad) in found[0].failure
    assert "\n" not in found[0].failure and found[0].row["error"]
    assert found[1].bundle is not None and found[1].failure is None
    assert found[1].row["steps"] == 2 and found[1].row["median_step_ns"] == 100_000


def test_the_straggler_is_the_slowest_median_step_and_needs_two_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank, step_us in ((0, 100), (1, 140), (2, 99)):
        _rank(run_dir / f"rank_{rank}", rank, step_us)
    inp = resolve(run_dir)
    assert isinstance(inp, RunDir)
    named = page_names(inp)
    assert [n for _, n in named] == ["rank0", "rank1", "rank2"]
    found = list(members(named, cache_dir=tmp_path / "cache"))
    assert straggler(found) == "rank1"
    assert straggler(found[:1]) is None


def test_page_names_are_unique() -> None:
    rows = [Member(name="a", path=Path("a"), bundle=None, row={"median_step_ns": 5})]
    assert straggler(rows) is None
    # a directory's traces by their path under it; two that still read alike get a '_' more
    assert [n for _, n in page_names(_batch(["x/t.json", "y/t.json"]))] == ["x_t", "y_t"]
    assert [n for _, n in page_names(_batch(["x/t.json", "x_t.json"]))] == ["x_t", "x_t_"]


def _batch(paths: list[str]) -> TraceBatch:
    return TraceBatch(path=Path("."), traces=tuple(Path(p) for p in paths))


def test_run_facts_from_the_first_manifest_and_none_without(tmp_path: Path) -> None:
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"command": {"argv": ["python", "train.py"]}, "device": {"type": "cuda", "name": "H100"},
                             "status": "ok", "baseline": {"mean_ns": 2_000_000}, "notes": ["warm-up 3 steps"]}))
    facts = run_facts([m])
    assert facts is not None
    assert (facts.command, facts.device, facts.status, facts.ranks) == ("python train.py", "cuda H100", "ok", 1)
    assert facts.baseline_step_ns == 2_000_000 and facts.notes == ["warm-up 3 steps"]
    assert run_facts([]) is None
    (tmp_path / "bad.json").write_text("[1, 2")
    assert run_facts([tmp_path / "bad.json"]) is None


def test_a_bad_side_file_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    bad = tmp_path / "snap.pickle"
    bad.write_bytes(b"\x80\x04not a pickle")
    run = RunDir(path=tmp_path, manifests=(), ranks=(), snapshots=(bad,), memory_timelines=())
    (side,) = side_files(run)
    assert side.result is None and side.problem and side.problem.startswith("snap.pickle: ")
