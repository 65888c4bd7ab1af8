"""`stepscope kernels TRACE`: GPU time per kernel name or per category (GEMM, convolution, attention, …)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("kernels")
@trace_argument
@click.option("--top", type=click.IntRange(min=1), default=30, show_default=True, help="Longest N kernel names.")
@click.option("--by", type=click.Choice(["name", "category"]), default="name", show_default=True,
              help="name: both tables; category: the category table only.")
@format_options
def command(trace: Path, top: int, by: str, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """GPU time of TRACE by kernel name and by category (memcpy/memset included); busy = union of GPU work."""
    from stepscope.analyze import load
    from stepscope.analyze.kernels import kernel_summary
    from stepscope.reports.text import render_frame, render_headline, result_headline
    result = kernel_summary(load(trace), top=top)
    if result.gpu_events == 0:
        emit("no GPU kernels, memcpy or memset in this trace (CPU-only trace)\n", output)
        return
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    if by == "category" and out_fmt == "table":
        emit(render_headline(result_headline(result)) + "\n"
             + render_frame(result.by_category, title="\nby category:", max_rows=None) + "\n", output)
        return
    if by == "category":
        result = dataclasses.replace(result, by_name=result.by_name.clear())
    emit_result(result, out_fmt, output, table=table or ("by_category" if by == "category" else None), max_rows=None)
