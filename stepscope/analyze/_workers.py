"""Worker processes for parallel ingest, shared by batch ingest and the span decoding of one large trace."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context


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
