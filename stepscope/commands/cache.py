"""`stepscope cache info|prune|clear`: the cache of traces ingested on the fly (analyze/cache.py)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from stepscope.analyze.cache import PruneResult

_DIR_HELP = "The cache directory (default: $XDG_CACHE_HOME/stepscope or ~/.cache/stepscope)."


def _when(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(n: int | None) -> str:
    if n is None:
        return "no limit"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@click.group("cache")
def command() -> None:
    """The trace cache: raw traces that commands ingest on the fly, keyed by content, least recently used
    evicted beyond the limit ($STEPSCOPE_CACHE_MAX, e.g. 20G; 0 for none; default 10G)."""


@command.command("info")
@click.option("--dir", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None, help=_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def info(cache_dir: Path | None, as_json: bool) -> None:
    """Where the cache is, how many traces and bytes it holds (mirrored URL inputs included), and its oldest and
    newest use."""
    from stepscope.analyze.cache import cache_info
    from stepscope.errors import InputError

    if cache_dir is not None and not cache_dir.is_dir():  # (a typo would read as an empty cache)
        raise InputError("no such directory: no cache there", path=cache_dir)
    found = cache_info(cache_dir)
    doc = {"location": str(found.location), "entries": len(found.entries), "bytes": found.total_bytes,
           "mirrored_files": len(found.mirrors), "mirrored_bytes": found.mirror_bytes,
           "max_bytes": found.max_bytes, "oldest_use": _when(found.oldest_use_s),
           "newest_use": _when(found.newest_use_s)}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"location:   {doc['location']}\n"
               f"entries:    {doc['entries']}\n"
               f"mirrored:   {len(found.mirrors)} files of URL inputs ({_size(found.mirror_bytes)})\n"
               f"size:       {_size(found.total_bytes)} (limit: {_size(found.max_bytes)})\n"
               f"oldest use: {doc['oldest_use'] or '-'}\n"
               f"newest use: {doc['newest_use'] or '-'}")


def _report(result: PruneResult, as_json: bool) -> None:
    if as_json:
        doc = {**asdict(result), "location": str(result.location)}
        click.echo(json.dumps(doc, indent=2))
        return
    busy = f"; {result.in_use} in use by another process, kept" if result.in_use else ""
    click.echo(f"{result.location}: removed {result.removed} ({_size(result.removed_bytes)}), kept {result.kept} "
               f"({_size(result.kept_bytes)}){busy}")


@command.command("prune")
@click.option("--max-size", "max_size", metavar="SIZE", default=None,
              help="Evict least recently used traces down to SIZE (e.g. 5G; 0 evicts every one, unlike "
                   "STEPSCOPE_CACHE_MAX=0, which means no limit; default: the cache's limit).")
@click.option("--dir", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None, help=_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def prune_command(max_size: str | None, cache_dir: Path | None, as_json: bool) -> None:
    """Evict least recently used traces until the cache fits its limit (or --max-size); a trace another
    process is reading or writing is never removed."""
    from stepscope.analyze.cache import max_cache_bytes, parse_size, prune

    limit = parse_size(max_size) if max_size is not None else max_cache_bytes()
    if limit is None:
        click.echo("the cache has no size limit (STEPSCOPE_CACHE_MAX=0): nothing to prune; use --max-size", err=True)
        return
    _report(prune(cache_dir, limit), as_json)


@command.command("clear")
@click.option("--dir", "cache_dir", type=click.Path(file_okay=False, path_type=Path), default=None, help=_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def clear(cache_dir: Path | None, as_json: bool) -> None:
    """Remove every cached trace (but those another process is using) and every mirrored URL input."""
    from stepscope.analyze.cache import prune

    _report(prune(cache_dir, 0), as_json)
