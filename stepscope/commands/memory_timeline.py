"""`stepscope memory-timeline FILE`: memory by category over time from an export_memory_timeline file."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit_result, format_options, resolve_format


@click.command("memory-timeline")
@click.argument("file", metavar="FILE|DIR", type=click.Path(path_type=Path))
@format_options
def command(file: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """Bytes per category (parameter, optimizer state, input, temporary, activation, gradient, autograd
    detail, unknown) over time and at the peak, from torch.profiler's export_memory_timeline output
    (`*.raw.json.gz` as written by stepscope capture, or the [times, sizes] JSON; or the one a directory, such as
    a capture run, holds)."""
    from stepscope.analyze.inputs import memory_file
    from stepscope.analyze.memory_categories import memory_categories
    result = memory_categories(memory_file(file, "memory_timeline"))
    emit_result(result, resolve_format(fmt, as_json, as_csv, table), output, table=table, max_rows=20)
