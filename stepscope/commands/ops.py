"""`stepscope ops TRACE`: the key_averages() table (calls, self/total CPU and device time, memory, FLOPs)."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analyze.vocab import ROW_KINDS, SORT_COLUMNS
from stepscope.commands._options import (
    capture_note,
    emit,
    emit_result,
    format_options,
    graph_capture_option,
    load_run,
    resolve_format,
    trace_argument,
)


@click.command("ops")
@trace_argument
@click.option("--sort", "sort_by", default="auto", show_default=True, metavar="COLUMN",
              help=f"Sort (descending) by one of: auto, {', '.join(SORT_COLUMNS)}; torch's keys "
                   "(self_cpu_time_total, cuda_time_total, …) work too. auto = self device time, else self CPU.")
@click.option("--top", type=click.IntRange(min=0), default=30, show_default=True,
              help="Show the first N rows (0 = all).")
@click.option("--group-by-shape", is_flag=True, help="One row per op name and input shapes (record_shapes).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(ROW_KINDS),
              help="Only rows of this kind (repeatable), e.g. --kind cpu_op to hide kernels and annotations.")
@graph_capture_option
@format_options
def command(trace: Path, sort_by: str, top: int, group_by_shape: bool, kinds: tuple[str, ...],
            graph_capture: Path | None, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """Per-op totals of TRACE as torch's prof.key_averages().table() prints them, from the trace alone.

    Rows are what torch's table holds: CPU ops, Python frames, annotations, runtime calls, and GPU kernels /
    copies / GPU-side annotations (which torch leaves out of the Self CUDA % denominator, so those can pass
    100%). The table output uses torch's column names and formats; --json/--csv give raw values (ns, bytes).
    Graph-replayed kernels count under the ops that launched them at capture time with --graph-capture.
    """
    from stepscope.analyze.ops import op_table
    from stepscope.reports.ops_text import render_ops_table
    chosen = resolve_format(fmt, as_json, as_csv, table)
    source, line = load_run(trace, graph_capture)
    result = op_table(source, group_by_shape=group_by_shape, sort_by=sort_by, top=top or None,
                      kinds=kinds or None)
    note = capture_note(line, chosen)
    if chosen == "table":
        emit(note + render_ops_table(result), output)
    else:
        emit_result(result, chosen, output, table=table)
