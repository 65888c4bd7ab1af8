"""The --engine / --address options of the commands that map work over many traces (ingest, fleet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def engine_options(func: F) -> F:
    """--engine local|ray and --address ADDR (Ray only)."""
    func = click.option(
        "--address", metavar="ADDR", default=None,
        help="With --engine ray: the cluster (`auto`, `ray://HEAD:10001`, `HEAD:6379`); default `local`, a Ray "
             "cluster started for this command on this machine. Traces and output must be on storage every node sees.",
    )(func)
    func = click.option(
        "--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
        help="Where the per-trace work runs: processes on this machine, or Ray tasks on a cluster "
             "(pip install 'stepscope[ray]').",
    )(func)
    return func


def check_engine(engine: str, address: str | None) -> None:
    """--address belongs to --engine ray: with the local engine it is a usage error, never ignored."""
    if address is not None and engine != "ray":
        raise click.UsageError("--address names a Ray cluster: use it with --engine ray")
