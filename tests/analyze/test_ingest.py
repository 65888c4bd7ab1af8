"""Ingest: every format generation maps to one schema, times are exact, nothing is dropped."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from builders import (
    annotation,
    cpu_op,
    flow,
    kernel,
    load_events,
    memcpy,
    memory,
    runtime,
    step,
    thread_name,
    trace,
    write_trace,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analyze import Trace, _read, load
from stepscope.analyze import ingest as ingest_module
from stepscope.analyze._coerce import parse_time_ns
from stepscope.analyze._columns import decode_span
from stepscope.analyze._read import iter_chunks, locate_events, split_document
from stepscope.analyze._spans import iter_chunk_tables
from stepscope.analyze._workers import widen_result_pipe, worker_context
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.meta import Counts
from stepscope.analyze.schema import EVENT_SCHEMA, Kind
from stepscope.errors import TraceFormatError

CORPUS_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "traces"


def _events(t: Trace) -> pl.DataFrame:
    return t.events.sort("event_id").collect()


def test_todays_format_maps_kinds_args_and_links(tmp_path: Path) -> None:
    # GIVEN a small trace in today's format
    doc = trace(
        thread_name("python main thread"),
        step(1, ts=0, dur=100),
        cpu_op("aten::mm", ts=5, dur=20, external_id=3,
               **{"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}),
        runtime("cudaLaunchKernel", ts=10, dur=5, correlation=7, external_id=3),
        kernel("sgemm_128x64", ts=30, dur=10, correlation=7, external_id=3, grid=[4, 1, 1], block=[128, 1, 1]),
        memcpy("HtoD", ts=41, dur=4, nbytes=4096, correlation=8),
        memory(12, 4096, total_allocated=4096, total_reserved=2**21),
        flow(7, "s", 10, pid=1000, tid=1),
        flow(7, "f", 30, pid=0, tid=7),
    )
    # WHEN it is ingested
    t = load_events(tmp_path, doc)
    ev = _events(t)
    # THEN every timed event is a row with the normalized kind, and flows/metadata are kept apart
    assert ev["kind"].to_list() == ["user_annotation", "cpu_op", "runtime", "kernel", "memcpy", "memory"]
    assert t.flows.collect().height == 2
    assert t.meta.counts == Counts(events=6, flows=2, metadata_events=1,
                                   by_kind={"cpu_op": 1, "kernel": 1, "memcpy": 1, "memory": 1, "runtime": 1,
                                            "user_annotation": 1})
    k = ev.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert (k["ts_ns"], k["dur_ns"], k["device"], k["stream"], k["correlation"]) == (30_000, 10_000, 0, 7, 7)
    assert k["grid"] == "[4, 1, 1]" and k["block"] == "[128, 1, 1]"  # JSON text as written
    op = ev.filter(pl.col("kind") == "cpu_op").row(0, named=True)
    assert json.loads(op["input_dims"]) == [[2, 3], [3, 4]]
    m = ev.filter(pl.col("kind") == "memory").row(0, named=True)
    assert (m["alloc_bytes"], m["total_allocated_bytes"], m["total_reserved_bytes"], m["device"]) == (
        4096, 4096, 2**21, 0)
    assert t.thread_names[("1000", "1")] == "python main thread"
    # AND the launch chain kernel <- runtime <- op is resolved
    links = t.launches().filter(pl.col("kind") == "kernel").collect().row(0, named=True)
    assert (links["runtime_name"], links["op_name"], links["launch_ts_ns"]) == ("cudaLaunchKernel", "aten::mm", 10_000)


def test_2021_format_categories_lowercase_external_id_and_bytes_only_memory(tmp_path: Path) -> None:
    doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 1, "tid": 1, "ts": 100, "dur": 50,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5,
         "args": {"correlation": 9, "external id": 1}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm", "pid": 0, "tid": "stream 7", "ts": 120, "dur": 9,
         "args": {"correlation": 9, "external id": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7", "ts": 130, "dur": 1,
         "args": {"device": 0, "stream": 7, "bytes": 64}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 111,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}},
        {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 110, "cat": "async", "name": "launch"},
    ]}
    t = load_events(tmp_path, doc)
    ev = _events(t)
    assert ev["kind"].to_list() == ["cpu_op", "runtime", "kernel", "memset", "memory"]
    assert ev["external_id"].to_list()[:3] == [1, 1, 1]  # 'External id' and 'external id' both land here
    mem = ev.filter(pl.col("kind") == "memory").row(0, named=True)
    assert mem["alloc_bytes"] == 512 and mem["total_allocated_bytes"] is None
    assert t.steps.collect()["step"].to_list() == [5]
    # a string tid on a GPU event: stream falls back to args.stream
    assert ev.filter(pl.col("kind") == "kernel")["stream"].to_list() == [7]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1623142623460111", 1623142623460111000), ("1712195495519689.047", 1712195495519689047),
     ("12.3456", 12346), ("0.5", 500), ("-3.5", -3500), ("1e3", 1_000_000), ("null", None), ('"17"', 17000)],
)
def test_time_rule_is_exact_decimal_shift(text: str, expected: int | None) -> None:
    assert parse_time_ns(pl.Series([text])).to_list() == [expected]


def test_epoch_scale_fractional_timestamps_keep_nanoseconds(tmp_path: Path) -> None:
    # float64 cannot hold 1712195495519689.047 to the ns; the ingest must read the text
    doc = '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, ' \
          '"ts": 1712195495519689.047, "dur": 63.813}, {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, ' \
          '"tid": 1, "ts": 4458676522690.655, "dur": 1}], "displayTimeUnit": "ns", "baseTimeNanoseconds": 17}'
    path = tmp_path / "t.json"
    path.write_text(doc)
    t = load(path, cache_dir=tmp_path / "c")
    ev = _events(t)
    assert ev["ts_ns"].to_list() == [1712195495519689047, 4458676522690655]
    assert ev["dur_ns"].to_list() == [63813, 1000]
    assert t.meta.display_time_unit == "ns" and t.meta.base_time_ns == 17


def test_odd_values_are_coerced_or_null_never_fatal(tmp_path: Path) -> None:
    doc = trace(
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": "Spans", "tid": "", "ts": 1, "dur": 1,
         "args": {"stream": "0x0", "bytes": "1", "correlation": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 0, "tid": 1, "ts": 2, "dur": 1,
         "args": {"Comms Id": 10159970886766084423, "External id": 10159970886766084423,
                  "Process Group Ranks": "[0, 1]"}},
        {"ph": "X", "cat": "some_new_category", "name": "x", "pid": 0, "tid": 1, "ts": 3, "dur": 1, "args": [1]},
        {"ph": "C", "name": "counter", "pid": 0, "tid": 1, "ts": 4, "args": {"v": 1}},
    )
    t = load_events(tmp_path, doc)
    ev = _events(t)
    assert ev["kind"].to_list() == ["runtime", "cpu_op", "other", "other"]
    rt = ev.row(0, named=True)
    assert (rt["pid"], rt["tid"], rt["stream"], rt["bytes"]) == ("Spans", "", 0, 1)
    op = ev.row(1, named=True)
    assert op["external_id"] is None  # above 2**63: unknown, not wrapped around
    assert json.loads(op["args"])["Comms Id"] == 10159970886766084423  # the raw args keep it exactly
    assert op["process_group_ranks"] == "[0, 1]"
    assert t.meta.unknown_categories == {"some_new_category": 1}


def test_an_event_without_a_phase_is_kept_as_its_category_says(tmp_path: Path) -> None:
    doc = trace({"cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"stream": 7}},
                {"ph": None, "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 3, "dur": 1},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}})
    ev = _events(load_events(tmp_path, doc))
    assert ev.select("event_id", "kind", "ph", "name", "stream").rows() == [(0, "kernel", None, "k", 7),
                                                                            (1, "cpu_op", None, "op", None)]


def test_bare_event_array_and_no_metadata(tmp_path: Path) -> None:
    path = write_trace(tmp_path, [kernel("k", ts=1, dur=2)], "bare.json")
    assert _events(load(path, cache_dir=tmp_path / "c"))["kind"].to_list() == ["kernel"]


def test_chunked_decode_equals_single_chunk_even_when_a_cut_lands_in_a_string(tmp_path: Path) -> None:
    events = []
    for i in range(300):
        events.append(cpu_op("aten::add }, { tricky", ts=i * 10, dur=5, external_id=i))
        events.append(kernel(f"k{i}", ts=i * 10 + 1, dur=3, correlation=i))
    path = write_trace(tmp_path, trace(*events), "big.json")
    one = ingest_trace(path, tmp_path / "one")
    many = ingest_trace(path, tmp_path / "many", chunk_bytes=500)
    in_turn = ingest_trace(path, tmp_path / "in_turn", chunk_bytes=500, spare_core=False)
    a = pl.read_parquet(one.out_dir / "events.parquet").sort("event_id")
    b = pl.read_parquet(many.out_dir / "events.parquet").sort("event_id")
    assert a.height == 600
    assert a.equals(b)
    assert pl.read_parquet(in_turn.out_dir / "events.parquet").equals(pl.read_parquet(many.out_dir / "events.parquet"))
    assert pl.read_parquet(in_turn.out_dir / "flows.parquet").equals(pl.read_parquet(many.out_dir / "flows.parquet"))


def test_ingest_never_imports_pyarrow_compute(tmp_path: Path) -> None:
    """Importing pyarrow.compute costs 30-50 ms of Python per process (and pandas, where installed, comes with
    it): ingest keeps its arrays out of the pyarrow APIs that import it (see _arrow.to_series)."""
    events = [e for i in range(200) for e in (cpu_op(f"op{i}", ts=i * 10, dur=5, external_id=i),
                                              flow(i, "s", i * 10 + 1, pid=1, tid=1),
                                              kernel(f"k{i}", ts=i * 10 + 2, dur=3, correlation=i))]
    path = write_trace(tmp_path, trace(*events, thread_name("main")), "t.json")
    script = f"""
