"""One span of traceEvents -> the normalized events table, the flows table and the metadata events.

Two paths give the same tables. The compiled scanner (``_scan.c``, see `decode_span` and `_from_scan`) reads
a span's bytes straight into column buffers, and hands back any span it cannot read exactly as the Python
path does. The Python path decodes a span (a JSON array of whole events) with msgspec into small Structs
holding only the fields we keep, and builds every column in bulk: no Python dict per event, no per-row
Python beyond one attribute read per field.

Each column is built by polars straight from the decoded values when they all have the expected Python
type (names are str, pids int, times int or float: what real traces write); a column holding values of
another type is coerced value by value (the time rule and the coercion rules are in `_coerce`), so a
stray string `ts` or boolean pid costs only its own column.

Bytes that are not UTF-8 inside a string are read as U+FFFD, as ``bytes.decode("utf-8", "replace")`` reads
them (on both paths: see ``_utf8``); each span counts the strings that held any, for a warning.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, TypeAlias, TypeVar

import msgspec
import polars as pl
import pyarrow as pa

from stepscope.analyze._arrow import to_arrow, to_frame, to_series
from stepscope.analyze._coerce import (
    ARG_GROUPS,
    NULL,
    OutOfRange,
    as_text,
    group_args,
    parse_time_ns,
    raw_texts,
    text_series,
    times_ns,
)
from stepscope.analyze._native import scan as _scan
from stepscope.analyze._read import NESTED_TOO_DEEP, Document
from stepscope.analyze._utf8 import Repaired, repair
from stepscope.analyze.schema import (
    ARG_COLUMNS,
    EVENT_SCHEMA,
    FLOW_SCHEMA,
    GPU_KINDS,
    GROUP_OF_KIND,
    KIND_BY_CATEGORY,
    MEMORY_EVENT_NAME,
    ArgGroup,
    ArgType,
    Kind,
)
from stepscope.errors import FileChanged, TraceFormatError


class _Event(msgspec.Struct, kw_only=True, gc=False):
    """One traceEvents entry, with only the fields we keep, of any value types (coerced per column).

    gc=False: its fields are scalars and raw bytes, so it can be in no reference cycle (and millions of
    them would otherwise be rescanned by every collection)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    bp: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = NULL


class _RawTimes(msgspec.Struct, gc=False):
    """ts/dur as their decimal text, for spans where float64 cannot hold them to the nanosecond."""

    ts: msgspec.Raw = NULL
    dur: msgspec.Raw = NULL


_EVENT_DECODER = msgspec.json.Decoder(list[_Event])
_TIMES_DECODER = msgspec.json.Decoder(list[_RawTimes])

# each event's args group as a small integer: the typed columns test it for each column (30 or so), and
# testing a byte is much cheaper than looking a string up
_GROUP_CODE: dict[ArgGroup, int] = {g: i for i, g in enumerate(ARG_GROUPS)}
_POLARS_TYPE: dict[ArgType, pl.DataType] = {"int": pl.Int64(), "float": pl.Float64(), "str": pl.String(),
                                            "json": pl.String()}
_GPU_KIND_VALUES = [k.value for k in (*GPU_KINDS, Kind.GPU_USER_ANNOTATION, Kind.SYNC)]
_NULL_COLUMNS = {c.column: _POLARS_TYPE[c.type] for c in ARG_COLUMNS}
_DERIVED_FROM = ("arg_device", "arg_stream", "device_id")  # the args columns `device` and `stream` come from


@dataclass
class ChunkTables:
    """The tables of one span of traceEvents. Event ids are local to the span until the caller shifts them."""

    events: pa.Table
    flows: pa.Table
    metadata: list[dict[str, Any]]  # M events: name, cat, pid and tid as text, args decoded
    kind_counts: Counter[str]
    n_input: int  # traceEvents entries in the span (events + flows + metadata)
    ts_min_ns: int | None  # earliest ts of the span's events
    end_max_ns: int | None  # latest ts + dur (ts for instants)
    unknown_categories: Counter[str]  # cat of the events whose kind is `other`
    invalid_strings: int = 0  # strings holding bytes that are not UTF-8 (read with U+FFFD)
    first_invalid: int | None = None  # the file offset of the first such byte


