"""Chrome trace -> normalized Parquet (`events.parquet`, `flows.parquet`, `meta.json`), once.

How a trace is read, fast and in bounded memory:

1. The file is read whole (gzip is sniffed by its magic bytes, not its name) and its top level is decoded
   with msgspec as ``dict[str, Raw]``: this validates the whole document (a truncated or malformed file is
   reported here, with its byte offset) and keeps ``traceEvents`` as raw bytes.
2. ``traceEvents`` is cut into chunks of about ``chunk_bytes`` at event boundaries (``}, {``); each chunk
   is decoded into small typed Structs (only the fields we keep; ``ts``/``dur``/``args`` stay raw text).
   A cut that lands inside a string fails to decode and is simply merged with the next chunk.
3. Columns are built in bulk: times are parsed from their decimal text, args are decoded per kind group
   into typed Structs and pulled out column by column, and each chunk is appended to Parquet.

**The time rule** (the only place units change): Chrome traces write ``ts``/``dur`` in microseconds,
as integers (older Kineto) or decimals with ns resolution (torch >= 2.1), whatever ``displayTimeUnit``
says (that key only tells viewers how to *display* time). We read the decimal text exactly and shift the
point three places, rounding beyond the third decimal:

    "ts": 1623142623460111        ->  ts_ns = 1623142623460111000
    "ts": 1712195495519689.047    ->  ts_ns = 1712195495519689047   (a float64 would lose the 47 ns)
    "dur": 12.3456                ->  dur_ns = 12346

``ts_ns`` stays on the trace's own clock; ``baseTimeNanoseconds`` (when present) is kept in meta.json.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import queue
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepscope.analyze._io import atomic_dir
from stepscope.analyze.schema import (
    ARG_COLUMNS,
    EVENT_SCHEMA,
    FLOW_SCHEMA,
    GPU_KINDS,
    GROUP_OF_KIND,
    INGEST_SCHEMA_VERSION,
    KIND_BY_CATEGORY,
    MEMORY_EVENT_NAME,
    ArgColumn,
    ArgGroup,
    Kind,
)
from stepscope.errors import InputError, TraceFormatError

DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
# Below this, starting worker processes costs more than it saves.
PARALLEL_MIN_BYTES = 160 * 1024 * 1024
TRACE_SUFFIXES = (".json", ".json.gz")
_NULL = msgspec.Raw(b"null")
_EMPTY_OBJECT = b"{}"
_SEP = b"\x00"  # never appears raw in JSON text, so it safely joins raw values
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _RawEvent(msgspec.Struct, kw_only=True):
    """One traceEvents entry, with only the fields we keep. Loose types: bad values are coerced later."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    bp: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = _NULL


class _RawTimes(msgspec.Struct):
    """ts/dur as their decimal text, for chunks where float64 cannot hold them to the nanosecond."""

    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL


def _args_struct(group: ArgGroup) -> type[msgspec.Struct]:
    """A Struct with one field per raw args key used by this group; json-typed keys stay raw text."""
    fields: list[tuple[str, Any, Any]] = []
    for col in ARG_COLUMNS:
        if group not in col.groups:
            continue
        for i, key in enumerate(col.keys):
            if col.type == "json":
                fields.append((f"{col.column}__{i}", msgspec.Raw, msgspec.field(default=_NULL, name=key)))
            else:
                fields.append((f"{col.column}__{i}", Any, msgspec.field(default=None, name=key)))
    return msgspec.defstruct(f"Args_{group}", fields, kw_only=True)


_GROUPS: tuple[ArgGroup, ...] = ("gpu", "cpu", "python", "runtime", "memory")
_ARGS_STRUCTS: dict[ArgGroup, type[msgspec.Struct]] = {g: _args_struct(g) for g in _GROUPS}
_ARGS_DECODERS = {g: msgspec.json.Decoder(list[s]) for g, s in _ARGS_STRUCTS.items()}  # type: ignore[valid-type]
_CHUNK_DECODER = msgspec.json.Decoder(list[_RawEvent])
_TIMES_DECODER = msgspec.json.Decoder(list[_RawTimes])
# A float below 2**43 µs is within 0.49 ns of its decimal text, so rounding its ns value is exact.
_EXACT_FLOAT_LIMIT_US = float(2**43)


