"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot` pickles): what held memory at the peak.

Formats read: the legacy bare list of segments; dicts with `segments` and `device_traces` (one list of
actions per device), with or without `time_us`, `allocator_settings`, `external_annotations`, frames.
The pickle is read by a restricted unpickler (`_unpickle.py`) and turned at once into columnar tables;
the Python objects are released as each part is converted, and frame text is interned (one row per
distinct frame), so what stays in memory is a few numeric columns.

Definitions:
- **allocated** over the trace: `alloc` adds the block size, `free_completed` subtracts it. The value at
  the trace's start is the allocated bytes at dump (active_allocated blocks) minus the trace's net change.
  **reserved**: `segment_alloc`/`segment_map` add, `segment_free`/`segment_unmap` subtract, from the
  segments' total at dump back to the start the same way.
- **peak**: the largest allocated value (the start value counts). Without a trace: allocated at dump.
- **live at the peak**: blocks allocated at or before the peak whose `free_completed` comes after it (or
  never), blocks freed after the peak whose allocation predates the recorded history, and blocks alive
  at dump that the history never mentions. Their bytes add up to the peak exactly.
- **user frame**: the innermost stack frame outside torch, Python's standard library, `<frozen …>` and
  C++ frames: where user code asked for the memory, e.g. `model.py:54 forward`.

      alloc A 100 (seq 0), alloc B 50 (1), free_completed A (3)  -> allocated 100, 150, 150, 50; peak 150
      at seq 1, live at the peak: A and B
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze._unpickle import load_plain_pickle
from stepscope.errors import SnapshotFormatError

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom")
PRE_HISTORY = "(allocated before the recorded history)"
NO_FRAME = "(no Python frame recorded)"

_NOT_USER = re.compile(
    r"([\\/]torch[\\/]|[\\/]stepscope[\\/]|^<frozen|^<string>|^\?\?$|\.(cpp|cc|h|hpp|cu)$|"
    r"[\\/]lib[\\/]python3\.\d+[\\/](?!site-packages|dist-packages)|[\\/]Lib[\\/](?!site-packages))",
)


def is_user_frame(filename: str) -> bool:
    """Whether a frame's file is the user's code (not torch, the stdlib, frozen modules or C++)."""
    return bool(filename) and _NOT_USER.search(filename) is None


@dataclass(frozen=True, kw_only=True)
class SnapshotTables:
    """A snapshot as tables. `frames` maps frame_id -> 'file:line function'."""

    source: str
    format: str
    events: pl.DataFrame
    blocks: pl.DataFrame
    segments: pl.DataFrame
    frames: pl.DataFrame
    allocator_settings: dict[str, Any]


class _Interner:
    """One id per distinct (file, line, function): frames shared by thousands of entries are stored once."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, int, str], int] = {}

    def first_user(self, frames: Any) -> int | None:
        if not frames:
            return None
        for f in frames:
            filename = str(f.get("filename", ""))
            if is_user_frame(filename):
                return self._id(filename, f.get("line"), f.get("name"))
        return None

    def forward(self, frames: Any) -> int | None:
        """The innermost user `forward` frame: which layer's forward asked for the memory."""
        if not frames:
            return None
        for f in frames:
            filename = str(f.get("filename", ""))
            if f.get("name") == "forward" and is_user_frame(filename):
                return self._id(filename, f.get("line"), "forward")
        return None

    def _id(self, filename: str, line: Any, name: Any) -> int:
        key = (filename, int(line) if isinstance(line, int) else 0, str(name))
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.ids)
        return found

    def table(self) -> pl.DataFrame:
        rows = [(i, f"{Path(f.replace(chr(92), '/')).name}:{line} {name}", f, line, name)
                for (f, line, name), i in self.ids.items()]
        return pl.DataFrame(rows, schema={"frame_id": pl.Int64, "frame": pl.String, "file": pl.String,
                                          "line": pl.Int64, "function": pl.String}, orient="row")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_snapshot(path: str | Path) -> SnapshotTables:
    """Load a snapshot pickle safely and convert it to tables, releasing the Python objects as it goes."""
    path = Path(path)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of fresh acyclic dicts: the cyclic collector would only rescan them, repeatedly
    try:
        return _read_snapshot(path)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_snapshot(path: Path) -> SnapshotTables:
    data = load_plain_pickle(path)
    traces: Any
    settings: Any
    if isinstance(data, list):
        fmt, segments, traces, settings = "legacy segment list", data, [], {}
    elif isinstance(data, dict) and ("segments" in data or "device_traces" in data):
        fmt = "snapshot dict"
        segments = data.get("segments") or []
        traces = data.get("device_traces") or []
        settings = data.get("allocator_settings") or {}
    else:
        raise SnapshotFormatError("not a CUDA memory snapshot (expected segments / device_traces)", path=path)
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise SnapshotFormatError("malformed snapshot: segments and device_traces must be lists", path=path)
    interner = _Interner()
    try:
        events = _events_table(traces, interner)
        blocks, segs = _segment_tables(segments, interner)
    except (AttributeError, TypeError) as exc:
        raise SnapshotFormatError(f"malformed snapshot entry ({exc})", path=path) from None
    del data, segments, traces
    return SnapshotTables(source=str(path), format=fmt, events=events, blocks=blocks, segments=segs,
                          frames=interner.table(),
                          allocator_settings={k: v for k, v in settings.items() if isinstance(v, (int, float, str,
                                                                                                   bool))}
                          if isinstance(settings, dict) else {})


