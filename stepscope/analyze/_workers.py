"""Worker processes for parallel ingest, shared by batch ingest and the span decoding of one large trace."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from concurrent.futures import ProcessPoolExecutor

_F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity


def worker_context() -> multiprocessing.context.BaseContext:
    """Processes for parallel ingest: a forkserver that has already imported stepscope (and so polars,
    pyarrow and msgspec), so each worker starts in milliseconds; spawn where forkserver is unavailable.
    Never plain fork: polars and pyarrow keep thread pools that must not be forked mid-use."""
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:  # pragma: no cover - Windows
        return multiprocessing.get_context("spawn")
    context.set_forkserver_preload(["stepscope.analyze.dataset"])
    return context


def widen_result_pipe(pool: ProcessPoolExecutor, size: int = 1 << 20) -> None:
    """Give the pool's result pipe `size` bytes (Linux's default unprivileged maximum) instead of 64 KiB.

    A span's tables are tens of MB, and this process reads them 64 KiB at a time, each read needing the
    GIL, which the thread decoding spans here holds for long stretches: a worker waited about 0.1 s per
    result to hand it over (a tenth of its time on the 608 MB trace). Best effort: it reaches into the
    executor's result queue, and where that or the fcntl is not there, nothing changes.
    """
    try:
        import fcntl

        reader = pool._result_queue._reader  # type: ignore[attr-defined]
        fcntl.fcntl(reader.fileno(), _F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError):  # not Linux, another Python, or over the user's pipe quota
        return
