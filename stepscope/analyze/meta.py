"""`TraceMeta`: an ingested trace's meta.json, typed.

Ingest writes meta.json (see `ingest._build_meta`); this module only reads it. Every field analyses use
has a type here; the whole document stays available as `raw`, so a key this class does not name (an
ingest extra, a new top-level key) is never lost. Reading is lenient: a missing key or a value of the
wrong type becomes None (or an empty container), never an exception, because meta.json describes traces
written by many torch versions.

    >>> meta = read_meta(Path("dataset/trace=x/rank=0"))
    >>> meta.counts.events, meta.rank, [d.name for d in meta.devices]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

RankSource = Literal["distributedInfo", "file name"]


@dataclass(frozen=True, kw_only=True)
class SourceFile:
    """The raw trace file that was ingested."""

    path: str
    name: str
    size_bytes: int | None
    sha256: str
    mtime: float | None


@dataclass(frozen=True, kw_only=True)
class DeviceProperties:
    """One entry of the trace's `deviceProperties`; `properties` is the entry as Kineto wrote it."""

    id: int | None
    name: str | None
    total_memory_bytes: int | None
    num_sms: int | None
    compute_capability: str | None
    properties: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Rows written: events, flows, the `M` metadata events, and events per kind."""

    events: int
    flows: int
    metadata_events: int
    by_kind: Mapping[str, int]


@dataclass(frozen=True, kw_only=True)
class TimeRange:
    """First event start and last event end on the trace's own clock (ns); None for an empty trace."""

    first_ns: int | None
    last_ns: int | None
    span_ns: int | None


@dataclass(frozen=True, kw_only=True)
class InvalidText:
    """Strings of the trace that held bytes that are not UTF-8 (read with U+FFFD, every event kept), and the
    byte offset of the first such byte in the uncompressed JSON (None when there are none)."""

    strings: int = 0
    first_offset: int | None = None


@dataclass(frozen=True, kw_only=True)
class ProcessMeta:
    """What the `process_name` / `process_labels` / `process_sort_index` metadata events say."""

    name: str | None
    labels: str | None
    sort_index: int | None


@dataclass(frozen=True, kw_only=True)
class ThreadMeta:
    """What the `thread_name` / `thread_sort_index` metadata events say."""

    name: str | None
    sort_index: int | None


