"""`stepscope summary TRACE|RUN`: what bounds the loop (data loading, syncs, transfers, communication, launches,
GPU), and why; for a run of several ranks, the run's verdict (a straggler, or what most ranks share)."""

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


@click.command("summary")
@trace_argument
@graph_capture_option
@click.option("--predict", is_flag=True,
              help="Also replay the step's dependency graph with the fix each verdict asks for (`stepscope whatif`) "
                   "and say what it would save; builds the graph, which takes longer than the rest.")
@format_options
def command(trace: Path, graph_capture: Path | None, predict: bool, fmt: str | None, as_json: bool, as_csv: bool,
            table: str | None, output: Path | None) -> None:
    """One verdict for TRACE (gpu_bound, launch_bound, communication_bound, data_loading_bound, sync_bound,
    transfer_bound, no_gpu) from an ordered rule table, with the evidence, per-step verdicts and the top places
    to look. For RUN (a capture run directory, a directory of per-rank traces, a dataset): straggler when one
    rank's late arrivals cost the others >= 10% of their step, with its cause; else the verdict most ranks share,
    with each rank's own. A trace of CUDA/HIP graph replays with a profile of the graph capture (--graph-capture,
    or found in its run directory) has its replayed kernels attributed to the ops that launched them."""
    from stepscope.analyze.graphs import locate_capture
    from stepscope.analyze.inputs import Dataset, RunDir, TraceBatch, resolve, traces_of
    from stepscope.analyze.run_summary import run_summary
    from stepscope.analyze.summary import verdict
    from stepscope.reports.summary_text import render_run_summary, render_summary

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    with_capture = graph_capture is not None or locate_capture(trace).capture is not None
    inp = resolve(trace, batch=True) if not with_capture else None
    # a directory of one trace is that trace (its evidence, --predict), not a run of one rank
    if isinstance(inp, RunDir | Dataset | TraceBatch) and len(traces_of(inp)) > 1:
        run = run_summary(trace)
        if out_fmt == "table":
            emit(render_run_summary(run), output)
        else:
            emit_result(run, out_fmt, output, table=table)
        return
    source, line = load_run(trace, graph_capture)
    result = verdict(source)
    if predict:
        from stepscope.analyze.savings import predicted_savings

        result = dataclasses.replace(result, predicted_savings=predicted_savings(source))
    note = capture_note(line, out_fmt)
    if out_fmt == "table":
        emit(note + render_summary(result), output)
    else:
        emit_result(result, out_fmt, output, table=table)
