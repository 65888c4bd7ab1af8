"""Worker processes for parallel ingest, shared by batch ingest and the span decoding of one large trace."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import stepscope

_F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS tells it (a `taskset` or a
    container's cpuset), else all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def worker_context(*, fork_if_fresh: bool = False, preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """Processes for parallel ingest: a forkserver that has already imported stepscope (and so polars,
    pyarrow and msgspec), so each worker starts in milliseconds; spawn where forkserver is unavailable.

    Plain fork only with `fork_if_fresh`, only in a process the stepscope CLI owns (`own_process`, called by
    `stepscope.cli.main`), and only while it runs no thread that it did not run once stepscope's analyzer
    was imported (see mark_import_threads): no pool of polars, pyarrow or
    stepscope has started, so the workers are forked from the state the fork server forks them from (the
    allocators' and BLAS's own threads, which handle fork), without its quarter second of imports. Only
    for a process that ran nothing before importing stepscope, as the CLI's: a polars pool started before
    that import is among the import-time threads, and a forked worker would wait on it forever. (A caller
    that runs the CLI inside its own process, as click's CliRunner does, may have started such a pool before
    the analyzer was imported: it gets the fork server.)

    `preload`: more modules for the fork server to import before it forks anything (the report's figure
    modules: matplotlib imported once, not once per worker); they count only where this starts the fork
    server, which a pool started earlier in this process may have done (its workers then import them).
    """
    if fork_if_fresh and _fresh() and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:  # pragma: no cover - Windows
        return multiprocessing.get_context("spawn")
    context.set_forkserver_preload(["stepscope.analyze.dataset", *preload])
    return context


def worker_pool(max_workers: int, *, fork_if_fresh: bool = False, preload: Sequence[str] = ()) -> ProcessPoolExecutor:
    """A pool of ingest worker processes (see worker_context) whose malloc is tuned as this process's is: a
    worker forked from the fork server does not inherit it (see stepscope.keep_freed_memory)."""
    return ProcessPoolExecutor(max_workers=max_workers,
                               mp_context=worker_context(fork_if_fresh=fork_if_fresh, preload=preload),
                               initializer=_start_worker, initargs=(stepscope.freed_memory_kept(),))


def _start_worker(keep_freed_memory: bool) -> None:
    if keep_freed_memory:
        stepscope.keep_freed_memory()


def _os_threads() -> frozenset[str] | None:
    """The ids of this process's OS threads; None where they cannot be listed (not Linux)."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return None


_import_threads: frozenset[str] | None = None
_owns_process = False


def own_process() -> None:
    """Say that this process is the stepscope CLI's own (it ran nothing before stepscope): forking ingest
    workers from it is safe while it runs only its import-time threads (see worker_context)."""
    global _owns_process
    _owns_process = True


def mark_import_threads() -> None:
    """Note the threads this process runs now, once stepscope's analyzer and its libraries are imported."""
    global _import_threads
    if _import_threads is None:
        _import_threads = _os_threads()


def _fresh() -> bool:
    now = _os_threads()
    return _owns_process and now is not None and _import_threads is not None and now <= _import_threads


def widen_result_pipe(pool: ProcessPoolExecutor, size: int = 1 << 20) -> None:
    """Give the pool's result pipe `size` bytes (Linux's default unprivileged maximum) instead of 64 KiB.

    A span's tables are tens of MB, and this process reads them 64 KiB at a time, each read needing the
    GIL, which the thread decoding spans here holds for long stretches: a worker waited long for each
    result to be taken. Best effort: it reaches into the
    executor's result queue, and where that or the fcntl is not there, nothing changes.
    """
    try:
        import fcntl

        reader = pool._result_queue._reader  # type: ignore[attr-defined]
        fcntl.fcntl(reader.fileno(), _F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError):  # not Linux, another Python, or over the user's pipe quota
        return