class _BackgroundWriter:
    """Appends tables to a Parquet file from a thread: pyarrow releases the GIL while it encodes and
    compresses, so writing chunk N overlaps with decoding chunk N + 1. At most two tables wait."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self._queue: queue.Queue[pa.Table | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"write-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (table := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._writer.write_table(table)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = exc

    def write_table(self, table: pa.Table) -> None:
        """Queue one table (blocks while two are already waiting)."""
        if self._error is not None:
            raise self._error
        self._queue.put(table)

    def close(self) -> None:
        """Flush, close the file and re-raise any write error."""
        self._queue.put(None)
        self._thread.join()
        self._writer.close()
        if self._error is not None:
            raise self._error


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    """What `ingest_trace` did: where the tables are and whether the work was skipped (unchanged file)."""

    source: Path
    out_dir: Path
    skipped: bool
    n_events: int
    seconds: float


# ----------------------------------------------------------------------------------------------- reading


def read_trace(path: Path) -> tuple[bytearray, str]:
    """The uncompressed JSON of a trace file (gzip sniffed by its magic bytes) and the sha256 of the file
    as stored, from one read. A bytearray, so spans of it can be decoded in place (see iter_chunk_tables)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            stored = bytearray(size)
            got = fh.readinto(stored)
    except IsADirectoryError:
        raise InputError("is a directory, expected a trace file", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=path) from None
    del stored[got:]
    sha = hashlib.sha256(stored).hexdigest()
    if stored[:2] != b"\x1f\x8b":
        return stored, sha
    try:
        return _gunzip(stored), sha
    except EOFError:
        raise TraceFormatError("truncated gzip file (the compressed stream ends early)", path=path) from None
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise TraceFormatError(f"corrupt gzip data ({exc})", path=path) from None


def _gunzip(stored: bytearray) -> bytearray:
    """Decompress into one preallocated bytearray (the gzip trailer states the size), in 16 MiB steps."""
    expected = int.from_bytes(stored[-4:], "little")
    if not 0 < expected <= 256 * len(stored):  # a truncated file's "trailer" is arbitrary bytes
        return bytearray(gzip.decompress(bytes(stored)))
    out = bytearray(expected)
    pos = 0
    decompressor = zlib.decompressobj(wbits=31)
    view = memoryview(stored)
    piece = decompressor.decompress(view, 1 << 24)
    while True:
        if pos + len(piece) > len(out):  # several members, or over 4 GiB: the trailer was not the size
            return bytearray(gzip.decompress(bytes(stored)))
        out[pos : pos + len(piece)] = piece
        pos += len(piece)
        if decompressor.eof:
            break
        if not decompressor.unconsumed_tail and not piece:
            raise EOFError("compressed stream ends early")
        piece = decompressor.decompress(decompressor.unconsumed_tail, 1 << 24)
    if decompressor.unused_data.strip(b"\x00") or pos != expected:
        return bytearray(gzip.decompress(bytes(stored)))
    return out


def read_trace_bytes(path: Path) -> bytearray:
    """The uncompressed JSON bytes of a trace file."""
    return read_trace(path)[0]


def _decode_error(exc: Exception, data: bytes | bytearray, path: Path, base: int = 0) -> TraceFormatError:
    text = str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return TraceFormatError(f"not UTF-8 text ({exc.reason})", path=path, offset=base + exc.start)
    if "truncated" in text:
        return TraceFormatError("truncated JSON (the file ends in the middle of the document)",
                                path=path, offset=len(data))
    match = re.search(r"\(byte (\d+)\)", text)
    offset = base + int(match.group(1)) if match else None
    message = re.sub(r"\s*\(byte \d+\)", "", text)
    first = re.search(rb"\S", data)
    if first is None or data[first.start()] not in b"{[":
        return TraceFormatError("not a JSON trace file (expected a Chrome trace: JSON with traceEvents)",
                                path=path, offset=offset)
    return TraceFormatError(f"malformed JSON: {message}", path=path, offset=offset)


