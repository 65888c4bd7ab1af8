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
    faults in fresh pages meanwhile. With the system pool (whose malloc ingest already tunes to keep freed
    memory: see analyze.ingest.keep_freed_memory) df_index's ingest is 13% faster in paired runs, and the
    corpus batch on 2 cores 4% faster.
    """
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:  # its pool is chosen already: say which (the variable may have changed since)
        return bool(pyarrow.default_memory_pool().backend_name == "system")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"
