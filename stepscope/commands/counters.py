"""`stepscope counters TRACE`: the GPU hardware counters the CUPTI range profiler measured, per kernel, with the op
that launched each kernel and the FLOPs its instruction counters add up to."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("counters")
@trace_argument
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows of each table in the table output (0: all; --json and --csv hold every row).")
@format_options
def command(trace: Path, top: int, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """A trace recorded by the CUPTI range profiler (torch.profiler's experimental_config with profiler_metrics)
    holds one cuda_profiler_range event per kernel with its hardware counters, and no kernel timeline. Per kernel
    measured: its counters, the op that launched it (innermost and outermost, paired with the launch calls in
    order, as HTA does) and the FLOPs of its SASS instruction counters (an FMA counts 2); totals per kernel name
    and per op."""
    from stepscope.analyze import load
    from stepscope.analyze.counters import counter_ranges
    from stepscope.reports.counters_text import render_counters
    chosen = resolve_format(fmt, as_json, as_csv, table)
    result = counter_ranges(load(trace))
    if chosen == "table":
        emit(render_counters(result, top=top or None), output)
        return
    emit_result(result, chosen, output, table=table, max_rows=None)