import sys
from pathlib import Path
from stepscope.analyze.ingest import ingest_trace
ingest_trace(Path({str(path)!r}), Path({str(tmp_path / "out")!r}), jobs=2, chunk_bytes=2000)
loaded = [m for m in ("pyarrow.compute", "pandas") if m in sys.modules]
assert not loaded, loaded
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert pl.read_parquet(tmp_path / "out" / "events.parquet")["event_id"].to_list() == [
        i for i in range(600) if i % 3 != 1]


@pytest.mark.parametrize("bad", ["directory", "corrupt.json.gz"])
def test_a_script_whose_first_ingest_fails_at_once_exits_with_its_error(tmp_path: Path, bad: str) -> None:
    """A file that fails before the warm-up thread is done (a directory, corrupt gzip): the error reaches the
    script, which exits with its traceback, not the abort of a daemon thread still inside pyarrow at exit."""
    path = tmp_path / bad
    if bad == "directory":
        path.mkdir()
    else:
        path.write_bytes(gzip.compress(b'{"traceEvents": []}')[:12] + b"garbage")
    script = f"""
from pathlib import Path
from stepscope.analyze.ingest import ingest_trace
ingest_trace(Path({str(path)!r}), Path({str(tmp_path / "out")!r}))
"""
    for _ in range(3):  # it was a race the thread lost nearly every time
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out.stderr
        assert "FATAL" not in out.stderr
        assert out.stderr.rstrip().splitlines()[-1].startswith("stepscope.errors.")
    assert not (tmp_path / "out").exists()


