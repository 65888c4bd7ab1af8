"""`stepscope critical-path TRACE`: per step, the chain of dependent work that sets its time, and what it is; for a
run (a capture run directory, a directory of per-rank traces, a dataset) the path may cross ranks through their
collectives."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument

if TYPE_CHECKING:
    import polars as pl

_SEGMENT_ROWS = 40


@click.command("critical-path")
@trace_argument
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True,
              help="Contributors to list (kind and name with the most time on the paths; 0: all).")
@click.option("--step", type=int, default=None,
              help="Step whose path the terminal lists segment by segment (default: the median step). JSON and "
                   "CSV hold every step's segments.")
@click.option("--annotation", default=None, metavar="REGEX",
              help="Take the instances of the CPU annotation (or op) matching REGEX as the steps, e.g. a region "
                   "of a trace without ProfilerStep (default: the ProfilerStep spans, else inferred iterations, else "
                   "the whole trace).")
@format_options
def command(trace: Path, top: int, step: int | None, annotation: str | None, fmt: str | None, as_json: bool,
            as_csv: bool, table: str | None, output: Path | None) -> None:
    """The critical path of each step of TRACE: the longest chain of dependent work (thread order, launches,
    stream order, cross-stream event waits, host syncs) from the step's start to its end, as ordered segments,
    split into CPU work, launch overhead, kernels by category, copies, sync waits, data loading and idle; the
    top contributors with their Python lines.

    TRACE may be a run (a capture run directory, a directory of per-rank traces, a dataset): the ranks' graphs,
    on clocks aligned by their collectives, are joined by the collectives (a rank's collective ends no earlier
    than the last rank's arrival plus the transfer), step N runs from the earliest rank's start to the latest
    rank's end, and the path may cross ranks: every segment names its rank, and a "wait for rank N (…)" segment
    is where it jumps to the rank that arrived last."""
    from stepscope.analyze.critical_path import critical_path
    from stepscope.errors import UsageError
    from stepscope.reports.text import render_frame, render_headline, result_headline

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    run = run_input(trace)
    result: Any
    if run is not None:
        from stepscope.analyze.run_graph import load_run, run_critical_path

        result = run_critical_path(load_run(run, annotation=annotation), top=top or None)
    else:
        from stepscope.analyze import load

        result = critical_path(load(trace), top=top or None, annotation=annotation)
    if result.steps_found == 0 and out_fmt == "table":
        emit("no CPU or GPU work in this trace: no dependency graph to walk\n", output)
        return
    if out_fmt == "json":  # a long step has ~0.5M segments: each table is written by polars, not row by row
        emit(_json(result), output)
        return
    if out_fmt != "table":
        emit_result(result, out_fmt, output, table=table, max_rows=None)
        return
    steps = result.steps["step"]
    if step is not None and step not in steps.to_list():
        raise UsageError(f"no step {step} in this trace; its steps are {steps.min()!s}..{steps.max()!s}"
                         if steps.null_count() < steps.len() else
                         "--step: this trace has no steps (its whole span is one window); leave --step out")
    shown = step if step is not None else _median_step(result.steps)
    segments = result.segments.filter(result.segments["step"].eq_missing(shown)).drop("step", "event_id")
    headline = {k: v for k, v in result_headline(result).items() if k != "notes"}
    parts = [render_headline(headline), *(f"note: {n}" for n in getattr(result, "notes", [])),
             render_frame(result.attribution, title="\ncritical path by kind (mean per step):", max_rows=None),
             render_frame(result.top, title="\ntop contributors:", max_rows=None),
             render_frame(result.steps, title="\nper step:", max_rows=20),
             render_frame(segments, title=f"\npath of step {'-' if shown is None else shown} (in order):",
                          max_rows=_SEGMENT_ROWS)]
    emit("\n".join(parts) + "\n", output)


def run_input(trace: Path) -> Path | None:
    """`trace` where it holds several traces (a capture run, a dataset, a directory of per-rank traces): a run for
    the run's graph; None for one trace (and for what is no trace: `load` says what it is)."""
    from stepscope.analyze.inputs import Dataset, RunDir, TraceBatch, resolve, traces_of
    from stepscope.errors import StepscopeError

    try:
        inp = resolve(trace)
    except StepscopeError:
        return None  # `load` reports it
    return trace if isinstance(inp, RunDir | Dataset | TraceBatch) and len(traces_of(inp)) > 1 else None


def _median_step(steps: pl.DataFrame) -> int | None:
    """The step whose wall time is the median's (the lower one of an even count)."""
    ordered = steps.sort("wall_ns", "step")
    value = ordered["step"][(ordered.height - 1) // 2]
    return None if value is None else int(value)


def _json(result: object) -> str:
    """The result as `--json` writes every result (headline fields, then each table as a list of row objects), the
    tables serialized by polars: the same document as `reports.text.render_json`, without its per-row cost."""
    import json

    from stepscope.reports.text import result_headline, result_tables, to_jsonable

    fields = [f"  {json.dumps(k)}: {json.dumps(to_jsonable(v), ensure_ascii=False)}"
              for k, v in result_headline(result).items()]
    fields += [f"  {json.dumps(k)}: {frame.write_json()}" for k, frame in result_tables(result).items()]
    return "{\n" + ",\n".join(fields) + "\n}\n"
