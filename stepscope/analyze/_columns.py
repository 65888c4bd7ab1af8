"""One span of traceEvents -> the normalized events table, the flows table and the metadata events.

Two paths give the same tables. The compiled scanner (``_scan.c``, see `decode_span` and `_from_scan`) reads
a span's bytes straight into column buffers, and hands back any span it cannot read exactly as the Python
path does. The Python path decodes a span (a JSON array of whole events) with msgspec into small Structs
holding only the fields we keep, and builds every column in bulk: no Python dict per event, no per-row
Python beyond one attribute read per field.

Each column is built by polars straight from the decoded values when they all have the expected Python
type (names are str, pids int, times int or float: what real traces write); a column holding values of
another type is coerced value by value with the rules below, so a stray string `ts` or boolean pid costs
only its own column.

**The time rule** (the only place units change): Chrome traces write ``ts``/``dur`` in microseconds,
as integers (older Kineto) or decimals with ns resolution (torch >= 2.1), whatever ``displayTimeUnit``
says (that key only tells viewers how to *display* time). We read the decimal text exactly and shift the
point three places, rounding beyond the third decimal:

    "ts": 1623142623460111        ->  ts_ns = 1623142623460111000
    "ts": 1712195495519689.047    ->  ts_ns = 1712195495519689047   (a float64 would lose the 47 ns)
    "dur": 12.3456                ->  dur_ns = 12346

**Coercion of values** (the declarative table in schema.ARG_COLUMNS says each args column's type; the first
present raw key wins): an int column takes integers within int64, integral floats and integer strings
("0x1f" included), a float column numbers and numeric strings, a text column strings (integers become their
digits, other values their JSON text); anything else is null, never -1. json columns keep the value's JSON
text as written. Booleans are not numbers.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter, itemgetter
from typing import Any, TypeAlias, TypeVar

import msgspec
import polars as pl
import pyarrow as pa

from stepscope.analyze._read import Document
from stepscope.analyze.schema import (
    ARG_COLUMNS,
    EVENT_SCHEMA,
    FLOW_SCHEMA,
    GPU_KINDS,
    GROUP_OF_KIND,
    KIND_BY_CATEGORY,
    MEMORY_EVENT_NAME,
    ArgColumn,
    ArgGroup,
    ArgType,
    Kind,
)
from stepscope.errors import TraceFormatError

try:  # the compiled fast path (setup.py); where it could not be built, every span takes the Python path
    from stepscope.analyze import _scan
except ImportError:  # pragma: no cover - exercised only on machines without a C compiler
    _scan = None  # type: ignore[assignment]

_NULL = msgspec.Raw(b"null")
_EMPTY_OBJECT = b"{}"
_SEP = b"\x00"  # never appears raw in JSON text, so it safely joins raw values
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# A float below 2**43 µs is within 0.49 ns of its decimal text, so rounding its ns value is exact.
_EXACT_FLOAT_LIMIT_US = float(2**43)


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
    args: msgspec.Raw = _NULL


class _RawTimes(msgspec.Struct, gc=False):
    """ts/dur as their decimal text, for spans where float64 cannot hold them to the nanosecond."""

    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL


_EVENT_DECODER = msgspec.json.Decoder(list[_Event])
_TIMES_DECODER = msgspec.json.Decoder(list[_RawTimes])

_GROUPS: tuple[ArgGroup, ...] = ("gpu", "cpu", "python", "runtime", "memory")
# each event's args group as a small integer: the typed columns test it for each column (30 or so), and
# testing a byte is much cheaper than looking a string up
_GROUP_CODE: dict[ArgGroup, int] = {g: i for i, g in enumerate(_GROUPS)}
_POLARS_TYPE: dict[ArgType, pl.DataType] = {"int": pl.Int64(), "float": pl.Float64(), "str": pl.String(),
                                            "json": pl.String()}
_GPU_KIND_VALUES = [k.value for k in (*GPU_KINDS, Kind.GPU_USER_ANNOTATION, Kind.SYNC)]
_NULL_COLUMNS = {c.column: _POLARS_TYPE[c.type] for c in ARG_COLUMNS}
_DERIVED_FROM = ("arg_device", "arg_stream", "device_id")  # the args columns `device` and `stream` come from
_NONE = type(None)
_INTS = {int, _NONE}
_NUMBERS = {int, float, _NONE}
_INTS_AND_TEXTS = {int, str, _NONE}


@dataclass
class ChunkTables:
    """The tables of one span of traceEvents. Event ids are local to the span until the caller shifts them."""

    events: pa.Table
    flows: pa.Table
    metadata: list[dict[str, Any]]  # M events: name, pid and tid as text, args decoded
    kind_counts: Counter[str]
    n_input: int  # traceEvents entries in the span (events + flows + metadata)
    ts_min_ns: int | None  # earliest ts of the span's events
    end_max_ns: int | None  # latest ts + dur (ts for instants)
    unknown_categories: Counter[str]  # cat of the events whose kind is `other`


def decode_span(document: bytes | bytearray | memoryview, path: str, offset: int) -> ChunkTables | None:
    """Decode a JSON array of whole events (one span of traceEvents) and build its tables.

    Returns None when the array is not valid JSON (the cut that made the span fell inside a string, so the
    caller merges it with the next span). `offset` is the span's position in the file, for error messages.
    Runs in worker processes for large traces, so it takes and returns only picklable values.

    The compiled scanner (_scan.c) reads the span when it can read it exactly as the Python path would;
    anything it is not sure of (and every error) is left to the Python path, which tests hold it to.
    """
    if _scan is not None and (scanned := _scan.scan_events(document, _SLOT_KEYS, _SLOT_TYPES)) is not None:
        return _from_scan(scanned)
    return _decode_python(document, path, offset)


def decode_range(data: bytes | Document, a: int, b: int, path: str) -> ChunkTables | None:
    """decode_span of the span data[a:b] of traceEvents (whole events and the commas between them), read in
    place by the scanner, so several threads can decode spans of one buffer at once; only a span that takes
    the Python path is copied (with its brackets)."""
    if _scan is not None and (scanned := _scan.scan_events(data, _SLOT_KEYS, _SLOT_TYPES, a, b)) is not None:
        return _from_scan(scanned)
    document = bytearray(b - a + 2)
    document[0], document[-1] = 0x5B, 0x5D  # [ ]
    document[1:-1] = memoryview(data)[a:b]
    return _decode_python(document, path, a)


_WARM_UP_SPAN = (b'[{"ph": "X", "cat": "cpu_op", "name": "w", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
                 b'"args": {"External id": 1}}, {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 1}, '
                 b'{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "w"}}]')


def warm_up() -> None:
    """Decode a tiny span: a process's first polars and pyarrow calls cost about 15 ms once (polars' pools,
    pyarrow's memory pool), which ingest hides behind reading the file (gunzip and sha256 release the GIL)."""
    decode_span(_WARM_UP_SPAN, "warm-up", 0)


