"""`stepscope serving TRACE`: an inference server's engine iterations (prefill, decode, mixed), batch sizes and
tokens, and per phase the latency p50/p95/p99, GPU busy share and tokens per second."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument


@click.command("serving")
@trace_argument
@format_options
def command(trace: Path, fmt: str | None, as_json: bool, as_csv: bool, table: str | None,
            output: Path | None) -> None:
    """The engine iterations of TRACE, from what the engine names them: vLLM's execute_…_context_…_generation_…
    annotations, SGLang's step[EXTEND bs=… toks=…] / step[DECODE bs=…], prefill/decode annotations, or the
    engines' forward frames. Per iteration its kind, batch size, prefill and decode tokens, wall and GPU busy; per
    phase the iterations, latency p50/p95/p99/mean, GPU busy share and tokens/s. Mixed iterations (prefill and
    decode in one batch) are their own phase. A trace without engine iterations gets an empty table and a note."""
    from stepscope.analyze import load
    from stepscope.analyze.serving import serving_iterations
    from stepscope.reports.text import render_table

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    result = serving_iterations(load(trace))
    if out_fmt == "table":
        emit(render_table(result, max_rows=40), output)
        return
    emit_result(result, out_fmt, output, table=table, max_rows=None)