def _events_table(traces: list[Any], interner: _Interner) -> pl.DataFrame:
    cols: dict[str, list[Any]] = {k: [] for k in ("device", "seq", "action", "addr", "size", "stream", "time_us",
                                                  "frame_id", "forward_frame_id", "device_free")}
    for device, trace in enumerate(traces):
        for seq, e in enumerate(trace or []):
            cols["device"].append(device)
            cols["seq"].append(seq)
            cols["action"].append(str(e.get("action")))
            cols["addr"].append(_int(e.get("addr")))
            cols["size"].append(_int(e.get("size")))
            cols["stream"].append(_int(e.get("stream")))
            cols["time_us"].append(_int(e.get("time_us")))
            frames = e.get("frames")
            cols["frame_id"].append(interner.first_user(frames))
            cols["forward_frame_id"].append(interner.forward(frames))
            cols["device_free"].append(_int(e.get("device_free")))
        if isinstance(trace, list):
            trace.clear()  # release this device's entries before converting the next
    return pl.DataFrame(cols, schema={"device": pl.Int64, "seq": pl.Int64, "action": pl.String, "addr": pl.Int64,
                                      "size": pl.Int64, "stream": pl.Int64, "time_us": pl.Int64,
                                      "frame_id": pl.Int64, "forward_frame_id": pl.Int64,
                                      "device_free": pl.Int64})


def _segment_tables(segments: list[Any], interner: _Interner) -> tuple[pl.DataFrame, pl.DataFrame]:
    seg_rows: list[tuple[Any, ...]] = []
    block_rows: list[tuple[Any, ...]] = []
    for s in segments:
        device = _int(s.get("device")) or 0
        address = _int(s.get("address"))
        seg_rows.append((device, address, _int(s.get("total_size")), _int(s.get("allocated_size")),
                         _int(s.get("active_size")), _int(s.get("stream")), str(s.get("segment_type", "")),
                         bool(s.get("is_expandable", False))))
        offset = address or 0
        for b in s.get("blocks") or []:
            frames = b.get("frames")
            if not frames and b.get("history"):  # older snapshots keep the allocation stack in history
                frames = (b["history"][-1] or {}).get("frames")
            size = _int(b.get("size")) or 0
            block_rows.append((device, address, _int(b.get("address")) or offset, size,
                               _int(b.get("requested_size")), str(b.get("state", "")),
                               interner.first_user(frames), interner.forward(frames)))
            offset += size
    segs = pl.DataFrame(seg_rows, schema={"device": pl.Int64, "address": pl.Int64, "total_bytes": pl.Int64,
                                          "allocated_bytes": pl.Int64, "active_bytes": pl.Int64,
                                          "stream": pl.Int64, "segment_type": pl.String,
                                          "is_expandable": pl.Boolean}, orient="row")
    blocks = pl.DataFrame(block_rows, schema={"device": pl.Int64, "segment_address": pl.Int64, "address": pl.Int64,
                                              "size": pl.Int64, "requested_size": pl.Int64, "state": pl.String,
                                              "frame_id": pl.Int64, "forward_frame_id": pl.Int64}, orient="row")
    return blocks, segs


# ----------------------------------------------------------------------------------------------- analysis


@dataclass(frozen=True, kw_only=True)
class SnapshotResult:
    """Headline figures for the busiest device, and tables for every device."""

    source: str
    format: str
    trace_entries: int
    has_history: bool
    peak_device: int | None
    peak_allocated_bytes: int
    peak_time_us: int | None
    allocated_at_dump_bytes: int
    reserved_at_dump_bytes: int
    oom_events: int
    devices: pl.DataFrame
    live_at_peak: pl.DataFrame
    largest_allocations: pl.DataFrame
    segments: pl.DataFrame
    ooms: pl.DataFrame
    timeline: pl.DataFrame