def split_document(data: bytes | bytearray, path: Path) -> tuple[int, int, dict[str, Any]]:
    """Validate the whole document; return the byte span of the traceEvents array and the other top keys."""
    first = re.search(rb"\S", data)
    if first is None:
        raise TraceFormatError("empty file", path=path)
    try:
        if data[first.start()] == ord("["):  # a bare array of events is a valid Chrome trace too
            msgspec.json.decode(data, type=msgspec.Raw)
            start = data.index(b"[")
            end = data.rindex(b"]") + 1
            return start, end, {}
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _decode_error(exc, data, path) from None
    except msgspec.ValidationError:
        raise TraceFormatError("not a Chrome trace (the top level is neither an object nor an array)",
                               path=path) from None
    if "traceEvents" not in top:
        keys = ", ".join(sorted(top)[:8]) or "none"
        raise TraceFormatError(f"not a Chrome trace: no traceEvents key (top-level keys: {keys})", path=path)
    events_raw = top.pop("traceEvents")
    meta: dict[str, Any] = {}
    for key, value in top.items():
        try:
            meta[key] = msgspec.json.decode(value)
        except UnicodeDecodeError as exc:
            raise TraceFormatError(f"not UTF-8 text in top-level key {key!r} ({exc.reason})", path=path) from None
    span = _locate(data, events_raw)
    if span is None:
        raise TraceFormatError("traceEvents is not an array", path=path)
    return span[0], span[1], meta


def _locate(data: bytes | bytearray, raw: msgspec.Raw) -> tuple[int, int] | None:
    """Byte span of a Raw value inside `data` (Raw keeps no offset: find the key, check both ends)."""
    view = memoryview(raw)
    size = len(view)
    if not size or view[0] != ord("["):
        return None
    head, tail = bytes(view[:4096]), bytes(view[-4096:])
    for match in re.finditer(rb'"traceEvents"\s*:\s*', data):
        start = match.end()
        if data.startswith(head, start) and data.startswith(tail, start + size - len(tail)):
            return start, start + size
    return None  # pragma: no cover - the key is always there when decode found it


