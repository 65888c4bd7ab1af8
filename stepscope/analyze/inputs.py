"""What a path on the command line is: the one place that classifies inputs.

Discovery helpers (trace files under a directory, whether a directory is an ingested trace, a file's hash and
the trace id derived from it) live here so that ingest, the dataset, the loader and the commands share them.
This module never imports ingest.py (ingest imports it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

from stepscope.analyze.schema import INGEST_SCHEMA_VERSION
from stepscope.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_id_for(path: Path, sha256: str) -> str:
    """A stable, readable id: the file's stem (without .pt.trace.json.gz) plus 8 hex digits of its hash."""
    stem = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "trace"
    return f"{stem}-{sha256[:8]}"


def file_sha256(path: Path) -> str:
    """sha256 of the file as stored (compressed bytes for .gz)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def is_ingested(out_dir: Path, sha256: str | None = None) -> bool:
    """Whether out_dir holds a complete ingest of the current schema (of the file with this hash, if given)."""
    meta_path = out_dir / "meta.json"
    if not (meta_path.is_file() and (out_dir / "events.parquet").is_file() and (out_dir / "flows.parquet").is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("ingest_schema_version") != INGEST_SCHEMA_VERSION:
        return False
    return sha256 is None or meta.get("source", {}).get("sha256") == sha256


def find_trace_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into trace files (.json / .json.gz), sorted."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.is_file() and _looks_like_trace(q)))
        elif p.exists():
            found.append(p)
        else:
            matches = sorted(Path().glob(str(p))) if not p.is_absolute() else sorted(
                Path(p.anchor).glob(str(p.relative_to(p.anchor))))
            if not matches:
                raise InputError("no such file, directory or glob match", path=p)
            found.extend(m for m in matches if m.is_file())
    seen: set[Path] = set()
    unique = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _looks_like_trace(p: Path) -> bool:
    name = p.name
    if name.startswith(("manifest", ".")) or name == "meta.json":  # capture manifests (manifest.rank<N>.json too)
        return False
    if ".raw.json" in name or "memory_timeline" in name:
        return False
    return name.endswith(TRACE_SUFFIXES)
