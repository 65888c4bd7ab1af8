"""_scan.c, the compiled fast path of ingest: wherever it reads a span, its tables are the Python path's, value
for value (bytes that are not UTF-8 inside strings read as U+FFFD on both, and counted alike); whatever it is not
sure of (odd types, odd number forms, any malformed byte) it leaves to the Python path by returning None, so
errors and edge cases keep one behaviour."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analyze import _columns
from stepscope.analyze._arrow import conform
from stepscope.analyze._columns import ChunkTables, decode_range, decode_span, scanner_available
from stepscope.analyze.schema import ARG_COLUMNS, EVENT_SCHEMA, KIND_BY_CATEGORY
from stepscope.errors import TraceFormatError

needs_scanner = pytest.mark.skipif(not scanner_available(),
                                   reason="the compiled scanner was not built (no C compiler when installed)")


def _scan(document: bytes, *span: int) -> Any:
    return _columns._scan.scan_events(  # type: ignore[attr-defined]
        document, _columns._SLOT_KEYS, _columns._SLOT_TYPES, *span)


def _python(document: bytes) -> ChunkTables | None:
    return _columns._decode_python(document, "t.json", 1)


def _assert_same(fast: ChunkTables, slow: ChunkTables) -> None:
    """The same tables as written (conform: a column no event has may be left out by either path)."""
    fast_events, slow_events = conform(fast.events, EVENT_SCHEMA), conform(slow.events, EVENT_SCHEMA)
    for name in EVENT_SCHEMA.names:
        assert fast_events[name].to_pylist() == slow_events[name].to_pylist(), name
    assert fast.flows.equals(slow.flows)
    assert fast.metadata == slow.metadata
    assert (fast.kind_counts, fast.n_input, fast.ts_min_ns, fast.end_max_ns, fast.unknown_categories) == (
        slow.kind_counts, slow.n_input, slow.ts_min_ns, slow.end_max_ns, slow.unknown_categories)
    assert (fast.invalid_strings, fast.first_invalid) == (slow.invalid_strings, slow.first_invalid)


def _both(document: bytes) -> tuple[Any, Any]:
    """(what the scanner gives or None, what the Python path gives or the error it raises)."""
    scanned = _scan(document)
    try:
        slow: Any = _python(document)
    except TraceFormatError as exc:
        slow = exc
    return scanned, slow


def test_ci_builds_the_scanner() -> None:
    # .ci/run sets STEPSCOPE_REQUIRE_SCANNER: a failed compile (setup.py's extension is optional) must not
    # leave CI green on the slow path
    if not os.environ.get("STEPSCOPE_REQUIRE_SCANNER"):
        pytest.skip("only where the scanner is required (CI)")
    assert scanner_available()


# ----------------------------------------------------------------------------------------------- what it reads

_KINETO = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 2914, "tid": 2914, "ts": "EPOCH_TS",
     "dur": 12.5, "args": {"External id": 7, "Input Dims": [[32, 64], [64, 64]], "Input type": ["float", "float"],
                           "Sequence number": 3, "Fwd thread id": 0, "Record function id": 0, "Ev Idx": 5}},
    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x64_nn", "pid": 0, "tid": 7,
     "ts": "EPOCH_TS2", "dur": 3.25,
     "args": {"External id": 7, "correlation": 42, "device": 0, "stream": 7, "grid": [4, 1, 1],
              "block": [256, 1, 1], "registers per thread": 72, "shared memory": 0, "blocks per SM": 0.5,
              "warps per SM": 4.0, "est. achieved occupancy %": 12}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 2914, "tid": 2914,
     "ts": 1712195495519690, "dur": 4, "args": {"External id": 7, "correlation": 42, "cbid": 211}},
    {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 2914, "tid": 2914,
     "ts": 1712195495519691, "args": {"Total Reserved": 2097152, "Total Allocated": 16384, "Bytes": 16384,
                                      "Addr": 140000000000000, "Device Type": 1, "Device Id": 0}},
    {"ph": "f", "id": 42, "pid": 0, "tid": 7, "ts": "EPOCH_TS2", "cat": "ac2g", "name": "ac2g", "bp": "e"},
    {"ph": "M", "name": "thread_name", "pid": 2914, "tid": 2914, "args": {"name": "python3"}},
    {"ph": "M", "name": "process_labels", "pid": 2914, "tid": 0, "args": None},  # no args: {} either way
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
     "ts": 1712195495519700, "dur": 2, "args": {"stream": "0x7", "bytes": "1024", "memory bandwidth (GB/s)": 0.5}},
    {"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0 \"quoted\" \u00e9 \U0001f600",
     "pid": 2914, "tid": 2914, "ts": 1712195495519680, "dur": 30, "args": {"Python id": 3, "Python parent id": 1}},
]


def _kineto_json(indent: int | None = None, ascii_only: bool = True) -> bytes:
    """_KINETO as JSON, its epoch timestamps written with all their digits (a Python float would drop them)."""
    text = json.dumps(_KINETO, indent=indent, ensure_ascii=ascii_only)
    return text.replace('"EPOCH_TS"', "1712195495519689.047").replace('"EPOCH_TS2"', "1712195495519695.5").encode()


@needs_scanner
@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "indented"])
@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "utf8"])
def test_reads_todays_kineto_events_exactly_as_the_python_path(indent: int | None, ascii_only: bool) -> None:
    # GIVEN every kind of event today's Kineto writes (ns-resolution epoch times, ROCm's numbers as strings,
    # escapes and non-ASCII names), compact or indented
    document = _kineto_json(indent, ascii_only)
    # WHEN the scanner reads it THEN it does, and its tables equal the Python path's
    scanned = _scan(document)
    assert scanned is not None
    _assert_same(_columns._from_scan(scanned), _python(document))  # type: ignore[arg-type]


@needs_scanner
def test_exact_values() -> None:
    chunk = decode_span(_kineto_json(), "t.json", 1)
    assert chunk is not None
    rows = {r["name"]: r for r in chunk.events.to_pylist()}
    assert rows["aten::mm"]["ts_ns"] == 1712195495519689047  # the 47 ns a float64 would lose
    assert rows["aten::mm"]["dur_ns"] == 12500
    assert rows["aten::mm"]["input_dims"] == "[[32, 64], [64, 64]]"
    assert rows["Memcpy HtoD (Pageable -> Device)"]["stream"] == 7
    assert rows["Memcpy HtoD (Pageable -> Device)"]["bytes"] == 1024
    assert rows["ampere_sgemm_64x64_nn"]["est_occupancy_pct"] == 12.0
    assert 'nn.Module: Linear_0 "quoted" \u00e9 \U0001f600' in rows
    assert chunk.metadata == [
        {"name": "thread_name", "cat": None, "pid": "2914", "tid": "2914", "args": {"name": "python3"}},
        {"name": "process_labels", "cat": None, "pid": "2914", "tid": "0", "args": {}}]


# ----------------------------------------------------------------------------------------------- what it leaves

_LEFT_TO_PYTHON = {
    "ts with 4 decimals": b'[{"ph": "X", "ts": 1.2345}]',
    "ts with an exponent": b'[{"ph": "X", "ts": 1e3}]',
    "ts as a string": b'[{"ph": "X", "ts": "12.5"}]',
    "ts beyond int64 ns": b'[{"ph": "X", "ts": 9999999999999999}]',
    "pid a float": b'[{"ph": "X", "pid": 1.5, "ts": 1}]',
    "pid a boolean": b'[{"ph": "X", "pid": true, "ts": 1}]',
    "pid -0": b'[{"ph": "X", "pid": -0, "ts": 1}]',
    "pid beyond int64": b'[{"ph": "X", "pid": 99999999999999999999, "ts": 1}]',
    "name an object": b'[{"ph": "X", "name": {"a": 1}, "ts": 1}]',
    "a key written with escapes": b'[{"ph": "X", "n\\u0061me": "a", "ts": 1}]',
    "a key twice": b'[{"ph": "X", "ts": 1, "ts": 2}]',
    "an args key twice": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"stream": 1, "stream": 2}}]',
    "a lone surrogate": b'[{"ph": "X", "name": "\\ud800", "ts": 1}]',
    "invalid UTF-8 in a key": b'[{"ph": "X", "n\xffme": "a", "ts": 1}]',
    "invalid UTF-8 in an args key": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"a\xc0": 1}}]',
    "invalid UTF-8 in a number as text": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"stream": "7\xff"}}]',
    "invalid UTF-8 outside a string": b'[{"ph": "X", "ts": 1}, \xff]',
    "a control character": b'[{"ph": "X", "name": "a\x01", "ts": 1}]',
    "deep nesting": b'[{"ph": "X", "ts": 1, "args": {"x": ' + b"[" * 100 + b"]" * 100 + b"}}]",
    "an entry not an object": b'[{"ph": "X", "ts": 1}, 5]',
    "an empty array": b"[]",
    "a trailing comma": b'[{"ph": "X", "ts": 1},]',
    "a leading zero": b'[{"ph": "X", "ts": 01}]',
    "truncated": b'[{"ph": "X", "ts": 1}',
    "an int key with spaces": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"stream": " 7 "}}]',
    "an int key with underscores": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"bytes": "1_000"}}]',
    "an int key in octal": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"bytes": "007"}}]',
    "an int key holding a list": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"correlation": [1]}}]',
    "a float key as a word": b'[{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"flops": "inf"}}]',
    "a number beyond a double": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"correlation": 1e400}}]',
    "a float key beyond a double": b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"blocks per SM": -1e999}}]',
    "a str key holding a float": b'[{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"dtype": 1.5}}]',
}


@needs_scanner
@pytest.mark.parametrize("document", list(_LEFT_TO_PYTHON.values()), ids=list(_LEFT_TO_PYTHON))
def test_leaves_what_it_is_not_sure_of_to_the_python_path(document: bytes) -> None:
    # GIVEN a span with one thing the scanner does not read itself WHEN it is scanned THEN it says so (None),
    # and decode_span gives what the Python path gives (tables, None for a bad cut, or the same error)
    scanned, slow = _both(document)
    assert scanned is None
    if isinstance(slow, TraceFormatError):
        with pytest.raises(TraceFormatError) as raised:
            decode_span(document, "t.json", 1)
        assert str(raised.value) == str(slow)
    elif slow is None:
        assert decode_span(document, "t.json", 1) is None
    else:
        _assert_same(decode_span(document, "t.json", 1), slow)  # type: ignore[arg-type]


def test_a_number_beyond_a_double_in_typed_args_is_one_clear_error() -> None:
    # GIVEN valid JSON whose typed args key holds 1e400 (msgspec refuses it; this once escaped as a traceback)
    document = b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"correlation": 1e400}}]'
    # THEN both paths report one line
    with pytest.raises(TraceFormatError, match="unreadable value in event args"):
        decode_span(document, "t.json", 1)


# what strings are made of, as written in the JSON text: read (the first group) or left to the Python path
_STRING_PIECES_READ = [b'\\"', b"\\\\", b"\\n", b"\\u00e9", b"\\ud83d\\ude00", "\u00e9".encode(), "\u20ac".encode(),
                       "\U0001f600".encode(), b"\x7f", b"~",
                       # not UTF-8: read as bytes.decode("utf-8", "replace") reads them
                       b"\xff", b"\x80", b"\xc0\x80", b"\xed\xa0\x80", b"\xe9", b"\xe2\x82", b"\xf0\x9f\x98",
                       b"\xf4\x90\x80\x80", b"\xc0b\xa4", b"\\n\xff\\u00e9"]
_STRING_PIECES_LEFT = [b"\x01", b"\x1f", b"\t", b"\\x", b"\\ud800"]


@needs_scanner
@pytest.mark.parametrize("piece", _STRING_PIECES_READ + _STRING_PIECES_LEFT)
def test_strings_are_read_as_the_python_path_whatever_byte_of_a_word_holds_what(piece: bytes) -> None:
    # GIVEN a name of plain bytes with one escape, non-ASCII character or forbidden byte, at every offset of
    # the eight-byte words the scanner tests plain text in, and ending at every offset too
    for length in range(0, 26):
        for at in range(length + 1):
            name = b"k" * at + piece + b"k" * (length - at)
            document = b'[{"ph": "X", "cat": "cpu_op", "name": "' + name + b'", "ts": 1, "dur": 2}]'
            scanned = _scan(document)
            # THEN the scanner reads the name as JSON reads it, and leaves the rest to the Python path
            if piece in _STRING_PIECES_LEFT:
                assert scanned is None, (piece, length, at)
            else:
                assert scanned is not None, (piece, length, at)
                name_column = _columns._scanned_views(1, scanned[3])
                expected = json.loads((b'"' + name + b'"').decode("utf-8", "replace"))
                assert name_column.item() == expected, (piece, length, at)


@needs_scanner
def test_every_truncation_of_a_span_is_left_to_the_python_path() -> None:
    document = _kineto_json()
    for cut in range(len(document)):
        assert _scan(document[:cut]) is None, cut


# ----------------------------------------------------------------------------------------------- properties

_KEYS = [key for col in ARG_COLUMNS for key in col.keys]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_NUMERIC_TEXT = st.sampled_from(["0x1f", "0X1F", "-0x10", "12", "-5", "0", "007", " 7 ", "1_000", "1.5", "-2.25",
                                 "1e3", "abc", "", "9223372036854775808", "0x8000000000000000", "inf"])
_VALUE = _JSON | _NUMERIC_TEXT
_TIME = (st.integers(-(2**50), 2**50) | st.none() | st.sampled_from(["12.5", "x"])
         | st.integers(0, 2**52).flatmap(lambda n: st.sampled_from([n / 10, n / 100, n / 1000, n / 10000])))
_TEXT = (st.text(max_size=6) | st.integers(-(2**66), 2**66) | st.integers(-(10**45), 10**45) | st.none()
         | st.booleans() | st.just(1.5))
_EVENT = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "M", "s", "f", "B"]) | _TEXT,
        "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "cuda_runtime", "python_function", "Operator",
                                "cpu_instant_event", "gpu_user_annotation", "new"]) | _TEXT,
        "name": st.sampled_from(["aten::mm", "[memory]", "thread_name", "process_name"]) | _TEXT,
        "pid": _TEXT, "tid": _TEXT, "id": _TEXT, "bp": _TEXT, "ts": _TIME, "dur": _TIME,
        "args": st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=4), _VALUE, max_size=6) | _JSON,
        "other": _JSON,
    },
)


@needs_scanner
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_EVENT, min_size=1, max_size=8), st.sampled_from([None, 0, 2]), st.booleans())
def test_whatever_it_reads_equals_the_python_path(events: list[dict[str, Any]], indent: int | None,
                                                   ascii_only: bool) -> None:
    # GIVEN events of any JSON shape and types, written compactly or indented, escaped or as UTF-8
    document = json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode()
    scanned, slow = _both(document)
    # THEN where the scanner reads the span, the Python path reads it too, to the same tables
    if scanned is not None:
        assert isinstance(slow, ChunkTables)
        _assert_same(_columns._from_scan(scanned), slow)


_INT64 = st.integers(-(2**63), 2**63 - 1)
_READABLE_TEXT = st.text(max_size=8) | _INT64
_READABLE_TIME = st.none() | st.integers(-(2**49), 2**49) | st.integers(-(2**43), 2**43).map(lambda n: n / 1000)
_READABLE_ARG = (st.none() | st.booleans() | _INT64 | st.integers(2**63, 2**66) | st.text(max_size=6)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.lists(_INT64, max_size=3)
                 | st.sampled_from(["0x1f", "-0x10", "12", "-5", "0", "1.5", "-2.25"]))
_READABLE_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i", "M", "s", "f"]), "ts": _READABLE_TIME},
    optional={
        "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "cuda_runtime", "python_function", "Operator",
                                "cpu_instant_event", "gpu_user_annotation", "new"]),
        "name": st.sampled_from(["aten::mm", "[memory]", "thread_name"]) | st.text(max_size=6),
        "pid": _READABLE_TEXT, "tid": _READABLE_TEXT, "id": _READABLE_TEXT, "bp": st.just("e"),
        "dur": _READABLE_TIME, "args": st.dictionaries(st.sampled_from(_KEYS), _READABLE_ARG, max_size=8),
    },
)


@needs_scanner
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_READABLE_EVENT, min_size=1, max_size=8), st.sampled_from([None, 2]), st.booleans())
def test_well_typed_events_with_edge_values_read_as_the_python_path(events: list[dict[str, Any]],
                                                                    indent: int | None, ascii_only: bool) -> None:
    # GIVEN events of the types real traces use, at their edges (int64 limits and beyond, escapes, non-ASCII,
    # times to the ns, numbers written as strings), where the scanner reads most spans itself
    document = json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode()
    scanned, slow = _both(document)
    if scanned is not None:
        assert isinstance(slow, ChunkTables)
        _assert_same(_columns._from_scan(scanned), slow)


_BASE = _kineto_json()


@needs_scanner
@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(_BASE) - 1), st.binary(min_size=0, max_size=3), st.integers(0, 3))
def test_a_corrupted_span_is_never_read_differently(at: int, insert: bytes, delete: int) -> None:
    # GIVEN a real-shaped span with a few bytes replaced, inserted or deleted
    document = _BASE[:at] + insert + _BASE[at + delete:]
    scanned, slow = _both(document)
    # THEN the scanner reads it only where msgspec finds it valid JSON, and then to the Python path's tables
    if scanned is not None:
        msgspec.json.decode(document.decode("utf-8", "replace"))  # (invalid UTF-8 only inside strings)
        assert isinstance(slow, ChunkTables)
        _assert_same(_columns._from_scan(scanned), slow)


# ----------------------------------------------------------------------------------------------- in place

@needs_scanner
@pytest.mark.parametrize("separator", [b",", b", ", b",\n  "])
def test_a_span_read_in_place_equals_the_same_span_bracketed(separator: bytes) -> None:
    # GIVEN a buffer of events separated tightly or loosely, and the span of its middle events
    pieces = [json.dumps(e).replace('"EPOCH_TS"', "1.5").replace('"EPOCH_TS2"', "2").encode() for e in _KINETO]
    data = bytearray(b"[" + separator.join(pieces) + b"]")
    a = 1 + len(pieces[0]) + len(separator)
    b = len(data) - 1 - len(pieces[-1]) - len(separator)
    # WHEN it is read in place THEN its tables are those of the bracketed copy, and the buffer is untouched
    before = bytes(data)
    in_place = decode_range(data, a, b, "t.json")
    assert in_place is not None
    _assert_same(in_place, _python(b"[" + bytes(data[a:b]) + b"]"))  # type: ignore[arg-type]
    assert bytes(data) == before
    assert _scan(bytes(data), a, b + 1) is None  # a range that ends inside an event is not a span


@needs_scanner
def test_threads_read_spans_of_one_buffer_at_once() -> None:
    pieces = [json.dumps(e).replace('"EPOCH_TS"', "1.5").replace('"EPOCH_TS2"', "2").encode() for e in _KINETO] * 200
    data = bytearray(b"[" + b",".join(pieces) + b"]")
    bounds = [1]
    for piece in pieces:
        bounds.append(bounds[-1] + len(piece) + 1)
    spans = [(bounds[i], bounds[i + 100] - 1) for i in range(0, len(pieces), 100)]
    want = [decode_range(data, a, b, "t.json") for a, b in spans]
    got: dict[int, ChunkTables | None] = {}
    threads = [threading.Thread(target=lambda i=i, a=a, b=b: got.__setitem__(i, decode_range(data, a, b, "t.json")))
               for i, (a, b) in enumerate(spans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        assert got[i] is not None and w is not None
        assert pa.Table.equals(got[i].events, w.events)  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------- bad numbers

def _outcome(decode: Any, document: bytes) -> Any:
    try:
        return decode(document)
    except TraceFormatError as exc:
        return str(exc)


_DEEP = b"[" * 5000 + b"]" * 5000
_BAD_NUMBERS = {
    "metadata args 1e400": b'{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x", "v": 1e400}}',
    "metadata args of 5000 digits": b'{"ph": "M", "name": "p", "pid": 1, "args": {"v": ' + b"1" * 5000 + b"}}",
    "ts of 40 digits": b'{"ph": "X", "ts": 1' + b"0" * 40 + b"}",
    "dur of 40 digits": b'{"ph": "X", "ts": 1, "dur": -1' + b"0" * 40 + b"}",
    "ts 1e17": b'{"ph": "X", "ts": 1e17}',
    "dur 100e30 (beyond Decimal(38, 3) once scaled)": b'{"ph": "X", "dur": 100e30}',
    "whole ts beyond int64 ns": b'{"ph": "X", "ts": 9223372036854776}',
    "whole ts at int64 ns's edge": b'{"ph": "X", "ts": -9223372036854775, "dur": 0}',
    "ts with decimals at the edge": b'{"ph": "X", "ts": 9223372036854775.807}',
    "ts with decimals beyond the edge": b'{"ph": "X", "ts": 9223372036854775.808}',
    "ts + dur beyond int64 ns": b'{"ph": "X", "ts": 9223372036854775, "dur": 1}',
    "ts 1e400": b'{"ph": "X", "ts": 1e400}',
    "pid of 40 digits": b'{"ph": "X", "ts": 1, "pid": 1' + b"0" * 40 + b"}",
    "name of 40 digits beside text": b'{"ph": "X", "ts": 1, "name": -1' + b"0" * 40 + b'}, {"ph": "X", "name": "a"}',
    "tid beyond 128 bits in a metadata event": b'{"ph": "M", "name": "thread_name", "tid": 1' + b"0" * 40 + b"}",
    "pid of 5000 digits": b'{"ph": "X", "ts": 1, "pid": ' + b"1" * 5000 + b"}",
    "an int args key of 30 digits": b'{"ph": "X", "cat": "kernel", "ts": 1, "args": {"bytes": ' + b"9" * 30 + b"}}",
    "an int args key of 5000 digits": b'{"ph": "X", "cat": "kernel", "ts": 1, "args": {"bytes": ' + b"9" * 5000 + b"}}",
    "a float args key of 40 digits": b'{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"flops": 1' + b"0" * 40 + b"}}",
    "a float args key of 400 digits": b'{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"flops": 1' + b"0" * 400 + b"}}",
    "a str args key of 40 digits": b'{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"dtype": 1' + b"0" * 40 + b"}}",
    "args nested 500 deep": b'{"ph": "X", "ts": 1, "args": {"x": ' + b"[" * 500 + b"]" * 500 + b"}}",
    "args nested beyond the recursion limit": b'{"ph": "X", "ts": 1, "args": {"x": ' + _DEEP + b"}}",
}


@pytest.mark.parametrize("event", list(_BAD_NUMBERS.values()), ids=list(_BAD_NUMBERS))
def test_numbers_beyond_int64_or_a_double_read_the_same_on_both_paths(event: bytes) -> None:
    # GIVEN a span whose second event holds a number beyond int64 or a double, or nests deeply
    first = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}, '
    document = b"[" + first + event + b"]"
    # WHEN the scanner (where built) and the Python path read it
    fast = _outcome(lambda d: decode_span(d, "t.json", 1), document)
    slow = _outcome(_python, document)
    # THEN both give the same tables or the same one-line error, naming the event where it is one event's
    if isinstance(slow, str):
        assert fast == slow and "\n" not in slow
        assert slow.startswith(f"t.json (byte {1 + len(first)}): ") or "nested too deeply" in slow
    else:
        _assert_same(fast, slow)
        assert slow.ts_min_ns is not None


@needs_scanner
def test_a_metadata_event_beyond_a_double_is_read_by_the_scanner_then_refused_as_the_python_path_does() -> None:
    document = b'[{"ph": "M", "name": "process_name", "pid": 1, "args": {"v": 1e400}}, {"ph": "X", "ts": 1}]'
    assert _scan(document) is not None  # valid JSON to the scanner: the error comes from decoding the args
    with pytest.raises(TraceFormatError, match=r"^t.json \(byte 1\): unreadable value in event args"):
        decode_span(document, "t.json", 1)


@needs_scanner
@pytest.mark.parametrize("code", [4, 9, 255])
def test_scan_events_refuses_a_type_code_it_does_not_know(code: int) -> None:
    # GIVEN a type code beyond json (3) WHEN scan_events is called THEN it raises, rather than read out of bounds
    with pytest.raises(ValueError, match=f"types\\[1\\] is {code}"):
        _columns._scan.scan_events(  # type: ignore[attr-defined]
            b'[{"ph": "X", "ts": 1, "args": {"b": 1}}]', (b"a", b"b"), bytes([0, code]))


# ----------------------------------------------------------------------------------------------- written as text

# The properties above write their documents with json.dumps, which writes a number one way only, never nests
# past a few levels and never writes a byte that is not UTF-8. These documents are built as text, so the
# scanner meets what other writers (and corruption) produce: numbers in every form JSON allows (exponents, any
# count of digits or decimals, -0, beyond int64 and a double), escapes, raw non-ASCII and invalid bytes,
# nesting on both sides of the scanner's 64 levels, every category and phase. Most values are of the kind real
# traces hold, so that the scanner reads many spans itself; one in several is odd.

_DIGITS = st.text("0123456789", min_size=1, max_size=45)
_PLAIN_INT = st.integers(-(2**63), 2**63 - 1).map(lambda n: str(n).encode())
_PLAIN_TIME = (st.integers(-(2**50), 2**50).map(str)
               | st.tuples(st.integers(-(2**50), 2**50), st.integers(0, 999)).map(lambda p: f"{p[0]}.{p[1]:03d}")
               ).map(str.encode)


@st.composite
def _odd_number(draw: st.DrawFn) -> str:
    """A JSON number of any form: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?"""
    whole = draw(st.sampled_from(["0", "9223372036854775807", "9223372036854775808", "18446744073709551616"])
                 | _DIGITS.map(lambda d: d.lstrip("0") or "0"))
    text = draw(st.sampled_from(["", "-"])) + whole
    if draw(st.booleans()):
        text += "." + draw(_DIGITS)
    if draw(st.booleans()):
        text += draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+", "-"])) + draw(
            st.sampled_from(["0", "3", "17", "308", "309", "400"]) | _DIGITS)
    return text


_NUMBER = st.one_of(_PLAIN_INT, _PLAIN_TIME, _odd_number().map(str.encode))
_CHARS = st.sampled_from(['\\"', "\\\\", "\\/", "\\b", "\\n", "\\t", "\\u00e9", "\\ud83d\\ude00", "\\u0000", "\u00e9",
                          "\u20ac", "\U0001f600", "\x7f", "a", "aten::mm", " ", "#"]).map(str.encode)
# not JSON (a lone surrogate, a control character, bytes that are not UTF-8): both paths refuse, or read, alike
_ODD_CHARS = st.sampled_from([b"\\ud800", b"\x01", b"\t", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe9",
                              b"\xf0\x9f\x98"])


@st.composite
def _string(draw: st.DrawFn) -> bytes:
    pieces = [draw(_CHARS) for _ in range(draw(st.integers(0, 5)))]
    if draw(st.integers(0, 19)) == 0:
        pieces.insert(draw(st.integers(0, len(pieces))), draw(_ODD_CHARS))
    return b'"' + b"".join(pieces) + b'"'


_SCALAR = _NUMBER | _string() | st.sampled_from([b"null", b"true", b"false", b'"0x1f"', b'"-7"', b'"1.5"', b'"inf"'])


@st.composite
def _value(draw: st.DrawFn) -> bytes:
    """A scalar, or one in nine times a container nested 1 to 80 deep (the scanner gives up past 64)."""
    leaf = draw(_SCALAR)
    if draw(st.integers(0, 8)):
        return leaf
    depth = draw(st.integers(1, 80))
    if draw(st.booleans()):
        return b"[" * depth + leaf + b"]" * depth
    return b'{"k": ' * depth + leaf + b"}" * depth


_CATEGORIES = sorted(KIND_BY_CATEGORY) + ["ac2g", "fwdbwd", "cpu_instant_event", "Trace", "new"]
_PHASES = ["X", "B", "E", "i", "I", "s", "t", "f", "M", "C", "b", "e", "n"]
_FIELDS = {"name": _string(), "pid": _PLAIN_INT | _string(), "tid": _PLAIN_INT | _string(), "ts": _PLAIN_TIME,
           "dur": _PLAIN_TIME, "id": _PLAIN_INT | _string(), "bp": st.just(b'"e"')}


@st.composite
def _event_text(draw: st.DrawFn) -> bytes:
    """One event object: its fields well-typed, or one in eight of any kind; typed args keys; any spacing."""
    ph = draw(st.sampled_from(_PHASES))
    members = [(b'"ph"', b'"' + ph.encode() + b'"')]
    if draw(st.integers(0, 5)):
        members.append((b'"cat"', json.dumps(draw(st.sampled_from(_CATEGORIES))).encode()))
    if ph == "M":
        members.append((b'"name"', draw(st.sampled_from([b'"process_name"', b'"thread_name"', b'"process_labels"']))))
    for field, plain in _FIELDS.items():
        if draw(st.integers(0, 3)):
            members.append((json.dumps(field).encode(), draw(plain if draw(st.integers(0, 7)) else _value())))
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from([*_KEYS, "name", "labels", "x"]), max_size=6, unique=True))
        args = b", ".join(json.dumps(k).encode() + b": " + draw(st.one_of(_PLAIN_INT, _PLAIN_INT, _value()))
                          for k in keys)
        members.append((b'"args"', b"{" + args + b"}"))
    if draw(st.integers(0, 19)) == 0:  # a key twice
        members.append(draw(st.sampled_from(members)))
    space = draw(st.sampled_from([b"", b" ", b"\n  "]))
    return b"{" + (b"," + space).join(k + b":" + space + v for k, v in members) + b"}"


@needs_scanner
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_event_text(), min_size=1, max_size=6), st.sampled_from([b",", b", ", b",\n"]))
def test_documents_written_as_text_read_the_same_on_both_paths(events: list[bytes], separator: bytes) -> None:
    # GIVEN a span of events written as text: every kind, numbers of any form, unicode and bad bytes, nesting
    document = b"[" + separator.join(events) + b"]"
    # WHEN decode_span (the scanner first) and the Python path alone read it, whole and in place
    slow = _outcome(_python, document)
    whole = _outcome(lambda d: decode_span(d, "t.json", 1), document)
    in_place = _outcome(lambda d: decode_range(d, 1, len(d) - 1, "t.json"), document)
    # THEN they give the same tables, or None (not JSON), or the same one-line error
    for got in (whole, in_place):
        if isinstance(slow, ChunkTables):
            assert isinstance(got, ChunkTables), got
            _assert_same(got, slow)
        else:
            assert got == slow
