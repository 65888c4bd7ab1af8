"""`stepscope export INPUT -o OUT.json[.gz]`: the trace with the answers laid over it, for Perfetto."""

from __future__ import annotations

import re
from pathlib import Path

import click

_STEPS = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")


def _step_range(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    """--steps N..M (or N): (first, last), first <= last."""
    if value is None:
        return None
    m = _STEPS.match(value)
    if m is None:
        raise click.BadParameter(f"{value!r} is not N..M (e.g. 3..5) or N", ctx=ctx, param=param)
    first, last = int(m.group(1)), int(m.group(2) or m.group(1))
    if first > last:
        raise click.BadParameter(f"{value!r}: the first step is after the last", ctx=ctx, param=param)
    return first, last


@click.command("export")
@click.argument("inputs", metavar="INPUT", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The trace file to write (.json, or .json.gz compressed), atomically; its directory must exist.")
@click.option("--only", type=click.Choice(["annotations"]), default=None,
              help="annotations: write only the added tracks, not the original events (a small file).")
@click.option("--steps", "steps", metavar="N..M", default=None, callback=_step_range,
              help="Only steps N to M: the original events overlapping their windows, and their annotations.")
def command(inputs: tuple[Path, ...], output: Path, only: str | None, steps: tuple[int, int] | None) -> None:
    """Write INPUT (a trace, or a run: a capture run directory, a directory of per-rank traces, a dataset, several
    trace files) as one Chrome trace-event file that Perfetto and chrome://tracing open, with the analysis laid
    over it: steps and their phases, every GPU idle gap named by its cause (the blamed op and Python line in its
    args), exposed copies, host syncs, the verdict with its evidence, and counters (GPU busy per step, launch
    queue depth, memory). Every original event is copied as it was. A run becomes one process per rank on
    aligned clocks, with arrows between the ranks' slices of each matched collective. Offline: open it in
    chrome://tracing or a local Perfetto UI (Open trace file); nothing is uploaded."""
    from stepscope.reports.perfetto import ExportOptions, export  # here, so that `--help` loads no polars
    from stepscope.reports.units import human_bytes, plural

    result = export(list(inputs), output, ExportOptions(only_annotations=only == "annotations", steps=steps))
    for line in result.warnings:
        click.echo(f"warning: {line}", err=True)
    ranks = f", {plural(len(result.ranks), 'rank')}" if result.ranks else ""
    tracks = plural(sum(len(t) for t in result.tracks.values()), "track")
    original = plural(result.original_events, "original event")
    click.echo(f"wrote {output} ({human_bytes(result.size_bytes)}{ranks}): {original}, "
               f"{result.added_events:,} added on {tracks}; "
               "open it in chrome://tracing or a local Perfetto UI", err=True)
