"""`export_memory_timeline` files: memory by category (parameter, activation, gradient, …) over time.

torch.profiler's `prof.export_memory_timeline(path, device)` writes one of two formats, chosen by the
path's suffix (torch/profiler/_memory_profiler.py):
- raw (`*.raw.json.gz`): a list of `[t_ns, action, bytes, category]` events; `t_ns` = -1 for tensors that
  existed before profiling; action 1 preexisting, 2 create, 3 increment version (two events: -bytes in
  the old version's category, +bytes in the new one's), 4 destroy (-bytes); category 0..7 in the order of
  `CATEGORIES` (torch's `_CATEGORY_TO_INDEX`; 7 = tensors torch could not categorize). A file with an event of
  any other category is refused (`TraceFormatError`), not read with that event's bytes in no category.
- plain (`*.json` / `*.json.gz`): `[times_us, sizes]`, each `sizes` row `[0, c0, …, c7]`, already cumulative.

Raw events become rows the way torch's own `_coalesce_timeline` makes the plain form, except for one
detail: events are taken in file order, a row starts whenever the microsecond timestamp changes, each
event adds its bytes to its category, and the rows are cumulative. Microseconds are `t_ns // 1000`
(exact); torch computes `int(t_ns / 1000)`, which rounds through a float and, on epoch-nanosecond
stamps, moves about one event in eight to the next microsecond. With floor, HolisticTraceAnalysis's
reference row (row 744 of its test file) comes out exactly; with torch's float rule it does not.

    [-1, 1, 512, 7], [-1, 1, 1024, 0], [5000, 2, 256, 4], [5400, 4, -512, 7]
        -> before profiling: parameter 1024, unknown 512
           5 us:             parameter 1024, activation 256, unknown 0
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.errors import InputError, TraceFormatError

CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")
_RAW_SCHEMA = {"t_ns": pl.Int64, "action": pl.Int64, "bytes": pl.Int64, "category": pl.Int64}


@dataclass(frozen=True, kw_only=True)
class MemoryCategoriesResult:
    """Bytes per category at the peak of their sum, and over time.

    `timeline`: every row, or at most `buckets` of them (in each of `buckets` equal slices of the rows, the one
    with the largest total), as `timeline_rows` says; `row` numbers the rows from 0 in the file's order
    (`read_memory_timeline`: HolisticTraceAnalysis's row 744 is row 744), `since_start_ns` counts from the first
    timestamped row, and is null for memory that existed before profiling.
    """

    source: str
    format: str
    rows: int
    start_time_us: int | None
    peak_total_bytes: int
    peak_since_start_ns: int | None
    timeline_rows: str  # "every row", or which rows `timeline` keeps: "20 of 7,717: …"
    at_peak: pl.DataFrame
    timeline: pl.DataFrame


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=path) from None
    try:
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        return json.loads(data)
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"corrupt gzip data ({exc})", path=path) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"not a memory timeline export (not JSON: {exc})", path=path) from None


def _is_plain(data: Any) -> bool:
    return (isinstance(data, list) and len(data) == 2 and isinstance(data[0], list) and isinstance(data[1], list)
            and len(data[0]) == len(data[1]) and all(isinstance(r, list) and len(r) == 9 for r in data[1][:100]))


def _is_raw(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(r, list) and len(r) == 4 for r in data[:100])


def read_memory_timeline(path: str | Path) -> tuple[str, pl.DataFrame]:
    """The export's format ('raw events' or 'category totals') and one row per timestamp, in file order:
    `time_us` (null before profiling), then the cumulative bytes of each category (columns `CATEGORIES`)."""
    path = Path(path)
    data = _read_json(path)
    try:
        if _is_plain(data):
            times, sizes = data
            frame = pl.DataFrame({"time_us": pl.Series(times, dtype=pl.Int64)})
            columns = pl.DataFrame(sizes, schema=["_zero", *CATEGORIES], orient="row").drop("_zero")
            return "category totals", pl.concat([frame, columns.cast(pl.Int64)], how="horizontal")
        if _is_raw(data):
            raw = pl.DataFrame(data, schema=_RAW_SCHEMA, orient="row")
            _check_categories(raw, path)
            return "raw events", _coalesce(raw)
    except (TypeError, ValueError, pl.exceptions.PolarsError) as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise TraceFormatError(f"malformed memory timeline export ({type(exc).__name__}: {first_line})",
                               path=path) from None
    raise TraceFormatError("not a memory timeline export (expected [t, action, bytes, category] events or "
                           "[times, sizes] from torch.profiler's export_memory_timeline)", path=path)


def _check_categories(raw: pl.DataFrame, path: Path) -> None:
    """Refuse an event whose category is not one of CATEGORIES' 0..7 (a newer torch's, or a damaged file): its
    bytes would count in no category, and the totals would be quietly short."""
    bad = raw.with_row_index("event").filter(~pl.col("category").is_between(0, len(CATEGORIES) - 1).fill_null(False))
    if bad.height:
        event, category = bad.row(0)[0], bad["category"][0]
        raise TraceFormatError(
            f"event {event} has category {'null' if category is None else category}, not one of torch's "
            f"0..{len(CATEGORIES) - 1} ({', '.join(CATEGORIES)}), so its bytes would count in none "
            f"({bad.height:,} such event{'s' if bad.height > 1 else ''} in the file)", path=path)


def _coalesce(raw: pl.DataFrame) -> pl.DataFrame:
    """Raw events -> one cumulative row per run of equal microsecond timestamps (see the module docstring)."""
    stamped = raw.with_columns(
        time_us=pl.when(pl.col("t_ns") >= 0).then(pl.col("t_ns") // 1000),
    ).with_columns(row=pl.col("time_us").ne_missing(pl.col("time_us").shift()).fill_null(True).cum_sum())
    per_row = stamped.group_by("row", maintain_order=True).agg(
        pl.col("time_us").first(),
        *[pl.col("bytes").filter(pl.col("category") == i).sum().alias(name) for i, name in enumerate(CATEGORIES)],
    )
    return per_row.select("time_us", *[pl.col(n).cum_sum() for n in CATEGORIES])


def memory_categories(path: str | Path, *, buckets: int | None = 200) -> MemoryCategoriesResult:
    """Bytes per category at the peak of the total, and over time (at most `buckets` rows; None: every row).

        7,717 rows, buckets=20    ->  timeline: rows 0, 387, … (the largest total of each slice of ~386 rows)
        7,717 rows, buckets=None  ->  timeline: rows 0 … 7,716
    """
    path = Path(path)
    fmt, timeline = read_memory_timeline(path)
    if timeline.height == 0:
        raise TraceFormatError("empty memory timeline export", path=path)
    start = timeline["time_us"].min()
    timeline = timeline.with_columns(
        since_start_ns=(pl.col("time_us") - pl.col("time_us").min()) * 1000,
        total_bytes=pl.sum_horizontal(*CATEGORIES),
    ).with_row_index("row")
    peak = timeline.sort("total_bytes", "row", descending=[True, False]).row(0, named=True)
    total = int(peak["total_bytes"])
    at_peak = pl.DataFrame({"category": list(CATEGORIES), "size_bytes": [int(peak[c]) for c in CATEGORIES]},
                           schema={"category": pl.String, "size_bytes": pl.Int64})
    at_peak = at_peak.with_columns(share_fraction=pl.col("size_bytes") / total if total else pl.lit(None, pl.Float64))
    n = timeline.height
    kept = n if buckets is None else min(buckets, n)
    if kept < n:
        timeline = (timeline.with_columns(bucket=pl.col("row") * kept // n)
                    .sort("total_bytes", "row", descending=[True, False]).group_by("bucket").first().sort("row"))
    shown = timeline.select(pl.col("row").cast(pl.Int64), "since_start_ns", "total_bytes",
                            *[pl.col(c).alias(f"{c}_bytes") for c in CATEGORIES])
    return MemoryCategoriesResult(
        source=str(path), format=fmt, rows=n,
        timeline_rows="every row" if kept == n else
        f"{kept:,} of {n:,}: in each of {kept:,} equal slices of the rows, the one with the largest total",
        start_time_us=start if isinstance(start, int) else None,
        peak_total_bytes=total, peak_since_start_ns=peak["since_start_ns"],
        at_peak=at_peak.sort("size_bytes", "category", descending=[True, False]),
        timeline=shown,
    )
