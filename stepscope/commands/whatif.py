"""`stepscope whatif TRACE`: predicted step times with data loading hidden, kernels faster, launches cheaper,
syncs dropped, copies pinned or communication overlapped: the trace's (or the run's) dependency graph re-timed."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._duration import Duration
from stepscope.commands._options import emit_result, format_options, resolve_format, trace_argument


@click.command("whatif")
@trace_argument
@click.option("--no-data-loading", is_flag=True, help="DataLoader time costs nothing (the batch is ready).")
@click.option("--speedup", "speedups", multiple=True, metavar="CATEGORY=FACTOR",
              help="GPU work of a kernel category (gemm, convolution, attention, normalization, elementwise, "
                   "reduction, communication, memcpy, memset, triton, other) or whose name matches a regex runs "
                   "FACTOR times faster. Repeatable.")
@click.option("--launch-overhead", type=Duration(), default=None, metavar="DURATION",
              help="Every launch call costs this much CPU time and its GPU work starts this long after it "
                   "(10us, 2us; a bare number is µs; 0 is about what CUDA graphs give).")
@click.option("--no-sync", is_flag=True, help="Blocking calls (device/stream/event synchronize, synchronous "
                                                "copies, .item()) neither wait nor cost CPU time.")
@click.option("--pinned", is_flag=True, help="Pageable host copies become pinned: faster, and a DtoH copy no "
                                               "longer blocks its call.")
@click.option("--overlap-comm", is_flag=True,
              help="Communication (NCCL/RCCL kernels; in a run also gloo collectives) delays nothing but the step's "
                   "end: no stream order after it, no cross-stream wait or host sync on it, no thread waiting for "
                   "it; it still starts when issued and, in a run, ends no earlier than the last rank's arrival "
                   "plus its transfer.")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="In a run, apply the changes to this rank only (e.g. --rank 1 --no-data-loading: what if rank "
                   "1 did not wait for its data; the others keep theirs). Default: every rank.")
@click.option("--annotation", default=None, metavar="REGEX",
              help="Take the instances of the CPU annotation (or op) matching REGEX as the steps, e.g. a region "
                   "of a trace without ProfilerStep (default: the ProfilerStep spans, else inferred iterations, else "
                   "the whole trace).")
@format_options
def command(trace: Path, no_data_loading: bool, speedups: tuple[str, ...], launch_overhead: int | None,
            no_sync: bool, pinned: bool, overlap_comm: bool, rank: int | None, annotation: str | None,
            fmt: str | None, as_json: bool, as_csv: bool, table: str | None, output: Path | None) -> None:
    """Re-time TRACE's dependency graph (the one `critical-path` walks) under the changes given and report the
    measured and predicted step times, per step and on average, and the saving. Without a change it replays the
    measured graph, which must reproduce the measured steps (the residual is reported).

    TRACE may be a run (a capture run directory, a directory of per-rank traces, a dataset): its ranks' graphs
    joined by their collectives (see `critical-path`); the changes apply to every rank, or to --rank N only, and
    a step runs from the earliest rank's start to the latest rank's end."""
    from stepscope.analyze.whatif import WhatIf, parse_speedup, what_if
    from stepscope.commands.critical_path import run_input
    from stepscope.errors import UsageError

    out_fmt = resolve_format(fmt, as_json, as_csv, table)
    change = WhatIf(no_data_loading=no_data_loading, speedups=tuple(parse_speedup(s) for s in speedups),
                    launch_overhead_ns=launch_overhead, no_sync=no_sync, pinned=pinned, overlap_comm=overlap_comm,
                    rank=rank)
    run = run_input(trace)
    if run is not None:
        from stepscope.analyze.run_graph import load_run, run_what_if

        result = run_what_if(load_run(run, annotation=annotation), change)
    elif rank is not None:
        raise UsageError("--rank picks one rank of a run; TRACE is one trace (pass the run's directory)")
    else:
        from stepscope.analyze import load

        result = what_if(load(trace), change, annotation=annotation)
    emit_result(result, out_fmt, output, table=table, max_rows=None if out_fmt != "table" else 30)
