"""Shared helpers for the capture tests (real CPU torch; skipped where torch is missing)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def profiler_steps(trace_path: Path) -> list[int]:
    """The N of each ProfilerStep#N in a gzip Chrome trace, read with the stdlib only."""
    doc = json.loads(gzip.decompress(trace_path.read_bytes()))
    return sorted({int(e["name"].split("#")[1]) for e in doc["traceEvents"]
                   if str(e.get("name", "")).startswith("ProfilerStep#")})


def traces(run: Path) -> list[Path]:
    return sorted(run.glob("*.pt.trace.json.gz"))


def manifest(run: Path, name: str = "manifest.json") -> dict[str, Any]:
    result: dict[str, Any] = json.loads((run / name).read_text())
    return result
