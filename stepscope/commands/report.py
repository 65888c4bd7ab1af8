"""`stepscope report INPUT -o OUT/`: a self-contained HTML report (OUT/index.html) of one trace, a capture
run (all ranks) or a batch (a dataset from `stepscope ingest`, or with --batch a directory of traces)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stepscope.commands._options import echo_failure, end_batch
from stepscope.reports.assemble import build_report


@click.command("report")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (replaced atomically); the main page is OUT/index.html.")
@click.option("--batch", is_flag=True,
              help="INPUT is a directory of many raw traces: one report each and an index.")
@click.option("--step", type=int, default=None,
              help="Step shown in the GPU timeline (default: the median-duration step).")
def command(input_path: Path, out: Path, batch: bool, step: int | None) -> None:
    """HTML report: steps and GPU timeline, ops, memory, trace info and warnings, how to reproduce; for a
    run or a batch, an index with one sortable row per rank or trace linking to each report.

    A trace that fails in a run or batch is reported in one line and the rest go on; the exit code is 1 if
    any failed."""
    start = time.perf_counter()
    outcome = build_report(input_path, out, batch=batch, step=step)
    for _, line in outcome.failed:
        echo_failure(line)
    kind = {"trace": "trace", "run": "run", "batch": "batch"}[outcome.mode]
    click.echo(f"wrote {outcome.index} ({kind}, {outcome.reports} report(s), {len(outcome.failed)} failed) "
               f"in {time.perf_counter() - start:.1f} s")
    end_batch(outcome.failed, outcome.reports + len(outcome.failed))
