"""`reports.perfetto`: the annotated trace export, checked against the analyses it shows and against the
trace-event format (a validator written here from the format's definition: required keys per phase, X slices
nested on each thread, ids on flow and async events, both ends of every added flow).

Synthetic traces give exact expectations; the corpus (skipped where ../shared is absent) checks real traces
and the 8-rank PARAM DLRM run.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import (
    cpu_op,
    flow,
    kernel,
    memcpy,
    memory,
    runtime,
    step,
    thread_name,
    trace,
    write_trace,
)
from polars.testing import assert_frame_equal

from stepscope.analyze import load
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.collectives import collectives
from stepscope.analyze.critical_path import critical_path
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.inputs import is_ingested
from stepscope.errors import InputError, UsageError
from stepscope.reports.perfetto import CATEGORY, ExportOptions, _ns, _us, export, export_run, export_trace

US = 1000

# ------------------------------------------------------------------------------------- the format's rules

#: keys every event of a phase must carry (Trace Event Format: "name", "ph", "ts", "pid", "tid" on every
#: event but metadata, which needs no ts; counters are process-wide, so no tid)
_REQUIRED = {
    "X": {"name", "ph", "ts", "pid", "tid", "dur"}, "B": {"name", "ph", "ts", "pid", "tid"},
    "E": {"ph", "ts", "pid", "tid"}, "i": {"name", "ph", "ts", "pid"}, "I": {"name", "ph", "ts", "pid"},
    "C": {"name", "ph", "ts", "pid", "args"}, "M": {"name", "ph", "pid", "args"},
    "s": {"name", "ph", "ts", "pid", "tid", "id"}, "t": {"name", "ph", "ts", "pid", "tid", "id"},
    "f": {"name", "ph", "ts", "pid", "tid", "id"}, "b": {"name", "ph", "ts", "pid", "id"},
    "e": {"ph", "ts", "pid", "id"}, "n": {"name", "ph", "ts", "pid", "id"},
}
_METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def validate(doc: dict[str, Any], *, only_added: bool = False) -> list[str]:
    """Problems with `doc` as a trace-event file (JSON object format); [] when there are none.

    Checked on every event (or only the added ones, `only_added`): the phase is known and its required keys are
    there; ts/dur are numbers, dur >= 0; an instant's scope is g, p or t; counter values are numbers; metadata
    names are the format's five, with their arg; X slices on one (pid, tid) nest (each starts after the one
    before ends, or ends within it); flows of our category have both a start and a finish with one id."""
    problems: list[str] = []
    if not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents array"]
    slices: dict[tuple[Any, Any], list[tuple[Decimal, Decimal, str]]] = defaultdict(list)
    flows: dict[tuple[Any, Any], set[str]] = defaultdict(set)
    for i, ev in enumerate(doc["traceEvents"]):
        if only_added and ev.get("cat") != CATEGORY:
            continue
        ph = ev.get("ph")
        if ph not in _REQUIRED:
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        if missing := _REQUIRED[ph] - set(ev):
            problems.append(f"event {i} ({ph}): missing {sorted(missing)}")
            continue
        for key in ("ts", "dur"):
            if key in ev and (not isinstance(ev[key], int | float | Decimal) or isinstance(ev[key], bool)):
                problems.append(f"event {i}: {key} is not a number")
        if ph == "X":
            if ev["dur"] < 0:
                problems.append(f"event {i}: negative dur")
            start = Decimal(str(ev["ts"]))  # exact: a float sum would make touching slices overlap
            slices[(ev["pid"], ev["tid"])].append((start, start + Decimal(str(ev["dur"])), ev["name"]))
        if ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"event {i}: instant scope {ev.get('s')!r}")
        if ph == "C" and not all(isinstance(v, int | float | Decimal) and not isinstance(v, bool)
                                 for v in ev["args"].values()):
            problems.append(f"event {i}: counter {ev['name']!r} has a value that is not a number")
        if ph == "M":
            if ev["name"] not in _METADATA:
                problems.append(f"event {i}: unknown metadata {ev['name']!r}")
            elif not ev["args"]:
                problems.append(f"event {i}: metadata {ev['name']!r} without its arg")
        if ph in ("s", "t", "f") and ev.get("cat") == CATEGORY:
            flows[(ev.get("cat"), ev["id"])].add(ph)
    for thread, spans in slices.items():
        stack: list[tuple[Decimal, Decimal, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"thread {thread}: {name!r} [{start}, {end}) overlaps {stack[-1][2]!r} "
                                f"[{stack[-1][0]}, {stack[-1][1]}) without nesting in it")
            stack.append((start, end, name))
    problems += [f"flow {key}: only {sorted(ends)}" for key, ends in flows.items() if not {"s", "f"} <= ends]
    return problems


def read(path: Path) -> dict[str, Any]:
    """The exported file (gzip or not), decimals read exactly: a float would merge the ns of today's timestamps
    (1712195495698982.858 -> ...982.8) and make touching slices overlap."""
    data = path.read_bytes()
    doc: dict[str, Any] = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, parse_float=Decimal)
    return doc


def added(doc: dict[str, Any], ph: str | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == CATEGORY and (ph is None or e["ph"] == ph)]


def thread_names(doc: dict[str, Any]) -> dict[tuple[Any, Any], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def on_thread(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    names = thread_names(doc)
    return [e for e in added(doc, "X") if names.get((e["pid"], e["tid"])) == name]


def to_ns(us: Decimal | float | int) -> int:
    return int(Decimal(str(us)) * US)


def test_the_validator_finds_what_it_should() -> None:
    # GIVEN events that break each rule once
    bad = {"traceEvents": [
        {"ph": "X", "cat": CATEGORY, "name": "a", "pid": 1, "tid": 1, "ts": 0},  # no dur
        {"ph": "X", "cat": CATEGORY, "name": "b", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": CATEGORY, "name": "c", "pid": 1, "tid": 1, "ts": 5, "dur": 10},  # crosses b's end
        {"ph": "s", "cat": CATEGORY, "name": "f", "pid": 1, "tid": 1, "ts": 0, "id": 3},  # no finish
        {"ph": "C", "cat": CATEGORY, "name": "q", "pid": 1, "ts": 0, "args": {"v": None}},
        {"ph": "M", "name": "process_nom", "pid": 1, "args": {"name": "x"}},
        {"ph": "i", "cat": CATEGORY, "name": "v", "pid": 1, "tid": 1, "ts": 0, "s": "x"},
    ]}
    # THEN each is reported
    problems = validate(bad)
    assert len(problems) == 6, problems
    assert validate({"traceEvents": bad["traceEvents"][1:2]}) == []


# ------------------------------------------------------------------------------------- exact times


@pytest.mark.parametrize(("ns", "text"), [(1712195495519689047, b"1712195495519689.047"), (12_000, b"12"),
                                          (-1_500, b"-1.500"), (0, b"0"), (7, b"0.007")])
def test_times_are_written_in_us_exactly(ns: int, text: bytes) -> None:
    assert bytes(_us(ns)) == text
    assert _ns(text) == ns


def test_times_are_read_as_ingest_reads_them() -> None:
    assert _ns(b"1623142623460111") == 1623142623460111000
    assert _ns(b"12.3456") == 12346
    assert _ns(b"1.5e3") == 1_500_000
    assert _ns(b'"x"') is None


# ------------------------------------------------------------------------------------- one synthetic trace


def _training_trace() -> dict[str, Any]:
    """Two steps on the main thread: data loading, forward ops launching kernels, a .item() sync, an exposed
    HtoD copy, an autograd thread, an optimizer step, memory events, launch flows."""
    events: list[dict[str, Any]] = [thread_name("python main"), thread_name("autograd", tid=2)]
    corr = 0
    for n, base in ((1, 0), (2, 1000)):
        events += [step(n, base, 900),
                   cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base + 5, 95)]
        for k in range(3):
            corr += 1
            t = base + 120 + k * 60
            events += [cpu_op("aten::mm", t, 40, external_id=corr + 100),
                       runtime("cudaLaunchKernel", t + 5, 10, correlation=corr, external_id=corr + 100),
                       kernel("sgemm", t + 20, 30, correlation=corr),
                       flow(corr, "s", t + 5, pid=1000, tid=1), flow(corr, "f", t + 20, pid=0, tid=7)]
        corr += 1
        events += [cpu_op("aten::item", base + 320, 80), cpu_op("aten::_local_scalar_dense", base + 321, 78),
                   runtime("cudaStreamSynchronize", base + 322, 76),
                   cpu_op("aten::copy_", base + 410, 60, external_id=corr + 100),
                   runtime("cudaMemcpyAsync", base + 412, 5, correlation=corr, external_id=corr + 100),
                   memcpy("HtoD", base + 420, 40, nbytes=1 << 20, correlation=corr),
                   cpu_op("MmBackward0", base + 500, 150, tid=2, fwd_thread_id=1),
                   cpu_op("Optimizer.step#SGD.step", base + 700, 150),
                   memory(base + 130, 1 << 20, total_allocated=(n + 1) << 20, total_reserved=8 << 20),
                   memory(base + 600, -(1 << 20), total_allocated=n << 20, total_reserved=8 << 20)]
        corr += 1
        events += [runtime("cudaLaunchKernel", base + 705, 10, correlation=corr),
                   kernel("sgd_update", base + 750, 100, correlation=corr)]
    doc: dict[str, Any] = trace(*events, displayTimeUnit="ms", baseTimeNanoseconds=1_700_000_000_000_000_000)
    return doc


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    path: Path = write_trace(tmp_path / "traces", _training_trace(), "train.pt.trace.json")
    return path


def _export(src: Path | list[Path], out: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    paths = src if isinstance(src, list) else [src]
    export(paths, out, ExportOptions(**options), cache_dir=tmp_path / "cache")
    return read(out)


def test_round_trip_gives_the_original_events_back(synthetic: Path, tmp_path: Path) -> None:
    # GIVEN a trace and its export
    out = tmp_path / "out" / "train.json"
    out.parent.mkdir()
    doc = _export(synthetic, out, tmp_path)
    # THEN the file is valid, holds the original top-level keys, and every original event as it was
    assert validate(doc) == []
    original = json.loads(synthetic.read_text())
    assert {k: v for k, v in doc.items() if k not in ("traceEvents", "stepscope")} == {
        k: v for k, v in original.items() if k != "traceEvents"}
    assert [e for e in doc["traceEvents"] if e.get("cat") != CATEGORY][:len(original["traceEvents"])] == \
        original["traceEvents"]
    # WHEN the export is ingested again, THEN its events less the added ones are the original table
    before, after = load(synthetic, cache_dir=tmp_path / "c1"), load(out, cache_dir=tmp_path / "c2")
    again = after.events.filter(pl.col("cat").ne_missing(CATEGORY)).collect()
    assert_frame_equal(again, before.events.collect())
    assert_frame_equal(after.flows.collect(), before.flows.collect())
    ours = after.events.filter(pl.col("cat").eq_missing(CATEGORY)).collect()
    assert ours.height == len(added(doc)) - len(added(doc, "M"))
    # AND the added tracks are known to ingest: no "unknown category" warning for them
    assert "stepscope" not in after.meta.unknown_categories


def test_ingest_drops_the_added_tracks_when_asked(synthetic: Path, tmp_path: Path) -> None:
    # GIVEN a trace's export (its added tracks with flows and the metadata naming their process)
    out = tmp_path / "train.json.gz"
    doc = _export(synthetic, out, tmp_path)
    assert added(doc, "s") or added(doc, "f") or added(doc, "X")
    # WHEN the export is ingested with drop_added, and the trace itself plainly
    ingest_trace(out, tmp_path / "dropped", drop_added=True)
    ingest_trace(synthetic, tmp_path / "plain")
    # THEN the tables are the trace's own, row for row, and meta.json counts and names only its own
    for table in ("events.parquet", "flows.parquet"):
        assert_frame_equal(pl.read_parquet(tmp_path / "dropped" / table), pl.read_parquet(tmp_path / "plain" / table))
    dropped, plain = (json.loads((tmp_path / d / "meta.json").read_text()) for d in ("dropped", "plain"))
    for key in ("counts", "time", "processes", "threads", "unknown_categories"):
        assert dropped[key] == plain[key], key
    assert dropped["added_tracks"] == "dropped" and plain["added_tracks"] == "kept"
    # AND an ingest that kept them is not taken for one that dropped them (nor the other way round)
    assert is_ingested(tmp_path / "dropped", drop_added=True) and not is_ingested(tmp_path / "dropped")
    assert not ingest_trace(out, tmp_path / "dropped").skipped
    assert ingest_trace(out, tmp_path / "dropped").skipped
    assert pl.read_parquet(tmp_path / "dropped" / "events.parquet").height > plain["counts"]["events"]


def test_added_tracks_have_their_own_process(synthetic: Path, tmp_path: Path) -> None:
    doc = _export(synthetic, tmp_path / "o.json", tmp_path)
    original_pids = {e["pid"] for e in doc["traceEvents"] if e.get("cat") != CATEGORY}
    ours = {e["pid"] for e in added(doc)}
    assert len(ours) == 1 and ours.isdisjoint(original_pids)
    (pid,) = ours
    assert pid > max(p for p in original_pids if isinstance(p, int))
    names = {e["args"].get("name") for e in doc["traceEvents"] if e["ph"] == "M" and e["pid"] == pid}
    assert {"stepscope", "steps", "phases", "verdict", "GPU 0 idle", "host syncs", "critical path"} <= names


def test_gap_slices_add_up_to_the_idle_time_and_steps_to_their_windows(synthetic: Path, tmp_path: Path) -> None:
    # GIVEN the analyses of the trace and its export
    doc = _export(synthetic, tmp_path / "o.json", tmp_path)
    bundle = TraceAnalysis.of(load(synthetic, cache_dir=tmp_path / "cache"))
    # THEN the idle slices of each device add up to gaps' idle total, one per gap, named by its cause
    idle = on_thread(doc, "GPU 0 idle")
    assert sum(to_ns(e["dur"]) for e in idle) == int(bundle.gaps.devices["idle_ns"][0]) > 0
    assert len(idle) == bundle.gaps.gaps_total
    assert {e["name"] for e in idle} == set(bundle.gaps.gaps["cause"])
    sync = [e for e in idle if e["name"] == "host_sync"]
    assert sync and {e["args"]["blamed_op"] for e in sync} == {"aten::_local_scalar_dense"}
    # the step slices are the step windows
    steps = on_thread(doc, "steps")
    windows = bundle.steps.steps
    assert [(to_ns(e["ts"]), to_ns(e["dur"])) for e in steps] == list(
        zip(windows["start_ns"], windows["wall_ns"], strict=True))
    # the phase slices add up to each step's phase times
    phases: dict[tuple[int, str], int] = defaultdict(int)
    for e in on_thread(doc, "phases"):
        phases[(e["args"]["step"], e["name"])] += to_ns(e["dur"])
    for row in windows.iter_rows(named=True):
        for phase in ("data_loading", "forward", "backward", "optimizer"):
            assert phases.get((row["step"], phase), 0) == row[f"{phase}_ns"], (row["step"], phase)
    assert phases[(1, "backward")] > 0 and phases[(1, "optimizer")] > 0
    # the critical path's slices tile each step window, in order, as `critical-path` lists them
    path = on_thread(doc, "critical path")
    segments = critical_path(bundle.frames).segments
    assert len(path) == segments.height > 0
    for row in windows.iter_rows(named=True):
        mine = sorted((to_ns(e["ts"]), to_ns(e["dur"])) for e in path if e["args"]["step"] == row["step"])
        assert mine[0][0] == row["start_ns"] and sum(d for _, d in mine) == row["wall_ns"]
        assert all(a + d == b for (a, d), (b, _) in zip(mine, mine[1:], strict=False))


def test_verdict_copies_syncs_and_counters(synthetic: Path, tmp_path: Path) -> None:
    doc = _export(synthetic, tmp_path / "o.json", tmp_path)
    bundle = TraceAnalysis.of(load(synthetic, cache_dir=tmp_path / "cache"))
    verdict = [e for e in added(doc, "i") if e["name"].startswith("verdict: ")]
    assert len(verdict) == 1
    assert verdict[0]["args"]["verdict"] == bundle.verdict.verdict.value
    assert float(verdict[0]["args"]["evidence"]["gpu_busy_fraction"]) == pytest.approx(bundle.verdict.gpu_busy_fraction)
    # each step's instant holds its row of summary's per-step table: verdict, runner-up, margin, evidence
    per_step = {e["args"]["step"]: e["args"] for e in added(doc, "i") if e["name"].startswith("step ")}
    expected = {r["step"]: r for r in bundle.verdict.per_step.to_dicts()}
    assert per_step.keys() == expected.keys() and per_step
    for n, row in per_step.items():
        assert {k: row[k] for k in ("verdict", "runner_up", "margin")} == {
            k: expected[n][k] for k in ("verdict", "runner_up", "margin")}
        assert float(row["gpu_busy_fraction"]) == pytest.approx(expected[n]["gpu_busy_fraction"])
    copies = on_thread(doc, "GPU 0 stream 7 exposed copies")
    assert len(copies) == 2 and all(e["args"]["exposed_ns"] == 40 * US for e in copies)
    assert [e["name"] for e in on_thread(doc, "host syncs")] == ["cudaStreamSynchronize"] * 2
    counters = {e["name"] for e in added(doc, "C")}
    assert {"GPU busy % (per step)", "launch queue depth GPU 0 stream 7", "memory cuda:0"} <= counters
    depth = [e["args"]["depth"] for e in added(doc, "C") if e["name"] == "launch queue depth GPU 0 stream 7"]
    assert max(depth) == 1 and depth[-1] == 0


def test_only_annotations_writes_no_original_event(synthetic: Path, tmp_path: Path) -> None:
    doc = _export(synthetic, tmp_path / "o.json", tmp_path, only_annotations=True)
    assert validate(doc) == []
    assert all(e.get("cat") == CATEGORY for e in doc["traceEvents"] if e["ph"] != "M")
    assert all(e["args"].get("name") not in ("python main", "autograd") for e in doc["traceEvents"] if e["ph"] == "M")
    assert on_thread(doc, "steps")
    # the tracks keep the trace's clock: its base time (ts are offsets from it), as the full export keeps it
    full = _export(synthetic, tmp_path / "f.json", tmp_path)
    assert doc["baseTimeNanoseconds"] == full["baseTimeNanoseconds"] == 1_700_000_000_000_000_000


def test_steps_clip_the_original_events_to_their_windows(synthetic: Path, tmp_path: Path) -> None:
    # GIVEN an export of step 2 only
    doc = _export(synthetic, tmp_path / "o.json.gz", tmp_path, steps=(2, 2))
    assert (tmp_path / "o.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert validate(doc) == []
    bundle = TraceAnalysis.of(load(synthetic, cache_dir=tmp_path / "cache"))
    lo, hi = (int(bundle.steps.steps.filter(pl.col("step") == 2)[c][0]) for c in ("start_ns", "end_ns"))
    # THEN every original timed event overlaps step 2's window, and every one that does is there
    original = [e for e in json.loads(synthetic.read_text())["traceEvents"] if e["ph"] != "M"]
    inside = [e for e in original if to_ns(e["ts"]) < hi and (to_ns(e["ts"]) + to_ns(e.get("dur", 0)) > lo
                                                               if e.get("dur") else to_ns(e["ts"]) >= lo)]
    kept = [e for e in doc["traceEvents"] if e.get("cat") != CATEGORY and e["ph"] != "M"]
    assert sorted(map(json.dumps, kept)) == sorted(map(json.dumps, inside)) and 0 < len(kept) < len(original)
    assert [e["name"] for e in on_thread(doc, "steps")] == ["step 2"]
    assert all(lo <= to_ns(e["ts"]) and to_ns(e["ts"]) + to_ns(e["dur"]) <= hi for e in on_thread(doc, "GPU 0 idle"))


def test_steps_the_trace_does_not_hold_are_a_usage_error(synthetic: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no step in 7\.\.9 in this trace \(steps 1\.\.2\)"):
        _export(synthetic, tmp_path / "o.json", tmp_path, steps=(7, 9))
    assert not (tmp_path / "o.json").exists()
    assert not list(tmp_path.glob(".o.json*"))


def test_an_ingested_trace_without_its_source_file_is_refused(synthetic: Path, tmp_path: Path) -> None:
    # GIVEN a trace ingested, then its file removed
    trace_dir = load(synthetic, cache_dir=tmp_path / "cache").directory
    synthetic.unlink()
    # WHEN it is exported, THEN one error names it and nothing is written
    with pytest.raises(InputError, match="source file .* is not there"):
        export_trace(trace_dir, tmp_path / "o.json", ExportOptions())
    assert not (tmp_path / "o.json").exists()


# ------------------------------------------------------------------------------------- a synthetic run

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
#: rank r's clock runs ahead of true time by this many µs; arrivals and the common end in true µs
CLOCK = {0: 0, 1: 500}
ARRIVE = {0: [100, 1040], 1: [130, 1000]}
END = [200, 1100]


def _run(directory: Path) -> None:
    for r, starts in ARRIVE.items():
        events = [step(1, 0 + CLOCK[r], 1200)]
        for k, (s, e) in enumerate(zip(starts, END, strict=True)):
            args: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256,
                                    "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                                    "Process Group Ranks": "[0, 1]"}
            events += [kernel(AR, s + CLOCK[r], e - s, **args),
                       kernel("sgemm", s + CLOCK[r] - 50, 40), flow(k + 1, "s", s, pid=1000, tid=1),
                       flow(k + 1, "f", s + CLOCK[r], pid=0, tid=7), thread_name(f"main {r}")]
        doc = trace(*events, distributedInfo={"backend": "nccl", "rank": r, "world_size": 2})
        write_trace(directory / f"rank_{r}", doc, f"rank{r}.pt.trace.json")


def test_a_run_is_one_process_per_rank_on_aligned_clocks(tmp_path: Path) -> None:
    # GIVEN two ranks whose clocks differ by 500 µs
    _run(tmp_path / "run")
    out = tmp_path / "run.json"
    # WHEN the run is exported
    result = export_run([tmp_path / "run"], out, ExportOptions(), cache_dir=tmp_path / "cache")
    doc = read(out)
    # THEN it is valid; each rank is one process "rank N", with its own annotations beside it
    assert validate(doc) == []
    assert result.ranks == (0, 1)
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {1: "rank 0", 2: "rank 0 · stepscope", 3: "rank 1", 4: "rank 1 · stepscope"}
    assert {e["pid"] for e in doc["traceEvents"] if e.get("cat") != CATEGORY} == {1, 3}
    assert "python main" not in thread_names(doc).values()
    assert "pid 1000 · main 1" in thread_names(doc).values()
    # the collectives end together on the aligned clock, as `comm` aligns them
    offsets = dict(collectives(tmp_path / "run", cache_dir=tmp_path / "cache").ranks
                   .select("rank", "clock_offset_ns").iter_rows())
    assert offsets == {0: 0, 1: -500 * US}
    ends: dict[int, set[int]] = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == AR:
            ends[round(to_ns(e["ts"]) + to_ns(e["dur"]))].add(e["pid"])
    assert ends == {END[0] * US: {1, 3}, END[1] * US: {1, 3}}
    # flow ids of the two ranks no longer collide: each id has one start and one finish
    ids: dict[int, list[str]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] in ("s", "f") and e.get("cat") != CATEGORY:
            ids[e["id"]].append(e["ph"])
    assert len(ids) == 4 and all(sorted(v) == ["f", "s"] for v in ids.values())
    # one arrow per call, from the last arrival (rank 1, then rank 0) to the other rank's collective slice
    starts = sorted(added(doc, "s"), key=lambda e: e["ts"])
    finishes = {e["id"]: e for e in added(doc, "f")}
    assert [(e["pid"], finishes[e["id"]]["pid"]) for e in starts] == [(4, 2), (2, 4)]
    slices = {(e["pid"], e["tid"], e["ts"]): e["name"] for e in added(doc, "X")}
    assert all(slices[(e["pid"], e["tid"], e["ts"])].startswith("all_reduce #") for e in [*starts, *finishes.values()])


def test_ingest_of_a_run_export_drops_every_added_track(tmp_path: Path) -> None:
    # GIVEN a run's export: added processes per rank, and flow arrows between the ranks' collectives
    _run(tmp_path / "run")
    out = tmp_path / "run.json"
    export_run([tmp_path / "run"], out, ExportOptions(), cache_dir=tmp_path / "cache")
    doc = read(out)
    assert added(doc, "s") and added(doc, "f")
    originals = [e for e in doc["traceEvents"] if e.get("cat") != CATEGORY]
    # WHEN it is ingested with drop_added, THEN what is left is exactly the original events
    ingest_trace(out, tmp_path / "d", drop_added=True)
    events, flows = (pl.read_parquet(tmp_path / "d" / f"{t}.parquet") for t in ("events", "flows"))
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert events.height + flows.height + meta["counts"]["metadata_events"] == len(originals)
    assert CATEGORY not in events["cat"].to_list() + flows["cat"].to_list()
    assert {p["name"] for p in meta["processes"].values()} == {"rank 0", "rank 1"}


def test_run_with_steps_none_hold_is_a_usage_error(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    with pytest.raises(UsageError, match=r"no rank holds steps 5\.\.6"):
        export_run([tmp_path / "run"], tmp_path / "o.json", ExportOptions(steps=(5, 6)), cache_dir=tmp_path / "c")
    assert not list(tmp_path.glob("*o.json*"))  # neither the file nor its temporary


# ------------------------------------------------------------------------------------- the corpus


RESNET = Path("traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")


def test_corpus_trace_round_trip_and_format(corpus: Path, tmp_path: Path) -> None:
    src = corpus / RESNET
    out = tmp_path / "resnet.json.gz"
    doc = _export(src, out, tmp_path)
    assert validate(doc) == []
    bundle = TraceAnalysis.of(load(src, cache_dir=tmp_path / "cache"))
    for device, idle_ns in bundle.gaps.devices.select("device", "idle_ns").iter_rows():
        assert sum(to_ns(e["dur"]) for e in on_thread(doc, f"GPU {device} idle")) == idle_ns
    again = load(out, cache_dir=tmp_path / "c2").events.filter(pl.col("cat").ne_missing(CATEGORY)).collect()
    assert_frame_equal(again, bundle.trace.events.collect())


@pytest.mark.parametrize("name", ["hta/ns_resolution_trace", "hta/nccl_parser_config", "tracelens/h100",
                                  "hta/cpu_only", "zoology"])
def test_corpus_traces_export_valid_files(corpus: Path, tmp_path: Path, name: str) -> None:
    src = next(p for p in sorted((corpus / "traces" / name).rglob("*")) if p.name.endswith((".json", ".json.gz")))
    doc = _export(src, tmp_path / "o.json", tmp_path)
    assert validate(doc, only_added=True) == []
    assert len([e for e in doc["traceEvents"] if e.get("cat") != CATEGORY]) >= len(json.loads(
        gzip.decompress(src.read_bytes()) if src.name.endswith(".gz") else src.read_bytes())["traceEvents"])


def test_corpus_dlrm_run(corpus: Path, tmp_path: Path) -> None:
    # GIVEN the 8-rank PARAM DLRM traces, WHEN they are exported as one run
    out = tmp_path / "dlrm.json.gz"
    result = export_run([corpus / "traces" / "param" / "dlrm_kineto"], out, ExportOptions(),
                        cache_dir=tmp_path / "cache")
    doc = read(out)
    # THEN the file is valid, one process per rank, and matched collectives are linked across ranks
    assert validate(doc) == []
    assert result.ranks == tuple(range(8))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank {r}" for r in range(8)} <= names
    arrows = added(doc, "f")
    assert arrows and {e["pid"] for e in arrows} | {e["pid"] for e in added(doc, "s")} == {2 * r + 2 for r in range(8)}
    assert doc["stepscope"]["clock_offsets_ns"]["0"] == 0
