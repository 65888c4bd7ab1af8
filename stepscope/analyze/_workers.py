"""Worker processes for parallel ingest, shared by batch ingest and the span decoding of one large trace."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import stepscope

_F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity

A = TypeVar("A", bound=tuple[Any, ...])
R = TypeVar("R")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS tells it (a `taskset` or a
    container's cpuset), else all the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


#: where a Linux container's memory limit is written (cgroup v2, then v1); "max" or a huge number where none is set
CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory() -> int | None:
    """The memory this process may use in bytes: the machine's physical memory where the OS tells it, or a Linux
    container's limit where that is lower (as `usable_cores` takes a container's cpuset); None where unknown."""
    try:
        memory = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - no sysconf (Windows), or no such name
        return None
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path, encoding="ascii") as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            memory = min(memory, int(limit))
        break
    return memory


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
    # last: its exit handler then runs before those of every module preloaded (see _fork_server)
    context.set_forkserver_preload(["stepscope.analyze.dataset", *preload, "stepscope.analyze._fork_server"])
    return context


def start_fork_server(preload: Sequence[str] = ()) -> None:
    """Start the fork server now, with `preload` (see worker_context), so that its imports run beside this
    process's own work instead of before the first worker this process asks for. Starting it runs no thread
    here (a process is spawned, which then imports on its own), so a process that may still fork its workers
    stays fresh. Nothing where the fork server runs already or is unavailable (the pools then start as before)."""
    context = worker_context(preload=preload)
    if context.get_start_method() != "forkserver":  # pragma: no cover - Windows
        return
    from multiprocessing import forkserver

    forkserver.ensure_running()


def worker_pool(max_workers: int, *, fork_if_fresh: bool = False, preload: Sequence[str] = ()) -> ProcessPoolExecutor:
    """A pool of ingest worker processes (see worker_context) whose malloc is tuned as this process's is: a
    worker forked from the fork server does not inherit it (see stepscope.keep_freed_memory)."""
    return ProcessPoolExecutor(max_workers=max_workers,
                               mp_context=worker_context(fork_if_fresh=fork_if_fresh, preload=preload),
                               initializer=_start_worker, initargs=(stepscope.freed_memory_kept(),))


def surviving_map(fn: Callable[..., R], jobs: Sequence[A], *, processes: int, lost: Callable[[A, str], R],
                  here: Callable[[A], R] | None = None, fork_if_fresh: bool = False, ahead: int = 2) -> Iterator[R]:
    """`fn(*args)` for every args tuple of `jobs`, on `processes` worker processes, yielded as each finishes (in
    no set order), `ahead` jobs per worker in flight; given `here`, this process takes the next job itself
    whenever none has finished (`here(args)`), so a short batch never waits for the workers to start.

    A worker that dies (the out-of-memory killer, a crash) breaks the pool: every job in flight on it fails. Each
    of those is then run again alone, in a fresh worker of its own, so the job that kills its worker is found:
    it yields `lost(args, how)` (how: "its worker process was killed by SIGKILL …") and the others their results;
    the jobs not yet started go on in a new pool. A batch loses only the file that killed its worker."""
    queue: deque[A] = deque(jobs)
    while queue:
        suspects: list[A] = []
        broken = False  # the pool broke before a job could be handed to it (a worker died meanwhile)
        with worker_pool(processes, fork_if_fresh=fork_if_fresh) as pool:
            pending: dict[Future[R], A] = {}
            while queue or pending:
                while not suspects and not broken and queue and len(pending) < ahead * processes:
                    args = queue.popleft()
                    try:
                        pending[pool.submit(fn, *args)] = args
                    except BrokenProcessPool:  # not started: it goes to the next pool, with the rest
                        queue.appendleft(args)
                        broken = True
                taking = here is not None and bool(queue) and not suspects and not broken
                if taking:
                    assert here is not None
                    yield here(queue.popleft())
                if not pending:  # (broken with nothing in flight: on to a new pool)
                    break
                done, _ = wait(pending, timeout=0 if taking and queue else None, return_when=FIRST_COMPLETED)
                for fut in done:
                    args = pending.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        suspects.append(args)
                        continue
                    yield result
                if suspects and not pending:
                    break
        for args in suspects:
            yield _alone(fn, args, lost)


def _alone(fn: Callable[..., R], args: A, lost: Callable[[A, str], R]) -> R:
    """fn(*args) in a worker process of its own; `lost(args, how)` where that worker dies."""
    with worker_pool(1) as solo:
        fut = solo.submit(fn, *args)
        try:
            return fut.result()
        except BrokenProcessPool:
            workers = pool_processes(solo)
    return lost(args, broken_how(workers))


def pool_processes(pool: ProcessPoolExecutor) -> list[multiprocessing.process.BaseProcess]:
    """The pool's worker processes (best effort: the executor keeps them privately). Read their exit codes
    (broken_how) once the pool is shut down: the executor joins them from its own thread, and a second thread
    reading a fork server worker's exit status at the same time can read none (it then says 255)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def broken_how(workers: Sequence[multiprocessing.process.BaseProcess], whose: str = "its") -> str:
    """died_how for the first of a broken pool's workers that died (`pool_processes`, the pool shut down): the
    executor ended the others with SIGTERM."""
    codes = [w.exitcode for w in workers]
    dead = [c for c in codes if c not in (None, 0, -signal.SIGTERM)] or codes
    return died_how(dead[0] if dead else None, whose)


def died_how(exitcode: int | None, whose: str = "its") -> str:
    """What happened to a worker process that ended with `exitcode` (negative: the signal that killed it), as
    "<whose> worker process was killed by SIGKILL (…)"."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (what the out-of-memory killer sends: try fewer --jobs, or more memory)" if name == "SIGKILL" else ""
        return f"{whose} worker process was killed by {name}{why}"
    if exitcode:
        return f"{whose} worker process exited with status {exitcode}"
    return f"{whose} worker process died"


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
