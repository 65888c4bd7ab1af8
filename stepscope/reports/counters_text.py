"""`stepscope counters` as a terminal table: the CUPTI metric names, long and alike, shown by the part that tells
them apart, with the pattern that gives the whole names back (`--json` and `--csv` keep them whole)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from stepscope.reports.labels import metric_labels
from stepscope.reports.text import render_frame, render_headline

if TYPE_CHECKING:
    from stepscope.analyze.counters import CountersResult


def render_counters(result: CountersResult, *, top: int | None = 20) -> str:
    """Headline, then the totals per op and per kernel name and the first `top` ranges (None: all)."""
    if result.ranges_found == 0:
        return result.note + "\n"
    labels, pattern = metric_labels(result.counters)
    headline = {"ranges found": result.ranges_found, "kernel launches found": result.launches_found,
                "paired with launches": "yes" if result.matched else "no", "flops": result.flops,
                "counters": f"{len(result.counters)}" + (f" ({pattern}: {', '.join(labels.values())})" if pattern
                                                        else ""),
                "note": result.note}
    parts = [render_headline(headline)]
    tables = [("by op (innermost under outermost), most FLOPs first", result.by_op),
              ("by kernel, most FLOPs first", result.by_kernel), ("ranges, in the order measured", result.ranges)]
    for title, frame in tables:
        if frame.height:
            cut = top is not None and frame.height > top
            parts.append(render_frame(frame.head(top or frame.height), title=f"\n{title}" + (
                f" (first {top} of {frame.height:,}):" if cut else ":"), max_rows=None,
                column_names=labels))
    return "\n".join(parts) + "\n"


def counter_columns(frame: pl.DataFrame, counters: list[str]) -> pl.DataFrame:
    """`frame` with its counter columns named by their short labels (`metric_labels`), for a report's table."""
    labels, _ = metric_labels(counters)
    return frame.rename({c: labels[c] for c in counters if c in frame.columns})