def decode_span(document: bytes | bytearray | memoryview, path: str, offset: int) -> ChunkTables | None:
    """Decode a JSON array of whole events (one span of traceEvents) and build its tables.

    Returns None when the array is not valid JSON (the cut that made the span fell inside a string, so the
    caller merges it with the next span). `offset` is the span's position in the file, for error messages.
    Runs in worker processes for large traces, so it takes and returns only picklable values.

    The compiled scanner (_scan.c) reads the span when it can read it exactly as the Python path would;
    anything it is not sure of (and every error) is left to the Python path, which tests hold it to.
    """
    if _scan is not None and (scanned := _scan.scan_events(document, _SLOT_KEYS, _SLOT_TYPES)) is not None:
        try:
            return _from_scan(scanned, offset - 1)
        except _UNSURE:  # a value the tables cannot hold: the Python path reports it, as it would alone
            pass
    return _decode_python(document, path, offset)


def decode_range(data: bytes | Document, a: int, b: int, path: str) -> ChunkTables | None:
    """decode_span of the span data[a:b] of traceEvents (whole events and the commas between them), read in
    place by the scanner, so several threads can decode spans of one buffer at once; only a span that takes
    the Python path is copied (with its brackets)."""
    try:
        scanned = _scan.scan_events(data, _SLOT_KEYS, _SLOT_TYPES, a, b) if _scan is not None else None
    except _scan.FileShrank as exc:  # a mapped file cut short as it was read (see _read.FileMap)
        raise FileChanged(str(exc), path=path) from None
    if scanned is not None:
        try:
            return _from_scan(scanned, a)
        except _UNSURE:  # as in decode_span
            pass
    document = bytearray(b - a + 2)
    document[0], document[-1] = 0x5B, 0x5D  # [ ]
    document[1:-1] = memoryview(data)[a:b]
    return _decode_python(document, path, a)


_WARM_UP_SPAN = (b'[{"ph": "X", "cat": "cpu_op", "name": "w", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
                 b'"args": {"External id": 1}}, {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1}, '
                 b'{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "w"}}]')


def warm_up() -> None:
    """Decode a tiny span: a process's first polars and pyarrow calls have a one-off cost (polars' pools,
    pyarrow's memory pool), which ingest hides behind reading the file (gunzip and sha256 release the GIL)."""
    decode_span(_WARM_UP_SPAN, "warm-up", 0)


def scanner_available() -> bool:
    """Whether the compiled scanner was built (a C compiler was there when stepscope was installed)."""
    return _scan is not None


#: what _from_scan raises for a span the scanner read but whose values the tables cannot hold (metadata args
#: beyond a double, ts + dur beyond int64): the Python path reads such a span, and reports it
_UNSURE = (OutOfRange, msgspec.ValidationError)


def _decode_python(document: bytes | bytearray | memoryview, path: str, offset: int) -> ChunkTables | None:
    """decode_span without the scanner: msgspec Structs, then columns built in bulk (the general path).

    `offset`: the file offset of document[1] (the span's first byte), so document[k] is at offset - 1 + k.
    An error about one event names that event's offset. Invalid UTF-8 inside strings is replaced first."""
    repaired = repair(document)
    if repaired is not None:
        document = repaired.data
    try:
        events = _EVENT_DECODER.decode(document)
    except msgspec.ValidationError as exc:
        reason, index, field = _validation_error(exc)
        at = _event_offset(document, index, offset, repaired)
        if "out of range" in reason:  # a number msgspec cannot hold (1e400, an integer of 4,301 digits)
            raise TraceFormatError(f"unreadable number in event field {field!r} ({reason})", path=path,
                                   offset=at) from None
        raise TraceFormatError(f"an entry of traceEvents is not an event object ({exc})", path=path,
                               offset=at) from None
    except RecursionError:
        raise TraceFormatError(NESTED_TOO_DEEP, path=path, offset=offset) from None
    except (msgspec.DecodeError, UnicodeDecodeError):
        # not JSON, or invalid UTF-8 left where it seemed outside a string: a cut inside a string (the caller
        # merges spans), or a malformed document (validated whole, which names the byte)
        return None
    try:
        chunk = build_chunk(events, document)
    except OutOfRange as exc:
        raise TraceFormatError(exc.reason, path=path,
                               offset=_event_offset(document, exc.index, offset, repaired)) from None
    except RecursionError:
        raise TraceFormatError(NESTED_TOO_DEEP, path=path, offset=offset) from None
    if repaired is None:
        return chunk
    return dataclasses.replace(chunk, invalid_strings=len(repaired.strings),
                               first_invalid=offset - 1 + repaired.strings[0] if repaired.strings else None)


