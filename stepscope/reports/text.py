"""Text renderers for analysis results: an aligned terminal table, JSON and CSV.

A result is a frozen dataclass whose fields are headline figures (numbers, strings, small lists) and
polars DataFrames (its tables). Column and field names carry their unit, and the table renderer formats
by suffix: `*_ns` as a duration, `*_bytes` as a size, `*_fraction`/`*_share` as a percentage.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import polars as pl

from stepscope.errors import UsageError
from stepscope.reports.labels import common_prefix
from stepscope.reports.units import human_bytes, human_fraction, human_ns

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

MAX_CELL = 100

OutputFormat = Literal["table", "json", "csv"]


def result_tables(result: Any) -> dict[str, pl.DataFrame]:
    """The DataFrame fields of a result, in declaration order."""
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
            if isinstance(getattr(result, f.name), pl.DataFrame)}


def result_headline(result: Any) -> dict[str, Any]:
    """The non-table fields of a result, in declaration order."""
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
            if not isinstance(getattr(result, f.name), pl.DataFrame) and not f.name.startswith("_")}


def headline_with_notes(result: Any) -> list[str]:
    """A run result's headline (its non-table fields but `note` and `warnings`), then its note and each warning on
    a line of its own: the top of `comm`'s and `ranks`' tables."""
    headline = {k: v for k, v in result_headline(result).items() if k not in ("note", "warnings")}
    return ([render_headline(headline)] + ([f"note: {result.note}"] if result.note else [])
            + [f"warning: {w}" for w in result.warnings])


def to_jsonable(value: Any) -> Any:
    """Plain JSON types for results: dataclasses, enums, frames (as lists of rows), NaN as null."""
    if isinstance(value, pl.DataFrame):
        return [to_jsonable(row) for row in value.to_dicts()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def render_json(result: Any, *, table: str | None = None, max_rows: int | None = None) -> str:
    """The whole result as one JSON document (every table, every row: `table` and `max_rows` do not apply)."""
    return json.dumps(to_jsonable(result), indent=2, ensure_ascii=False) + "\n"


def csv_tables(result: Any, table: str | None = None) -> dict[str, str]:
    """Each table of the result (or only the one named) as CSV with raw (unformatted) values, every row.

    An unknown `table` is a UsageError naming the tables there are."""
    tables = result_tables(result)
    if not tables:
        raise ValueError("this result has no table to write as CSV")
    if table is not None:
        if table not in tables:
            raise UsageError(f"no table {table!r} in this result; choose one of: {', '.join(tables)}")
        tables = {table: tables[table]}
    return {name: _frame_csv(frame) for name, frame in tables.items()}


def _frame_csv(frame: pl.DataFrame) -> str:
    flat = frame.with_columns(
        [pl.col(c).cast(pl.String) for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Struct, pl.Array))]
    )
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(flat.columns)
    for row in flat.iter_rows():
        writer.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def join_csv_tables(parts: Mapping[str, str]) -> str:
    """One CSV table as it is; several as sections, each after a `# <table>` line, a blank line between.

        {"a": "x\n1\n"}                  -> x / 1
        {"a": "x\n1\n", "b": "y\n2\n"}   -> # a / x / 1 / (blank) / # b / y / 2
    """
    if len(parts) == 1:
        return next(iter(parts.values()))
    return "\n".join(f"# {name}\n{text}" for name, text in parts.items())


def render_csv(result: Any, table: str | None = None, *, max_rows: int | None = None) -> str:
    """Every table of the result (or the one named) as CSV with raw values, every row: a result of one table
    is plain CSV; of several, one section per table (`join_csv_tables`)."""
    return join_csv_tables(csv_tables(result, table))


def whole_text_column(frame: pl.DataFrame) -> int | None:
    """The index of the column whose text a table shows whole (`format_value(whole=True)`): the last, where it is
    text (a warning's detail, a Python line), since nothing to its right needs aligning; None otherwise."""
    return frame.width - 1 if frame.width and frame.dtypes[-1] == pl.String else None


#: of a cut text that must stay apart from another (`cut_texts`): its first characters, and the characters before
#: the first one it differs in
_HEAD, _BEFORE = 40, 30


def cut_texts(texts: Sequence[str]) -> list[str]:
    """A column's texts, each longer than MAX_CELL cut there ("…" at the cut); where distinct texts would be cut
    to one (kernels whose names differ in a template argument past the cut), each shows instead its first
    characters and, after "…", the part from a little before it first differs from the others:

        void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<float, float, float,
        5ul>(at::GenericPackedTensorAccessor<…>, …) and the same with 2ul
        ->  void split_embedding_backward_codegen_ro…er_row_1<float, float, float, 5ul>(at::GenericPackedTensor…
            void split_embedding_backward_codegen_ro…er_row_1<float, float, float, 2ul>(at::GenericPackedTensor…
    """
    cut = [t if len(t) <= MAX_CELL else t[: MAX_CELL - 1] + "…" for t in texts]
    groups: dict[str, set[str]] = {}
    for text, shown in zip(texts, cut, strict=True):
        if shown != text:
            groups.setdefault(shown, set()).add(text)
    apart: dict[str, str] = {}
    for members in groups.values():
        for text in members if len(members) > 1 else ():
            differs = max(common_prefix(text, other) for other in members if other != text)
            start = max(_HEAD, differs - _BEFORE)
            end = start + MAX_CELL - _HEAD - 2  # room for the two "…"
            if end >= len(text):
                end, start = len(text), max(_HEAD, len(text) - (MAX_CELL - _HEAD - 1))
            apart[text] = f"{text[:_HEAD]}…{text[start:end]}{'…' if end < len(text) else ''}"
    return [apart.get(text, shown) for text, shown in zip(texts, cut, strict=True)]


def cell_texts(frame: pl.DataFrame) -> list[list[str]]:
    """The frame's cells as text, row by row: each by the unit its column carries (`format_value`), the last text
    column whole (`whole_text_column`), the other text columns cut so that distinct texts stay distinct
    (`cut_texts`)."""
    last = whole_text_column(frame)
    columns = []
    for i, series in enumerate(frame.iter_columns()):
        if series.dtype == pl.String and i != last:
            texts = [str(v).replace("\n", " ") for v in series.drop_nulls()]
            shown = iter(cut_texts(texts))
            columns.append(["-" if v is None else next(shown) for v in series])
        else:
            columns.append([format_value(series.name, v, whole=i == last) for v in series])
    return [list(row) for row in zip(*columns, strict=True)] if columns else []


def format_value(name: str, value: Any, *, whole: bool = False) -> str:
    """Format one value by the unit its name carries; text longer than MAX_CELL is cut, unless `whole`."""
    if value is None:
        return "-"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return "-"
        if name.endswith("_ns"):
            return human_ns(value)
        if name.endswith("_bytes"):
            return human_bytes(value)
        if name.endswith(("_fraction", "_share")):
            return human_fraction(float(value))
        if name.endswith("_mib"):
            return f"{value:.2f}"
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(name, v, whole=whole) for v in value) or "none"
    text = " ".join(str(value).split()) if whole else str(value).replace("\n", " ")
    return text if whole or len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _display_names(names: Sequence[str]) -> list[str]:
    """Short names without the unit suffix; where two would collide (busy_ns, busy_fraction), the share
    reads 'busy %' and the other keeps 'busy'; any remaining clash keeps the full name."""
    short = [_display_name(n) for n in names]
    out = [f"{d} %" if short.count(d) > 1 and n.endswith(("_fraction", "_share")) else d
           for n, d in zip(names, short, strict=True)]
    return [n if out.count(d) > 1 else d for n, d in zip(names, out, strict=True)]


