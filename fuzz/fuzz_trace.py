"""Fuzz target: a whole trace document, read as ingest reads it, by the compiled scanner and by the Python path.

Each input is a trace file's bytes (JSON: an object with traceEvents, or a bare array). It is read in memory as
`ingest_trace` reads it (`locate_events`, then `iter_chunk_tables`, which cuts the array into spans, decodes each
with `decode_range` and mends cuts that fell inside a string), short of writing Parquet, in two ways:

- with the compiled scanner (`_scan.scan_events` on each span in place), then with it switched off (every span
  on msgspec and `_columns._decode_python`): the tables, or the error messages, must be identical;
- as one span and cut into about four: the same tables (or both an error; the offset an error names may be
  its span's).

Any exception other than a StepscopeError is a finding.

    python fuzz/fuzz_trace.py /tmp/corpus-trace fuzz/seeds/trace -max_len=8192
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import atheris
from _common import outcome, plain, run

with atheris.instrument_imports(include=["stepscope"]):
    from stepscope.analyze import _columns
    from stepscope.analyze._arrow import conform
    from stepscope.analyze._read import locate_events
    from stepscope.analyze._spans import Relocated, iter_chunk_tables
    from stepscope.analyze.schema import EVENT_SCHEMA, FLOW_SCHEMA
    from stepscope.errors import StepscopeError

_PATH = Path("fuzz.json")
_WHOLE = 1 << 30  # one span
_SPANS = 4  # cuts inside strings, merged spans, file-wide event ids (more spans cost more than they find: each
# span has a fixed cost in polars)

def read_trace(document: bytes, chunk_bytes: int) -> Any:
    """The tables ingest would write for `document`, as plain values (the spans' tables put together)."""
    data = bytearray(document)
    start, end, top, certain = locate_events(data, _PATH)
    while True:
        try:
            chunks = list(iter_chunk_tables(data, start, end, _PATH, chunk_bytes=chunk_bytes, certain=certain))
            break
        except Relocated as exc:  # as ingest does: a valid document that fooled locate_events
            start, end, top, certain = exc.start, exc.end, exc.top, True
    kinds: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    events: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names}
    flows: dict[str, list[Any]] = {name: [] for name in FLOW_SCHEMA.names}
    metadata: list[dict[str, Any]] = []
    for chunk in chunks:
        table = conform(chunk.events, EVENT_SCHEMA)  # a column no event has may be left out by either path
        for name in EVENT_SCHEMA.names:
            events[name] += table[name].to_pylist()
        for name in FLOW_SCHEMA.names:
            flows[name] += chunk.flows[name].to_pylist()
        metadata += chunk.metadata
        kinds += chunk.kind_counts
        unknown += chunk.unknown_categories
    ts_min = [c.ts_min_ns for c in chunks if c.ts_min_ns is not None]
    end_max = [c.end_max_ns for c in chunks if c.end_max_ns is not None]
    first_invalid: list[int] = [at for c in chunks if (at := getattr(c, "first_invalid", None)) is not None]
    return plain({
        "invalid_strings": sum(getattr(c, "invalid_strings", 0) for c in chunks),
        "first_invalid": min(first_invalid, default=None),
        "top": top, "events": events, "flows": flows, "metadata": metadata, "kinds": dict(kinds),
        "unknown": dict(unknown), "n_input": sum(c.n_input for c in chunks),
        "ts_min": min(ts_min, default=None), "end_max": max(end_max, default=None),
    })


@contextmanager
def python_path() -> Iterator[None]:
    """Every span on the pure-Python path (msgspec and _decode_python), as where the scanner was not built."""
    scanner = _columns._scan  # type: ignore[attr-defined]
    _columns._scan = None  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        _columns._scan = scanner  # type: ignore[attr-defined]


def test_one_input(document: bytes) -> None:
    results = []
    for chunk_bytes in (_WHOLE, max(16, len(document) // _SPANS)):
        fast = outcome(lambda: read_trace(document, chunk_bytes), (StepscopeError,))  # noqa: B023
        with python_path():
            slow = outcome(lambda: read_trace(document, chunk_bytes), (StepscopeError,))  # noqa: B023
        assert fast == slow, f"the scanner and the Python path disagree (spans of {chunk_bytes} bytes)"
        results.append(fast)
    whole, small = results
    both_errors = isinstance(whole, str) and isinstance(small, str)
    assert both_errors or whole == small, "one span and small spans disagree"


if __name__ == "__main__":
    if not _columns.scanner_available():
        sys.exit("the compiled scanner is not built: pip install -e . (with a C compiler) first")
    run(test_one_input)