_AT = re.compile(r" - at `\$(?:\[(\d+)\](?:\.(\w+))?)?")


def _validation_error(exc: msgspec.ValidationError) -> tuple[str, int | None, str | None]:
    """msgspec's message split: the reason, the event's index in the span and the field, where it says them.

        "Number out of range - at `$[1].ts`"  ->  ("Number out of range", 1, "ts")
    """
    text = str(exc)
    match = _AT.search(text)
    if match is None:
        return text, None, None
    return text[: match.start()], int(match.group(1)) if match.group(1) else None, match.group(2)


def _event_offset(document: bytes | bytearray | memoryview, index: int | None, offset: int,
                  repaired: Repaired | None = None) -> int:
    """The file offset of event `index` of the span (a JSON array, valid but for values msgspec refuses: its
    elements are taken raw, unread; `repaired`: the document is that repair of the span's bytes); the span's
    offset where the index is not known. Only for an error."""
    if index is None:
        return offset
    try:
        raws = msgspec.json.decode(document, type=list[msgspec.Raw])
    except (msgspec.DecodeError, RecursionError):
        return offset
    data = bytes(document)
    pos = 0
    for raw in raws[: index + 1]:  # each raw element is the first copy of its text after the one before
        pos = data.find(bytes(raw), pos)
        start, pos = pos, pos + len(raw)
    return offset - 1 + (repaired.original(start) if repaired is not None else start)


def build_chunk(events: Sequence[_Event], body: bytes | bytearray | memoryview) -> ChunkTables:
    """Decoded events (`body`, their JSON array, is re-read only for timestamps a float cannot hold) -> the
    events table, the flows table and the M (metadata) events; event ids count from 0 within the span."""
    n = len(events)
    ts_ns = _times("ts", times_ns, [e.ts for e in events])
    dur_ns = _times("dur", times_ns, [e.dur for e in events])
    if ts_ns is None or dur_ns is None:
        times = _TIMES_DECODER.decode(body)
        ts_ns = _times("ts", parse_time_ns, raw_texts([t.ts for t in times]))
        dur_ns = _times("dur", parse_time_ns, raw_texts([t.dur for t in times]))
        del times
    base = pl.DataFrame({
        "event_id": pl.int_range(0, n, dtype=pl.Int64, eager=True),
        "ph": text_series([e.ph for e in events]),
        "cat": text_series([e.cat for e in events]),
        "name": text_series([e.name for e in events]),
        "pid": text_series([e.pid for e in events]),
        "tid": text_series([e.tid for e in events]),
        "ts_ns": ts_ns.rename("ts_ns"),
        "dur_ns": dur_ns.rename("dur_ns"),
    })
    metadata: list[dict[str, Any]] = []
    for event_id in base.filter(_IS_METADATA)["event_id"].to_list():
        e = events[event_id]
        try:
            margs = msgspec.json.decode(e.args) if e.args is not NULL else None
        except msgspec.ValidationError as exc:  # a number beyond a double (1e400) or a 4,301-digit integer
            raise OutOfRange(_args_error(exc), event_id) from None
        margs = {} if margs is None else margs  # no args, or "args": null (as the scanner reads both)
        metadata.append({"name": as_text(e.name), "cat": as_text(e.cat), "pid": as_text(e.pid), "tid": as_text(e.tid),
                         "args": margs})

    flows = base.filter(_IS_FLOW)
    flow_events = _pick(events, flows["event_id"].to_list())
    flow_table = to_arrow(flows.with_columns(flow_id=text_series([e.id for e in flow_events]),
                                              binding_point=text_series([e.bp for e in flow_events]))
                           .select(FLOW_SCHEMA.names), FLOW_SCHEMA)
    evs = _kinds(base)

    # args are decoded per group (each pays only for its keys), then rows go back to file order
    all_args = [e.args for e in events]
    pieces: list[pl.DataFrame] = []
    for group in ARG_GROUPS:
        rows = evs.filter(pl.col("group") == _GROUP_CODE[group])
        if rows.height == 0:
            continue
        ids = rows["event_id"].to_list()
        raw_args = _pick(all_args, ids)
        try:
            columns = group_args(raw_args, group)
        except msgspec.ValidationError as exc:  # a typed args key holding a number beyond a double's range
            index = _validation_error(exc)[1]
            raise OutOfRange(_args_error(exc), ids[index] if index is not None else 0) from None
        except OutOfRange as exc:
            raise OutOfRange(exc.reason, ids[exc.index]) from None
        pieces.append(rows.drop("group").with_columns(raw_texts(raw_args).alias("args"), *columns))
    merged = pl.concat(pieces, how="diagonal_relaxed").sort("event_id") if pieces else evs.drop("group")
    return _chunk(_finished(merged.lazy(), merged.columns).collect(engine="in-memory"), flow_table, metadata, n)


