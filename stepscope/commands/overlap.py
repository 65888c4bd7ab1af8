"""`stepscope overlap TRACE`: CPU–GPU overlap, launch latency, queue depth and synchronizing calls."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("overlap")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """GPU utilization, CPU busy share and the share where both run, launch latency per stream, kernel queue
    depth over time, and the synchronizing runtime calls with where in Python they come from."""
    from stepscope.analyze import load
    from stepscope.analyze.overlap import cpu_gpu_overlap
    chosen = resolve_format(fmt, as_json, as_csv, table)
    result = cpu_gpu_overlap(load(trace))
    if result.gpu_events == 0 and chosen == "table":
        emit("no GPU work in this trace (a CPU-only capture): no CPU/GPU overlap to analyze\n", output)
        return
    emit_result(result, chosen, output, table=table)
