"""_columns: one span of events -> columns. Whatever mix of value types a span holds, every column equals
what the documented coercion rules give value by value (an oracle written plainly here), and key pruning
never loses a key however JSON spells it."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze._arrow import conform
from stepscope.analyze._columns import decode_span
from stepscope.analyze.schema import (
    ARG_COLUMNS,
    EVENT_SCHEMA,
    GROUP_OF_KIND,
    KIND_BY_CATEGORY,
    MEMORY_EVENT_NAME,
    Kind,
)

_INT64 = range(-(2**63), 2**63)


def _text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else json.dumps(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v.strip(), 0)
        except ValueError:
            return None
    return v if isinstance(v, int) and v in _INT64 else None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _json(v: Any) -> str | None:
    return v if v is None or isinstance(v, str) else json.dumps(v)


_COERCE = {"int": _int, "float": _float, "str": _text, "json": _json}


def _expected(event: dict[str, Any]) -> dict[str, Any]:
    """One event's row, by the rules, value by value."""
    cat = event.get("cat")
    kind = Kind.MEMORY if event.get("name") == MEMORY_EVENT_NAME else KIND_BY_CATEGORY.get(cat, Kind.OTHER) \
        if isinstance(cat, str) else Kind.OTHER
    group = GROUP_OF_KIND[kind]
    args = event.get("args")
    row: dict[str, Any] = {
        "kind": kind.value, **{k: _text(event.get(k)) for k in ("ph", "cat", "name", "pid", "tid")},
        "ts_ns": _time(event.get("ts")), "dur_ns": _time(event.get("dur")),
        "args": None if args is None else json.dumps(args),
    }
    for col in ARG_COLUMNS:
        if col.folded_into is not None:
            continue
        values = [args.get(k) for k in col.keys] if isinstance(args, dict) and group in col.groups else []
        row[col.column] = next((c for c in map(_COERCE[col.type], values) if c is not None), None)
    return row


def _time(v: Any) -> int | None:
    if isinstance(v, str):  # a number written as a string is still read
        try:
            return int(Decimal(v.strip()) * 1000)
        except ArithmeticError:
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v * 1000 if isinstance(v, int) else round(v * 1000)


_ARG_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["0x1f", " 7 ", "1.5", "x", "", "[0, 1]"]), st.lists(st.integers(0, 9), max_size=3),
)
_ARGS = st.fixed_dictionaries({}, optional={key: _ARG_VALUE for col in ARG_COLUMNS for key in col.keys})
_TIME = st.one_of(st.integers(0, 2**40), st.integers(0, 2**40).map(lambda n: n / 1000), st.none(),
                  st.booleans(), st.sampled_from(["12.5", "x"]))
_ID = st.one_of(st.integers(0, 2**40), st.sampled_from(["Spans", "", "7"]), st.none())
_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "i"]), "ts": _TIME},
    optional={
        "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "cuda_runtime", "python_function", "Operator",
                                "cpu_instant_event", "new_category"]),
        "name": st.sampled_from(["aten::mm", MEMORY_EVENT_NAME, "sgemm", "cudaLaunchKernel"]),
        "pid": _ID, "tid": _ID, "dur": _TIME, "args": _ARGS,
    },
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=12))
def test_every_column_follows_the_coercion_rules_whatever_the_mix_of_types(events: list[dict[str, Any]]) -> None:
    # GIVEN a span of events whose values are of any JSON type, WHEN it is decoded as ingest does
    chunk = decode_span(json.dumps(events).encode(), "t.json", 0)
    assert chunk is not None
    table = pl.DataFrame(conform(chunk.events, EVENT_SCHEMA)).sort("event_id")
    # THEN each row equals the rules applied value by value
    columns = list(_expected(events[0]))
    for got, event in zip(table.select(columns).iter_rows(named=True), events, strict=True):
        want = _expected(event)
        for name in columns:
            assert got[name] == want[name], (name, got[name], want[name], event)


def test_amd_string_args_are_coerced() -> None:
    # GIVEN ROCm's habit of writing numbers as strings ("stream": "0x0", "bytes": "1")
    doc = [{"ph": "X", "cat": "gpu_memcpy", "name": "CopyHostToDevice", "pid": 2, "tid": 3, "ts": 1, "dur": 2,
            "args": {"stream": "0x0", "bytes": "1", "correlation": 4}},
           {"ph": "X", "cat": "gpu_memcpy", "name": "CopyHostToDevice", "pid": 2, "tid": 3, "ts": 5, "dur": 2,
            "args": {"stream": 7, "bytes": 2048, "correlation": 5}}]
    chunk = decode_span(json.dumps(doc).encode(), "t.json", 0)
    assert chunk is not None
    rows = pl.DataFrame(chunk.events).sort("event_id").select("stream", "bytes", "correlation").rows()
    assert rows == [(0, 1, 4), (7, 2048, 5)]


def test_a_key_spelled_with_escapes_is_still_found() -> None:
    # GIVEN args whose keys use JSON escapes ('\/' and '\u0045'), which pruning by quoted name must not miss
    doc = (b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, '
           b'"args": {"memory bandwidth (GB\\/s)": 12.5, "\\u0045xternal id": 3}}]')
    chunk = decode_span(doc, "t.json", 0)
    assert chunk is not None
    assert pl.DataFrame(chunk.events).select("memory_bandwidth_gbps", "external_id").row(0) == (12.5, 3)


def test_conform_gives_every_schema_column_in_order_the_lacking_ones_null() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.int64()), ("d", pa.float64()),
                        ("e", pa.string())])
    table = pa.table({"d": pa.array([1.5, None, 2.5]), "b": pa.array(["x", "y", None])})
    out = conform(table, schema)
    assert out.schema.equals(schema)
    assert out.to_pydict() == {"a": [None] * 3, "b": ["x", "y", None], "c": [None] * 3, "d": [1.5, None, 2.5],
                               "e": [None] * 3}
    assert [out.column(name).null_count for name in "ace"] == [3, 3, 3]
    out.validate(full=True)
