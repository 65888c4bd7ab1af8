"""Types of the compiled fast path of ingest (_scan.c)."""

from mmap import mmap
from typing import Any

def scan_events(document: bytes | bytearray | memoryview | mmap, keys: tuple[bytes, ...], types: bytes,
                start: int = ..., end: int = ..., /) -> tuple[Any, ...] | None:
    """Column buffers of a span of traceEvents, or None where the Python path must read it (see _scan.c)."""

def nest(start: Any, end: Any, new_thread: Any, parent: Any, depth: Any, /) -> None:
    """Each event's parent row (-1: none) and depth into `parent` and `depth` (nesting.parent_index)."""
