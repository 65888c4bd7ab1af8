"""stepscope: offline trace analysis for PyTorch profiler traces."""

from __future__ import annotations

import os
import sys

__version__ = "0.1.0"


def prefer_system_allocator() -> bool:
    """Have pyarrow allocate with the C library's malloc (its "system" memory pool), unless the user chose a
    pool with ARROW_DEFAULT_MEMORY_POOL. Only before pyarrow is first imported (it reads that variable once);
    returns whether it took effect. The `stepscope` command does this for every command but `capture`.

    Why: pyarrow's default pool (mimalloc in most wheels) suits ingest badly. The Parquet writer frees, in its
    own thread, the memory that the decoding threads allocated, and mimalloc hands such memory back late and
    faults in fresh pages meanwhile. The system pool (with malloc tuned to keep freed memory: see
    keep_freed_memory) makes ingest faster (README, Performance).
    """
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:  # its pool is chosen already: say which (the variable may have changed since)
        return bool(pyarrow.default_memory_pool().backend_name == "system")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"


# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3
_TOP_PAD_BYTES = 64 << 20
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest (64-bit); analyze._read.LARGE_BUFFER_BYTES counts on it
_freed_memory_kept: bool | None = None  # None: not asked yet


def keep_freed_memory() -> bool:
    """Tune glibc's malloc for ingest, process-wide: keep up to 64 MiB of freed memory at the top of its heap
    rather than hand it back to the kernel at once (M_TOP_PAD), and serve blocks of up to 32 MiB from that
    heap (M_MMAP_THRESHOLD, which setting either stops malloc from moving by itself). Returns whether it took
    effect (False where the C library is not glibc: nothing changes). Once per process; later calls only say.

    Why: ingest frees and allocates buffers of megabytes for every span and every file; with glibc's defaults
    many rounds get fresh pages from the kernel, and a page fault is dear on a virtual machine. Why not inside
    ingest: this changes how the whole process allocates, so the program decides, not a library call. The
    `stepscope` command does it at start-up for every command but `capture` (which runs the user's program
    in its own process); a script that ingests many traces through the API can call it first, likewise.
    Batch ingest's worker processes follow the process that starts them (see analyze._workers.worker_pool).
    """
    global _freed_memory_kept
    if _freed_memory_kept is None:
        _freed_memory_kept = _mallopt((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES), (_M_TOP_PAD, _TOP_PAD_BYTES))
    return _freed_memory_kept


def freed_memory_kept() -> bool:
    """Whether keep_freed_memory() has tuned this process's malloc."""
    return bool(_freed_memory_kept)


def _mallopt(*settings: tuple[int, int]) -> bool:
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no C library to load by name, or no mallopt in it
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all([mallopt(param, value) == 1 for param, value in settings])  # (mallopt returns 1 on success)
