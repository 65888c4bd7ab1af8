"""The compiled extension (`_scan.c`: the scanner, nesting, the critical path's replay, mapped-file guards), or
None where it could not be built (no C compiler at install time). Each module that uses it keeps a Python path
with the same answer, and binds it as its own `_scan` (so that tests can switch one module to its Python path)."""

from __future__ import annotations

__all__ = ["scan"]

try:
    import stepscope.analyze._scan as scan
except ImportError:  # pragma: no cover - exercised only on machines without a C compiler
    scan = None  # type: ignore[assignment]
