"""`stepscope capture [options] -o RUN_DIR -- python train.py ARGS`: profile an unmodified script."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click

from stepscope.analyze._text import plural


@click.command("capture", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Run directory: one trace per rank and active cycle, manifest, memory files.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier capture of the same rank in RUN_DIR.")
@click.option("--skip-first", type=click.IntRange(min=0), default=1, show_default=True,
              help="Steps run first, neither timed nor profiled (start-up, autotuning).")
@click.option("--baseline", type=click.IntRange(min=0), default=5, show_default=True,
              help="Unprofiled steps timed next: the profiler-free step time.")
@click.option("--wait", type=click.IntRange(min=0), default=1, show_default=True,
              help="torch.profiler.schedule's wait: steps after the baseline, before the profiler starts.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="schedule's warmup: steps the profiler runs but does not record (its own start-up).")
@click.option("--active", type=click.IntRange(min=1), default=3, show_default=True,
              help="schedule's active: steps recorded in each trace (the ProfilerStep#N the analyses read).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="schedule's repeat: wait/warmup/active cycles, one trace file each.")
@click.option("--step-on", default=None, metavar="NAME|module:function",
              help="Advance on each return of this function instead of each optimizer step (inference loops).")
@click.option("--step-on-annotation", default=None, metavar="NAME",
              help="Advance on each exit of torch.profiler.record_function(NAME).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Samples per step, for samples/s.")
@click.option("--no-shapes", is_flag=True, help="Do not record input shapes.")
@click.option("--no-memory", is_flag=True, help="Do not record allocations.")
@click.option("--no-stack", is_flag=True, help="Do not record Python stacks (smaller traces).")
@click.option("--no-modules", is_flag=True, help="Do not record nn.Module hierarchy.")
@click.option("--flops", is_flag=True, help="Estimate FLOPs of matmul and convolution ops.")
@click.option("--no-snapshot", is_flag=True, help="No CUDA memory snapshot.")
@click.option("--snapshot-max-entries", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Allocator events kept in the snapshot (caps its size).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None, help="Default: cuda when available.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def command(out_dir: Path, overwrite: bool, skip_first: int, baseline: int, wait: int, warmup: int, active: int,
            repeat: int, step_on: str | None, step_on_annotation: str | None, batch_size: int | None,
            no_shapes: bool, no_memory: bool, no_stack: bool, no_modules: bool, flops: bool, no_snapshot: bool,
            snapshot_max_entries: int, device: Literal["cuda", "cpu"] | None, command: tuple[str, ...]) -> None:
    """Run COMMAND (python train.py ARGS, python -m module ARGS, or train.py ARGS) in this process with the
    profiler armed, advancing on each optimizer step.

    Under torchrun (torchrun … -m stepscope capture -o RUN_DIR -- train.py) each rank writes its own traces
    and manifest into RUN_DIR. Then: stepscope report RUN_DIR
    """
    from stepscope.capture.options import CaptureOptions
    from stepscope.capture.runner import parse_target, run_script
    from stepscope.errors import ScriptFailed

    if step_on and step_on_annotation:
        raise click.UsageError("--step-on and --step-on-annotation cannot be combined")
    options = CaptureOptions(skip_first=skip_first, baseline=baseline, wait=wait, warmup=warmup, active=active,
                             repeat=repeat, record_shapes=not no_shapes, profile_memory=not no_memory,
                             with_stack=not no_stack, with_modules=not no_modules, with_flops=flops,
                             memory_snapshot=not no_snapshot, snapshot_max_entries=snapshot_max_entries,
                             batch_size=batch_size, device=device)
    try:
        session = run_script(parse_target(command), out_dir, options, step_on=step_on,
                             step_on_annotation=step_on_annotation, command=list(command), overwrite=overwrite)
    except ScriptFailed as exc:  # the script's traceback, as python would print it, above stepscope's one line
        if exc.script_traceback:
            click.echo(exc.script_traceback, err=True, nl=False)
        raise
    traces = sum(1 for p in session.files if p.name.endswith(".pt.trace.json.gz"))
    ratio = session.manifest.get("overhead_ratio")
    overhead = f", profiled/baseline step {ratio:.2f}x" if ratio else ""
    profiled = (session.manifest.get("profiled") or {}).get("steps")
    steps = (f"{profiled:,} of {session.steps_seen:,} steps profiled" if isinstance(profiled, int)
             else f"{session.steps_seen:,} steps")
    env = session.manifest.get("distributed") or {}
    rank = env.get("rank") if isinstance(env, dict) and (env.get("world_size") or 1) > 1 else None
    who = f"rank {rank}: " if rank is not None else ""  # (under torchrun each rank's process says its own)
    click.echo(f"{who}{out_dir}: {plural(traces, 'trace')}{' of this rank' if who else ''}, {steps}{overhead}; "
               f"next: stepscope report {out_dir}", err=True)
