"""`stepscope transfers TRACE`: every host/device copy with bandwidth, pinned/pageable, sync, exposed stall."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("transfers")
@trace_argument
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="Worst copies to list (0: all).")
@format_options
def command(trace: Path, top: int, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """HtoD / DtoH / DtoD copies: bytes, GB/s, pageable vs pinned, sync vs async, the part the GPU spent
    waiting (not overlapped by kernels), CPU time blocked, per direction and step, and where the worst came from."""
    from stepscope.analyze import load
    from stepscope.analyze.transfers import transfers
    chosen = resolve_format(fmt, as_json, as_csv, table)
    result = transfers(load(trace), top=top or None)
    if result.copies_total == 0 and chosen == "table":
        emit("no memcpy events in this trace: no host/device copies to analyze\n", output)
        return
    emit_result(result, chosen, output, table=table)