def _series(tables: SnapshotTables) -> pl.DataFrame:
    """Per trace entry: allocated and reserved bytes after it, per device (start values from the dump)."""
    at_dump = _at_dump(tables)
    ev = tables.events.with_columns(
        d_alloc=pl.when(pl.col("action") == "alloc").then(pl.col("size"))
        .when(pl.col("action") == "free_completed").then(-pl.col("size")).otherwise(0).fill_null(0),
        d_res=pl.when(pl.col("action").is_in(["segment_alloc", "segment_map"])).then(pl.col("size"))
        .when(pl.col("action").is_in(["segment_free", "segment_unmap"])).then(-pl.col("size"))
        .otherwise(0).fill_null(0),
    ).sort("device", "seq")
    ev = ev.join(at_dump, on="device", how="left").with_columns(
        pl.col("allocated_at_dump_bytes", "reserved_at_dump_bytes").fill_null(0))
    return ev.with_columns(
        allocated_bytes=pl.col("allocated_at_dump_bytes") - pl.col("d_alloc").sum().over("device")
        + pl.col("d_alloc").cum_sum().over("device"),
        reserved_bytes=pl.col("reserved_at_dump_bytes") - pl.col("d_res").sum().over("device")
        + pl.col("d_res").cum_sum().over("device"),
        start_allocated_bytes=pl.col("allocated_at_dump_bytes") - pl.col("d_alloc").sum().over("device"),
    )


def _at_dump(tables: SnapshotTables) -> pl.DataFrame:
    alloc = tables.blocks.filter(pl.col("state") == "active_allocated").group_by("device").agg(
        allocated_at_dump_bytes=pl.col("size").sum())
    reserved = tables.segments.group_by("device").agg(reserved_at_dump_bytes=pl.col("total_bytes").sum())
    return reserved.join(alloc, on="device", how="full", coalesce=True).with_columns(
        pl.col("allocated_at_dump_bytes", "reserved_at_dump_bytes").fill_null(0))


def _peaks(tables: SnapshotTables, series: pl.DataFrame) -> pl.DataFrame:
    """device, peak_allocated_bytes, peak_seq (-1 = before the first entry), peak_time_us."""
    at_dump = _at_dump(tables)
    if series.height == 0:
        return at_dump.select("device", peak_allocated_bytes="allocated_at_dump_bytes",
                              peak_seq=pl.lit(None, pl.Int64), peak_time_us=pl.lit(None, pl.Int64))
    best = series.sort("allocated_bytes", "seq", descending=[True, False]).group_by("device").first().select(
        "device", "allocated_bytes", "seq", "time_us", "start_allocated_bytes")
    with_history = best.select(
        "device",
        peak_allocated_bytes=pl.max_horizontal("allocated_bytes", "start_allocated_bytes"),
        peak_seq=pl.when(pl.col("start_allocated_bytes") > pl.col("allocated_bytes")).then(-1).otherwise("seq"),
        peak_time_us=pl.when(pl.col("start_allocated_bytes") > pl.col("allocated_bytes")).then(None)
        .otherwise("time_us"),
    )
    without = at_dump.join(with_history.select("device"), on="device", how="anti").select(
        "device", peak_allocated_bytes="allocated_at_dump_bytes", peak_seq=pl.lit(None, pl.Int64),
        peak_time_us=pl.lit(None, pl.Int64))
    return pl.concat([with_history, without]).sort("device")


def lifetimes(tables: SnapshotTables) -> pl.DataFrame:
    """alloc and free_completed entries with, on each, the seq of the next free_completed of its address.

        addr 7: alloc (seq 1), free_completed (4), alloc (6)  ->  next_free_seq 4, 4, null
    """
    ev = tables.events.filter(pl.col("action").is_in(["alloc", "free_completed"])).sort("device", "addr", "seq")
    return ev.with_columns(
        next_free_seq=pl.when(pl.col("action") == "free_completed").then(pl.col("seq"))
        .backward_fill().over("device", "addr"),
        first_action=pl.col("action").first().over("device", "addr"),
        first_seq=pl.col("seq").first().over("device", "addr"),
    )


