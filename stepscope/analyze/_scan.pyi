"""Types of the compiled fast path of ingest (_scan.c)."""

from mmap import mmap
from typing import Any

def scan_events(document: bytes | bytearray | memoryview | mmap, keys: tuple[bytes, ...], types: bytes,
                start: int = ..., end: int = ..., /) -> tuple[Any, ...] | None:
    """Column buffers of a span of traceEvents, or None where the Python path must read it (see _scan.c)."""

def nest(start: Any, end: Any, new_thread: Any, parent: Any, depth: Any, /) -> None:
    """Each event's parent row (-1: none) and depth into `parent` and `depth` (nesting.parent_index)."""

def collapse(parent: Any, names: Any, lifted: Any, out_parent: Any, removed: Any, out_lifted: Any, depth: Any,
             /) -> None:
    """torch's _remove_dup_nodes (nesting.collapse_repeated), its results into the four writable arrays."""

def replay(order: Any, ptr: Any, src: Any, weight: Any, row: Any, t: Any, via: Any, /) -> None:
    """depgraph.replay's walk, in place on `t` (node times) and `via` (the in-edge row that set each node)."""

def walk(via: Any, src: Any, t: Any, starts: Any, ends: Any, counts: Any, heads: Any, rows: Any = ..., /) -> None:
    """critical_path.walk_paths: without rows each window's counts and heads, with rows its paths' edge rows."""

class FileShrank(OSError):
    """A guarded mapping's file was cut short (SIGBUS) while scan_events read it."""

def guard(mapping: mmap, path: bytes, /) -> int:
    """Guard the mapping's address range (see _scan.c); the handle for unguard, -1 where not guarded."""

def unguard(handle: int, /) -> None:
    """The mapping is no longer guarded (call before it is closed)."""
