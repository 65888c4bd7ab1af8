"""`stepscope memory-timeline FILE`: memory by category over time from an export_memory_timeline file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click

from stepscope.commands._options import OutputFormat, emit_result, format_options, resolve_format

if TYPE_CHECKING:
    from stepscope.analyze.memory_categories import MemoryCategoriesResult

#: the timeline rows a table shows (JSON and CSV hold every row)
TABLE_ROWS = 20


def categories(path: Path, fmt: OutputFormat) -> MemoryCategoriesResult:
    """The file's memory by category: for a table, TABLE_ROWS rows of its timeline (each slice's highest) and
    where to find the rest; for JSON and CSV, every row."""
    from stepscope.analyze.memory_categories import memory_categories

    if fmt != "table":
        return memory_categories(path, buckets=None)
    result = memory_categories(path, buckets=TABLE_ROWS)
    if result.timeline.height == result.rows:
        return result
    return dataclasses.replace(result, timeline_rows=f"{result.timeline_rows} (--json or --csv: every row)")


@click.command("memory-timeline")
@click.argument("file", metavar="FILE|DIR", type=click.Path(path_type=Path))
@format_options
def command(file: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """Bytes per category (parameter, optimizer state, input, temporary, activation, gradient, autograd
    detail, unknown) over time and at the peak, from torch.profiler's export_memory_timeline output
    (`*.raw.json.gz` as written by stepscope capture, or the [times, sizes] JSON; or the one a directory, such as
    a capture run, holds). The table shows 20 timeline rows (each the highest of its slice); --json and --csv
    hold every row, numbered from 0 in the file's order."""
    from stepscope.analyze.inputs import memory_file
    chosen = resolve_format(fmt, as_json, as_csv, table)
    emit_result(categories(memory_file(file, "memory_timeline"), chosen), chosen, output, table=table,
                max_rows=None)