@dataclass(frozen=True, kw_only=True)
class TraceMeta:
    """meta.json of one ingested trace. `raw` is the document as read, for keys not typed here."""

    trace_id: str
    source: SourceFile
    ingest_schema_version: int | None
    ingested_at: str | None
    trace_schema_version: int | None
    trace_name: str | None
    display_time_unit: str | None
    base_time_ns: int | None
    rank: int | None
    world_size: int | None
    rank_source: RankSource | None
    distributed: Mapping[str, Any] | None  # the trace's distributedInfo, as written
    devices: tuple[DeviceProperties, ...]
    versions: Mapping[str, Any]  # cuda_runtime_version, cupti_version, torch_version, …
    profiler_options: Mapping[str, Any]  # record_shapes, profile_memory, with_stack, with_flops, with_modules
    counts: Counts
    time: TimeRange
    unknown_categories: Mapping[str, int]
    processes: Mapping[str, ProcessMeta]  # pid -> process
    threads: Mapping[str, ThreadMeta]  # "pid/tid" -> thread
    invalid_utf8: InvalidText = field(default_factory=InvalidText)
    top_level: Mapping[str, Any] = field(repr=False)  # the trace's top-level keys but deviceProperties
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, fallback_id: str = "") -> TraceMeta:
        """Type a meta.json document; `fallback_id` names the trace when the document has no trace_id."""
        source = _mapping(doc.get("source"))
        counts = _mapping(doc.get("counts"))
        span = _mapping(doc.get("time"))
        invalid = _mapping(doc.get("invalid_utf8"))
        rank_source = doc.get("rank_source")
        return cls(
            trace_id=_str(doc.get("trace_id")) or fallback_id,
            source=SourceFile(
                path=_str(source.get("path")) or "",
                name=_str(source.get("name")) or fallback_id,
                size_bytes=_int(source.get("size_bytes")),
                sha256=_str(source.get("sha256")) or "",
                mtime=_float(source.get("mtime")),
            ),
            ingest_schema_version=_int(doc.get("ingest_schema_version")),
            ingested_at=_str(doc.get("ingested_at")),
            trace_schema_version=_int(doc.get("trace_schema_version")),
            trace_name=_str(doc.get("trace_name")),
            display_time_unit=_str(doc.get("display_time_unit")),
            base_time_ns=_int(doc.get("base_time_ns")),
            rank=_int(doc.get("rank")),
            world_size=_int(doc.get("world_size")),
            rank_source="distributedInfo" if rank_source == "distributedInfo"
            else "file name" if rank_source == "file name" else None,
            distributed=doc["distributed"] if isinstance(doc.get("distributed"), Mapping) else None,
            devices=tuple(_device(d) for d in _list(doc.get("devices")) if isinstance(d, Mapping)),
            versions=_mapping(doc.get("versions")),
            profiler_options=_mapping(doc.get("profiler_options")),
            counts=Counts(
                events=_int(counts.get("events")) or 0,
                flows=_int(counts.get("flows")) or 0,
                metadata_events=_int(counts.get("metadata_events")) or 0,
                by_kind=_int_values(counts.get("by_kind")),
            ),
            time=TimeRange(first_ns=_int(span.get("first_ns")), last_ns=_int(span.get("last_ns")),
                           span_ns=_int(span.get("span_ns"))),
            unknown_categories=_int_values(doc.get("unknown_categories")),
            processes={str(pid): ProcessMeta(name=_name(p.get("name")), labels=_str(p.get("labels")),
                                             sort_index=_int(p.get("sort_index")))
                       for pid, p in _mapping(doc.get("processes")).items() if isinstance(p, Mapping)},
            threads={str(key): ThreadMeta(name=_name(t.get("name")), sort_index=_int(t.get("sort_index")))
                     for key, t in _mapping(doc.get("threads")).items() if isinstance(t, Mapping)},
            invalid_utf8=InvalidText(strings=_int(invalid.get("strings")) or 0,
                                     first_offset=_int(invalid.get("first_offset"))),
            top_level=_mapping(doc.get("top_level")),
            raw=dict(doc),
        )

    @property
    def thread_names(self) -> dict[tuple[str, str], str]:
        """(pid, tid) -> thread name, for the threads that have one."""
        out: dict[tuple[str, str], str] = {}
        for key, thread in self.threads.items():
            pid, _, tid = key.partition("/")
            if thread.name:
                out[(pid, tid)] = thread.name
        return out


def read_meta(directory: Path) -> TraceMeta:
    """Read `directory/meta.json` (an ingested trace's directory)."""
    doc = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    return TraceMeta.from_dict(doc if isinstance(doc, dict) else {}, fallback_id=directory.name)


def devices_by_id(devices: Sequence[DeviceProperties], used: Iterable[int]) -> dict[int, DeviceProperties]:
    """The listed device of each GPU id the trace's GPU work ran on (`used`): the one of the same id, or, where the
    trace lists one device and the work ran on one id, that device. A process that sees one GPU runs on it, and
    ROCm lists the devices a process sees from 0 while it numbers the work by the physical GPU (the MI300X
    traces list device 0 and ran on device 2).

        listed 0..3, used {1}  -> {1: device 1}        listed [0], used {2}  -> {2: device 0}
        listed [0], used {1, 2} -> {}                  listed [0, 1], used {2} -> {}
    """
    ids = set(used)
    by_id = {d.id: d for d in devices if d.id is not None}
    if len(devices) == 1 and len(ids) == 1 and not ids & by_id.keys():
        return {next(iter(ids)): devices[0]}
    return {i: by_id[i] for i in ids if i in by_id}


def _device(d: Mapping[str, Any]) -> DeviceProperties:
    return DeviceProperties(
        id=_int(d.get("id")),
        name=_str(d.get("name")) or None,  # ROCm may write "": no name, as when absent
        total_memory_bytes=_int(d.get("total_memory_bytes")),
        num_sms=_int(d.get("num_sms")),
        compute_capability=_str(d.get("compute_capability")),
        properties=_mapping(d.get("properties")),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _name(value: Any) -> str | None:
    """A name as text (Kineto writes strings; a number is kept as its text), None when absent or empty."""
    return str(value) if value is not None and value != "" else None


def _mapping(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int_values(value: Any) -> dict[str, int]:
    return {k: v for k, v in _mapping(value).items() if _int(v) is not None}
