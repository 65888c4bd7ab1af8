"""Trace reading, the Parquet store and the analyses. Never imports torch.

    >>> from stepscope.analyze import load
    >>> trace = load("worker0.pt.trace.json.gz")     # ingested once into a cache, then Parquet
    >>> trace.kernels.collect()
"""

from stepscope.analyze.ingest import IngestResult, ingest_trace
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace, load

__all__ = ["IngestResult", "Kind", "Trace", "ingest_trace", "load"]
