"""`stepscope transfers TRACE`: every host/device copy with bandwidth, pinned/pageable, sync, exposed stall."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analyze import load
from stepscope.analyze.transfers import transfers
from stepscope.commands._options import emit, format_options, resolve_format, trace_argument
from stepscope.reports.text import render


@click.command("transfers")
@trace_argument
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Worst copies to list.")
@format_options
def command(trace: Path, top: int, fmt: str | None, as_json: bool, as_csv: bool, output: Path | None) -> None:
    """HtoD / DtoH / DtoD copies: bytes, GB/s, pageable vs pinned, sync vs async, the part the GPU spent
    waiting (not overlapped by kernels), CPU time blocked, per direction and step, and where the worst came from."""
    chosen = resolve_format(fmt, as_json, as_csv)
    result = transfers(load(trace), top=top)
    if result.copies_total == 0 and chosen == "table":
        emit("no memcpy events in this trace: no host/device copies to analyze\n", output)
        return
    emit(render(result, chosen, table="copies" if chosen == "csv" else None), output)
