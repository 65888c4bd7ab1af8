"""`stepscope info TRACE`: devices, ranks, versions, span, steps, event counts, options, warnings."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit_result, format_options, resolve_format, trace_argument


@click.command("info")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """What TRACE holds (devices, ranks, steps, events by kind, profiler options) and what is odd about it."""
    from stepscope.analyze import load
    from stepscope.analyze.info import trace_info
    result = trace_info(load(trace))
    emit_result(result, resolve_format(fmt, as_json, as_csv, table), output, table=table, max_rows=None)
