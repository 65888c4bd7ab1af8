"""Bytes that are not UTF-8 inside a trace's strings (torch for CUDA 12.4 writes python_function names read from
freed memory): read as U+FFFD, as bytes.decode("utf-8", "replace") reads them, every event kept, the same on the
compiled scanner and the Python path, and a warning with the count and the first byte's offset. Outside a string
such a byte is malformed JSON: one line naming the file and the byte's offset in the uncompressed JSON."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, python_fn, runtime, step, thread_name, trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analyze import _columns, load
from stepscope.analyze._columns import ChunkTables, decode_span, scanner_available
from stepscope.analyze._utf8 import first_invalid, repair
from stepscope.analyze.info import trace_info
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.meta import read_meta
from stepscope.errors import TraceFormatError

needs_scanner = pytest.mark.skipif(not scanner_available(),
                                   reason="the compiled scanner was not built (no C compiler when installed)")

GARBAGE = {
    "as torch writes it": b"\xc0b\xa4",
    "a lone continuation byte": b"\x80",
    "a truncated sequence": b"\xe2\x82",
    "a truncated 4-byte sequence": b"\xf0\x9f\x98",
    "an overlong form": b"\xc0\xaf",
    "an overlong 3-byte form": b"\xe0\x80\xaf",
    "a surrogate": b"\xed\xa0\x80",
    "beyond U+10FFFF": b"\xf4\x90\x80\x80",
    "0xff": b"\xff",
    "beside escapes and valid UTF-8": b'\\n\xfe\\u00e9\xc3\xa9\\"\xe9',
}
MARK = "@@GARBAGE@@"


def _events() -> list[dict[str, Any]]:
    return [
        thread_name("main"),
        step(1, ts=0, dur=100),
        python_fn(f"torch/utils/_config_module.py(0): {MARK}", ts=1, dur=10),
        cpu_op("aten::mm", ts=5, dur=20, external_id=3, **{"Input type": [f"float{MARK}"]}),
        runtime("cudaLaunchKernel", ts=10, dur=5, correlation=7, external_id=3),
        kernel(f"sgemm{MARK}", ts=30, dur=10, correlation=7),
    ]


def _document(garbage: bytes, **top: Any) -> bytes:
    return json.dumps(trace(*_events(), **top)).encode().replace(MARK.encode(), garbage)


def _offsets(document: bytes, garbage: bytes) -> list[int]:
    """The offset of the first invalid byte of each copy of `garbage` in the document."""
    first = first_invalid(garbage)
    assert first is not None
    found, at = [], document.find(garbage)
    while at >= 0:
        found.append(at + first)
        at = document.find(garbage, at + 1)
    return found


@pytest.fixture(params=["scanner", "python"])
def path_taken(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Ingest with the compiled scanner, or with the Python path alone (as where no C compiler was)."""
    if request.param == "scanner" and not scanner_available():
        pytest.skip("the compiled scanner was not built")
    if request.param == "python":
        monkeypatch.setattr(_columns, "_scan", None)
    yield request.param


def _ingest(tmp_path: Path, data: bytes, name: str, **kwargs: Any) -> Path:
    source = tmp_path / name
    source.write_bytes(data)
    out = tmp_path / (name + ".out")
    ingest_trace(source, out, force=True, **kwargs)
    return out


# ----------------------------------------------------------------------------------------------- one span


@needs_scanner
@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_the_scanner_reads_garbage_in_strings_as_the_python_path(garbage: bytes) -> None:
    # GIVEN a span whose name, args text and typed args hold bytes that are not UTF-8
    document = json.dumps(_events()).encode().replace(MARK.encode(), garbage)
    # WHEN the scanner and the Python path read it
    scanned = _columns._scan.scan_events(document, _columns._SLOT_KEYS, _columns._SLOT_TYPES)  # type: ignore[attr-defined]
    assert scanned is not None  # the scanner reads it itself
    fast, slow = _columns._from_scan(scanned, 0), _columns._decode_python(document, "t.json", 1)
    assert isinstance(slow, ChunkTables)
    # THEN the same tables, each string as Python's "replace" decodes it, and the same count and first offset
    assert fast.events.to_pylist() == slow.events.to_pylist()
    assert fast.flows.equals(slow.flows) and fast.metadata == slow.metadata
    expected = json.loads(document.decode("utf-8", "replace"))
    names = pl.from_arrow(fast.events).get_column("name").to_list()  # type: ignore[union-attr]
    assert names == [e["name"] for e in expected if e["ph"] != "M"]
    assert "\ufffd" in names[1] and names[1].startswith("torch/utils/_config_module.py(0): ")
    args = pl.from_arrow(fast.events).get_column("args").to_list()  # type: ignore[union-attr]
    assert [json.loads(a) if a else None for a in args] == [e.get("args") for e in expected if e["ph"] != "M"]
    offsets = _offsets(document, garbage)
    assert (fast.invalid_strings, fast.first_invalid) == (slow.invalid_strings, slow.first_invalid) == (
        len(offsets), offsets[0])


