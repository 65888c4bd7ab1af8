"""`stepscope steps TRACE`: per step (ProfilerStep or inferred iteration) wall time, GPU busy/idle and the CPU phase
split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument

_ABSOLUTE = ("start_ns", "cpu_start_ns", "cpu_end_ns", "end_ns")  # clock readings, not durations


@click.command("steps")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """Per step of TRACE (its ProfilerStep#N spans, or without them the iterations inferred from the loop's
    repeating structure): window, GPU busy/idle, kernel/memcpy/memset time, data loading / forward / backward /
    optimizer CPU time, stats across steps, outlier steps and per-module time."""
    from stepscope.analyze import load
    from stepscope.analyze._text import NO_STEPS, STEPS_ADVICE
    from stepscope.analyze.steps import step_breakdown
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    result = step_breakdown(load(trace))
    if result.steps_found == 0:
        if out_fmt == "table":
            emit(f"{NO_STEPS}: {STEPS_ADVICE}\n", output)
            return
        # JSON and CSV stay what was asked for (no steps, the reason in the note), so a script can read them
        result = dataclasses.replace(result, note=f"{NO_STEPS}: {STEPS_ADVICE}")
    if out_fmt == "table":
        result = dataclasses.replace(result, steps=result.steps.drop(_ABSOLUTE))
    emit_result(result, out_fmt, output, table=table, max_rows=None)
