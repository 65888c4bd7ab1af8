"""`stepscope plot KIND TRACE -o file.png`: one figure of the report, alone."""

from __future__ import annotations

from pathlib import Path

import click
import polars as pl

from stepscope.analyze import Trace, load
from stepscope.analyze.inputs import MemoryTimeline, Snapshot, describe, resolve
from stepscope.commands._options import trace_argument

KINDS = ("timeline", "steps", "gaps", "kernels", "ops", "memory", "snapshot", "transfers")


@click.command("plot")
@click.argument("kind", type=click.Choice(KINDS))
@trace_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="PNG file to write (atomically).")
@click.option("--step", type=int, default=None, help="timeline: the step to show (default: the median-duration step).")
def command(kind: str, trace: Path, output: Path, step: int | None) -> None:
    """Write one PNG: timeline (GPU work of one step per device/stream, by kernel category, idle shaded by
    cause), steps (CPU phases and GPU busy/idle per step), gaps (idle by cause, gap-length histogram),
    kernels (GPU time by category, top kernels), ops (top ops by self CPU and device time), memory
    (allocated/reserved over time, peak marked; by category for an export_memory_timeline file) or
    snapshot (a CUDA memory snapshot .pickle as TRACE) or transfers (copy time and bytes per step)."""
    from stepscope._io import atomic_write_bytes
    from stepscope.reports import figures

    png: bytes | None
    source = resolve(trace)
    if kind == "snapshot" and not isinstance(source, Snapshot):
        from stepscope.errors import UsageError

        raise UsageError(f"is {describe(source)}, not a CUDA memory snapshot (.pickle)", path=trace)
    if kind == "snapshot" or (kind == "memory" and isinstance(source, MemoryTimeline)):
        if kind == "snapshot":
            from stepscope.analyze.snapshot import analyze_snapshot
            from stepscope.analyze.snapshot_read import read_snapshot

            png = figures.snapshot_figure(analyze_snapshot(read_snapshot(trace)))
        else:
            from stepscope.analyze.memory_categories import memory_categories

            png = figures.memory_categories_figure(memory_categories(trace))
        if png is None:
            click.echo(f"no allocation history in {trace}: nothing to plot, {output} not written")
            return
        atomic_write_bytes(output, png)
        click.echo(f"wrote {output}", err=True)
        return
    loaded = load(source)
    if kind == "timeline":
        png = figures.timeline_figure(loaded, step, _gaps_table(loaded))
        empty = "no GPU work (kernels, memcpy, memset) in this trace"
    elif kind == "gaps":
        from stepscope.analyze.gaps import gpu_gaps

        png, empty = figures.gaps_figure(gpu_gaps(loaded)), "no GPU idle gaps in this trace (no GPU work, or none idle)"
    elif kind == "steps":
        from stepscope.analyze.steps import step_breakdown

        png = figures.step_breakdown_figure(step_breakdown(loaded))
        empty = "no ProfilerStep#N spans in this trace"
    elif kind == "transfers":
        from stepscope.analyze.transfers import transfers

        png, empty = figures.transfers_figure(transfers(loaded)), "no host/device copies in this trace"
    elif kind == "kernels":
        from stepscope.analyze.kernels import kernel_summary

        png, empty = figures.kernels_figure(kernel_summary(loaded)), "no GPU work in this trace"
    elif kind == "ops":
        from stepscope.analyze.ops import op_table

        png, empty = figures.ops_figure(op_table(loaded)), "no ops in this trace"
    else:
        from stepscope.analyze.memory import memory_timeline

        png = figures.memory_figure(memory_timeline(loaded, buckets=200))
        empty = "no [memory] events in this trace: capture with profile_memory=True"
    if png is None:
        click.echo(f"{empty}: nothing to plot, {output} not written")
        return
    atomic_write_bytes(output, png)
    click.echo(f"wrote {output}", err=True)


def _gaps_table(trace: Trace) -> pl.DataFrame | None:
    """gaps.py's idle gaps (to shade idle by cause), None where that analysis is not installed."""
    try:
        from stepscope.analyze.gaps import gpu_gaps
    except ModuleNotFoundError:
        return None
    return gpu_gaps(trace).gaps