def test_repair_is_pythons_replace_inside_strings_only() -> None:
    # GIVEN strings with garbage, escaped quotes and backslashes before it, and a bad byte outside any string
    document = b'["a\\\\\xff", "b\\"\xc0b\xa4", "\\\\\\"\xe9", 1, \xfe 2]'
    repaired = repair(document)
    assert repaired is not None
    # THEN the strings read as "replace" reads them, the byte outside is left for the parser to refuse
    assert repaired.data == document[:-4].decode("utf-8", "replace").encode() + b"\xfe 2]"
    assert repaired.strings == [document.index(b"\xff"), document.index(b"\xc0"), document.index(b"\xe9")]
    assert repaired.original(repaired.data.index(b", 1,")) == document.index(b", 1,")
    assert repair(b'["\xc3\xa9", 1]') is None and repair(b"[1, \xff]") is None


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_a_trace_with_garbage_in_names_is_ingested_whole_with_a_warning(garbage: bytes, tmp_path: Path,
                                                                         path_taken: str) -> None:
    # GIVEN a trace whose python_function name (and others) hold bytes that are not UTF-8
    document = _document(garbage)
    clean = _ingest(tmp_path, _document(b"?"), "clean.json")
    # WHEN it is ingested (on either path)
    out = _ingest(tmp_path, document, "garbage.json")
    # THEN every event is kept, each name as Python's "replace" decodes it
    events = pl.read_parquet(out / "events.parquet")
    assert events.height == pl.read_parquet(clean / "events.parquet").height
    expected = json.loads(document.decode("utf-8", "replace"))["traceEvents"]
    assert events["name"].to_list() == [e["name"] for e in expected if e["ph"] != "M"]
    # AND info (so summary and report) warns with the count and the first byte's offset
    offsets = _offsets(document, garbage)
    meta = read_meta(out)
    assert (meta.invalid_utf8.strings, meta.invalid_utf8.first_offset) == (len(offsets), offsets[0])
    warnings = trace_info(load(out)).warnings.filter(pl.col("code") == "invalid_utf8")
    assert warnings["count"].to_list() == [len(offsets)]
    assert f"byte {offsets[0]:,}" in warnings["detail"].item()


