"""`stepscope memory-timeline FILE`: memory by category over time from an export_memory_timeline file."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analyze.inputs import MemoryTimeline, describe, resolve
from stepscope.analyze.memory_categories import memory_categories
from stepscope.commands._options import emit, format_options, resolve_format
from stepscope.reports.text import render


@click.command("memory-timeline")
@click.argument("file", type=click.Path(path_type=Path))
@format_options
def command(file: Path, fmt: str | None, as_json: bool, as_csv: bool, output: Path | None) -> None:
    """Bytes per category (parameter, optimizer state, input, temporary, activation, gradient, autograd
    detail, unknown) over time and at the peak, from torch.profiler's export_memory_timeline output
    (`*.raw.json.gz` as written by stepscope capture, or the [times, sizes] JSON)."""
    source = resolve(file)
    if not isinstance(source, MemoryTimeline):
        from stepscope.errors import UsageError

        raise UsageError(f"is {describe(source)}, not an export_memory_timeline file", path=file)
    emit(render(memory_categories(file), resolve_format(fmt, as_json, as_csv), max_rows=20), output)