def live_blocks_at_peak(tables: SnapshotTables, peaks: pl.DataFrame) -> pl.DataFrame:
    """One row per block alive at its device's peak: device, size, frame_id, forward_frame_id, origin."""
    ev = lifetimes(tables).join(peaks.select("device", "peak_seq"), on="device", how="left")
    in_trace = ev.filter(
        (pl.col("action") == "alloc") & (pl.col("seq") <= pl.col("peak_seq"))
        & (pl.col("next_free_seq").is_null() | (pl.col("next_free_seq") > pl.col("peak_seq")))
    ).select("device", "size", "frame_id", "forward_frame_id", origin=pl.lit("allocated in the history"))
    pre_history = ev.filter(
        (pl.col("action") == "free_completed") & (pl.col("first_action") == "free_completed")
        & (pl.col("seq") == pl.col("first_seq")) & (pl.col("seq") > pl.col("peak_seq"))
    ).select("device", "size", frame_id=pl.lit(None, pl.Int64), forward_frame_id=pl.lit(None, pl.Int64),
             origin=pl.lit(PRE_HISTORY))
    mentioned = ev.select("device", address="addr").unique()
    untouched = (
        tables.blocks.filter(pl.col("state") == "active_allocated")
        .join(mentioned, on=["device", "address"], how="anti")
        .select("device", "size", "frame_id", "forward_frame_id", origin=pl.lit("alive at dump, never in the history"))
    )
    return pl.concat([in_trace, pre_history, untouched])


def analyze_snapshot(tables: SnapshotTables, *, top: int = 15, device: int | None = None,
                     buckets: int = 200) -> SnapshotResult:
    """Peak, live blocks at the peak by user frame, largest allocations, segments, OOMs, timeline."""
    if device is not None:
        tables = SnapshotTables(
            source=tables.source, format=tables.format, frames=tables.frames,
            allocator_settings=tables.allocator_settings,
            events=tables.events.filter(pl.col("device") == device),
            blocks=tables.blocks.filter(pl.col("device") == device),
            segments=tables.segments.filter(pl.col("device") == device),
        )
    series = _series(tables)
    peaks = _peaks(tables, series)
    at_dump = _at_dump(tables)
    live = live_blocks_at_peak(tables, peaks)
    frames = tables.frames.select("frame_id", "frame")
    live_by_frame = (
        live.join(frames, on="frame_id", how="left")
        .with_columns(frame=pl.when(pl.col("origin") == PRE_HISTORY).then(pl.lit(PRE_HISTORY))
                      .otherwise(pl.col("frame").fill_null(NO_FRAME)))
        .group_by("device", "frame").agg(live_bytes=pl.col("size").sum(), blocks=pl.len())
        .join(peaks.select("device", "peak_allocated_bytes"), on="device", how="left")
        .with_columns(share_fraction=pl.col("live_bytes") / pl.col("peak_allocated_bytes"))
        .drop("peak_allocated_bytes").sort("live_bytes", descending=True)
    )
    largest = (
        lifetimes(tables).filter(pl.col("action") == "alloc").sort("size", descending=True).head(top or 1_000_000)
        .join(frames, on="frame_id", how="left")
        .select("device", size_bytes="size", time_us="time_us", frame=pl.col("frame").fill_null(NO_FRAME),
                freed=pl.col("next_free_seq").is_not_null())
    )
    segments = (
        tables.blocks.group_by("device", "segment_address").agg(
            blocks=pl.len(),
            allocated_bytes=pl.col("size").filter(pl.col("state") == "active_allocated").sum(),
            free_bytes=pl.col("size").filter(pl.col("state") == "inactive").sum(),
            largest_free_bytes=pl.col("size").filter(pl.col("state") == "inactive").max(),
        )
        .join(tables.segments.select("device", segment_address="address", total_bytes="total_bytes",
                                     segment_type="segment_type"), on=["device", "segment_address"], how="left")
        .with_columns(fragmentation_fraction=pl.when(pl.col("free_bytes") > 0)
                      .then(1 - pl.col("largest_free_bytes") / pl.col("free_bytes")).otherwise(None))
        .select("device", "segment_address", "segment_type", "total_bytes", "allocated_bytes", "free_bytes",
                "largest_free_bytes", "fragmentation_fraction", "blocks")
        .sort("total_bytes", descending=True)
    )
    ooms = series.filter(pl.col("action") == "oom").select(
        "device", "time_us", requested_bytes="size", device_free_bytes="device_free",
        allocated_bytes="allocated_bytes", reserved_bytes="reserved_bytes")
    timeline = _bucketed(series, buckets)
    devices = (
        at_dump.join(peaks, on="device", how="full", coalesce=True)
        .join(series.group_by("device").agg(trace_entries=pl.len(), peak_reserved_bytes=pl.col("reserved_bytes").max(),
                                            oom_events=(pl.col("action") == "oom").sum()),
              on="device", how="left")
        .with_columns(pl.col("trace_entries", "oom_events").fill_null(0))
        .select("device", "trace_entries", "allocated_at_dump_bytes", "reserved_at_dump_bytes",
                "peak_allocated_bytes", "peak_time_us", "peak_reserved_bytes", "oom_events")
        .sort("device")
    )
    busiest = devices.sort("peak_allocated_bytes", descending=True).head(1)
    head = busiest.row(0, named=True) if busiest.height else {}
    return SnapshotResult(
        source=tables.source,
        format=tables.format,
        trace_entries=tables.events.height,
        has_history=tables.events.height > 0,
        peak_device=head.get("device"),
        peak_allocated_bytes=int(head.get("peak_allocated_bytes") or 0),
        peak_time_us=head.get("peak_time_us"),
        allocated_at_dump_bytes=int(head.get("allocated_at_dump_bytes") or 0),
        reserved_at_dump_bytes=int(head.get("reserved_at_dump_bytes") or 0),
        oom_events=ooms.height,
        devices=devices,
        live_at_peak=live_by_frame.head(top) if top else live_by_frame,
        largest_allocations=largest,
        segments=segments.head(top) if top else segments,
        ooms=ooms,
        timeline=timeline,
    )


