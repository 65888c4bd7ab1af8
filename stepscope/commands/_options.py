"""Options shared by several commands, as decorators, and the one place that writes command output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import click

F = TypeVar("F", bound=Callable[..., Any])

OutputFormat = Literal["table", "json", "csv"]
_OUTPUT_FORMATS: dict[str, OutputFormat] = {name: name for name in get_args(OutputFormat)}


def trace_argument(func: F) -> F:
    """The TRACE argument: a raw Chrome trace (.json/.json.gz), a trace directory, or an ingested directory.

    Not checked here: `stepscope.analyze.inputs.resolve` says what it is, with the same one-line errors in
    every command."""
    return click.argument("trace", type=click.Path(path_type=Path))(func)


def format_options(func: F) -> F:
    """--format table|json|csv (with --json / --csv shortcuts), --table NAME (the one CSV table) and
    -o/--output FILE."""
    func = click.option(
        "-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
        help="Write to FILE instead of standard output (written atomically; its directory must exist). CSV of "
             "several tables: one file per table, FILE.<table>.csv.",
    )(func)
    func = click.option(
        "--table", "table", metavar="NAME", default=None,
        help="With --csv: write only this table (default: every table, each after a '# NAME' line).",
    )(func)
    func = click.option("--csv", "as_csv", is_flag=True, help="Shortcut for --format csv.")(func)
    func = click.option("--json", "as_json", is_flag=True, help="Shortcut for --format json.")(func)
    func = click.option(
        "--format", "fmt", type=click.Choice(list(_OUTPUT_FORMATS)), default=None,
        help="Output format (default: table).",
    )(func)
    return func


def graph_capture_option(func: F) -> F:
    """--graph-capture FILE: a profile of the CUDA/HIP graph capture, which maps graph-replayed kernels to ops."""
    return click.option(
        "--graph-capture", "graph_capture", type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="A profile of the CUDA/HIP graph capture (a trace recorded while the graphs were captured): replayed "
             "kernels are attributed to the ops that launched them at capture time. Default: a capture_traces/ "
             "or *graph_capture* trace in TRACE's run directory, if any (TRACE itself, or a trace file's folder "
             "where it holds one capture profile and no other trace).",
    )(func)


def load_run(trace: Path, graph_capture: Path | None) -> tuple[Any, str | None]:
    """The frames to analyse (`analyze.graphs.load_replayed`: replayed kernels mapped through the capture profile
    given or found beside the trace) and the line that says which capture, if any (`capture_note`)."""
    from stepscope.analyze.graphs import capture_line, load_replayed

    frames, choice = load_replayed(trace, graph_capture)
    return frames, capture_line(choice, frames)


def capture_note(line: str | None, fmt: OutputFormat) -> str:
    """The capture line as the first line of table output; for JSON / CSV it goes to stderr instead ('')."""
    if line is None:
        return ""
    if fmt == "table":
        return line + "\n"
    click.echo(line, err=True)
    return ""


def resolve_format(fmt: str | None, as_json: bool, as_csv: bool, table: str | None = None) -> OutputFormat:
    """Combine --format/--json/--csv (and --table, CSV only); conflicting choices are a usage error, never
    silently resolved."""
    chosen = {c for c in (fmt, "json" if as_json else None, "csv" if as_csv else None) if c}
    if len(chosen) > 1:
        raise click.UsageError(f"conflicting output formats: {', '.join(sorted(chosen))}")
    out = _OUTPUT_FORMATS[chosen.pop()] if chosen else "table"
    if table is not None and out != "csv":
        raise click.UsageError(f"--table picks one CSV table: use it with --csv, not --format {out}")
    return out


def emit(text: str, output: Path | None) -> None:
    """Write command output to stdout or, atomically, to a file (whose directory must exist: one UsageError
    naming it otherwise, `stepscope._io.check_output_path`)."""
    if output is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    from stepscope._io import atomic_write_text

    atomic_write_text(output, text, create_parents=False)
    click.echo(f"wrote {output}", err=True)


def emit_result(result: Any, fmt: OutputFormat, output: Path | None, *, table: str | None = None,
                max_rows: int | None = 50) -> None:
    """Render `result` in `fmt` (`reports.text.render`) and write it (`emit`); CSV of several tables to a file
    is one file per table, FILE.<table>.csv (out.csv -> out.gaps.csv, out.per_device.csv), each atomically."""
    from stepscope.reports.text import csv_tables, join_csv_tables, render

    if fmt != "csv":
        emit(render(result, fmt, table=table, max_rows=max_rows), output)
        return
    parts = csv_tables(result, table)
    if output is None or len(parts) == 1:
        emit(join_csv_tables(parts), output)
        return
    from stepscope._io import atomic_write_text, check_output_path

    check_output_path(output)
    stem = output.name.removesuffix(".csv")
    paths = {name: output.with_name(f"{stem}.{name}.csv") for name in parts}
    for name, text in parts.items():
        atomic_write_text(paths[name], text, create_parents=False)
    click.echo(f"wrote {', '.join(map(str, paths.values()))}", err=True)


def echo_failure(line: str) -> None:
    """One failed file of a batch, in one line naming it (errors.failure_line), on stderr; the batch goes on
    (see `end_batch`)."""
    from stepscope.analyze.remote import as_given

    click.echo(f"stepscope: error: {as_given(line)}", err=True)  # (a URL input named as given)


def end_batch(failed: Sequence[object], total: int) -> None:
    """After a batch: exit code 1 (BatchFailed) when any file failed, each already reported in one line."""
    if failed:
        from stepscope.errors import BatchFailed

        raise BatchFailed(len(failed), total)
