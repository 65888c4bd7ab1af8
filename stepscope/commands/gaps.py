"""`stepscope gaps TRACE`: GPU busy, utilization, and every idle gap with its blame and cause."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from stepscope.commands._duration import Duration
from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("gaps")
@trace_argument
@click.option("--min-gap", type=Duration(), default="0ns", show_default=True,
              help="List only gaps at least this long (10us, 1.5ms); totals always count every gap.")
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True, help="Gaps to list (0: all).")
@click.option("--device", type=int, default=None, help="Only this GPU.")
@click.option("--window", type=click.Choice(["steps", "trace"]), default="steps", show_default=True,
              help="steps: the ProfilerStep windows; trace: first to last GPU event.")
@format_options
def command(trace: Path, min_gap: int, top: int, device: int | None, window: str, fmt: str | None, as_json: bool,
            as_csv: bool, table: str | None, output: Path | None) -> None:
    """Why is the GPU idle? Busy time per device, and each idle gap with the CPU op / Python line on the
    launching thread during it and a cause: host_sync, data_loading, communication_wait, memcpy_wait,
    launch_overhead or other."""
    from stepscope.analyze import load
    from stepscope.analyze.gaps import gpu_gaps
    chosen = resolve_format(fmt, as_json, as_csv, table)
    result = gpu_gaps(load(trace), min_gap_ns=min_gap, window=window, device=device,  # type: ignore[arg-type]
                      top=top or None)
    if result.devices_with_gpu_work == 0 and chosen == "table":
        emit(f"no GPU work on device {device} in this trace\n" if device is not None else
             "no GPU work in this trace (a CPU-only capture): no GPU timeline to analyze\n", output)
        return
    if chosen == "table":  # trace-clock timestamps mean nothing on a terminal; JSON/CSV keep them
        result = dataclasses.replace(result, gaps=result.gaps.drop("start_ns", "end_ns"))
    emit_result(result, chosen, output, table=table)