def scanner_available() -> bool:
    """Whether the compiled scanner was built (a C compiler was there when stepscope was installed)."""
    return _scan is not None


def _decode_python(document: bytes | bytearray | memoryview, path: str, offset: int) -> ChunkTables | None:
    """decode_span without the scanner: msgspec Structs, then columns built in bulk (the general path)."""
    try:
        events = _EVENT_DECODER.decode(document)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"an entry of traceEvents is not an event object ({exc})", path=path,
                               offset=offset) from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"not UTF-8 text ({exc.reason})", path=path, offset=offset - 1 + exc.start) from None
    except msgspec.DecodeError:
        return None
    try:
        return build_chunk(events, document)
    except UnicodeDecodeError as exc:  # inside args, which the first decode keeps raw
        raise TraceFormatError(f"not UTF-8 text in event args ({exc.reason})", path=path, offset=offset) from None
    except msgspec.ValidationError as exc:  # a typed args key holding a number beyond a double's range
        reason = str(exc).split(" - at ")[0]
        raise TraceFormatError(f"unreadable value in event args ({reason})", path=path, offset=offset) from None


def build_chunk(events: Sequence[_Event], body: bytes | bytearray | memoryview) -> ChunkTables:
    """Decoded events (`body`, their JSON array, is re-read only for timestamps a float cannot hold) -> the
    events table, the flows table and the M (metadata) events; event ids count from 0 within the span."""
    n = len(events)
    ts_ns = _times_ns([e.ts for e in events])
    dur_ns = _times_ns([e.dur for e in events])
    if ts_ns is None or dur_ns is None:
        times = _TIMES_DECODER.decode(body)
        ts_ns = parse_time_ns(_raw_texts([t.ts for t in times]))
        dur_ns = parse_time_ns(_raw_texts([t.dur for t in times]))
        del times
    base = pl.DataFrame({
        "event_id": pl.int_range(0, n, dtype=pl.Int64, eager=True),
        "ph": _text_series([e.ph for e in events]),
        "cat": _text_series([e.cat for e in events]),
        "name": _text_series([e.name for e in events]),
        "pid": _text_series([e.pid for e in events]),
        "tid": _text_series([e.tid for e in events]),
        "ts_ns": ts_ns.rename("ts_ns"),
        "dur_ns": dur_ns.rename("dur_ns"),
    })
    metadata: list[dict[str, Any]] = []
    for event_id in base.filter(_IS_METADATA)["event_id"].to_list():
        e = events[event_id]
        margs = msgspec.json.decode(e.args) if e.args is not _NULL else None
        margs = {} if margs is None else margs  # no args, or "args": null (as the scanner reads both)
        metadata.append({"name": e.name, "pid": _as_text(e.pid), "tid": _as_text(e.tid), "args": margs})

    flows = base.filter(_IS_FLOW)
    flow_events = _pick(events, flows["event_id"].to_list())
    flow_table = _to_arrow(flows.with_columns(flow_id=_text_series([e.id for e in flow_events]),
                                              binding_point=_text_series([e.bp for e in flow_events]))
                           .select(FLOW_SCHEMA.names), FLOW_SCHEMA)
    evs = _kinds(base)

    # args are decoded per group (each pays only for its keys), then rows go back to file order
    all_args = [e.args for e in events]
    pieces: list[pl.DataFrame] = []
    for group in _GROUPS:
        rows = evs.filter(pl.col("group") == _GROUP_CODE[group])
        if rows.height == 0:
            continue
        raw_args = _pick(all_args, rows["event_id"].to_list())
        columns = _group_args(raw_args, group)
        pieces.append(rows.drop("group").with_columns(_raw_texts(raw_args).alias("args"), *columns))
    merged = pl.concat(pieces, how="diagonal_relaxed").sort("event_id") if pieces else evs.drop("group")
    return _chunk(_finished(merged.lazy(), merged.columns).collect(engine="in-memory"), flow_table, metadata, n)


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