_Values = TypeVar("_Values")
_Times = TypeVar("_Times", pl.Series, pl.Series | None)


def _times(field: str, parse: Callable[[_Values], _Times], values: _Values) -> _Times:
    """ts or dur in ns by `parse` (times_ns or parse_time_ns), a value beyond int64 ns named as the field."""
    try:
        return parse(values)
    except OutOfRange as exc:
        raise OutOfRange(f"{field}: {exc.reason}", exc.index) from None


def _args_error(exc: msgspec.ValidationError) -> str:
    return f"unreadable value in event args ({_validation_error(exc)[0]})"


_IS_METADATA = pl.col("ph") == "M"
_IS_FLOW = pl.col("ph").is_in(["s", "t", "f"])
# an event without a ph is kept, as its category says (an unreadable ph is no reason to lose it)
_IS_TIMED = ~pl.col("ph").is_in(["M", "s", "t", "f"]).fill_null(False)


_Frame = TypeVar("_Frame", pl.DataFrame, pl.LazyFrame)
_KIND_OF_CATEGORY = {k: v.value for k, v in KIND_BY_CATEGORY.items()}
_GROUP_OF_KIND_VALUE = {k.value: _GROUP_CODE[g] for k, g in GROUP_OF_KIND.items()}


def _kinds(frame: _Frame) -> _Frame:
    """The timed events (not M, s, t, f) with their `kind` and args `group` (its _GROUP_CODE)."""
    return frame.filter(_IS_TIMED).with_columns(kind=_KIND).with_columns(group=_GROUP)


# (polars expressions are immutable: built once, not for every span, whose fixed cost they would add to)
_KIND = (pl.when(pl.col("name") == MEMORY_EVENT_NAME)
         .then(pl.lit(Kind.MEMORY.value))
         .otherwise(pl.col("cat").replace_strict(_KIND_OF_CATEGORY, default=Kind.OTHER.value, return_dtype=pl.String)))
_GROUP = pl.col("kind").replace_strict(_GROUP_OF_KIND_VALUE, return_dtype=pl.UInt8)


# ----------------------------------------------------------------------------------------------- fast path

_TYPE_CODES: dict[ArgType, int] = {"int": 0, "float": 1, "str": 2, "json": 3}  # as _scan.c numbers them
#: every raw args key of the declarative table, in order (a column's keys consecutive), and its type
_SLOT_KEYS = tuple(key.encode() for col in ARG_COLUMNS for key in col.keys)
_SLOT_TYPES = bytes(_TYPE_CODES[col.type] for col in ARG_COLUMNS for _ in col.keys)
_SLOT_ARROW = {"int": pa.int64(), "float": pa.float64()}