def iter_chunks(data: bytes | bytearray, start: int, end: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Cut the array data[start:end] ('[' ... ']') into spans of whole events, about chunk_bytes each."""
    body_start = start + 1
    body_end = data.rindex(b"]", start, end)
    pos = body_start
    while pos < body_end:
        target = pos + chunk_bytes
        if target >= body_end:
            yield pos, body_end
            return
        match = _BOUNDARY.search(data, target, body_end)
        if match is None:
            yield pos, body_end
            return
        cut = match.start() + 1  # just after the closing brace
        yield pos, cut
        pos = match.end() - 1  # at the next opening brace


def process_span(body: bytes | bytearray, path: str, offset: int) -> _ChunkTables | None:
    """Decode and build one span of whole events (the bytes between two cuts, without brackets).

    Event ids are local to the span (0-based); the caller shifts them. Returns None when the cut that
    made this span fell inside a string, so the caller merges it with the next span. Runs in worker
    processes for large traces, so it takes and returns only picklable values.
    """
    return process_document(b"[" + body + b"]", path, offset)


def process_document(document: bytes | memoryview, path: str, offset: int) -> _ChunkTables | None:
    """Like process_span, for a span already wrapped in brackets (a JSON array of events)."""
    try:
        events = _CHUNK_DECODER.decode(document)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"an entry of traceEvents is not an event object ({exc})", path=path,
                               offset=offset) from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8 text ({exc.reason})", path=path, offset=offset - 1 + exc.start) from None
    except msgspec.DecodeError:
        return None
    try:
        return build_chunk(events, 0, document)
    except UnicodeDecodeError as exc:  # inside args, which the first pass keeps raw
        raise TraceFormatError(f"not UTF-8 text in event args ({exc.reason})", path=path, offset=offset) from None


def _process_in_place(data: bytearray, a: int, b: int, path: Path) -> _ChunkTables | None:
    """process_document on data[a:b] without copying it: the separator bytes just outside the span are
    set to '[' and ']' while it is decoded, then restored. Raw values never include those bytes.

        data:  [ {e0} , {e1} , {e2} ]        span (a, b) = {e1}
        view:        [ {e1} ]                 (the commas around it, briefly)
    """
    before, after = data[a - 1], data[b]
    data[a - 1], data[b] = 0x5B, 0x5D
    try:
        return process_document(memoryview(data)[a - 1 : b + 1], str(path), a)
    finally:
        data[a - 1], data[b] = before, after


def _shifted(chunk: _ChunkTables, first_index: int) -> _ChunkTables:
    if first_index == 0:
        return chunk
    events = chunk.events.set_column(0, "event_id", pc.add(chunk.events["event_id"], first_index))
    flows = chunk.flows.set_column(0, "event_id", pc.add(chunk.flows["event_id"], first_index))
    return _ChunkTables(events=events, flows=flows, metadata=chunk.metadata, kind_counts=chunk.kind_counts,
                        n_input=chunk.n_input)


def iter_chunk_tables(data: bytearray, start: int, end: int, path: Path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      jobs: int = 1) -> Iterator[_ChunkTables]:
    """Yield the tables of each span of traceEvents in file order, decoding spans in `jobs` processes.

    At most jobs + 1 spans are in flight, so memory stays bounded; a span whose cut fell inside a string
    is merged with the next one and rebuilt here.
    """
    spans = list(iter_chunks(data, start, end, chunk_bytes))
    index = 0
    if jobs <= 1 or len(spans) <= 2:
        i = 0
        while i < len(spans):
            chunk, i = _merge_bad_cuts(data, spans, i, None, path)
            yield _shifted(chunk, index)
            index += chunk.n_input
        return
    from concurrent.futures import Future, ProcessPoolExecutor

    from stepscope.analyze._workers import worker_context

    with ProcessPoolExecutor(max_workers=jobs, mp_context=worker_context()) as pool:
        in_flight: dict[int, Future[_ChunkTables | None]] = {}
        next_span = 0

        def fill() -> None:
            nonlocal next_span
            while next_span < len(spans) and len(in_flight) < jobs + 1:
                a, b = spans[next_span]
                in_flight[next_span] = pool.submit(process_span, data[a:b], str(path), a)
                next_span += 1

        fill()
        i = 0
        while i < len(spans):
            first = in_flight.pop(i).result()
            chunk, i = _merge_bad_cuts(data, spans, i, first, path, in_flight)
            next_span = max(next_span, i)
            fill()
            yield _shifted(chunk, index)
            index += chunk.n_input


def _merge_bad_cuts(data: bytearray, spans: list[tuple[int, int]], i: int, first: _ChunkTables | None, path: Path,
                    in_flight: dict[int, Any] | None = None) -> tuple[_ChunkTables, int]:
    """The tables for span i, merging it with the following spans while the cut is bad; the next index."""
    a = spans[i][0]
    result = first if in_flight is not None else _process_in_place(data, a, spans[i][1], path)
    j = i + 1
    while result is None:
        if j >= len(spans):
            raise TraceFormatError("malformed traceEvents array", path=path, offset=a)
        if in_flight is not None and j in in_flight:
            in_flight.pop(j).cancel()
        result = _process_in_place(data, a, spans[j][1], path)
        j += 1
    return result, j


# ----------------------------------------------------------------------------------------------- columns


def _text_array(values: list[Any]) -> pa.Array:
    """Arrow strings from values that are usually all str (names) or all int (pids); others become text."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed, e.g. int pids and a few names
        return pa.array([str(v) if type(v) is int else _as_text(v) for v in values], pa.string())
    if pa.types.is_string(arr.type) or pa.types.is_null(arr.type) or pa.types.is_integer(arr.type):
        return arr.cast(pa.string())
    return pa.array([_as_text(v) for v in values], pa.string())


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


def _raw_texts(raws: Sequence[msgspec.Raw]) -> pl.Series:
    """Raw JSON values as a String series ('null' and absent become null). One join, one split."""
    joined = _SEP.join(raws).decode("utf-8", errors="replace")
    series = pl.Series(joined.split("\x00"), dtype=pl.String)
    return pl.select(pl.when(series == "null").then(None).otherwise(series)).to_series()


def parse_time_ns(texts: pl.Series) -> pl.Series:
    """Decimal microsecond text -> Int64 ns, exactly (see the module docstring). Non-numbers become null."""
    cleaned = texts.str.strip_chars().str.strip_chars('"')
    micro = cleaned.cast(pl.Decimal(38, 3), strict=False)
    return (micro * 1000).cast(pl.Int64, strict=False)


def _times_ns(values: list[Any]) -> pl.Series | None:
    """Decoded ts/dur numbers -> Int64 ns; None when a value is a float too large to be exact (use text).

    Integers are exact at any size; a float is split into whole and fractional µs so that only the
    fraction is scaled: 1623142623460111 -> 1623142623460111000, 4458676522690.655 -> 4458676522690655000.
    """
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None  # strings or huge integers: parse the text
    series = pl.Series(arr)
    if series.dtype == pl.Null:
        return series.cast(pl.Int64)
    if series.dtype.is_integer():
        return series.cast(pl.Int64) * 1000
    if not series.dtype.is_float():
        return None
    if (series.abs() >= _EXACT_FLOAT_LIMIT_US).any():
        return None  # a float this large may have lost its last digits (…689.047 reads back as …689.0)
    whole = series.floor()
    return pl.select(
        whole.cast(pl.Int64, strict=False) * 1000 + ((series - whole) * 1000).round().cast(pl.Int64)
    ).to_series()


def _coerce_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and _INT64_MIN <= value <= _INT64_MAX else None
    if isinstance(value, str):
        try:
            parsed = int(value.strip(), 0)
        except ValueError:
            return None
        return parsed if _INT64_MIN <= parsed <= _INT64_MAX else None
    return None


def _coerce_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _typed_array(values: list[Any], col: ArgColumn) -> pa.Array:
    """Values of one args key -> a typed Arrow array; values of the wrong type become null, never -1."""
    if col.type == "int":
        try:
            return pa.array(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return pa.array([_coerce_int(v) for v in values], pa.int64())
    if col.type == "float":
        try:
            return pa.array(values, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return pa.array([_coerce_float(v) for v in values], pa.float64())
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_as_text(v) for v in values], pa.string())


def _json_text_array(raws: list[msgspec.Raw]) -> pa.Array:
    """Raw JSON values kept as text; a JSON string value is unquoted ('"[0, 1]"' -> '[0, 1]')."""
    series = _raw_texts(raws)
    if series.str.starts_with('"').any():
        series = pl.Series([msgspec.json.decode(v) if v is not None and v.startswith('"') else v
                            for v in series.to_list()], dtype=pl.String)
    return series.to_arrow()


def _group_args(args: list[msgspec.Raw], group: ArgGroup) -> dict[str, pa.Array]:
    """Decode one group's args in one call and pull out each typed column (first present key wins)."""
    joined = b"[" + b",".join([_EMPTY_OBJECT if a is _NULL else a for a in args]) + b"]"
    try:
        decoded = _ARGS_DECODERS[group].decode(joined)
    except msgspec.ValidationError:
        # an args value that is not an object: treat it as no args for that event
        parts = [a if a is not _NULL and bytes(a).lstrip()[:1] == b"{" else _EMPTY_OBJECT for a in args]
        decoded = _ARGS_DECODERS[group].decode(b"[" + b",".join(parts) + b"]")
    out: dict[str, pa.Array] = {}
    for col in ARG_COLUMNS:
        if group not in col.groups:
            continue
        arrays = []
        for i in range(len(col.keys)):
            field = f"{col.column}__{i}"
            values = list(map(attrgetter(field), decoded))
            arrays.append(_json_text_array(values) if col.type == "json" else _typed_array(values, col))
        merged = arrays[0]
        for extra in arrays[1:]:
            merged = pc.coalesce(merged, extra)
        out[col.column] = merged
    return out


_ARG_TYPES = {c.column: c.type for c in ARG_COLUMNS}
_GPU_KIND_VALUES = [k.value for k in (*GPU_KINDS, Kind.GPU_USER_ANNOTATION, Kind.SYNC)]


@dataclass
class _ChunkTables:
    events: pa.Table
    flows: pa.Table
    metadata: list[dict[str, Any]]
    kind_counts: Counter[str]
    n_input: int  # traceEvents entries in the span (events + flows + metadata)


def build_chunk(events: list[_RawEvent], first_index: int, body: bytes | memoryview) -> _ChunkTables:
    """One decoded chunk -> the events table, the flows table and the M (metadata) events."""
    n = len(events)
    ph = _text_array([e.ph for e in events])
    ts_ns = _times_ns([e.ts for e in events])
    dur_ns = _times_ns([e.dur for e in events])
    if ts_ns is None or dur_ns is None:
        times = _TIMES_DECODER.decode(body)
        ts_ns = parse_time_ns(_raw_texts([t.ts for t in times]))
        dur_ns = parse_time_ns(_raw_texts([t.dur for t in times]))
        del times
    base = pl.DataFrame(
        {
            "event_id": pl.int_range(first_index, first_index + n, dtype=pl.Int64, eager=True),
            "ph": ph,
            "cat": _text_array([e.cat for e in events]),
            "name": _text_array([e.name for e in events]),
            "pid": _text_array([e.pid for e in events]),
            "tid": _text_array([e.tid for e in events]),
            "ts_ns": ts_ns.rename("ts_ns"),
            "dur_ns": dur_ns.rename("dur_ns"),
        }
    )
    metadata: list[dict[str, Any]] = []
    meta_rows = base.filter(pl.col("ph") == "M")["event_id"].to_list()
    for event_id in meta_rows:
        e = events[event_id - first_index]
        margs = msgspec.json.decode(e.args) if e.args is not _NULL else {}
        metadata.append({"name": e.name, "pid": e.pid, "tid": e.tid, "args": margs})

    flows = base.filter(pl.col("ph").is_in(["s", "t", "f"]))
    if flows.height:
        ids = [events[i - first_index].id for i in flows["event_id"].to_list()]
        bps = [events[i - first_index].bp for i in flows["event_id"].to_list()]
        flows = flows.with_columns(flow_id=pl.Series(_text_array(ids)), binding_point=pl.Series(_text_array(bps)))
    else:
        flows = flows.with_columns(flow_id=pl.lit(None, pl.String), binding_point=pl.lit(None, pl.String))
    flow_table = flows.select(FLOW_SCHEMA.names).to_arrow().cast(FLOW_SCHEMA)

    evs = base.filter(~pl.col("ph").is_in(["M", "s", "t", "f"])).with_columns(
        kind=pl.when(pl.col("name") == MEMORY_EVENT_NAME)
        .then(pl.lit(Kind.MEMORY.value))
        .otherwise(pl.col("cat").replace_strict({k: v.value for k, v in KIND_BY_CATEGORY.items()},
                                                default=Kind.OTHER.value, return_dtype=pl.String))
    )
    kind_counts: Counter[str] = Counter(dict(evs["kind"].value_counts().iter_rows()))
    group_map = {k.value: g for k, g in GROUP_OF_KIND.items()}
    evs = evs.with_columns(group=pl.col("kind").replace_strict(group_map, return_dtype=pl.String))

    # decode args per group, then put rows back in file order
    pieces: list[pa.Table] = []
    for group in _GROUPS:
        rows = evs.filter(pl.col("group") == group)
        if rows.height == 0:
            continue
        raw_args = [events[i - first_index].args for i in rows["event_id"].to_list()]
        columns = _group_args(raw_args, group)
        columns["args"] = _raw_texts(raw_args).to_arrow()
        table = rows.drop("group").to_arrow()
        for name, arr in columns.items():
            table = table.append_column(name, arr)
        pieces.append(table)
    if pieces:
        frames = [pl.DataFrame(p) for p in pieces]
        merged = pl.concat(frames, how="diagonal_relaxed")  # rows grouped by kind; event_id keeps file order
    else:
        merged = evs.drop("group")
    event_table = _finish_events(merged)
    return _ChunkTables(events=event_table, flows=flow_table, metadata=metadata, kind_counts=kind_counts,
                        n_input=n)


def _finish_events(frame: pl.DataFrame) -> pa.Table:
    """Fold device/stream sources into the derived columns and conform to EVENT_SCHEMA."""
    for col in ARG_COLUMNS:
        if col.column not in frame.columns:
            dtype = {"int": pl.Int64, "float": pl.Float64, "str": pl.String, "json": pl.String}[col.type]
            frame = frame.with_columns(pl.lit(None, dtype).alias(col.column))
    if "args" not in frame.columns:
        frame = frame.with_columns(args=pl.lit(None, pl.String))
    is_gpu = pl.col("kind").is_in(_GPU_KIND_VALUES)
    frame = frame.with_columns(
        device=pl.when(is_gpu)
        .then(pl.coalesce(pl.col("arg_device"), pl.col("pid").cast(pl.Int64, strict=False)))
        .when((pl.col("kind") == Kind.MEMORY.value) & (pl.col("device_id") >= 0))
        .then(pl.col("device_id"))
        .otherwise(None),
        stream=pl.when(is_gpu)
        .then(pl.coalesce(pl.col("arg_stream"), pl.col("tid").cast(pl.Int64, strict=False)))
        .otherwise(pl.col("arg_stream")),
    )
    return frame.select(EVENT_SCHEMA.names).to_arrow().cast(EVENT_SCHEMA)


# ----------------------------------------------------------------------------------------------- metadata

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_OPTION_KEYS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
                 "hip_driver_version", "roctracer_version", "torch_version")