def _display_name(name: str) -> str:
    for suffix in ("_ns", "_bytes", "_fraction", "_share"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return rate_unit(name)


#: rate columns' names -> the unit as nccl-tests and spec sheets write it (busbw_gbps is GB/s, not Gbit/s)
_RATE_UNITS = (("gbps", "GB/s"), ("tflops", "TFLOP/s"))


def rate_unit(name: str) -> str:
    """A rate column's name with its unit written out: busbw_gbps -> busbw_GB/s, tflops -> TFLOP/s."""
    for word, unit in _RATE_UNITS:
        if name == word or name.endswith("_" + word):
            return name[: -len(word)] + unit
    return name


def render_frame(frame: pl.DataFrame, *, title: str | None = None, max_rows: int | None = 50,
                 column_names: Mapping[str, str] | None = None, empty: str = "(none)") -> str:
    """An aligned text table; numbers right-aligned and formatted by their column's unit suffix. `empty`: what
    an empty table says."""
    lines: list[str] = []
    if title:
        lines.append(title)
    if frame.height == 0:
        lines.append(f"  {empty}")
        return "\n".join(lines)
    shown = frame if max_rows is None else frame.head(max_rows)
    names = [(column_names or {}).get(c, d) for c, d in zip(shown.columns, _display_names(shown.columns),
                                                            strict=True)]
    cells = cell_texts(shown)
    numeric = [t.is_numeric() for t in shown.dtypes]
    widths = [max(len(n), *(len(r[i]) for r in cells)) for i, n in enumerate(names)]

    def line(values: Sequence[str]) -> str:
        cells = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))
        return "  ".join(cells).rstrip()

    lines.append(line(names))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(r) for r in cells)
    if max_rows is not None and frame.height > max_rows:
        lines.append(f"  … {frame.height - max_rows} more rows (use --format csv or --json for all)")
    return "\n".join(lines)


