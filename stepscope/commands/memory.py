"""`stepscope memory TRACE`: allocated/reserved over time per device, the peak and the op running then,
bytes allocated per op, allocations never freed; `--by-layer`: activations per nn.Module at the peak."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit, emit_result, format_options, resolve_format, trace_argument

NO_EVENTS = ("no [memory] events in this trace: capture with torch.profiler.profile(profile_memory=True) "
             "to see memory over time\n")

NO_MODULES = ("no nn.Module frames in this trace: capture with torch.profiler.profile(profile_memory=True, "
              "with_stack=True, with_modules=True) to see activations per layer\n")


@click.command("memory")
@trace_argument
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True,
              help="Rows of the per-op and never-freed tables (0: all).")
@click.option("--buckets", type=click.IntRange(min=1), default=24, show_default=True,
              help="Time slices of the allocated/reserved timeline (per device).")
@click.option("--by-layer", is_flag=True,
              help="Activations per nn.Module at the peak and what checkpointing could save (with_modules).")
@format_options
def command(trace: Path, top: int, buckets: int, by_layer: bool, fmt: str | None, as_json: bool, as_csv: bool,
            table: str | None, output: Path | None) -> None:
    """Memory over time from TRACE's [memory] events: per-device peak (time, step, op), reserved vs
    allocated, MiB allocated per op (self and inclusive), and allocations never freed in the trace."""
    from stepscope.analyze import load
    from stepscope.analyze.inputs import MemoryTimeline, resolve
    from stepscope.analyze.memory import activation_memory, memory_timeline
    chosen = resolve_format(fmt, as_json, as_csv, table)
    source = resolve(trace)
    if isinstance(source, MemoryTimeline):
        from stepscope.commands.memory_timeline import categories

        emit_result(categories(trace, chosen), chosen, output, table=table, max_rows=None)
        return
    loaded = load(source)
    if by_layer:
        layers = activation_memory(loaded)
        if layers.module_frames == 0 and chosen == "table":
            emit(NO_MODULES, output)
            return
        emit_result(layers, chosen, output, table=table)
        return
    result = memory_timeline(loaded, buckets=buckets, top=top or None)
    if result.memory_events == 0 and chosen == "table":
        emit(NO_EVENTS, output)
        return
    emit_result(result, chosen, output, table=table)
