"""Where the per-file work of a batch runs: here (`local`, worker processes on this machine) or as Ray tasks on a
local or remote cluster (`ray`). Ray is what ML infrastructure already runs, so we hand it the map and keep no
scheduler of our own; Ray is imported only when asked for.

    ray_map(ingest_one, [(path, dataset, False, 1, False) for path in files], address="auto", ...)
        -> each result as its task finishes; a task that died (a worker lost, an uncaught error) becomes
           on_error(args, exception) instead, so a batch reports it and goes on

On a remote cluster (`--address ray://head:10001` or `auto` on a node of it) the workers need stepscope
installed and the paths (the traces, the dataset) on storage every node sees under the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, get_args

from stepscope.errors import UsageError

Engine = Literal["local", "ray"]
ENGINES: tuple[Engine, ...] = get_args(Engine)

#: what `--address local` (or no address) means: start a Ray cluster on this machine for the command
LOCAL_ADDRESS = "local"

RAY_MISSING = "--engine ray needs Ray, which is not installed: pip install 'stepscope[ray]'"

A = TypeVar("A", bound=tuple[Any, ...])
R = TypeVar("R")


def import_ray() -> Any:
    """The `ray` module, or a one-line UsageError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise UsageError(RAY_MISSING) from exc
    return ray


@contextmanager
def ray_session(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray, connected: to the cluster already initialised in this process if there is one (left running), else
    to `address` (`auto`, `ray://host:port`, or a head node's `host:port`) or, for None / `local`, a cluster
    started here with `num_cpus` (default: every core) and stopped on exit."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    try:
        if address is None or address == LOCAL_ADDRESS:
            ray.init(num_cpus=num_cpus, **options)
        else:
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or LOCAL_ADDRESS
        raise UsageError(f"cannot start or reach a Ray cluster at {where}: {str(exc).splitlines()[0]}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_map(fn: Callable[..., R], jobs: Sequence[A], *, on_error: Callable[[A, BaseException], R],
            address: str | None = None, num_cpus: int | None = None) -> Iterator[R]:
    """`fn(*args)` for every args tuple of `jobs`, each a Ray task of one CPU, yielded as they finish (not in
    order). A task that raises, or whose worker dies (after one retry), yields `on_error(args, exception)`."""
    if not jobs:
        return
    with ray_session(address, num_cpus=num_cpus) as ray:
        remote = ray.remote(num_cpus=1, max_retries=1)(fn)
        pending = {remote.remote(*args): args for args in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                args = pending.pop(ref)
                try:
                    result: R = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost task is one failed file; the batch goes on
                    result = on_error(args, _cause(exc))
                yield result


def _cause(exc: BaseException) -> BaseException:
    """The task's own exception inside Ray's wrapper (RayTaskError keeps it as `.cause`), else Ray's own."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
