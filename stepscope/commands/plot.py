"""`stepscope plot KIND TRACE -o file.png`: one figure of the report, alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click

from stepscope.analyze._text import NO_STEPS
from stepscope.commands._options import graph_capture_option, trace_argument
from stepscope.errors import UsageError

if TYPE_CHECKING:
    from stepscope.analyze.bundle import TraceAnalysis

KINDS = ("timeline", "steps", "gaps", "kernels", "ops", "memory", "snapshot", "transfers", "roofline")


@click.command("plot")
@click.argument("kind", type=click.Choice(KINDS))
@trace_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="PNG file to write (atomically).")
@click.option("--step", type=int, default=None, help="timeline: the step to show (default: the median-duration step).")
@graph_capture_option
def command(kind: str, trace: Path, output: Path, step: int | None, graph_capture: Path | None) -> None:
    """Write one PNG: timeline (GPU work of one step per device/stream, by kernel category, idle shaded by
    cause), steps (CPU phases and GPU busy/idle per step), gaps (idle by cause, gap-length histogram),
    kernels (GPU time by category, top kernels), ops (top ops by self CPU and device time), memory
    (allocated/reserved over time, peak marked; by category for an export_memory_timeline file) or
    snapshot (a CUDA memory snapshot .pickle, or a directory holding one, as TRACE) or transfers (copy time and
    bytes per step) or roofline (ops as points on the device's roofline, log-log, sized by GPU time).
    A trace of CUDA/HIP graph replays with a profile of the graph capture (--graph-capture, or found in its run
    directory) has its replayed kernels attributed to their ops, as `ops`, `flops` and the report have.
    A figure with nothing to draw is an error (exit code 2), the file not written."""
    from stepscope._io import atomic_write_bytes, check_output_path
    from stepscope.analyze.bundle import TraceAnalysis
    from stepscope.analyze.graphs import load_replayed, locate_capture
    from stepscope.analyze.inputs import MemoryTimeline, memory_file, resolve

    png: bytes | None
    check_output_path(output)
    # a snapshot, or the one a directory (a capture run's) holds
    with_capture = graph_capture is not None or (kind != "snapshot" and locate_capture(trace).capture is not None)
    source = memory_file(trace, "snapshot") if kind == "snapshot" else None if with_capture else resolve(trace)
    if isinstance(source, Path) or (kind == "memory" and isinstance(source, MemoryTimeline)):
        from stepscope.reports import memory_figures  # matplotlib: imported only when a figure is drawn

        if isinstance(source, Path):
            from stepscope.analyze.snapshot import analyze_snapshot
            from stepscope.analyze.snapshot_read import read_snapshot

            png = memory_figures.snapshot_figure(analyze_snapshot(read_snapshot(source)))
        else:
            from stepscope.analyze.memory_categories import memory_categories

            png = memory_figures.memory_categories_figure(memory_categories(source.path))
        if png is None:
            raise UsageError(f"no allocation history: nothing to plot, {output} not written", path=trace)
        atomic_write_bytes(output, png, create_parents=False)
        click.echo(f"wrote {output}", err=True)
        return
    frames, _choice = load_replayed(trace, graph_capture)  # (the trace itself where no capture is given or found)
    bundle = TraceAnalysis.of(frames)
    draw, empty = _TRACE_FIGURES[kind]
    png = draw(bundle, step)
    if png is None:
        why = empty if isinstance(empty, str) else empty(bundle)
        raise UsageError(f"{why}: nothing to plot, {output} not written", path=trace)
    atomic_write_bytes(output, png, create_parents=False)
    click.echo(f"wrote {output}", err=True)


def _figures() -> ModuleType:
    from stepscope.reports import figures  # matplotlib: imported only when a figure is drawn

    return figures


def _memory_figures() -> ModuleType:
    from stepscope.reports import memory_figures  # matplotlib: imported only when a figure is drawn

    return memory_figures


def _roofline_refusal(bundle: TraceAnalysis) -> str:
    from stepscope.analyze.roofline import why_nothing_plotted

    return why_nothing_plotted(bundle.roofline) or "no op to place on the roofline"


# kind -> (draw the figure from the trace's bundle and --step, what to say when there is nothing to draw, or
# how to say it from the bundle)
_TRACE_FIGURES: dict[str, tuple[Callable[[TraceAnalysis, int | None], bytes | None],
                                str | Callable[[TraceAnalysis], str]]] = {
    "timeline": (lambda b, step: _figures().timeline_figure(b.timeline(step)),
                 "no GPU work (kernels, memcpy, memset) in this trace"),
    "gaps": (lambda b, _: _figures().gaps_figure(b.gaps), "no GPU idle gaps in this trace (no GPU work, or none idle)"),
    "steps": (lambda b, _: _figures().step_breakdown_figure(b.steps), NO_STEPS),
    "transfers": (lambda b, _: _figures().transfers_figure(b.transfers), "no host/device copies in this trace"),
    "kernels": (lambda b, _: _figures().kernels_figure(b.kernels), "no GPU work in this trace"),
    "ops": (lambda b, _: _figures().ops_figure(b.ops), "no ops in this trace"),
    "roofline": (lambda b, _: _figures().roofline_figure(b.roofline),
                 _roofline_refusal),
    "memory": (lambda b, _: _memory_figures().memory_figure(b.memory),
               "no [memory] events with allocated totals in this trace (capture with profile_memory=True)"),
}
