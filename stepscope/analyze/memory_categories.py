"""`export_memory_timeline` files: memory by category (parameter, activation, gradient, …) over time.

torch.profiler's `export_memory_timeline(path)` writes one of two formats (torch/profiler/_memory_profiler.py):
- raw (`*.raw.json.gz`): a list of `[t_ns, action, bytes, category]`; t = -1 for tensors that existed
  before profiling; action 1 preexisting, 2 create, 3 increment version (two rows: -bytes for the old
  version's category, +bytes for the new one), 4 destroy (-bytes); category 0..7 in torch's order below.
- plain (`*.json(.gz)` / `.html` data): `[times_us, sizes]`, each `sizes` row `[0, c0, …, c7]`, cumulative.

The raw rows are turned into the plain form the way torch's own `_coalesce_timeline` does it: rows are
taken in file order, each new timestamp starts a row that copies the previous totals, and each event
adds its bytes to its category:

    [-1, 1, 512, 7], [-1, 1, 1024, 0], [5000, 2, 256, 4], [5000, 4, -512, 7]
        -> t=-1: parameter 1024, unknown 512;  t=5000: parameter 1024, activation 256, unknown 0
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from stepscope.errors import InputError, TraceFormatError

CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
              "unknown")


@dataclass(frozen=True, kw_only=True)
class MemoryCategoriesResult:
    """Bytes per category over time, and at the peak of their sum."""

    source: str
    format: str
    rows: int
    peak_total_bytes: int
    peak_time_us: int | None
    at_peak: pl.DataFrame
    timeline: pl.DataFrame


def _read_json(path: Path) -> object:
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


def timeline_by_category(path: str | Path) -> pl.DataFrame:
    """One row per distinct timestamp (file order): time_us, then cumulative bytes per category."""
    path = Path(path)
    data = _read_json(path)
    if isinstance(data, list) and len(data) == 2 and isinstance(data[0], list) and isinstance(data[1], list) \
            and (not data[1] or isinstance(data[1][0], list)):
        times, sizes = data
        frame = pl.DataFrame({"time_us": pl.Series(times, dtype=pl.Int64)})
        cols = {name: pl.Series([row[i + 1] for row in sizes], dtype=pl.Int64) for i, name in enumerate(CATEGORIES)}
        return frame.with_columns(**cols)
    if not (isinstance(data, list) and data and all(isinstance(r, list) and len(r) == 4 for r in data[:100])):
        raise TraceFormatError("not a memory timeline export (expected [t, action, bytes, category] rows or "
                               "[times, sizes])", path=path)
    raw = pl.DataFrame(data, schema={"t_ns": pl.Int64, "action": pl.Int64, "bytes": pl.Int64, "category": pl.Int64},
                       orient="row")
    stamped = raw.with_columns(
        time_us=pl.when(pl.col("t_ns") == -1).then(-1).otherwise(pl.col("t_ns") // 1000),
    ).with_columns(row=(pl.col("time_us") != pl.col("time_us").shift()).fill_null(True).cum_sum() - 1)
    deltas = stamped.with_columns(
        [pl.when(pl.col("category") == i).then(pl.col("bytes")).otherwise(0).alias(name)
         for i, name in enumerate(CATEGORIES)]
    )
    per_row = deltas.group_by("row", maintain_order=True).agg(
        pl.col("time_us").first(), *[pl.col(name).sum() for name in CATEGORIES])
    return per_row.sort("row").select("time_us", *[pl.col(n).cum_sum() for n in CATEGORIES])


def memory_categories(path: str | Path) -> MemoryCategoriesResult:
    """Bytes per category over time and at the peak of the total."""
    path = Path(path)
    timeline = timeline_by_category(path).with_columns(total_bytes=pl.sum_horizontal(*CATEGORIES))
    if timeline.height == 0:
        raise TraceFormatError("empty memory timeline export", path=path)
    peak = timeline.sort("total_bytes", descending=True).row(0, named=True)
    at_peak = pl.DataFrame({"category": list(CATEGORIES), "size_bytes": [int(peak[c]) for c in CATEGORIES]})
    at_peak = at_peak.with_columns(share_fraction=pl.col("size_bytes") / max(int(peak["total_bytes"]), 1))
    fmt = "raw events" if path.name.endswith((".raw.json.gz", ".raw.json", ".raw.gz")) else "category totals"
    return MemoryCategoriesResult(
        source=str(path), format=fmt, rows=timeline.height, peak_total_bytes=int(peak["total_bytes"]),
        peak_time_us=peak["time_us"] if peak["time_us"] != -1 else None,
        at_peak=at_peak.sort("size_bytes", descending=True),
        timeline=timeline.rename({c: f"{c}_bytes" for c in CATEGORIES}),
    )
