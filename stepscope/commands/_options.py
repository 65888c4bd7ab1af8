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
    """--format table|json|csv (with --json / --csv shortcuts) and -o/--output FILE."""
    func = click.option(
        "-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
        help="Write to FILE instead of standard output (written atomically).",
    )(func)
    func = click.option("--csv", "as_csv", is_flag=True, help="Shortcut for --format csv.")(func)
    func = click.option("--json", "as_json", is_flag=True, help="Shortcut for --format json.")(func)
    func = click.option(
        "--format", "fmt", type=click.Choice(list(_OUTPUT_FORMATS)), default=None,
        help="Output format (default: table).",
    )(func)
    return func


def resolve_format(fmt: str | None, as_json: bool, as_csv: bool) -> OutputFormat:
    """Combine --format/--json/--csv; conflicting choices are a usage error, never silently resolved."""
    chosen = {c for c in (fmt, "json" if as_json else None, "csv" if as_csv else None) if c}
    if len(chosen) > 1:
        raise click.UsageError(f"conflicting output formats: {', '.join(sorted(chosen))}")
    return _OUTPUT_FORMATS[chosen.pop()] if chosen else "table"


def emit(text: str, output: Path | None) -> None:
    """Write command output to stdout or, atomically, to a file."""
    if output is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    from stepscope._io import atomic_write_text

    atomic_write_text(output, text)
    click.echo(f"wrote {output}", err=True)


def echo_failure(line: str) -> None:
    """One failed file of a batch, in one line naming it (errors.failure_line), on stderr; the batch goes on
    (see `end_batch`)."""
    click.echo(f"stepscope: error: {line}", err=True)


def end_batch(failed: Sequence[object], total: int) -> None:
    """After a batch: exit code 1 (BatchFailed) when any file failed, each already reported in one line."""
    if failed:
        from stepscope.errors import BatchFailed

        raise BatchFailed(len(failed), total)
