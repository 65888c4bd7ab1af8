"""`stepscope graphs TRACE`: CUDA/HIP graph replays, their kernels and GPU share, and (with a capture profile)
the ops that launched the replayed kernels."""

from __future__ import annotations

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


@click.command("graphs")
@trace_argument
@graph_capture_option
@format_options
def command(trace: Path, graph_capture: Path | None, fmt: str | None, as_json: bool, as_csv: bool,
            table: str | None, output: Path | None) -> None:
    """The graph launches of TRACE (cudaGraphLaunch / hipGraphLaunch): per distinct graph (its kernel
    sequence) the replays, kernels per replay, GPU time and share and the Python line that launched it; per
    replay the same; and, with a profile of the graph capture (--graph-capture, or found in TRACE's run
    directory), how many replayed kernels map to the ops that launched them at capture time, and which ops."""
    from stepscope.analyze.graphs import graph_replays
    from stepscope.reports.text import render_table
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    source, line = load_run(trace, graph_capture)
    result = graph_replays(source)
    note = capture_note(line, out_fmt)
    if out_fmt == "table":
        emit(note + render_table(result, max_rows=40), output)
        return
    emit_result(result, out_fmt, output, table=table, max_rows=None)
