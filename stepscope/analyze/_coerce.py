"""Decoded JSON values -> typed polars columns: the time rule and the coercion of args values.

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

**Numbers beyond int64 or a double** (the same on the compiled scanner's path, which leaves them all here):
an integer in a text field (pid, tid, name, ...) is kept as its exact digits, whatever its length
(``"pid": 10**40`` -> ``"10000000000000000000000000000000000000000"``); in an int column it is null, in a
float column the nearest double. A ts/dur whose value in ns does not fit int64 (beyond about ±292 years, e.g.
``"ts": 1e17`` or a 40-digit integer), an event whose ts + dur does not, and a number beyond a double's
range in a float column or a metadata event's args (``1e400``) raise OutOfRange: ingest refuses the file
with a one-line error naming the event, rather than wrap around or drop the value unseen.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa

from stepscope.analyze._arrow import to_series
from stepscope.analyze.schema import ARG_COLUMNS, ArgColumn, ArgGroup, ArgType

NULL = msgspec.Raw(b"null")  # an absent or null value, kept raw
ARG_GROUPS: tuple[ArgGroup, ...] = ("gpu", "cpu", "python", "runtime", "memory")
_EMPTY_OBJECT = b"{}"
_SEP = b"\x00"  # never appears raw in JSON text, so it safely joins raw values
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# A float below 2**43 µs is within 0.49 ns of its decimal text, so rounding its ns value is exact.
_EXACT_FLOAT_LIMIT_US = float(2**43)
_NONE = type(None)
_INTS = {int, _NONE}
_NUMBERS = {int, float, _NONE}
_INTS_AND_TEXTS = {int, str, _NONE}
# the whole µs an int64 of ns holds (±9223372036854775.807 µs)
_TIME_LIMIT_US = _INT64_MAX // 1000
# text that reads as a number (JSON's grammar, as ts/dur are written or quoted): beyond the limit it is an error
_NUMBER_TEXT = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$"


class OutOfRange(ValueError):
    """A number the tables cannot hold exactly: `index` is the event's position in the values given (see
    the module docstring); the caller names the event's byte offset."""

    def __init__(self, reason: str, index: int) -> None:
        super().__init__(reason)
        self.reason, self.index = reason, index


# ----------------------------------------------------------------------------------------------- times


def parse_time_ns(texts: pl.Series) -> pl.Series:
    """Decimal microsecond text -> Int64 ns, exactly (see the module docstring). Non-numbers become null; a
    number beyond int64 ns raises OutOfRange."""
    cleaned = texts.str.strip_chars().str.strip_chars('"')
    micro = cleaned.cast(pl.Decimal(38, 3), strict=False)
    # beyond int64 ns: null before the scaling, whose Decimal(38, 3) would overflow first (a ComputeError, not
    # OutOfRange, for "dur": 100e30)
    fits = (micro.abs() <= _TIME_LIMIT_US + 1).fill_null(True)
    micro = pl.select(pl.when(fits).then(pl.lit(micro))).to_series()
    ns = (micro * 1000).cast(pl.Int64, strict=False)
    beyond = ns.is_null() & cleaned.str.contains(_NUMBER_TEXT)
    if beyond.any():
        index = int(beyond.arg_max())  # type: ignore[arg-type]
        raise OutOfRange(_beyond_int64_ns(cleaned[index]), index)
    return ns


def _beyond_int64_ns(text: str) -> str:
    shown = text if len(text) <= 24 else f"{text[:12]}… ({len(text)} characters)"
    return f"time {shown} µs is beyond what int64 nanoseconds hold (±9.2e18 ns, about ±292 years)"


