"""`stepscope snapshot FILE.pickle`: what held CUDA memory at the peak, from an allocator snapshot."""

from __future__ import annotations

from pathlib import Path

import click

from stepscope.commands._options import emit_result, format_options, resolve_format


@click.command("snapshot")
@click.argument("file", metavar="FILE|DIR", type=click.Path(path_type=Path))
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True, help="Rows per table (0: all).")
@click.option("--device", type=int, default=None, help="Only this device.")
@click.option("--activations", is_flag=True,
              help="Which layer's activations hold the most at the peak, and what checkpointing could save.")
@format_options
def command(file: Path, top: int, device: int | None, activations: bool, fmt: str | None, as_json: bool,
            as_csv: bool, table: str | None, output: Path | None) -> None:
    """Peak allocated memory, the live blocks at the peak by the user code that allocated them, the largest
    allocations, segments and fragmentation, and OOM events, from a torch.cuda.memory._dump_snapshot pickle
    (or the one a directory, such as a capture run, holds).

    The pickle is read as data only: a pickle that asks to run code is refused.
    """
    from stepscope.analyze.inputs import memory_file
    from stepscope.analyze.snapshot import activation_estimate, analyze_snapshot
    from stepscope.analyze.snapshot_read import read_snapshot
    tables = read_snapshot(memory_file(file, "snapshot"))
    result = activation_estimate(tables, device=device) if activations else analyze_snapshot(
        tables, top=top, device=device)
    emit_result(result, resolve_format(fmt, as_json, as_csv, table), output, table=table, max_rows=top or None)
