"""`stepscope ingest PATH... -o DATASET`: traces -> one hive-partitioned Parquet dataset."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stepscope.analyze._workers import usable_cores
from stepscope.commands._engine import check_engine, engine_options
from stepscope.commands._options import echo_failure, emit, end_batch


@click.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "dataset", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Dataset directory (created if missing, in a directory that exists; re-ingesting an unchanged file "
                   "is skipped).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help=f"Parallel processes (default: the cores this process may use, {usable_cores()}).")
@click.option("--force", is_flag=True, help="Re-ingest files even when unchanged.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome of every file as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--drop-added", is_flag=True,
              help="Leave out the tracks `stepscope export` added (category \"stepscope\"): an exported file is then "
                   "read as the trace it was made from.")
@engine_options
def command(paths: tuple[Path, ...], dataset: Path, jobs: int | None, force: bool, as_json: bool,
            quiet: bool, drop_added: bool, engine: str, address: str | None) -> None:
    """Parse traces (files, directories, globs) into DATASET, one partition per trace and rank.

    Query it directly: pl.scan_parquet("DATASET/**/events.parquet", hive_partitioning=True).
    A bad file is reported with its reason and the rest go on; the exit code is 1 if any failed.
    With --engine ray each file is a Ray task (same dataset, partition for partition); -j is then the CPUs of
    the local cluster started for the command.
    """
    check_engine(engine, address)
    from stepscope._io import output_dir
    from stepscope.analyze.dataset import FileOutcome, ingest_many
    from stepscope.analyze.inputs import find_trace_files
    from stepscope.reports.text import render_json

    total = len(find_trace_files(list(paths)))
    if engine == "ray":
        from stepscope.analyze.engines import import_ray

        import_ray()  # (not installed: one line saying how, before the dataset directory is made)
    existed = dataset.exists()
    output_dir(dataset)
    show = not quiet and not as_json and sys.stderr.isatty()  # (in a log a bar's label is a stray line)
    with click.progressbar(length=total, label="ingesting", file=sys.stderr,
                           hidden=not show, show_pos=True) as bar:
        def done(outcome: FileOutcome) -> None:
            bar.update(1)
            if outcome.status == "failed":
                if show:
                    click.echo("", err=True)  # (below the progress bar)
                echo_failure(outcome.error or outcome.source)

        try:
            result = ingest_many(list(paths), dataset, jobs=jobs, force=force, on_done=done, fork_workers=True,
                                 engine="ray" if engine == "ray" else "local", address=address,
                                 drop_added=drop_added)
        finally:  # (every file failed, or the engine could not start: leave no empty dataset behind)
            if not existed and dataset.is_dir() and not any(dataset.iterdir()):
                dataset.rmdir()
    if as_json:
        emit(render_json(result), None)
    else:
        counts = {s: sum(o.status == s for o in result.outcomes) for s in ("ingested", "skipped", "failed")}
        events = sum(o.n_events or 0 for o in result.outcomes)
        click.echo(f"{dataset}: {counts['ingested']} ingested, {counts['skipped']} unchanged (skipped), "
                   f"{counts['failed']} failed; {events:,} events")
    end_batch([o for o in result.outcomes if o.status == "failed"], len(result.outcomes))
