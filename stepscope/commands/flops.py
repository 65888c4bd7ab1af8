"""`stepscope flops TRACE`: FLOPs and bytes per op, achieved TFLOP/s and GB/s against the roofline, MFU per step."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.analyze.vocab import DTYPES, Dtype
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

#: --by -> the tables shown in a terminal (JSON always holds every table)
_VIEWS = {"op": ("ops", "unmodelled", "handoff"), "family": ("families",), "step": ("steps",)}


@click.command("flops")
@trace_argument
@click.option("--by", type=click.Choice(list(_VIEWS)), default=None,
              help="op (the table's default): per op, and the kernels to hand to the kernel profiler (Nsight "
                   "Compute, ROCm Compute Profiler); family: per op family; step: MFU per step. With --csv, that "
                   "table only (default: every table).")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The device's dense peak TFLOP/s at the dominant dtype (default: the device table).")
@click.option("--peak-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The device's memory bandwidth in GB/s (default: the device table).")
@click.option("--dtype", type=click.Choice(DTYPES), default=None,
              help="The dtype MFU is measured at (default: the one holding most FLOPs).")
@graph_capture_option
@format_options
def command(trace: Path, by: str | None, peak_tflops: float | None, peak_bandwidth: float | None, dtype: Dtype | None,
            graph_capture: Path | None, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """FLOPs and bytes of every op with a FLOP model (from its recorded shapes: profile with
    record_shapes=True), its kernels' GPU time, achieved TFLOP/s and GB/s, arithmetic intensity and share of
    the roofline (peaks from the device table, or --peak-tflops / --peak-bandwidth), MFU per step, and the
    command of the GPU vendor's kernel profiler (ncu, rocprof-compute) for the kernels furthest below their
    roofline. With --graph-capture, the ops of graph replays count once per replay, with their shapes at capture
    time. A trace without GPU kernels (a CPU capture) shows each op's and family's FLOPs and bytes with no time:
    nothing is held to a GPU's peak from CPU time."""
    from stepscope.analyze.roofline import roofline
    from stepscope.reports.text import render_frame, render_headline, result_headline
    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    source, line = load_run(trace, graph_capture)
    result = roofline(source, peak_tflops=peak_tflops, peak_bandwidth_gbps=peak_bandwidth, dtype=dtype)
    note = capture_note(line, out_fmt)
    if out_fmt == "table":
        parts = [note + render_headline(result_headline(result))]
        parts += [render_frame(getattr(result, name), title=f"\n{name}:", max_rows=40 if by in (None, "op") else None)
                  for name in _VIEWS[by or "op"]
                  if getattr(result, name).height or name not in ("handoff", "unmodelled")]
        emit("\n".join(parts) + "\n", output)
        return
    picked = table or (_VIEWS[by][0] if by is not None and out_fmt == "csv" else None)
    emit_result(result, out_fmt, output, table=picked, max_rows=None)
