"""`stepscope fleet DATASET|DIR`: one row per trace and rank across many traces, computed by the chosen engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stepscope.commands._engine import check_engine, engine_options

_FORMATS = ("table", "json", "csv", "parquet")


@click.command("fleet")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--where", "where", multiple=True, metavar="EXPR",
              help="Keep rows where COLUMN OP VALUE holds (= != < <= > >=; repeat for AND): verdict=gpu_bound, "
                   "gpu_busy<0.5, gpu_busy<50%, step_p95>120ms, peak_memory>20G, error=null.")
@click.option("--sort", "sort", metavar="COL", default=None,
              help="Sort by this column (unit suffix optional: gpu_busy, step_p95); default: input order.")
@click.option("--desc", is_flag=True, help="With --sort: largest first.")
@click.option("--format", "fmt", type=click.Choice(_FORMATS), default=None, help="Output format (default: table).")
@click.option("--json", "as_json", is_flag=True, help="Shortcut for --format json.")
@click.option("--csv", "as_csv", is_flag=True, help="Shortcut for --format csv.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write to FILE (atomically; its directory must exist). Needed for --format parquet.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel processes (local engine) or CPUs of the Ray cluster started here (default: all cores).")
@engine_options
def command(source: Path, where: tuple[str, ...], sort: str | None, desc: bool, fmt: str | None, as_json: bool,
            as_csv: bool, output: Path | None, jobs: int | None, engine: str, address: str | None) -> None:
    """One row per trace and rank of SOURCE (a `stepscope ingest` dataset, a directory of traces, a capture
    run): run, rank, host, device, steps, step p50/p95, GPU busy, verdict, top idle cause and its share, exposed
    communication, MFU and peak memory where known. A trace that fails is reported in one line (its row keeps
    the error) and the exit code is 1."""
    check_engine(engine, address)
    chosen = {c for c in (fmt, "json" if as_json else None, "csv" if as_csv else None) if c}
    if len(chosen) > 1:
        raise click.UsageError(f"conflicting output formats: {', '.join(sorted(chosen))}")
    out_fmt = chosen.pop() if chosen else "table"
    if out_fmt == "parquet" and output is None:
        raise click.UsageError("--format parquet writes a file: give -o FILE")
    if desc and sort is None:  # (it would be ignored: the rows are in input order without a sort)
        raise click.UsageError("--desc orders by --sort COLUMN: give the column")

    from stepscope._io import check_output_path
    from stepscope.analyze.fleet import column_name, fleet, parse_condition, select_rows
    from stepscope.commands._options import echo_failure, end_batch

    for text in where:  # (a bad filter or column is an error before any trace is read)
        parse_condition(text)
    if sort is not None:
        column_name(sort)
    if output is not None:
        check_output_path(output)

    def reported(row: dict[str, Any]) -> None:
        if row["error"] is not None:
            echo_failure(row["error"])

    result = fleet(source, engine="ray" if engine == "ray" else "local", address=address, jobs=jobs,
                   on_row=reported)
    chosen_rows = select_rows(result, where=where, sort=sort, descending=desc)
    _write(chosen_rows, out_fmt, output)
    end_batch([None] * result.failed, result.traces)


def _write(result: Any, fmt: str, output: Path | None) -> None:
    from dataclasses import replace

    from stepscope.commands._options import emit_result

    if fmt == "parquet":
        from stepscope._io import atomic_path

        assert output is not None
        with atomic_path(output, create_parents=False) as tmp:
            result.fleet.write_parquet(tmp)
        click.echo(f"wrote {output}", err=True)
        return
    if fmt == "table":  # the path column is for machines; the error column (less the path) only when one failed
        import polars as pl

        shown = result.fleet.with_columns(error=pl.col("error").str.strip_prefix(pl.col("path"))
                                          .str.strip_prefix(":").str.strip_chars()).drop("path")
        if shown["error"].null_count() == shown.height:
            shown = shown.drop("error")
        emit_result(replace(result, fleet=shown), "table", output, max_rows=None)
        return
    emit_result(result, "json" if fmt == "json" else "csv", output)