def _bucketed(series: pl.DataFrame, buckets: int) -> pl.DataFrame:
    """allocated/reserved per device in at most `buckets` steps (the maximum of each bucket)."""
    if series.height == 0:
        return pl.DataFrame(schema={"device": pl.Int64, "time_us": pl.Int64, "allocated_bytes": pl.Int64,
                                    "reserved_bytes": pl.Int64})
    return (
        series.with_columns(bucket=(pl.col("seq") * buckets // (pl.col("seq").max().over("device") + 1)))
        .group_by("device", "bucket").agg(time_us=pl.col("time_us").last(),
                                          allocated_bytes=pl.col("allocated_bytes").max(),
                                          reserved_bytes=pl.col("reserved_bytes").max())
        .sort("device", "bucket").drop("bucket")
    )


@dataclass(frozen=True, kw_only=True)
class ActivationEstimate:
    """Seed exercise: which layer's activations hold the most memory at the peak, and what checkpointing saves.

    Activations = blocks live at the peak whose allocation stack passes through a user `forward` (the
    layer is that innermost forward frame). Checkpointing keeps roughly one layer's activations at a
    time, so the saving is estimated as all activations minus the largest layer's (an upper bound).
    """

    peak_allocated_bytes: int
    activations_bytes: int
    activations_of_peak_fraction: float | None
    largest_layer: str | None
    largest_layer_live_bytes: int
    checkpoint_saving_estimate_bytes: int
    layers: pl.DataFrame


def activation_estimate(tables: SnapshotTables, *, device: int | None = None) -> ActivationEstimate:
    """Activations live at the peak, by the layer (forward frame) that allocated them."""
    result = analyze_snapshot(tables, device=device, top=0)
    peaks = _peaks(tables, _series(tables))
    if device is not None:
        peaks = peaks.filter(pl.col("device") == device)
    elif result.peak_device is not None:
        peaks = peaks.filter(pl.col("device") == result.peak_device)
    live = live_blocks_at_peak(tables, peaks).join(peaks.select("device"), on="device", how="semi")
    layers = (
        live.filter(pl.col("forward_frame_id").is_not_null())
        .join(tables.frames.select(forward_frame_id="frame_id", layer="frame"), on="forward_frame_id", how="left")
        .group_by("layer").agg(live_bytes=pl.col("size").sum(), blocks=pl.len())
        .sort("live_bytes", descending=True)
    )
    total = int(layers["live_bytes"].sum() or 0)
    largest = layers.row(0, named=True) if layers.height else None
    peak = result.peak_allocated_bytes
    return ActivationEstimate(
        peak_allocated_bytes=peak,
        activations_bytes=total,
        activations_of_peak_fraction=total / peak if peak else None,
        largest_layer=largest["layer"] if largest else None,
        largest_layer_live_bytes=int(largest["live_bytes"]) if largest else 0,
        checkpoint_saving_estimate_bytes=total - (int(largest["live_bytes"]) if largest else 0),
        layers=layers,
    )
