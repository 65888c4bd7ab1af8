"""meta.json: what ingest records about a trace besides its tables (source, rank, devices, versions, counts).

`Totals` gathers the spans' figures as their tables are written; `build_meta` adds the top-level keys of
the document and the source file's identity.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from stepscope.analyze._columns import ChunkTables
from stepscope.analyze.schema import INGEST_SCHEMA_VERSION

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_OPTION_KEYS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
                 "hip_driver_version", "roctracer_version", "torch_version")
#: categories kept as kind `other` without a warning: the profiler's own, and "stepscope", the tracks
#: `stepscope export` adds (reports/perfetto.py), which no analysis reads
_KNOWN_CATEGORIES = {"Trace", "overhead", "cpu_instant_event", "cuda_profiler_range", "stepscope"}


@dataclass
class Totals:
    """What meta.json says about all the spans together."""

    n_input: int = 0
    n_events: int = 0
    n_flows: int = 0
    kind_counts: Counter[str] = field(default_factory=Counter)
    metadata_events: list[dict[str, Any]] = field(default_factory=list)
    ts_min: int | None = None
    end_max: int | None = None
    unknown_categories: Counter[str] = field(default_factory=Counter)
    invalid_strings: int = 0  # strings holding bytes that are not UTF-8 (read with U+FFFD)
    first_invalid: int | None = None  # the offset of the first such byte in the (uncompressed) JSON

    def add(self, chunk: ChunkTables) -> None:
        self.n_input += chunk.n_input
        self.n_events += chunk.events.num_rows
        self.n_flows += chunk.flows.num_rows
        self.kind_counts.update(chunk.kind_counts)
        self.metadata_events.extend(chunk.metadata)
        if chunk.ts_min_ns is not None:
            self.ts_min = chunk.ts_min_ns if self.ts_min is None else min(self.ts_min, chunk.ts_min_ns)
        if chunk.end_max_ns is not None:
            self.end_max = chunk.end_max_ns if self.end_max is None else max(self.end_max, chunk.end_max_ns)
        self.unknown_categories.update(chunk.unknown_categories)
        self.add_invalid(chunk.invalid_strings, chunk.first_invalid)

    def add_invalid(self, strings: int, first: int | None) -> None:
        """Count `strings` more strings with bytes that are not UTF-8, the first at offset `first`."""
        self.invalid_strings += strings
        if first is not None:
            self.first_invalid = first if self.first_invalid is None else min(self.first_invalid, first)


def build_meta(*, path: Path, sha: str, trace_id: str, top: dict[str, Any], totals: Totals,
               extra: dict[str, Any]) -> dict[str, Any]:
    """The content of meta.json for the trace file `path` (hash `sha`), its top-level keys `top` and the
    spans' `totals`; `extra` keys are added as they are."""
    processes, threads = _processes_and_threads(totals.metadata_events)
    rank, world_size, rank_source = _rank(top, path)
    base_time = top.get("baseTimeNanoseconds")
    return {
        "ingest_schema_version": INGEST_SCHEMA_VERSION,
        "trace_id": trace_id,
        "source": {"path": str(path.resolve()), "name": path.name, "size_bytes": path.stat().st_size,
                   "sha256": sha, "mtime": path.stat().st_mtime},
        "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trace_schema_version": top.get("schemaVersion"),
        "trace_name": top.get("traceName"),
        "display_time_unit": top.get("displayTimeUnit"),
        "base_time_ns": base_time if isinstance(base_time, int) else None,
        "rank": rank,
        "world_size": world_size,
        "rank_source": rank_source,
        "distributed": _jsonable(top.get("distributedInfo")),
        "devices": _jsonable(_device_properties(top)),
        "versions": {k: top[k] for k in _VERSION_KEYS if k in top},
        "profiler_options": {k: top[k] for k in _OPTION_KEYS if k in top},
        "counts": {"events": totals.n_events, "flows": totals.n_flows, "metadata_events": len(totals.metadata_events),
                   "by_kind": dict(sorted(totals.kind_counts.items()))},
        "time": {"first_ns": totals.ts_min, "last_ns": totals.end_max,
                 "span_ns": (totals.end_max - totals.ts_min)
                 if totals.ts_min is not None and totals.end_max is not None else None},
        "unknown_categories": {k: v for k, v in sorted(totals.unknown_categories.items())
                               if k not in _KNOWN_CATEGORIES},
        "invalid_utf8": {"strings": totals.invalid_strings, "first_offset": totals.first_invalid},
        "processes": processes,
        "threads": threads,
        "top_level": _jsonable({k: v for k, v in top.items() if k not in ("deviceProperties",)}),
        **extra,
    }


def _processes_and_threads(metadata_events: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]],
                                                                            dict[str, dict[str, Any]]]:
    """Names, labels and sort indices from the M events: per pid, and per 'pid/tid'."""
    processes: dict[str, dict[str, Any]] = {}
    threads: dict[str, dict[str, Any]] = {}
    for m in metadata_events:
        pid = str(m.get("pid"))
        raw_args = m.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        name = m.get("name")
        if name == "process_name":
            processes.setdefault(pid, {})["name"] = args.get("name")
        elif name == "process_labels":
            processes.setdefault(pid, {})["labels"] = args.get("labels")
        elif name == "process_sort_index":
            processes.setdefault(pid, {})["sort_index"] = args.get("sort_index")
        elif name == "thread_name":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["name"] = args.get("name")
        elif name == "thread_sort_index":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["sort_index"] = args.get("sort_index")
    return processes, threads


def _device_properties(top: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for d in top.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        major, minor = d.get("computeMajor"), d.get("computeMinor")
        out.append({
            "id": d.get("id"),
            "name": d.get("name"),
            "total_memory_bytes": d.get("totalGlobalMem"),
            "num_sms": d.get("numSms"),
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "properties": d,
        })
    return out


def _rank(top: dict[str, Any], path: Path) -> tuple[int | None, int | None, str | None]:
    info = top.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        if isinstance(rank, int):
            return rank, world if isinstance(world, int) else None, "distributedInfo"
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), None, "file name"
    return None, None, None


def _jsonable(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))


def encode_meta(meta: dict[str, Any]) -> bytes:
    """meta.json's bytes, indented (msgspec: json.dumps with an indent takes its pure-Python encoder)."""
    return msgspec.json.format(msgspec.json.encode(meta, enc_hook=str), indent=1)