def _from_scan(scanned: tuple[Any, ...], at: int = 0) -> ChunkTables:
    """The tables of a span from _scan.scan_events' column buffers: the same as build_chunk gives (`at`: the
    file offset of the scanned bytes, for the first invalid UTF-8 byte's).

    The scanner pulls every args key for every event; here each typed column keeps the first present key
    (coalesce) of the events whose group reads it, as _group_args does group by group.
    """
    n, ph, cat, name, pid, tid, flow_id, bp, args, ts, dur, slots, bad_strings, first_bad = scanned
    slot_names = [f"_slot{i}" for i in range(len(slots))]
    base = pl.DataFrame({
        "event_id": pl.int_range(0, n, dtype=pl.Int64, eager=True),
        "ph": _scanned_views(n, ph),
        "cat": _scanned_views(n, cat),
        "name": _scanned_views(n, name),
        "pid": _scanned_views(n, pid),
        "tid": _scanned_views(n, tid),
        "ts_ns": _scanned_numbers(n, ts, pa.int64()),
        "dur_ns": _scanned_numbers(n, dur, pa.int64()),
        "flow_id": _scanned_views(n, flow_id),
        "binding_point": _scanned_views(n, bp),
        "args": _scanned_views(n, args),
        **{slot_names[i]: _scanned_slot(n, buffers, col.type) for i, col in enumerate(_SLOT_COLUMNS)
           if (buffers := slots[i]) is not None},
    })
    # one query for the three tables (each polars call has a fixed cost per span), on the in-memory engine:
    # collect's default in polars 2, the streaming one, spends most of a query this size handing work
    # between threads
    lazy = base.lazy()
    evs = _kinds(lazy)
    typed = []
    first = 0
    for col in ARG_COLUMNS:
        present = [pl.col(slot_names[i]) for i in range(first, first + len(col.keys)) if slots[i] is not None]
        first += len(col.keys)
        if present:
            value = present[0] if len(present) == 1 else pl.coalesce(present)
            typed.append(pl.when(_READ_BY[col.column]).then(value).alias(col.column))
    columns = [c for c in base.columns if c not in ("flow_id", "binding_point") and not c.startswith("_slot")]
    columns += ["kind", *(t.meta.output_name() for t in typed)]
    events, flows, meta = pl.collect_all([
        _finished(evs.with_columns(typed), columns),
        lazy.filter(_IS_FLOW).select(FLOW_SCHEMA.names),
        lazy.filter(_IS_METADATA).select("name", "cat", "pid", "tid", "args"),
    ], engine="in-memory")
    metadata = [{"name": name, "cat": cat, "pid": pid, "tid": tid, "args": msgspec.json.decode(margs) if margs else {}}
                for name, cat, pid, tid, margs in meta.iter_rows()]
    chunk = _chunk(events, to_arrow(flows, FLOW_SCHEMA), metadata, n)
    if bad_strings:
        chunk.invalid_strings, chunk.first_invalid = bad_strings, at + first_bad
    return chunk


_SLOT_COLUMNS = tuple(col for col in ARG_COLUMNS for _ in col.keys)
#: whether an event's args group reads the column
_READ_BY = {col.column: pl.col("group").is_in([_GROUP_CODE[g] for g in col.groups]) for col in ARG_COLUMNS}
_Block: TypeAlias = Any  # a column buffer from _scan.c: a read-only object exporting memory the scanner filled


def _scanned_text(n: int, buffers: tuple[_Block, _Block, _Block] | None) -> pl.Series:
    """A text column from (int64 offsets, UTF-8 data, validity bitmap); None: every row null."""
    if buffers is None:
        return pl.repeat(None, n, dtype=pl.String, eager=True)
    offsets, data, valid = buffers
    return to_series(pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data),
                                                      pa.py_buffer(valid)))


def _scanned_views(n: int, buffers: tuple[_Block, _Block, _Block] | None) -> pl.Series:
    """A base field's text column from (string views, UTF-8 data, validity bitmap), polars' own layout, which
    it takes without a copy; None: every row null."""
    if buffers is None:
        return pl.repeat(None, n, dtype=pl.String, eager=True)
    views, data, valid = buffers
    return to_series(pa.Array.from_buffers(pa.string_view(), n, [pa.py_buffer(valid), pa.py_buffer(views),
                                                                 pa.py_buffer(data)]))


def _scanned_numbers(n: int, buffers: tuple[_Block, _Block], dtype: pa.DataType) -> pl.Series:
    values, valid = buffers
    return to_series(pa.Array.from_buffers(dtype, n, [pa.py_buffer(valid), pa.py_buffer(values)]))


def _scanned_slot(n: int, buffers: Any, kind: ArgType) -> pl.Series:
    if kind in _SLOT_ARROW:
        return _scanned_numbers(n, buffers, _SLOT_ARROW[kind])
    return _scanned_text(n, buffers)


