"""`stepscope info TRACE`: devices, ranks, versions, span, steps, event counts, options, warnings."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analyze import load
from stepscope.analyze.info import trace_info
from stepscope.commands._options import emit, format_options, resolve_format, trace_argument
from stepscope.reports.text import render


@click.command("info")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, output: Path | None) -> None:
    """What TRACE holds (devices, ranks, steps, events by kind, profiler options) and what is odd about it."""
    result = trace_info(load(trace))
    emit(render(result, resolve_format(fmt, as_json, as_csv), max_rows=None), output)