def times_ns(values: list[Any]) -> pl.Series | None:
    """Decoded ts/dur numbers -> Int64 ns; None when a value is a float too large to be exact (use text).

    Integers are exact within int64 ns (OutOfRange beyond); a float is split into whole and fractional µs so
    that only the fraction is scaled: 1623142623460111 -> 1623142623460111000, 4458676522690.655 ->
    4458676522690655000.
    """
    types = set(map(type, values))
    if types <= _INTS:
        try:
            micro = pl.Series(values, dtype=pl.Int64)
        except (TypeError, OverflowError):  # beyond int64 (beyond 128 bits: OverflowError): parse the text
            return None
        beyond = (micro > _TIME_LIMIT_US) | (micro < -_TIME_LIMIT_US)
        if beyond.any():
            index = int(beyond.arg_max())  # type: ignore[arg-type]
            raise OutOfRange(_beyond_int64_ns(str(values[index])), index)
        return micro * 1000
    if not types <= _NUMBERS:
        return None  # strings, booleans, …: parse the text (non-numbers become null)
    try:
        series = pl.Series(values, dtype=pl.Float64)
    except OverflowError:  # an integer beyond a double's range: parse the text
        return None
    if (series.abs() >= _EXACT_FLOAT_LIMIT_US).any():
        return None  # a float this large may have lost its last digits (…689.047 reads back as …689.0)
    whole = series.floor()
    return pl.select(
        whole.cast(pl.Int64, strict=False) * 1000 + ((series - whole) * 1000).round().cast(pl.Int64)
    ).to_series()


# ----------------------------------------------------------------------------------------------- text


def text_series(values: list[Any]) -> pl.Series:
    """Text from values that are usually all str (names) or all int (pids: 2914 -> '2914'); other values
    become their JSON text."""
    try:
        return pl.Series(values, dtype=pl.String)  # strict: any value but str and None raises
    except (TypeError, OverflowError):  # (OverflowError: an integer beyond 128 bits)
        pass
    types = set(map(type, values))
    try:
        if types <= _INTS:
            return pl.Series(values, dtype=pl.Int64).cast(pl.String)
        if types <= _INTS_AND_TEXTS:  # pids and tids of GPU traces: 7 and "stream 7" (polars writes ints' digits)
            mixed = pl.Series(values, dtype=pl.String, strict=False)
            if mixed.null_count() == values.count(None):  # (an integer beyond 128 bits would be null)
                return mixed
    except (TypeError, OverflowError):  # an integer beyond int64 (OverflowError beyond 128 bits): its digits
        pass
    return pl.Series([as_text(v) for v in values], dtype=pl.String)


def as_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value)


def raw_texts(raws: Sequence[msgspec.Raw]) -> pl.Series:
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
            out.append((col, tuple((f"k{i + j}", NULL if col.type == "json" else None) for j in range(len(col.keys)))))
            i += len(col.keys)
    return tuple(out)


_GROUP_FIELDS = {g: _group_fields(g) for g in ARG_GROUPS}
_ARGS_DECODERS = {g: _args_decoder(g) for g in ARG_GROUPS}


def group_args(args: list[msgspec.Raw], group: ArgGroup) -> list[pl.Series]:
    """Decode one group's args in one call and pull out each typed column (first present key wins).

    A column whose keys no event of these args has is left out (the caller adds it as nulls).
    """
    decoder = _ARGS_DECODERS[group]
    try:
        decoded = decoder.decode(_json_array([_EMPTY_OBJECT if a is NULL else a for a in args]))
    except msgspec.ValidationError:
        # an args value that is not an object: treat it as no args for that event
        parts = [a if a is not NULL and bytes(a).lstrip()[:1] == b"{" else _EMPTY_OBJECT for a in args]
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
        return text_series(values)
    types = set(map(type, values))
    if kind == "int":
        if types <= _INTS:
            try:
                return pl.Series(values, dtype=pl.Int64)
            except (TypeError, OverflowError):  # an integer beyond int64
                pass
        return pl.Series([_coerce_int(v) for v in values], dtype=pl.Int64)
    if types <= _NUMBERS:
        try:
            return pl.Series(values, dtype=pl.Float64)
        except OverflowError:  # an integer beyond a double's range (raised below)
            pass
    return pl.Series([_coerce_float(v, i) for i, v in enumerate(values)], dtype=pl.Float64)


def _json_texts(raws: list[msgspec.Raw]) -> pl.Series:
    """Raw JSON values kept as text; a JSON string value is unquoted ('"[0, 1]"' -> '[0, 1]')."""
    series = raw_texts(raws)
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


def _coerce_float(value: Any, index: int) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # as msgspec refuses 1e400, so an integer of 309 digits or more
            raise OutOfRange("unreadable value in event args (Number out of range)", index) from None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None