# (polars expressions are immutable: built once, not for every span, whose fixed cost they were a fifth of)
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


def _from_scan(scanned: tuple[Any, ...]) -> ChunkTables:
    """The tables of a span from _scan.scan_events' column buffers: the same as build_chunk gives.

    The scanner pulls every args key for every event; here each typed column keeps the first present key
    (coalesce) of the events whose group reads it, as _group_args does group by group.
    """
    n, ph, cat, name, pid, tid, flow_id, bp, args, ts, dur, slots = scanned
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
    # one query for the three tables (a span's polars calls each cost a fixed 0.1-0.2 ms, and were fifteen), on
    # the in-memory engine: collect's default in polars 2, the streaming one, spent most of a query this size
    # handing work between threads (a span's fixed cost: 4.3 ms against 2.2 ms)
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
        lazy.filter(_IS_METADATA).select("name", "pid", "tid", "args"),
    ], engine="in-memory")
    metadata = [{"name": name, "pid": pid, "tid": tid, "args": msgspec.json.decode(margs) if margs else {}}
                for name, pid, tid, margs in meta.iter_rows()]
    return _chunk(events, _to_arrow(flows, FLOW_SCHEMA), metadata, n)


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
    ts_min, end_max, kinds, others = events.select(
        lo=pl.col("ts_ns").min(),
        hi=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max(),
        kinds=pl.col("kind").value_counts().implode(),
        others=pl.col("cat").filter(other).value_counts().implode(),
    ).row(0)
    return ChunkTables(events=_to_arrow(events, pa.schema([EVENT_SCHEMA.field(name) for name in events.columns])),
                       flows=flows, metadata=metadata, n_input=n_input, ts_min_ns=ts_min, end_max_ns=end_max,
                       kind_counts=Counter({k["kind"]: k["count"] for k in kinds}),
                       unknown_categories=Counter({c["cat"]: c["count"] for c in others}))


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


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table with every column of `schema`, in its order: the columns it lacks are all null, each type's
    from one shared array (Arrow arrays are immutable). A span of CPU ops lacks some thirty columns, whose
    buffers of zeros, one each, cost more to allocate and fault in than the rest of conforming the span."""
    nulls: dict[pa.DataType, pa.Array] = {}

    def null_column(dtype: pa.DataType) -> pa.Array:
        if dtype not in nulls:
            nulls[dtype] = pa.nulls(table.num_rows, dtype)
        return nulls[dtype]

    present = set(table.column_names)
    columns = [table.column(f.name) if f.name in present else null_column(f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _to_arrow(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """The frame as an Arrow table of `schema`: large_string -> string is an offsets-only cast (polars'
    default export, string views, would copy every value). Cast by Arrow's C++ reader, not Table.cast, which
    imports pyarrow.compute (see to_series)."""
    table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches()).cast(schema).read_all()


class _ArrowArray:
    """An Arrow array seen only through the Arrow PyCapsule interface."""

    __slots__ = ("_array",)

    def __init__(self, array: pa.Array) -> None:
        self._array = array

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self._array.__arrow_c_array__(requested_schema)  # type: ignore[no-any-return]


def to_series(array: pa.Array | pa.ChunkedArray) -> pl.Series:
    """An Arrow array as a polars Series, handed over through the Arrow C data interface: `pl.Series` given a
    pyarrow array imports pyarrow.compute, 30-50 ms of Python once per process (a tenth of ingesting the
    54 MB df_index trace), spent under the GIL while the file is being gunzipped."""
    if isinstance(array, pa.ChunkedArray):  # (combine_chunks imports pyarrow.compute, and pandas with it)
        array = pa.concat_arrays(array.chunks) if array.num_chunks else pa.nulls(0, array.type)
    return pl.Series(_ArrowArray(array))


def _pick(values: Sequence[Any], index: list[int]) -> list[Any]:
    """values[i] for each i in index, in one C-level call."""
    if len(index) <= 1:
        return [values[i] for i in index]
    return list(itemgetter(*index)(values))


# ----------------------------------------------------------------------------------------------- times


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
    types = set(map(type, values))
    if types <= _INTS:
        try:
            return pl.Series(values, dtype=pl.Int64) * 1000
        except TypeError:  # beyond int64: parse the text
            return None
    if not types <= _NUMBERS:
        return None  # strings, booleans, …: parse the text (non-numbers become null)
    series = pl.Series(values, dtype=pl.Float64)
    if (series.abs() >= _EXACT_FLOAT_LIMIT_US).any():
        return None  # a float this large may have lost its last digits (…689.047 reads back as …689.0)
    whole = series.floor()
    return pl.select(
        whole.cast(pl.Int64, strict=False) * 1000 + ((series - whole) * 1000).round().cast(pl.Int64)
    ).to_series()


# ----------------------------------------------------------------------------------------------- text


def _text_series(values: list[Any]) -> pl.Series:
    """Text from values that are usually all str (names) or all int (pids: 2914 -> '2914'); other values
    become their JSON text."""
    try:
        return pl.Series(values, dtype=pl.String)  # strict: any value but str and None raises
    except TypeError:
        pass
    types = set(map(type, values))
    if types <= _INTS:
        try:
            return pl.Series(values, dtype=pl.Int64).cast(pl.String)
        except TypeError:  # beyond int64
            pass
    if types <= _INTS_AND_TEXTS:  # pids and tids of GPU traces: 7 and "stream 7" (polars writes ints' digits)
        return pl.Series(values, dtype=pl.String, strict=False)
    return pl.Series([_as_text(v) for v in values], dtype=pl.String)


def _as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


def _raw_texts(raws: Sequence[msgspec.Raw]) -> pl.Series:
    """Raw JSON values as a String series ('null' and absent become null), without one Python str per value:
    the bytes are joined once and the Arrow offsets come from their lengths. Bytes that are not UTF-8 become
    U+FFFD (only inside args, which the first decode keeps raw).

        [b'{"a": 1}', b'null', b'[2]']  ->  data b'{"a": 1}null[2]', offsets 0, 8, 12, 15  ->  '{"a": 1}', null, '[2]'
    """
    offsets = array("q", [0, *accumulate(map(len, raws))])
    text = pa.LargeStringArray.from_buffers(len(raws), pa.py_buffer(offsets), pa.py_buffer(b"".join(raws)))
    try:
        text.validate(full=True)
        series = to_series(text)
    except pa.ArrowInvalid:
        joined = _SEP.join(raws).decode("utf-8", errors="replace")
        series = pl.Series(joined.split("\x00"), dtype=pl.String)
    return pl.select(pl.when(series == "null").then(None).otherwise(series)).to_series()


# ----------------------------------------------------------------------------------------------- args


def _args_decoder(group: ArgGroup) -> msgspec.json.Decoder[Any]:
    """A decoder of a JSON array of one group's args objects into Structs with a field per raw key the
    group's columns read (`k<i>`, in _GROUP_FIELDS order): json-typed keys stay raw text, the others decode
    to Python values (coerced per column)."""
    fields: list[tuple[str, Any, Any]] = []
    for col, slots in _GROUP_FIELDS[group]:
        for (field, missing), key in zip(slots, col.keys, strict=True):
            fields.append((field, msgspec.Raw if col.type == "json" else Any, msgspec.field(default=missing, name=key)))
    struct = msgspec.defstruct(f"Args_{group}", fields, kw_only=True, gc=False)
    return msgspec.json.Decoder(list[struct])  # type: ignore[valid-type]


def _group_fields(group: ArgGroup) -> tuple[tuple[ArgColumn, tuple[tuple[str, Any], ...]], ...]:
    """Each of the group's columns with its (Struct field, value when absent) per raw key."""
    out = []
    i = 0
    for col in ARG_COLUMNS:
        if group in col.groups:
            out.append((col, tuple((f"k{i + j}", _NULL if col.type == "json" else None) for j in range(len(col.keys)))))
            i += len(col.keys)
    return tuple(out)