def _chunk(events: pl.DataFrame, flows: pa.Table, metadata: list[dict[str, Any]], n_input: int) -> ChunkTables:
    """The span's ChunkTables from its finished events (see _finished), with the figures meta.json sums over
    spans taken while the events are in polars, in one call."""
    other = (pl.col("kind") == Kind.OTHER.value) & pl.col("cat").is_not_null()
    ts_min, end_min, end_max, kinds, others = events.select(
        lo=pl.col("ts_ns").min(),
        end_lo=_END_NS.min(),
        hi=_END_NS.max(),
        kinds=pl.col("kind").value_counts().implode(),
        others=pl.col("cat").filter(other).value_counts().implode(),
    ).row(0)
    if (end_max is not None and end_max > _INT64_MAX) or (end_min is not None and end_min < _INT64_MIN):
        beyond = events.select(pl.col("event_id").filter(~_END_NS.is_between(_INT64_MIN, _INT64_MAX)).first())
        raise OutOfRange("ts + dur: the event ends beyond what int64 nanoseconds hold (±9.2e18 ns, about ±292 "
                         "years)", beyond.item())
    return ChunkTables(events=to_arrow(events, pa.schema([EVENT_SCHEMA.field(name) for name in events.columns])),
                       flows=flows, metadata=metadata, n_input=n_input, ts_min_ns=ts_min, end_max_ns=end_max,
                       kind_counts=Counter({k["kind"]: k["count"] for k in kinds}),
                       unknown_categories=Counter({c["cat"]: c["count"] for c in others}))


#: the category of every event `stepscope export` adds to a trace (reports/perfetto.py writes it)
ADDED_CATEGORY = "stepscope"


def without_added(chunk: ChunkTables) -> ChunkTables:
    """The span without the events `stepscope export` added (category "stepscope": its tracks, flows and the
    metadata naming its processes), its figures taken again from what is left: an exported file ingested so
    reads as the trace it was made from."""
    events, flows = to_frame(chunk.events), to_frame(chunk.flows)
    ours = pl.col("cat").eq_missing(ADDED_CATEGORY)
    metadata = [m for m in chunk.metadata if m.get("cat") != ADDED_CATEGORY]
    dropped = int(events.select(ours.sum()).item()) + int(flows.select(ours.sum()).item()) + (
        len(chunk.metadata) - len(metadata))
    if not dropped:
        return chunk
    kept_flows = to_arrow(flows.filter(~ours), FLOW_SCHEMA)
    return dataclasses.replace(_chunk(events.filter(~ours), kept_flows, metadata, chunk.n_input - dropped),
                               invalid_strings=chunk.invalid_strings, first_invalid=chunk.first_invalid)


# an event's end, exact (Int128: ts_ns + dur_ns of int64 values can overflow int64, which would wrap around)
_END_NS = pl.col("ts_ns").cast(pl.Int128) + pl.col("dur_ns").fill_null(0)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _finished(frame: pl.LazyFrame, columns: list[str]) -> pl.LazyFrame:
    """The events (of these `columns`) with device/stream sources folded into the derived columns, and
    EVENT_SCHEMA's columns that this span has, in its order.

    Columns no event of the span has are left out (see `conform`): a span of CPU ops would otherwise carry
    some thirty columns of nulls to the process that writes it.
    """
    frame = frame.with_columns(_NULLS[name] for name in _DERIVED_FROM if name not in columns)
    have = {*columns, *_DERIVED_FROM, "device", "stream"}
    return frame.with_columns(device=_DEVICE, stream=_STREAM).select(
        name for name in EVENT_SCHEMA.names if name in have)


_NULLS = {name: pl.lit(None, _NULL_COLUMNS[name]).alias(name) for name in _DERIVED_FROM}
_IS_GPU = pl.col("kind").is_in(_GPU_KIND_VALUES)
_DEVICE = (pl.when(_IS_GPU).then(pl.coalesce(pl.col("arg_device"), pl.col("pid").cast(pl.Int64, strict=False)))
           .when((pl.col("kind") == Kind.MEMORY.value) & (pl.col("device_id") >= 0)).then(pl.col("device_id"))
           .otherwise(None))
_STREAM = (pl.when(_IS_GPU).then(pl.coalesce(pl.col("arg_stream"), pl.col("tid").cast(pl.Int64, strict=False)))
           .otherwise(pl.col("arg_stream")))




def _pick(values: Sequence[Any], index: list[int]) -> list[Any]:
    """values[i] for each i in index, in one C-level call."""
    if len(index) <= 1:
        return [values[i] for i in index]
    return list(itemgetter(*index)(values))

