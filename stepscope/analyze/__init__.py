"""Trace reading, the Parquet store and the analyses. Never imports torch.

    >>> from stepscope.analyze import load
    >>> trace = load("worker0.pt.trace.json.gz")     # ingested once into a cache, then Parquet
    >>> trace.kernels.collect()

The names below are imported on first use (PEP 562), so importing a submodule such as
`stepscope.analyze.schema` does not pull in the ingest machinery (polars, pyarrow, msgspec).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analyze.ingest import IngestResult, ingest_trace
    from stepscope.analyze.schema import Kind
    from stepscope.analyze.trace import Trace, load

__all__ = ["IngestResult", "Kind", "Trace", "ingest_trace", "load"]

_HOMES = {
    "IngestResult": "stepscope.analyze.ingest",
    "ingest_trace": "stepscope.analyze.ingest",
    "Kind": "stepscope.analyze.schema",
    "Trace": "stepscope.analyze.trace",
    "load": "stepscope.analyze.trace",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