_GROUP_FIELDS = {g: _group_fields(g) for g in _GROUPS}
_ARGS_DECODERS = {g: _args_decoder(g) for g in _GROUPS}


def _group_args(args: list[msgspec.Raw], group: ArgGroup) -> list[pl.Series]:
    """Decode one group's args in one call and pull out each typed column (first present key wins).

    A column whose keys no event of these args has is left out (the caller adds it as nulls).
    """
    decoder = _ARGS_DECODERS[group]
    try:
        decoded = decoder.decode(_json_array([_EMPTY_OBJECT if a is _NULL else a for a in args]))
    except msgspec.ValidationError:
        # an args value that is not an object: treat it as no args for that event
        parts = [a if a is not _NULL and bytes(a).lstrip()[:1] == b"{" else _EMPTY_OBJECT for a in args]
        decoded = decoder.decode(_json_array(parts))
    n = len(decoded)
    out: list[pl.Series] = []
    for col, fields in _GROUP_FIELDS[group]:
        series = []
        for field, missing in fields:
            values = list(map(attrgetter(field), decoded))
            if values.count(missing) < n:  # identity first: absent keys are the very default object
                series.append(_arg_series(values, col.type))
        if series:
            merged = series[0] if len(series) == 1 else pl.select(pl.coalesce(series)).to_series()
            out.append(merged.alias(col.column))
    return out


