"""Fuzz target: the compiled scanner's C API, `_scan.scan_events(document, keys, types[, start, end])`.

Beyond whole documents (fuzz_trace.py), this drives the arguments ingest never passes: any keys (empty, long,
repeated, more than the scanner's 128), any type codes (a code above 3 must be a ValueError, never a read
out of bounds), any range (in place, reversed, past the end). Whatever comes back must be well-formed Arrow
buffers (pyarrow validates them in full: offsets and views inside their data, valid UTF-8), and with the real
keys, the tables decode_span / decode_range build from them must be the Python path's.

Input layout (see make_seeds.scan_api_seeds):

    flags (1 byte: 1 = keys and types from the input, else ingest's; 2 = a range, else the whole document)
    [keys: count (1 byte), then per key: length (1 byte), its bytes, its type code (1 byte)]
    [range: start (2 bytes, little-endian), bytes left off the end (2 bytes)]   (each modulo the length + 1)
    document: the rest

    python fuzz/fuzz_scan_events.py /tmp/corpus-scan fuzz/seeds/scan_events -max_len=8192
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import atheris
from _common import outcome, plain, run

with atheris.instrument_imports(include=["stepscope"]):
    import pyarrow as pa

    from stepscope.analyze import _columns
    from stepscope.analyze._arrow import conform
    from stepscope.analyze.schema import EVENT_SCHEMA
    from stepscope.errors import TraceFormatError

_ARGUMENT_ERRORS = ("keys and types differ in length", "types[")  # scan_events' own refusals (ValueError)


def _parse(data: bytes) -> tuple[tuple[bytes, ...], bytes, tuple[int, ...], bytes]:
    """(keys, types, range (empty: the whole document), document) from an input laid out as above."""
    flags, pos = (data[0] if data else 0), 1
    keys, types = _columns._SLOT_KEYS, _columns._SLOT_TYPES
    if flags & 1:
        count = data[pos] if pos < len(data) else 0
        pos += 1
        key_list, type_list = [], []
        for _ in range(count):
            length = data[pos] if pos < len(data) else 0
            key_list.append(data[pos + 1 : pos + 1 + length])
            pos += 1 + length
            type_list.append(data[pos] if pos < len(data) else 0)
            pos += 1
        keys, types = tuple(key_list), bytes(type_list)
    span: tuple[int, ...] = ()
    if flags & 2:
        head = data[pos : pos + 4].ljust(4, b"\0")
        pos += 4
        document = data[pos:]
        size = len(document) + 1
        start, cut = int.from_bytes(head[:2], "little") % size, int.from_bytes(head[2:], "little") % size
        return keys, types, (start, len(document) - cut), document
    return keys, types, span, data[pos:]


def _check_text(n: int, column: Any, *, views: bool) -> None:
    if column is None:
        return
    a, data, valid = column
    if views:  # Arrow string views: (views, data, validity)
        array = pa.Array.from_buffers(pa.string_view(), n, [pa.py_buffer(valid), pa.py_buffer(a), pa.py_buffer(data)])
    else:  # (int64 offsets, data, validity)
        array = pa.LargeStringArray.from_buffers(n, pa.py_buffer(a), pa.py_buffer(data), pa.py_buffer(valid))
    array.validate(full=True)


def _check_numbers(n: int, column: Any, dtype: pa.DataType) -> None:
    values, valid = column
    pa.Array.from_buffers(dtype, n, [pa.py_buffer(valid), pa.py_buffer(values)]).validate(full=True)


def check_buffers(scanned: tuple[Any, ...], types: bytes) -> None:
    """Every buffer scan_events returned is a well-formed Arrow column of n rows."""
    n, *texts, ts, dur, slots = scanned[:12]
    assert isinstance(n, int) and n > 0
    assert len(texts) == 8 and len(slots) == len(types)
    assert all(type(extra) is int for extra in scanned[12:])  # counts and offsets (invalid UTF-8)
    for column in texts:
        _check_text(n, column, views=True)
    _check_numbers(n, ts, pa.int64())
    _check_numbers(n, dur, pa.int64())
    for column, code in zip(slots, types, strict=True):
        if column is None:
            continue
        if code in (0, 1):
            _check_numbers(n, column, pa.int64() if code == 0 else pa.float64())
        else:
            _check_text(n, column, views=False)


def _tables(chunk: _columns.ChunkTables | None) -> Any:
    """Every field of a span's tables as plain values (the events conformed: a column no event has may be left
    out by either path)."""
    if chunk is None:
        return None
    fields = {f.name: getattr(chunk, f.name) for f in dataclasses.fields(chunk)}
    events = conform(fields.pop("events"), EVENT_SCHEMA)
    fields["events"] = {name: events[name].to_pylist() for name in EVENT_SCHEMA.names}
    fields["flows"] = fields["flows"].to_pylist()
    return plain(fields)


def test_one_input(data: bytes) -> None:
    keys, types, span, document = _parse(data)
    try:
        scanned = _columns._scan.scan_events(document, keys, types, *span)  # type: ignore[attr-defined]
    except ValueError as exc:
        assert str(exc).startswith(_ARGUMENT_ERRORS), exc
        return
    if scanned is None:
        return
    check_buffers(scanned, types)
    if keys is not _columns._SLOT_KEYS:
        return
    # with ingest's keys, the scanner read this span: decode_span / decode_range (which take the scanner's
    # columns) give the Python path's tables or error
    if span:
        a, b = span
        fast = outcome(lambda: _tables(_columns.decode_range(document, a, b, "fuzz.json")), (TraceFormatError,))
        slow = outcome(lambda: _tables(_columns._decode_python(b"[" + document[a:b] + b"]", "fuzz.json", a)),
                       (TraceFormatError,))
    else:
        fast = outcome(lambda: _tables(_columns.decode_span(document, "fuzz.json", 1)), (TraceFormatError,))
        slow = outcome(lambda: _tables(_columns._decode_python(document, "fuzz.json", 1)), (TraceFormatError,))
    assert fast == slow, "the scanner read a span the Python path reads otherwise"


if __name__ == "__main__":
    if not _columns.scanner_available():
        sys.exit("the compiled scanner is not built: pip install -e . (with a C compiler) first")
    run(test_one_input)