def _device_properties(top: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for d in top.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        major, minor = d.get("computeMajor"), d.get("computeMinor")
        out.append({
            "id": d.get("id"),
            "name": d.get("name"),
            "total_memory_bytes": d.get("totalGlobalMem"),
            "num_sms": d.get("numSms"),
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "properties": d,
        })
    return out


def _rank(top: dict[str, Any], path: Path) -> tuple[int | None, int | None, str | None]:
    info = top.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        if isinstance(rank, int):
            return rank, world if isinstance(world, int) else None, "distributedInfo"
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), None, "file name"
    return None, None, None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def trace_id_for(path: Path, sha256: str) -> str:
    """A stable, readable id: the file's stem (without .pt.trace.json.gz) plus 8 hex digits of its hash."""
    stem = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "trace"
    return f"{stem}-{sha256[:8]}"


def file_sha256(path: Path) -> str:
    """sha256 of the file as stored (compressed bytes for .gz)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# ----------------------------------------------------------------------------------------------- ingest


def is_ingested(out_dir: Path, sha256: str | None = None) -> bool:
    """Whether out_dir holds a complete ingest of the current schema (of the file with this hash, if given)."""
    meta_path = out_dir / "meta.json"
    if not (meta_path.is_file() and (out_dir / "events.parquet").is_file() and (out_dir / "flows.parquet").is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("ingest_schema_version") != INGEST_SCHEMA_VERSION:
        return False
    return sha256 is None or meta.get("source", {}).get("sha256") == sha256


def ingest_trace(path: Path, out_dir: Path, *, force: bool = False, jobs: int = 1,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, extra_meta: dict[str, Any] | None = None) -> IngestResult:
    """Parse one Chrome trace into out_dir (events.parquet, flows.parquet, meta.json), atomically.

    `jobs` > 1 decodes the spans of a large trace (>= PARALLEL_MIN_BYTES of JSON) in that many processes.

    Skipped when out_dir already holds this file's ingest (same sha256, same schema version) unless
    `force`. Raises TraceFormatError / InputError with a one-line message naming the file.
    """
    started = time.perf_counter()
    path = Path(path)
    out_dir = Path(out_dir)
    if not path.exists():
        raise InputError("not found", path=path)
    data, sha = read_trace(path)
    if not force and is_ingested(out_dir, sha):
        meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
        return IngestResult(source=path, out_dir=out_dir, skipped=True, n_events=int(meta["counts"]["events"]),
                            seconds=time.perf_counter() - started)
    start, end, top = split_document(data, path)
    if len(data) < PARALLEL_MIN_BYTES:
        jobs = 1

    kind_counts: Counter[str] = Counter()
    metadata_events: list[dict[str, Any]] = []
    n_total = n_events = n_flows = 0
    ts_min: int | None = None
    end_max: int | None = None
    unknown_categories: Counter[str] = Counter()
    with atomic_dir(out_dir) as tmp:
        writer = _BackgroundWriter(tmp / "events.parquet", EVENT_SCHEMA)
        flow_writer = _BackgroundWriter(tmp / "flows.parquet", FLOW_SCHEMA)
        try:
            for chunk in iter_chunk_tables(data, start, end, path, chunk_bytes=chunk_bytes, jobs=jobs):
                n_total += chunk.n_input
                writer.write_table(chunk.events)
                flow_writer.write_table(chunk.flows)
                n_events += chunk.events.num_rows
                n_flows += chunk.flows.num_rows
                kind_counts.update(chunk.kind_counts)
                metadata_events.extend(chunk.metadata)
                frame = pl.from_arrow(chunk.events.select(["ts_ns", "dur_ns", "kind", "cat"]))
                assert isinstance(frame, pl.DataFrame)
                span = frame.select(lo=pl.col("ts_ns").min(),
                                    hi=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max()).row(0)
                if span[0] is not None:
                    ts_min = span[0] if ts_min is None else min(ts_min, span[0])
                    end_max = span[1] if end_max is None else max(end_max, span[1])
                others = frame.filter((pl.col("kind") == Kind.OTHER.value) & pl.col("cat").is_not_null())
                unknown_categories.update(dict(others["cat"].value_counts().iter_rows()))
        finally:
            writer.close()
            flow_writer.close()
        del data
        if n_total == 0:
            raise TraceFormatError("empty trace: traceEvents holds no events", path=path)
        if n_events == 0:
            raise TraceFormatError("empty trace: no timed events (only metadata or flow events)", path=path)
        meta = _build_meta(path=path, sha=sha, top=top, metadata_events=metadata_events, kind_counts=kind_counts,
                           n_events=n_events, n_flows=n_flows, ts_min=ts_min, end_max=end_max,
                           unknown_categories=unknown_categories, extra=extra_meta or {})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
    return IngestResult(source=path, out_dir=out_dir, skipped=False, n_events=n_events,
                        seconds=time.perf_counter() - started)


_KNOWN_CATEGORIES = {"Trace", "overhead", "cpu_instant_event", "cuda_profiler_range"}


def _build_meta(*, path: Path, sha: str, top: dict[str, Any], metadata_events: list[dict[str, Any]],
                kind_counts: Counter[str], n_events: int, n_flows: int, ts_min: int | None, end_max: int | None,
                unknown_categories: Counter[str], extra: dict[str, Any]) -> dict[str, Any]:
    processes: dict[str, dict[str, Any]] = {}
    threads: dict[str, dict[str, Any]] = {}
    for m in metadata_events:
        pid = str(m.get("pid"))
        raw_args = m.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        name = m.get("name")
        if name == "process_name":
            processes.setdefault(pid, {})["name"] = args.get("name")
        elif name == "process_labels":
            processes.setdefault(pid, {})["labels"] = args.get("labels")
        elif name == "process_sort_index":
            processes.setdefault(pid, {})["sort_index"] = args.get("sort_index")
        elif name == "thread_name":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["name"] = args.get("name")
        elif name == "thread_sort_index":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["sort_index"] = args.get("sort_index")
    rank, world_size, rank_source = _rank(top, path)
    base_time = top.get("baseTimeNanoseconds")
    return {
        "ingest_schema_version": INGEST_SCHEMA_VERSION,
        "trace_id": trace_id_for(path, sha),
        "source": {"path": str(path.resolve()), "name": path.name, "size_bytes": path.stat().st_size,
                   "sha256": sha, "mtime": path.stat().st_mtime},
        "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trace_schema_version": top.get("schemaVersion"),
        "trace_name": top.get("traceName"),
        "display_time_unit": top.get("displayTimeUnit"),
        "base_time_ns": base_time if isinstance(base_time, int) else None,
        "rank": rank,
        "world_size": world_size,
        "rank_source": rank_source,
        "distributed": _jsonable(top.get("distributedInfo")),
        "devices": _jsonable(_device_properties(top)),
        "versions": {k: top[k] for k in _VERSION_KEYS if k in top},
        "profiler_options": {k: top[k] for k in _OPTION_KEYS if k in top},
        "counts": {"events": n_events, "flows": n_flows, "metadata_events": len(metadata_events),
                   "by_kind": dict(sorted(kind_counts.items()))},
        "time": {"first_ns": ts_min, "last_ns": end_max,
                 "span_ns": (end_max - ts_min) if ts_min is not None and end_max is not None else None},
        "unknown_categories": {k: v for k, v in sorted(unknown_categories.items()) if k not in _KNOWN_CATEGORIES},
        "processes": processes,
        "threads": threads,
        "top_level": _jsonable({k: v for k, v in top.items() if k not in ("deviceProperties",)}),
        **extra,
    }


def find_trace_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into trace files (.json / .json.gz), sorted."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.is_file() and _looks_like_trace(q)))
        elif p.exists():
            found.append(p)
        else:
            matches = sorted(Path().glob(str(p))) if not p.is_absolute() else sorted(
                Path(p.anchor).glob(str(p.relative_to(p.anchor))))
            if not matches:
                raise InputError("no such file, directory or glob match", path=p)
            found.extend(m for m in matches if m.is_file())
    seen: set[Path] = set()
    unique = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _looks_like_trace(p: Path) -> bool:
    name = p.name
    if name.startswith(("manifest", ".")) or name == "meta.json":  # capture manifests (manifest.rank<N>.json too)
        return False
    if ".raw.json" in name or "memory_timeline" in name:
        return False
    return name.endswith(TRACE_SUFFIXES)