def _json_array(items: list[Any]) -> bytes:
    """b'[' + b','.join(items) + b']' in one join: the brackets ride on the first and last items, so the
    (often tens of MB of) args text is copied once, not three times."""
    if not items:
        return b"[]"
    items[0] = b"[" + bytes(items[0])
    items[-1] = bytes(items[-1]) + b"]"
    return b",".join(items)


def _arg_series(values: list[Any], kind: ArgType) -> pl.Series:
    """Values of one args key -> a typed column (see the coercion rules in the module docstring)."""
    if kind == "json":
        return _json_texts(values)
    if kind == "str":
        return _text_series(values)
    types = set(map(type, values))
    if kind == "int":
        if types <= _INTS:
            try:
                return pl.Series(values, dtype=pl.Int64)
            except TypeError:  # an integer beyond int64
                pass
        return pl.Series([_coerce_int(v) for v in values], dtype=pl.Int64)
    if types <= _NUMBERS:
        return pl.Series(values, dtype=pl.Float64)
    return pl.Series([_coerce_float(v) for v in values], dtype=pl.Float64)


def _json_texts(raws: list[msgspec.Raw]) -> pl.Series:
    """Raw JSON values kept as text; a JSON string value is unquoted ('"[0, 1]"' -> '[0, 1]')."""
    series = _raw_texts(raws)
    if series.str.starts_with('"').any():
        series = pl.Series([msgspec.json.decode(v) if v is not None and v.startswith('"') else v
                            for v in series.to_list()], dtype=pl.String)
    return series


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

