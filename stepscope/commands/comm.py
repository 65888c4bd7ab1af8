"""`stepscope comm RUN`: every collective of a run, matched across ranks on aligned clocks."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format


@click.command("comm")
@click.argument("run", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--link-bandwidth", "link_bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="GB/S", help="The link's peak bandwidth in GB/s: adds each group's and call's share of it "
                                   "(busbw / peak).")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True,
              help="Calls shown in the terminal, the most skewed first (0: every call). JSON and CSV hold all.")
@format_options
def command(run: tuple[Path, ...], link_bandwidth: float | None, top: int, fmt: str | None, as_json: bool,
            as_csv: bool, table: str | None, output: Path | None) -> None:
    """Collectives of RUN (a capture run directory, a directory of per-rank traces, rank_N/ sub-directories, a
    dataset, or several trace files): NCCL/RCCL kernels, or gloo and other CPU-side collectives, matched across
    the ranks of their process group; per-rank clock offsets that make matched calls end together; per call
    and per collective x message size x dtype x group: arrival skew, latency, wait per rank, bytes, algbw and
    busbw (nccl-tests factors), and the straggler."""
    from stepscope.analyze.collectives import collectives  # here, so that `--help` loads no polars
    from stepscope.reports.text import headline_with_notes, render_frame

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    result = collectives(list(run), link_bandwidth_gbps=link_bandwidth)
    if out_fmt != "table":
        emit_result(result, out_fmt, output, table=table, max_rows=None)
        return
    parts = headline_with_notes(result)
    if result.call_count:
        shown = result.calls.sort("skew_ns", "call", descending=[True, False], nulls_last=True)
        parts += [render_frame(result.groups, title="\nby collective x size x dtype x group:", max_rows=None),
                  render_frame(result.ranks, title="\nranks:", max_rows=None),
                  render_frame(shown.drop("start_ns"), title="\ncalls, most skewed first:",
                               max_rows=top or None)]
    emit("\n".join(parts) + "\n", output)