def render_headline(headline: Mapping[str, Any]) -> str:
    """`name: value` lines for headline figures, values formatted by unit."""
    headline = {k: v for k, v in headline.items() if v != ""}  # an empty note says nothing: no blank row
    if not headline:
        return ""
    label = {k: d.replace("_", " ") for k, d in zip(headline, _display_names(list(headline)), strict=True)}
    width = max(len(v) for v in label.values())
    out = []
    for k, v in headline.items():
        if isinstance(v, Mapping):
            v = ", ".join(f"{kk}={format_value(k, vv)}" for kk, vv in v.items()) or "-"
            out.append(f"{label[k]:<{width}}  {v}")
        elif isinstance(v, str) and len(v) > MAX_CELL or (  # a sentence (a note, a source): wrapped, never cut
                isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v)
                and sum(map(len, v)) > MAX_CELL):  # sentences (notes): each on lines of its own
            indent = "" if isinstance(v, str) else "  "  # (several: each one's own lines indented after its first)
            lines = [line for text in ([v] if isinstance(v, str) else v)
                     for line in textwrap.wrap(text.replace("\n", " "), width=max(40, 100 - width - 2),
                                               subsequent_indent=indent, break_on_hyphens=False,
                                               break_long_words=False)]
            out.append(f"{label[k]:<{width}}  " + f"\n{'':<{width}}  ".join(lines))
        else:
            out.append(f"{label[k]:<{width}}  {format_value(k, v)}")
    return "\n".join(out)


def render_table(result: Any, *, table: str | None = None, max_rows: int | None = 50) -> str:
    """Headline figures, then each table of the result under its name (all tables: `table` picks a CSV one). An
    empty table says "(none)", or what the result's `empty_table_note(name)` says it means, where it has one."""
    parts = []
    head = render_headline(result_headline(result))
    if head:
        parts.append(head)
    why_empty = getattr(result, "empty_table_note", None)
    for name, frame in result_tables(result).items():
        empty = (why_empty(name) if callable(why_empty) and frame.height == 0 else None) or "(none)"
        parts.append(render_frame(frame, title=f"\n{name.replace('_', ' ')}:", max_rows=max_rows, empty=empty))
    return "\n".join(parts) + "\n"


class Renderer(Protocol):
    """Writes one result in one format; `table` names the one table CSV writes (default: every table)."""

    def __call__(self, result: Any, *, table: str | None = ..., max_rows: int | None = ...) -> str: ...


#: one renderer per output format
RENDERERS: Mapping[OutputFormat, Renderer] = {"table": render_table, "json": render_json, "csv": render_csv}


def render(result: DataclassInstance, fmt: OutputFormat, *, table: str | None = None,
           max_rows: int | None = 50) -> str:
    """`result` in the format asked for (the renderer from `RENDERERS`)."""
    return RENDERERS[fmt](result, table=table, max_rows=max_rows)