def test_both_paths_write_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a trace with garbage in names, args and a top-level key, cut into many small spans (some cuts fall
    # inside the strings that hold it, which hold "}, {" too)
    document = _document(b"}, {\xc0b\xa4}, {", traceName=f"run{MARK}.json")
    runs = {}
    for name in ("scanner", "python"):
        if name == "python":
            monkeypatch.setattr(_columns, "_scan", None)
        for chunk_bytes in (None, 64):
            out = _ingest(tmp_path, document, f"{name}-{chunk_bytes}.json", chunk_bytes=chunk_bytes)
            runs[(name, chunk_bytes)] = (pl.read_parquet(out / "events.parquet"),
                                         pl.read_parquet(out / "flows.parquet"), read_meta(out))
    # THEN the tables, the count and the first offset are the same whichever path and however cut
    (events, flows, meta), *others = runs.values()
    for other_events, other_flows, other_meta in others:
        assert other_events.equals(events) and other_flows.equals(flows)
        assert other_meta.invalid_utf8 == meta.invalid_utf8
    # the three strings in events and the top-level one, which is read with U+FFFD too
    assert meta.invalid_utf8.strings == 4 and meta.invalid_utf8.first_offset == document.index(b"\xc0")
    assert meta.trace_name == "run}, {\ufffdb\ufffd}, {.json"


def test_garbage_in_a_top_level_key_is_read_too(tmp_path: Path, path_taken: str) -> None:
    # GIVEN a trace whose top-level keys, before and after traceEvents, hold garbage in a key and in a value
    document = _document(b"x").replace(b'{"schemaVersion"', b'{"INFO\xc0": ["a\xff"], "schemaVersion"')
    document = document[:-1] + b', "traceName": "t\xe9.json"}'
    # WHEN it is ingested THEN its events are all there, and the three strings counted
    out = _ingest(tmp_path, document, "top.json")
    meta = read_meta(out)
    assert meta.counts.events == len(json.loads(_document(b"x"))["traceEvents"]) - 1  # (less the M event)
    assert (meta.invalid_utf8.strings, meta.invalid_utf8.first_offset) == (3, document.index(b"\xc0"))
    assert meta.trace_name == "t\ufffd.json" and meta.top_level["INFO\ufffd"] == ["a\ufffd"]


# ----------------------------------------------------------------------------------------------- refused


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_a_byte_outside_a_string_is_one_line_with_its_offset(gz: bool, tmp_path: Path, path_taken: str) -> None:
    # GIVEN a trace with a byte that is not UTF-8 between two events (not JSON at all), plain or gzip
    launch = b', {"ph": "X", "name": "cudaLaunchKernel"'
    document = _document(b"x").replace(launch, launch[:2] + b"\xff" + launch[2:])
    at = document.index(b"\xff")
    source = tmp_path / ("t.json.gz" if gz else "t.json")
    source.write_bytes(gzip.compress(document) if gz else document)
    # WHEN it is ingested THEN one line names the file and the byte's offset in the uncompressed JSON
    with pytest.raises(TraceFormatError) as raised:
        ingest_trace(source, tmp_path / "out")
    message = str(raised.value)
    assert raised.value.offset == at and f"byte {at}" in message and message.startswith(str(source))
    assert "0xff outside a string" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def _large(garbage_at: int, bad: bytes, *, outside: bool) -> tuple[bytes, int]:
    """A trace of about 20 MB (several spans), with `bad` in one name near `garbage_at`, or between two events
    there; returns it and the offset of the bad byte."""
    event = json.dumps(python_fn("torch/nn/modules/module.py(1501): _call_impl", ts=1, dur=2)).encode()
    head, sep = b'{"schemaVersion": 1, "traceEvents": [', b", "
    n = 20_000_000 // (len(event) + len(sep))
    k = (garbage_at - len(head)) // (len(event) + len(sep))
    bad_event = (sep + bad + event) if outside else (sep + event.replace(b"_call_impl", b"_call_impl" + bad))
    body = sep.join([event] * k) + bad_event + sep + sep.join([event] * (n - k - 1))
    document = head + body + b'], "traceName": "large"}'
    return document, document.index(bad)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_large_trace_names_the_true_offset(jobs: int, tmp_path: Path, path_taken: str) -> None:
    # GIVEN a 20 MB trace (spans of at most 16 MB) with garbage in one name at about 16.6 MB
    document, at = _large(16_569_769, b"\xc0b\xa4", outside=False)
    assert at > 16_000_000
    # WHEN it is ingested THEN every event is kept and the warning names the true offset, not the span's
    out = _ingest(tmp_path, document, "large.json", jobs=jobs)
    meta = read_meta(out)
    assert (meta.invalid_utf8.strings, meta.invalid_utf8.first_offset) == (1, at)
    assert meta.counts.events == document.count(b'"ph"')
    # AND a byte outside a string there is refused with its true offset, from gzip too
    document, at = _large(16_569_769, b"\xff", outside=True)
    source = tmp_path / "bad.json.gz"
    source.write_bytes(gzip.compress(document, compresslevel=1))
    with pytest.raises(TraceFormatError) as raised:
        ingest_trace(source, tmp_path / "bad", jobs=jobs)
    assert raised.value.offset == at and f"(byte {at})" in str(raised.value)


# ----------------------------------------------------------------------------------------------- properties

_PIECE = st.sampled_from([b"a", b"\\n", b'\\"', b"\\\\", b"\\u00e9", "\u00e9".encode(), "\U0001f600".encode(), b"}, {",
                          b"\x80", b"\xbf", b"\xc0", b"\xc2", b"\xe0", b"\xe0\xa0", b"\xed", b"\xed\xa0", b"\xf0",
                          b"\xf0\x90", b"\xf0\x90\x80", b"\xf4\x90", b"\xf5", b"\xff"])


@needs_scanner
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_PIECE, max_size=6).map(b"".join), min_size=3, max_size=3))
def test_any_garbage_in_strings_reads_the_same_on_both_paths(texts: list[bytes]) -> None:
    # GIVEN a span whose name, a str args key and raw args text hold any mix of escapes, UTF-8 and garbage
    name, dtype, other = texts
    document = (b'[{"ph": "X", "cat": "cpu_op", "name": "' + name + b'", "ts": 1, "dur": 2, "args": {"Input type": "'
                + dtype + b'", "x": ["' + other + b'"]}}, {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, '
                b'"args": {"name": "' + other + b'"}}]')
    fast = decode_span(document, "t.json", 1)
    slow = _columns._decode_python(document, "t.json", 1)
    # THEN the same tables, count and offset, and each string as Python's "replace" decodes it
    assert isinstance(fast, ChunkTables) and isinstance(slow, ChunkTables)
    assert fast.events.to_pylist() == slow.events.to_pylist() and fast.metadata == slow.metadata
    assert (fast.invalid_strings, fast.first_invalid) == (slow.invalid_strings, slow.first_invalid)
    expected = json.loads(document.decode("utf-8", "replace"))
    assert fast.events.column("name").to_pylist() == [expected[0]["name"]]
    assert fast.metadata[0]["args"] == expected[1]["args"]
    bad = [t for t in (name, dtype, other, other) if t.decode("utf-8", "replace").encode() != t]
    assert fast.invalid_strings == len(bad)
