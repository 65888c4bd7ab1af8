"""`stepscope summary TRACE`: what bounds the loop (data loading, syncs, transfers, launches, GPU), and why."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("summary")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """One verdict for TRACE (gpu_bound, launch_bound, data_loading_bound, sync_bound, transfer_bound,
    no_gpu) from an ordered rule table, with the evidence, per-step verdicts and the top places to look."""
    from stepscope.analyze import load
    from stepscope.analyze.summary import verdict
    from stepscope.reports.summary_text import render_summary
    result = verdict(load(trace))
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    if out_fmt == "table":
        emit(render_summary(result), output)
    else:
        emit_result(result, out_fmt, output, table=table)
