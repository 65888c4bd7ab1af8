"""`stepscope capture [options] -o RUN_DIR -- python train.py ARGS`: profile an unmodified script."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.errors import CaptureError


@click.command("capture", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("run"),
              show_default=True, help="Run directory (one trace per rank and active cycle, manifest, snapshot).")
@click.option("--baseline", type=click.IntRange(min=0), default=5, show_default=True,
              help="Unprofiled steps timed first (the profiler-free step time).")
@click.option("--wait", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--active", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--step-on", default=None, metavar="FUNCTION|module:function",
              help="Advance on each call of this function instead of each optimizer step (inference loops).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="For samples/s in the manifest.")
@click.option("--no-stack", is_flag=True, help="Do not record Python stacks (smaller traces).")
@click.option("--no-memory", is_flag=True, help="Do not record allocations.")
@click.option("--flops", is_flag=True, help="Estimate FLOPs of matmul/conv ops.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None, help="Default: cuda when available.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def command(out_dir: Path, baseline: int, wait: int, warmup: int, active: int, repeat: int, step_on: str | None,
            batch_size: int | None, no_stack: bool, no_memory: bool, flops: bool, device: str | None,
            command: tuple[str, ...]) -> None:
    """Run COMMAND (python train.py ARGS, python -m module ARGS) with the profiler armed.

    Under torchrun each rank writes its own trace and manifest into RUN_DIR.
    Then: stepscope report RUN_DIR
    """
    try:
        from stepscope.capture.runner import parse_target, run_script
        from stepscope.capture.session import CaptureOptions
    except ImportError as exc:  # pragma: no cover - only without torch
        raise CaptureError(f"capture needs torch: pip install 'stepscope[capture]' ({exc})") from None
    options = CaptureOptions(baseline=baseline, wait=wait, warmup=warmup, active=active, repeat=repeat,
                             with_stack=not no_stack, profile_memory=not no_memory, with_flops=flops,
                             batch_size=batch_size, device=device)
    session = run_script(parse_target(command), out_dir, options, step_on=step_on, command=list(command))
    traces = [p.name for p in session.files if p.name.endswith(".pt.trace.json.gz")]
    click.echo(f"{out_dir}: {len(traces)} trace(s), {session.steps_seen} steps seen; "
               f"next: stepscope report {out_dir}")
