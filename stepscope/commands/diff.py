"""`stepscope diff BEFORE AFTER [-o OUT/]`: what changed between two traces (terminal summary, optional HTML)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from stepscope.commands._options import emit


@click.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write an HTML page OUT/index.html (OUT: new, empty, or an earlier diff, which is "
                   "replaced whole).")
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True,
              help="Rows of the ops/kernels tables (0: all).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of the text summary.")
def command(before: Path, after: Path, out: Path | None, top: int, as_json: bool) -> None:
    """BEFORE is the trace without your change, AFTER the one with it: median step time, GPU busy share, memory
    peak, and the ops and kernels whose time changed most (delta = after - before; negative is faster)."""
    from stepscope._io import atomic_output_dir, check_output_dir
    from stepscope.analyze import load
    from stepscope.analyze.diff import diff_traces
    from stepscope.reports.text import render

    if out is not None:
        check_output_dir(out, "diff")  # before the work, not after it
    result = diff_traces(load(before), load(after), top=top or None)
    # name each side as the user gave it: a capture run's directory says which is which, its file name
    # (vm_937.1795736888663556836.pt.trace.json.gz) does not
    result = dataclasses.replace(result, before=_named(before, result.before), after=_named(after, result.after))
    emit(render(result, "json" if as_json else "table"), None)
    if out is not None:
        from stepscope.reports.html import diff_report

        page = diff_report(result, reproduce=[f"stepscope diff {before} {after} -o {out}"])
        with atomic_output_dir(out, kind="diff") as tmp:
            (tmp / "index.html").write_text(page, encoding="utf-8")
        click.echo(f"wrote {out / 'index.html'}", err=True)


def _named(given: Path, source_name: str) -> str:
    """The trace as the user named it, with the file it resolved to where that is another name."""
    return str(given) if given.name == source_name else f"{given} ({source_name})"