_TOP_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text("ab]}[{\\\", ", max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("xy]", max_size=2),
                                                                                        inner, max_size=3),
                           max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.dictionaries(st.sampled_from(["a", "b]", "c"]), _TOP_VALUES, max_size=3),
       after=st.dictionaries(st.sampled_from(["x", "y]", "z"]), _TOP_VALUES, max_size=3))
def test_trace_events_anywhere_among_the_top_level_keys(before: dict[str, Any], after: dict[str, Any],
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    # GIVEN traceEvents between other top-level keys whose values hold ']', '}' and '"' (which fool a quick
    # look for the array's end: the last ']' may lie in a later value)
    tmp = tmp_path_factory.mktemp("top")
    events = [cpu_op(f"op{i}", ts=i, dur=1, external_id=i) for i in range(20)]
    path = tmp / "t.json"
    path.write_text(json.dumps({**before, "traceEvents": events, **after}))
    # WHEN it is ingested THEN every event and every other key is there, as the whole-document decode sees them
    result = ingest_trace(path, tmp / "out", chunk_bytes=300)
    assert result.n_events == 20
    assert json.loads((tmp / "out" / "meta.json").read_text())["top_level"] == {**before, **after}
    assert split_document(path.read_bytes(), path)[2] == {**before, **after}


def test_the_end_of_trace_events_is_found_before_later_lists(tmp_path: Path) -> None:
    # GIVEN a trace laid out as newer Kineto writes it: lists after the events (INFO lines holding ']',
    # deviceProperties, a list of objects ending in '}]')
    path = tmp_path / "t.json"
    later = {"INFO": ["INFO: cpp:907] x", "y]"], "deviceProperties": [{"id": 0}, {"id": 1}], "traceName": "t"}
    path.write_text(json.dumps({"traceEvents": [kernel("k", ts=1, dur=2)], **later}, indent=2))
    # WHEN the array is located without reading it THEN it is the array the whole-document decode finds
    start, end, top, certain = locate_events(path.read_bytes(), path)
    exact_start, exact_end, exact_top = split_document(path.read_bytes(), path)
    assert (start, end, top, certain) == (exact_start, exact_end, exact_top, False)
    assert top == later


def test_a_wrong_guess_at_the_end_of_trace_events_is_mended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a valid trace whose true end of traceEvents lies beyond the searched window, and a later list
    # of objects inside it (so the guess is that list's end)
    monkeypatch.setattr(_read, "_TAIL_WINDOW", 12)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [kernel("k", ts=1, dur=2)], "pad": "x" * 50, "later": [{"a": 1}]}))
    start, end, _, certain = locate_events(path.read_bytes(), path)
    assert not certain and (start, end) != split_document(path.read_bytes(), path)[:2]
    # WHEN it is ingested THEN the span that fails to decode sends it the exact way, with the same tables
    result = ingest_trace(path, tmp_path / "out")
    assert result.n_events == 1
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["top_level"] == {"pad": "x" * 50,
                                                                                      "later": [{"a": 1}]}


