"""`stepscope ranks RUN`: the ranks of a run side by side per step, imbalance, and the straggler's cause."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format


@click.command("ranks")
@click.argument("run", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--top", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows of the rank x step table shown in the terminal (0: all). JSON and CSV hold all.")
@format_options
def command(run: tuple[Path, ...], top: int, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """Ranks of RUN (a capture run directory, a directory of per-rank traces, rank_N/ sub-directories, a
    dataset, or several trace files) per step: wall, compute kernels, communication, exposed communication
    (not overlapped by compute on its device), GPU idle, data loading, CPU time and wait in collectives;
    imbalance (max / median across ranks) per metric; the straggler of each step, the wait it costs the
    others and its likely cause (more compute, data loading, or host delay with the op and Python line)."""
    from stepscope.analyze.ranks import ranks  # here, so that `--help` loads no polars
    from stepscope.reports.text import headline_with_notes, render_frame

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    result = ranks(list(run))
    if out_fmt != "table":
        emit_result(result, out_fmt, output, table=table, max_rows=None)
        return
    parts = headline_with_notes(result)
    parts += [render_frame(result.ranks, title="\nranks (mean per step):", max_rows=None),
              render_frame(result.imbalance, title="\nimbalance (max / median across ranks):", max_rows=None),
              render_frame(result.stragglers, title="\nstraggler per step:", max_rows=None),
              render_frame(result.steps, title="\nrank x step:", max_rows=top or None)]
    emit("\n".join(parts) + "\n", output)
