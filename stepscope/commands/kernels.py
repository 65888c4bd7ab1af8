"""`stepscope kernels TRACE`: GPU time per kernel name or per category (GEMM, convolution, attention, …)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

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


@click.command("kernels")
@trace_argument
@click.option("--top", type=click.IntRange(min=0), default=30, show_default=True,
              help="Longest N kernel names (0: all).")
@click.option("--by", type=click.Choice(["name", "category"]), default="name", show_default=True,
              help="name: both tables; category: the category table only.")
@graph_capture_option
@format_options
def command(trace: Path, top: int, by: str, graph_capture: Path | None, fmt: str | None, as_json: bool,
            as_csv: bool, table: str | None, output: Path | None) -> None:
    """GPU time of TRACE by kernel name, by category (memcpy/memset included) and by the op that launched it;
    busy = union of GPU work. Graph-replayed kernels are `(graph replay)` unless --graph-capture maps them to
    their ops."""
    from stepscope.analyze.kernels import kernel_summary
    from stepscope.reports.text import render_frame, render_headline, render_table, result_headline
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    source, line = load_run(trace, graph_capture)
    result = kernel_summary(source, top=top or None)
    if result.gpu_events == 0 and out_fmt == "table":  # the note: kernels measured by the CUPTI range profiler
        emit((result.note or "no GPU kernels, memcpy or memset in this trace (CPU-only trace)") + "\n", output)
        return
    note = capture_note(line, out_fmt)
    if by == "category" and out_fmt == "table":
        emit(note + render_headline(result_headline(result)) + "\n"
             + render_frame(result.by_category, title="\nby category:", max_rows=None) + "\n", output)
        return
    if by == "category":
        result = dataclasses.replace(result, by_name=result.by_name.clear(), by_op=result.by_op.clear())
    if out_fmt == "table":
        emit(note + render_table(result, max_rows=None), output)
        return
    emit_result(result, out_fmt, output, table=table or ("by_category" if by == "category" else None), max_rows=None)