def test_reingest_of_unchanged_file_is_skipped_and_output_is_atomic(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(kernel("k", ts=1, dur=2)), "t.json", gz=True)
    first = ingest_trace(path, tmp_path / "out")
    again = ingest_trace(path, tmp_path / "out")
    assert (first.skipped, again.skipped) == (False, True)
    forced = ingest_trace(path, tmp_path / "out", force=True)
    assert not forced.skipped
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["events.parquet", "flows.parquet", "meta.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_event_schema_is_the_documented_one(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(kernel("k", ts=1, dur=2)))
    assert list(t.events.collect_schema().names()) == EVENT_SCHEMA.names
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in EVENT_SCHEMA.names:
        assert f"`{name}`" in readme, f"column {name} is not documented in the README"


def test_ids_and_start_times_are_delta_encoded_and_read_back_by_any_reader(tmp_path: Path) -> None:
    events = [e for i in range(300) for e in (cpu_op(f"op{i % 7}", ts=1000 + i * 10, dur=5 + i % 3, external_id=i),
                                              kernel(f"k{i % 5}", ts=1002 + i * 10, dur=3, correlation=50 + i))]
    path = write_trace(tmp_path, trace(*events), "t.json")
    ingest_trace(path, tmp_path / "out")
    parquet = pq.ParquetFile(tmp_path / "out" / "events.parquet")
    group = parquet.metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    for name in ("event_id", "ts_ns", "external_id", "correlation"):
        assert "DELTA_BINARY_PACKED" in chunks[name].encodings, name
    assert "DELTA_BINARY_PACKED" not in chunks["dur_ns"].encodings  # durations do better plain
    # min/max for the numbers, which let readers skip row groups by time; none for the text
    ts_stats = chunks["ts_ns"].statistics
    assert ts_stats is not None and (ts_stats.min, ts_stats.max) == (1000 * 1000, (1002 + 2990) * 1000)
    assert chunks["name"].statistics is None and chunks["args"].statistics is None
    frame = pl.read_parquet(tmp_path / "out" / "events.parquet").sort("event_id")
    assert frame["ts_ns"].to_list() == [(1000 + i * 10 + d) * 1000 for i in range(300) for d in (0, 2)]
    assert frame["correlation"].drop_nulls().to_list() == list(range(50, 350))
    via_duckdb = duckdb.sql(f"SELECT ts_ns FROM read_parquet('{tmp_path}/out/events.parquet') ORDER BY event_id")
    assert via_duckdb is not None and [row[0] for row in via_duckdb.fetchall()] == frame["ts_ns"].to_list()


def test_meta_json_keeps_text_and_numbers_as_the_trace_has_them(tmp_path: Path) -> None:
    # GIVEN a thread name beyond ASCII and a top-level key holding an integer beyond 64 bits
    doc = trace(kernel("k", ts=1, dur=2), thread_name("главный поток ✓"), hugeCounter=2**70, ratio=0.1)
    ingest_trace(write_trace(tmp_path, doc, "t.json"), tmp_path / "out")
    # THEN meta.json is UTF-8 JSON that gives them back exactly
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert [t["name"] for t in meta["threads"].values()] == ["главный поток ✓"]
    assert (meta["top_level"]["hugeCounter"], meta["top_level"]["ratio"]) == (2**70, 0.1)


def test_steps_take_the_longest_span_per_step_number(tmp_path: Path) -> None:
    doc = trace(step(3, ts=0, dur=10), step(3, ts=0, dur=12, tid=2), step(4, ts=12, dur=5),
                annotation("ProfilerStep#x", ts=0, dur=1))
    steps = load_events(tmp_path, doc).steps.collect()
    assert steps.select("step", "dur_ns").rows() == [(3, 12_000), (4, 5_000)]


# ------------------------------------------------------------------------------------------- real corpus


def _json_counts(path: Path) -> dict[str, int]:
    raw = gzip.decompress(path.read_bytes()) if path.read_bytes()[:2] == b"\x1f\x8b" else path.read_bytes()
    doc = json.loads(raw)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    flows = sum(1 for e in events if e.get("ph") in ("s", "t", "f"))
    meta = sum(1 for e in events if e.get("ph") == "M")
    return {"events": len(events) - flows - meta, "flows": flows, "metadata_events": meta}


def _corpus_traces() -> list[Path]:
    if not CORPUS_TRACES.is_dir():
        return []
    return sorted(p for p in CORPUS_TRACES.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
                  and "memory_timeline" not in p.name)


@pytest.mark.parametrize("path", _corpus_traces(), ids=lambda p: str(p.relative_to(CORPUS_TRACES)))
def test_every_corpus_trace_ingests_with_every_event(path: Path, tmp_path: Path) -> None:
    t = load(path, cache_dir=tmp_path)
    expected = _json_counts(path)
    got = t.meta.raw["counts"]
    assert {k: got[k] for k in expected} == expected
    assert t.events.select(pl.len()).collect().item() == expected["events"]
    assert t.events.filter(pl.col("ts_ns").is_null()).select(pl.len()).collect().item() == 0


def test_corpus_spot_checks(corpus: Path, tmp_path: Path) -> None:
    resnet = corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    t = load(resnet, cache_dir=tmp_path)
    counts = t.meta.counts.by_kind
    assert counts["kernel"] == 8772 and counts["memcpy"] == 12
    assert t.meta.devices[0].name == "Tesla V100-DGXS-32GB"
    first = t.events.filter(pl.col("kind") == "memcpy").sort("ts_ns").collect().row(0, named=True)
    assert first["name"].startswith("Memcpy HtoD") and first["bytes"] == 19267584
    nccl = load(corpus / "traces/hta/nccl_parser_config/nccl_data.json.gz", cache_dir=tmp_path)
    assert nccl.meta.rank == 0 and nccl.meta.world_size == 2 and nccl.meta.rank_source == "distributedInfo"
    nccl_kernels = nccl.kernels.filter(pl.col("name").str.starts_with("ncclKernel")).sort("dur_ns").collect()
    longest = nccl_kernels.row(-1, named=True)
    assert longest["collective_name"] == "allreduce" and longest["process_group_ranks"] == "[0, 1]"
    amd = load(corpus / "traces/tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz", cache_dir=tmp_path)
    assert amd.kernels.select(pl.len()).collect().item() == 562
    assert amd.runtime.filter(pl.col("name").str.starts_with("hip")).select(pl.len()).collect().item() > 0
    hta = corpus / "traces/hta"
    cpu_only = load(hta / "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", cache_dir=tmp_path)
    assert cpu_only.gpu.select(pl.len()).collect().item() == 0 and cpu_only.meta.rank == 34
    ns = load(hta / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", cache_dir=tmp_path)
    assert ns.events.sort("event_id").select("ts_ns").collect().item(0, 0) == 1712195495519689047
    big = load(hta / "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz", cache_dir=tmp_path)
    assert big.meta.rank == 70 and big.events.select(pl.len()).collect().item() == 2
    graph = load(corpus / "traces/kineto/docs/after_fix_trace.json", cache_dir=tmp_path)
    assert graph.kernels.collect()["correlation"].null_count() == 0


def test_memory_events_are_all_kept(corpus: Path, tmp_path: Path) -> None:
    t = load(corpus / "traces/hta/df_index_resolver/df_index_resolver.json.gz", cache_dir=tmp_path)
    mem = t.memory.collect()
    assert mem.height == 28010
    assert mem.filter(pl.col("device") == 1)["total_allocated_bytes"].max() == 6_629_508_096


def test_kind_enum_covers_every_kind_ingest_writes() -> None:
    from stepscope.analyze.schema import KIND_BY_CATEGORY

    assert set(KIND_BY_CATEGORY.values()) | {Kind.MEMORY, Kind.OTHER} == set(Kind)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_parallel_span_decoding_equals_sequential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool) -> None:
    # workers read their spans from the file itself, or from the gzip trace's JSON spilled to a temporary file
    events = []
    for i in range(400):
        events.append(cpu_op("aten::add }, { tricky", ts=i * 10, dur=5, external_id=i))
        events.append(kernel(f"k{i}", ts=i * 10 + 1, dur=3, correlation=i))
        events.append(flow(i, "s", i * 10 + 2, pid=1000, tid=1))
    path = write_trace(tmp_path, trace(thread_name("main"), *events), "big.json", gz=gz)
    monkeypatch.setattr(ingest_module, "PARALLEL_MIN_BYTES", 0)
    seq = ingest_trace(path, tmp_path / "seq", chunk_bytes=700, jobs=1)
    par = ingest_trace(path, tmp_path / "par", chunk_bytes=700, jobs=2)
    for table in ("events", "flows"):
        a = pl.read_parquet(seq.out_dir / f"{table}.parquet").sort("event_id")
        b = pl.read_parquet(par.out_dir / f"{table}.parquet").sort("event_id")
        assert a.height > 0 and a.equals(b)
    assert pl.read_parquet(par.out_dir / "events.parquet")["event_id"].sort().to_list() == [
        i for i in range(1, 1201) if i % 3 != 0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the spilled JSON is gone


class _LazyFuture(Future):  # type: ignore[type-arg]
    """Never done until its result is asked for: the caller decodes spans ahead of their turn meanwhile."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        super().__init__()
        self._call = fn, args

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        fn, args = self._call
        return fn(*args)


class _LazyPool(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[type-arg]
        return _LazyFuture(fn, args)


def test_a_span_decoded_ahead_keeps_its_error_until_its_turn(tmp_path: Path) -> None:
    # GIVEN a valid trace whose names (written last) hold "}, {}, 5, {": a cut there makes a span '{}, 5, {…'
    # that is JSON up to an entry that is not an object, so decoding it alone raises, not just fails
    events = [{"ph": "X", "cat": "cpu_op", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1, "name": "a}, {}, 5, {b"}
              for i in range(200)]
    path = write_trace(tmp_path, {"traceEvents": events}, "t.json")
    data = bytearray(path.read_bytes())
    start, end, _ = split_document(data, path)
    alone: list[bool | str] = []
    for a, b in iter_chunks(data, start, end, 150):
        try:
            alone.append(decode_span(b"[" + data[a:b] + b"]", str(path), a) is not None)
        except TraceFormatError:
            alone.append("raised")
    assert "raised" in alone and False in alone  # some cuts are bad, and some of those raise
    # WHEN spans are decoded ahead of their turn (by workers that are never done) THEN the errors of spans
    # that are merged into the one before are void, and the tables equal a plain in-order read
    ahead = list(iter_chunk_tables(data, start, end, path, chunk_bytes=150, pool=_LazyPool(), source=path, jobs=2))
    plain = list(iter_chunk_tables(data, start, end, path, chunk_bytes=150))
    assert sum(c.events.num_rows for c in ahead) == 200
    assert [c.events.to_pydict() for c in ahead] == [c.events.to_pydict() for c in plain]


class _QueuedFuture(Future):  # type: ignore[type-arg]
    def result(self, timeout: float | None = None) -> Any:
        raise AssertionError("waited for a span that no worker has started")


class _StalledPool(Executor):
    """Queues every span submitted and never starts one (a worker busy with something else)."""

    def __init__(self) -> None:
        self.futures: list[Future] = []  # type: ignore[type-arg]

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[type-arg]
        self.futures.append(_QueuedFuture())
        return self.futures[-1]


def test_spans_still_queued_for_a_worker_are_taken_back_rather_than_waited_for(tmp_path: Path) -> None:
    # GIVEN a trace cut into many spans, and a worker that never gets to the spans queued for it
    events = [{"ph": "X", "cat": "cpu_op", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1, "name": f"op{i}"}
              for i in range(200)]
    path = write_trace(tmp_path, {"traceEvents": events}, "t.json")
    data = bytearray(path.read_bytes())
    start, end, _ = split_document(data, path)
    pool = _StalledPool()
    # WHEN its spans are decoded THEN this thread withdraws each queued span and decodes it itself (no wait,
    # which would never end), and the tables are those of a plain in-order read
    taken = list(iter_chunk_tables(data, start, end, path, chunk_bytes=300, pool=pool, jobs=2))
    plain = list(iter_chunk_tables(data, start, end, path, chunk_bytes=300))
    assert len(pool.futures) > 4 and all(f.cancelled() for f in pool.futures)
    assert [c.events.to_pydict() for c in taken] == [c.events.to_pydict() for c in plain]


@pytest.mark.skipif(sys.platform != "linux", reason="pipe capacity is a Linux fcntl")
def test_span_workers_hand_results_back_through_a_wide_pipe() -> None:
    import fcntl

    with ProcessPoolExecutor(max_workers=1, mp_context=worker_context()) as pool:
        reader = pool._result_queue._reader  # type: ignore[attr-defined]
        widen_result_pipe(pool)
        assert fcntl.fcntl(reader.fileno(), 1032) >= 1 << 20  # F_GETPIPE_SZ
        assert pool.submit(sum, [1, 2]).result() == 3
    widen_result_pipe(object())  # type: ignore[arg-type]  # no result queue: left alone, no error


def test_launch_links_fall_back_to_flows_when_a_gpu_event_has_no_correlation(tmp_path: Path) -> None:
    doc = trace(
        cpu_op("aten::add", ts=5, dur=20, external_id=4),
        runtime("cudaLaunchKernel", ts=10, dur=5, correlation=7, external_id=4),
        {"ph": "X", "cat": "kernel", "name": "add_kernel", "pid": 0, "tid": 7, "ts": 30, "dur": 3,
         "args": {"device": 0, "stream": 7}},
        flow(5, "s", 10, pid=1000, tid=1), flow(5, "f", 30, pid=0, tid=7),
    )
    link = load_events(tmp_path, doc).launches().collect().row(0, named=True)
    assert (link["correlation"], link["runtime_name"], link["op_name"]) == (7, "cudaLaunchKernel", "aten::add")


def test_load_and_batch_ingest_hash_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN callers that key their output by the file's sha256 (load's cache, the dataset's trace ids)
    import stepscope.analyze._read as read_module
    from stepscope.analyze.dataset import ingest_many
    from stepscope.analyze.inputs import file_sha256

    path = write_trace(tmp_path, trace(kernel("k", ts=1, dur=2)), "t.json", gz=True)
    sha = file_sha256(path)

    def no_second_hash(*_: Any) -> None:
        raise AssertionError("the file was hashed a second time")

    monkeypatch.setattr(read_module.hashlib, "sha256", no_second_hash)  # type: ignore[attr-defined]
    # WHEN they ingest THEN the hash they computed is the one recorded, and the file is not hashed again
    assert load(path, cache_dir=tmp_path / "cache").meta.source.sha256 == sha
    outcome = ingest_many([path], tmp_path / "ds").outcomes[0]
    assert outcome.status == "ingested"
    assert json.loads((Path(outcome.out_dir) / "meta.json").read_text())["source"]["sha256"] == sha  # type: ignore[arg-type]


_SPAN_WORKER_KILLED = r"""
import sys
from pathlib import Path
import stepscope.analyze.ingest as ingest
from stepscope.errors import StepscopeError

ingest.scanner_available = lambda: False  # (as where stepscope was installed without a C compiler)
ingest.PARALLEL_MIN_BYTES = 0
try:
    ingest.ingest_trace(Path(sys.argv[1]), Path(sys.argv[2]), jobs=2, chunk_bytes=2000)
except StepscopeError as exc:
    print(exc)
    sys.exit(exc.exit_code)
"""


def test_a_span_worker_that_dies_is_one_line_naming_the_trace(tmp_path: Path) -> None:
    # GIVEN a trace whose spans are decoded by worker processes (the path without the compiled scanner) and a worker
    # that dies decoding one (SIGKILL, as the out-of-memory killer: a sitecustomize in every process) THEN one line
    # naming the trace and how the worker died, exit code 1, nothing written
    from dying_jobs import killer_env

    path = write_trace(tmp_path, trace(*[cpu_op(f"op{i}", ts=i * 10, dur=5) for i in range(20_000)]),
                       "kill-me.pt.trace.json")
    env = killer_env(tmp_path / "site", "stepscope.analyze._spans", "decode_file_span")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", _SPAN_WORKER_KILLED, str(path), str(out)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert (res.returncode, res.stdout.splitlines()) == (1, [
        f"{path}: a worker process was killed by SIGKILL (what the out-of-memory killer sends: try fewer --jobs, or "
        "more memory), decoding this trace's spans"]), res.stderr
    assert not out.exists()
