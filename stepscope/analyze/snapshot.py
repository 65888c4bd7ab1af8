"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot` pickles): what held memory at the peak.

The tables come from `snapshot_read.read_snapshot`.

Definitions:
- **allocated** over the trace: `alloc` adds the block size, `free_completed` subtracts it. The value at
  the trace's start is the allocated bytes at dump (active_allocated blocks) minus the trace's net change.
  **reserved**: `segment_alloc`/`segment_map` add, `segment_free`/`segment_unmap` subtract, from the
  segments' total at dump back to the start the same way.
- **peak**: the largest allocated value (the start value counts). Without a trace: allocated at dump.
- **live at the peak**: blocks allocated at or before the peak whose `free_completed` comes after it (or
  never), blocks freed after the peak whose allocation predates the recorded history, and blocks alive
  at dump that the history never mentions. The history records requested sizes and the dump rounded
  block sizes, so one more row, the rounding of blocks alive at dump, makes them add up to the peak exactly.
- **user frame**: the frame a block is charged to (see snapshot_read).

      alloc A 100 (seq 0), alloc B 50 (1), free_completed A (3)  -> allocated 100, 150, 150, 50; peak 150
      at seq 1, live at the peak: A and B
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analyze.snapshot_read import TORCH_MODULE, SnapshotTables
from stepscope.errors import UsageError

PRE_HISTORY = "(allocated before the recorded history)"
NO_FRAME = "(no Python frame recorded)"
#: origin of a block alive at dump that the history never mentions: allocated before the history began (or before
#: its ring buffer's oldest kept entry); without a stack of its own it reads PRE_HISTORY, not NO_FRAME, on a device
#: that has a history (cs336_magma27: 227 blocks, 1 GB, once "(no Python frame recorded)")
UNTOUCHED = "alive at dump, never in the history"
ROUNDING = "(block rounding: size at dump minus the size the history recorded)"

NO_HISTORY = "no allocation history (_record_memory_history was off): peak = allocated at dump, no timeline"
ESTIMATE_RULE = ("live at peak and allocated inside a forward() (the model's own, else a torch module's); saving = all "
                 "layers but the largest (upper bound)")
#: why the saving is refused where the layers are torch's own modules
SHARED_FRAMES = ("checkpoint saving not estimated: the layers are torch's own modules (e.g. nn.TransformerEncoder), "
                 "whose instances share one forward frame, so one layer's activations cannot be told from all of its "
                 "kind; `stepscope memory TRACE --by-layer` splits them by module instance")


@dataclass(frozen=True, kw_only=True)
class SnapshotResult:
    """Headline figures for the device with the highest peak, and tables for every device.

    Times are `since_start_ns`: nanoseconds after the device's first trace entry; `trace_start_time_us` is
    that entry's `time_us` on the allocator's clock, to line the snapshot up with other records.
    """

    source: str
    format: str
    note: str | None
    trace_entries: int
    has_history: bool
    peak_device: int | None
    peak_allocated_bytes: int
    peak_since_start_ns: int | None
    trace_start_time_us: int | None
    allocated_at_dump_bytes: int
    reserved_at_dump_bytes: int
    inactive_split_at_dump_bytes: int
    largest_free_block_at_dump_bytes: int | None
    oom_events: int
    devices: pl.DataFrame
    live_at_peak: pl.DataFrame
    largest_allocations: pl.DataFrame
    segments: pl.DataFrame
    ooms: pl.DataFrame
    timeline: pl.DataFrame


def _on_device(tables: SnapshotTables, device: int | None) -> SnapshotTables:
    if device is None:
        return tables
    known = sorted(set(tables.segments["device"].to_list()) | set(tables.events["device"].unique().to_list()))
    if device not in known:
        raise UsageError(f"device {device} is not in this snapshot (devices: {', '.join(map(str, known)) or 'none'})",
                         path=tables.source)
    return SnapshotTables(
        source=tables.source, format=tables.format, frames=tables.frames, allocator_settings=tables.allocator_settings,
        events=tables.events.filter(pl.col("device") == device),
        blocks=tables.blocks.filter(pl.col("device") == device),
        segments=tables.segments.filter(pl.col("device") == device),
    )


def _alloc_delta() -> pl.Expr:
    return (pl.when(pl.col("action") == "alloc").then(pl.col("size"))
            .when(pl.col("action") == "free_completed").then(-pl.col("size")).otherwise(0).fill_null(0))


def _reserve_delta() -> pl.Expr:
    return (pl.when(pl.col("action").is_in(["segment_alloc", "segment_map"])).then(pl.col("size"))
            .when(pl.col("action").is_in(["segment_free", "segment_unmap"])).then(-pl.col("size"))
            .otherwise(0).fill_null(0))


def _by_device(per_device: pl.DataFrame, column: str) -> pl.Expr:
    """A per-device value (one row per device in `per_device`) broadcast to each row of a trace-long frame.

    Cheaper in memory than a window (`.over("device")`), which builds group indices as long as the trace.
    """
    values = dict(zip(per_device["device"].to_list(), per_device[column].to_list(), strict=True))
    dtype = per_device.schema[column]
    if len(values) == 1:
        (device, value), = values.items()
        return pl.when(pl.col("device") == device).then(pl.lit(value, dtype=dtype))
    return pl.col("device").replace_strict(values, default=None, return_dtype=dtype)


def _series(tables: SnapshotTables) -> pl.DataFrame:
    """Per trace entry: device, seq, allocated and reserved bytes after it (start values from the dump),
    nanoseconds since the device's first entry. Only these columns: it is as long as the trace.

        at dump 17 MB allocated; entries alloc 10, alloc 4, free_completed 4  (net +10)
            -> start 7; allocated after each entry 17, 21, 17

    The events are in (device, seq) order (read_snapshot builds them so), so one running sum over the whole
    column plus a per-device offset gives each device's running total.
    """
    per_device = (
        tables.events.group_by("device").agg(d_alloc=_alloc_delta().sum(), d_res=_reserve_delta().sum(),
                                             first_time_us=pl.col("time_us").min())
        .join(_at_dump(tables), on="device", how="left", maintain_order="left").sort("device")
        .with_columns(alloc_offset=pl.col("allocated_at_dump_bytes").fill_null(0) - pl.col("d_alloc").cum_sum(),
                      res_offset=pl.col("reserved_at_dump_bytes").fill_null(0) - pl.col("d_res").cum_sum())
    )
    if per_device.height == 0:
        return pl.DataFrame(schema={"device": pl.Int64, "seq": pl.Int64, "allocated_bytes": pl.Int64,
                                    "reserved_bytes": pl.Int64, "since_start_ns": pl.Int64})
    return tables.events.select(
        "device", "seq",
        allocated_bytes=_alloc_delta().cum_sum() + _by_device(per_device, "alloc_offset"),
        reserved_bytes=_reserve_delta().cum_sum() + _by_device(per_device, "res_offset"),
        since_start_ns=(pl.col("time_us") - _by_device(per_device, "first_time_us")) * 1000,
    )


def _starts(tables: SnapshotTables) -> pl.DataFrame:
    """Per device with a trace: allocated bytes before its first entry, the first entry's time_us, the
    number of entries and of OOMs."""
    return (
        tables.events.group_by("device").agg(
            d_alloc=_alloc_delta().sum(), trace_start_time_us=pl.col("time_us").min(), trace_entries=pl.len(),
            oom_events=(pl.col("action") == "oom").sum())
        .join(_at_dump(tables), on="device", how="left", maintain_order="left")
        .select("device", "trace_start_time_us", "trace_entries", "oom_events",
                start_allocated_bytes=pl.col("allocated_at_dump_bytes").fill_null(0) - pl.col("d_alloc"))
    )


def _at_dump(tables: SnapshotTables) -> pl.DataFrame:
    alloc = tables.blocks.filter(pl.col("state") == "active_allocated").group_by("device").agg(
        allocated_at_dump_bytes=pl.col("size").sum())
    reserved = tables.segments.group_by("device").agg(reserved_at_dump_bytes=pl.col("total_bytes").sum())
    return reserved.join(alloc, on="device", how="full", coalesce=True).with_columns(
        pl.col("allocated_at_dump_bytes", "reserved_at_dump_bytes").fill_null(0))


def _peaks(tables: SnapshotTables, series: pl.DataFrame) -> pl.DataFrame:
    """device, peak_allocated_bytes, peak_seq (-1: before the first entry), peak_since_start_ns, trace start.

    Ties go to the earliest entry; a device without a trace peaks at its allocated bytes at dump.
    """
    at_dump = _at_dump(tables)
    empty = {"peak_seq": pl.lit(None, pl.Int64), "peak_since_start_ns": pl.lit(None, pl.Int64),
             "trace_start_time_us": pl.lit(None, pl.Int64)}
    if series.height == 0:
        return at_dump.select("device", peak_allocated_bytes="allocated_at_dump_bytes", **empty)
    highest = series.group_by("device").agg(pl.col("allocated_bytes").max())
    best = (series.filter(pl.col("allocated_bytes") == _by_device(highest, "allocated_bytes"))
            .group_by("device").agg(pl.all().sort_by("seq").first())
            .join(_starts(tables), on="device", how="left", maintain_order="left"))
    before = pl.col("start_allocated_bytes") > pl.col("allocated_bytes")
    with_history = best.select(
        "device",
        peak_allocated_bytes=pl.max_horizontal("allocated_bytes", "start_allocated_bytes"),
        peak_seq=pl.when(before).then(-1).otherwise("seq"),
        peak_since_start_ns=pl.when(before).then(0).otherwise("since_start_ns"),
        trace_start_time_us="trace_start_time_us",
    )
    without = at_dump.join(with_history.select("device"), on="device", how="anti").select(
        "device", peak_allocated_bytes="allocated_at_dump_bytes", **empty)
    return pl.concat([with_history, without]).sort("device")


def _ooms(tables: SnapshotTables, series: pl.DataFrame) -> pl.DataFrame:
    """One row per OOM entry: when, what it asked for, what the device had free, allocated and reserved."""
    oom = tables.events.filter(pl.col("action") == "oom").select("device", "seq", "size", "device_free")
    return (
        oom.join(series.filter(pl.col("seq").is_in(oom["seq"].implode())), on=["device", "seq"], how="left",
                 maintain_order="left")
        .sort("device", "seq")
        .select("device", "since_start_ns", requested_bytes="size", device_free_bytes="device_free",
                allocated_bytes="allocated_bytes", reserved_bytes="reserved_bytes")
    )


def lifetimes(tables: SnapshotTables) -> pl.DataFrame:
    """alloc and free_completed entries, sorted by address, with the seq and time of the next free_completed
    of the same address, and the first action and seq seen for that address.

        addr 7: alloc (seq 1), free_completed (4), alloc (6)  ->  next_free_seq 4, 4, null

    One sort, then fills checked against the address they came from (no per-address windows).
    """
    ev = (tables.events.filter(pl.col("action").is_in(["alloc", "free_completed"]))
          .drop("stream", "device_free").sort("device", "addr", "seq"))
    is_free = pl.col("action") == "free_completed"
    same_address = pl.struct("device", "addr")
    starts = same_address.ne_missing(same_address.shift()).fill_null(True)

    def within(value: pl.Expr, fill: str) -> pl.Expr:
        key = pl.when(is_free).then(same_address)
        filled_key = key.backward_fill() if fill == "backward" else key.forward_fill()
        filled = value.backward_fill() if fill == "backward" else value.forward_fill()
        return pl.when(filled_key.eq_missing(same_address)).then(filled)

    return ev.with_columns(
        next_free_seq=within(pl.when(is_free).then(pl.col("seq")), "backward"),
        next_free_time_us=within(pl.when(is_free).then(pl.col("time_us")), "backward"),
        first_action=pl.when(starts).then(pl.col("action")).forward_fill(),
        first_seq=pl.when(starts).then(pl.col("seq")).forward_fill(),
        last_of_address=same_address.ne_missing(same_address.shift(-1)).fill_null(True),
    )


def live_blocks_at_peak(tables: SnapshotTables, peaks: pl.DataFrame, *,
                        life: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per block alive at its device's peak: device, size, frame_id, forward_frame_id, origin.

    Sizes are the history's (requested) sizes for blocks it allocated, the block size otherwise. `life`:
    `lifetimes(tables)` when the caller already has it.
    """
    life = lifetimes(tables) if life is None else life
    peak_seq = _by_device(peaks, "peak_seq")  # null for a device without a peak in its history: no row passes
    in_trace = life.filter(
        (pl.col("action") == "alloc") & (pl.col("seq") <= peak_seq)
        & (pl.col("next_free_seq").is_null() | (pl.col("next_free_seq") > peak_seq))
    ).select("device", "size", "frame_id", "forward_frame_id", origin=pl.lit("allocated in the history"))
    pre_history = life.filter(
        (pl.col("action") == "free_completed") & (pl.col("first_action") == "free_completed")
        & (pl.col("seq") == pl.col("first_seq")) & (pl.col("seq") > peak_seq)
    ).select("device", "size", frame_id=pl.lit(None, pl.Int64), forward_frame_id=pl.lit(None, pl.Int64),
             origin=pl.lit(PRE_HISTORY))
    alive = (tables.blocks.filter(pl.col("state") == "active_allocated")
             .join(peaks.filter(pl.col("peak_seq").is_not_null()).select("device"), on="device", how="semi"))
    mentioned = (life.filter(pl.col("addr").is_in(alive["address"].implode()))  # the history's rows for them only
                 .select("device", address="addr").unique())
    untouched = (
        tables.blocks.filter(pl.col("state") == "active_allocated")
        .join(peaks.select("device"), on="device", how="semi")
        .join(mentioned, on=["device", "address"], how="anti")
        .select("device", "size", "frame_id", "forward_frame_id", origin=pl.lit(UNTOUCHED))
    )
    return pl.concat([in_trace, pre_history, untouched])


def rounding_bytes(tables: SnapshotTables, *, life: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per device: block size at dump minus the size the history recorded, over blocks alive at dump.

    The history records requested sizes (4 B), the dump rounded block sizes (512 B); the peak definition
    (allocated at dump minus the history's net change) carries that difference, so the live blocks at the
    peak add up to the peak only together with it.
    """
    life = lifetimes(tables) if life is None else life
    last = life.filter(pl.col("last_of_address") & (pl.col("action") == "alloc")).select("device", "addr", "size")
    return (
        tables.blocks.filter(pl.col("state") == "active_allocated")
        .join(last, left_on=["device", "address"], right_on=["device", "addr"], how="inner")
        .group_by("device").agg(rounding_bytes=(pl.col("size") - pl.col("size_right")).sum())
    )


def analyze_snapshot(tables: SnapshotTables, *, top: int = 15, device: int | None = None,
                     buckets: int = 200) -> SnapshotResult:
    """Peak, live blocks at the peak by user frame, largest allocations, segments, OOMs, timeline.

    `top` rows per table (0: all); `device` keeps one device; the timeline is cut into at most `buckets`
    steps per device (the maximum of each).
    """
    tables = _on_device(tables, device)
    # One trace-long intermediate at a time: the per-entry series, then the lifetimes.
    series = _series(tables)
    peaks = _peaks(tables, series)
    ooms = _ooms(tables, series)
    reserved_peaks = series.group_by("device").agg(peak_reserved_bytes=pl.col("reserved_bytes").max())
    timeline = _bucketed(series, buckets)
    del series
    frames = tables.frames.select("frame_id", "frame")
    life = lifetimes(tables)
    live_by_frame = _live_by_frame(tables, peaks, life, frames)
    allocs = life.filter(pl.col("action") == "alloc")
    del life
    largest = _largest_allocations(allocs, peaks, frames, top)
    del allocs
    segments = _segment_summary(tables)
    devices = _devices(tables, peaks, reserved_peaks)
    busiest = devices.sort("peak_allocated_bytes", "device", descending=[True, False]).head(1)
    head = busiest.row(0, named=True) if busiest.height else {}
    dev_segments = segments.filter(pl.col("device") == head["device"]) if head else segments.clear()
    largest_free = dev_segments["largest_free_bytes"].max()
    return SnapshotResult(
        source=tables.source,
        format=tables.format,
        note=None if tables.events.height else NO_HISTORY,
        trace_entries=tables.events.height,
        has_history=tables.events.height > 0,
        peak_device=head.get("device"),
        peak_allocated_bytes=int(head.get("peak_allocated_bytes") or 0),
        peak_since_start_ns=head.get("peak_since_start_ns"),
        trace_start_time_us=head.get("trace_start_time_us"),
        allocated_at_dump_bytes=int(head.get("allocated_at_dump_bytes") or 0),
        reserved_at_dump_bytes=int(head.get("reserved_at_dump_bytes") or 0),
        inactive_split_at_dump_bytes=int(dev_segments["inactive_split_bytes"].sum() or 0),
        largest_free_block_at_dump_bytes=int(largest_free) if isinstance(largest_free, int) else None,
        oom_events=ooms.height,
        devices=devices,
        live_at_peak=live_by_frame.head(top) if top else live_by_frame,
        largest_allocations=largest,
        segments=segments.head(top) if top else segments,
        ooms=ooms,
        timeline=timeline,
    )


def _live_by_frame(tables: SnapshotTables, peaks: pl.DataFrame, life: pl.DataFrame,
                   frames: pl.DataFrame) -> pl.DataFrame:
    """Bytes and blocks live at each device's peak by frame, with the rounding row, largest first."""
    live_by_frame = (
        live_blocks_at_peak(tables, peaks, life=life).join(frames, on="frame_id", how="left", maintain_order="left")
        .with_columns(frame=pl.when((pl.col("origin") == PRE_HISTORY)
                                    | ((pl.col("origin") == UNTOUCHED) & pl.col("frame").is_null()
                                       & pl.col("device").is_in(tables.events["device"].unique().implode())))
                      .then(pl.lit(PRE_HISTORY)).otherwise(pl.col("frame").fill_null(NO_FRAME)))
        .group_by("device", "frame").agg(live_bytes=pl.col("size").sum(), blocks=pl.len())
    )
    rounding = (
        rounding_bytes(tables, life=life)
        .join(peaks.filter(pl.col("peak_seq").is_not_null()).select("device"), on="device")
        .filter(pl.col("rounding_bytes") != 0)
        .select("device", frame=pl.lit(ROUNDING), live_bytes="rounding_bytes", blocks=pl.lit(None, pl.UInt32))
    )
    return (
        pl.concat([live_by_frame, rounding])
        .join(peaks.select("device", "peak_allocated_bytes"), on="device", how="left", maintain_order="left")
        .with_columns(share_fraction=pl.col("live_bytes") / pl.col("peak_allocated_bytes"))
        .drop("peak_allocated_bytes").sort("live_bytes", "frame", descending=[True, False])
    )


def _largest_allocations(allocs: pl.DataFrame, peaks: pl.DataFrame, frames: pl.DataFrame,
                         top: int) -> pl.DataFrame:
    """The `top` largest allocations (0: all) of the history: size, when, how long they lived, their frame."""
    starts = peaks.select("device", "trace_start_time_us")
    allocs = allocs.top_k(top, by=["size", "seq"], reverse=[False, True]) if top else allocs
    return (
        allocs.sort("size", "seq", descending=[True, False]).join(frames, on="frame_id", how="left",
                                                                  maintain_order="left")
        .join(starts, on="device", how="left", maintain_order="left")
        .select("device", size_bytes="size",
                since_start_ns=(pl.col("time_us") - pl.col("trace_start_time_us")) * 1000,
                lifetime_ns=(pl.col("next_free_time_us") - pl.col("time_us")) * 1000,
                freed=pl.col("next_free_seq").is_not_null(), frame=pl.col("frame").fill_null(NO_FRAME))
    )


def _devices(tables: SnapshotTables, peaks: pl.DataFrame, reserved_peaks: pl.DataFrame) -> pl.DataFrame:
    """One row per device: trace entries, start, at dump, peaks and OOMs."""
    return (
        _at_dump(tables).join(peaks, on="device", how="full", coalesce=True)
        .join(_starts(tables).select("device", "trace_entries", "oom_events").join(reserved_peaks, on="device"),
              on="device", how="left", maintain_order="left")
        .with_columns(pl.col("trace_entries", "oom_events").fill_null(0),
                      pl.col("peak_reserved_bytes").fill_null(pl.col("reserved_at_dump_bytes")))
        .select("device", "trace_entries", "trace_start_time_us", "allocated_at_dump_bytes", "reserved_at_dump_bytes",
                "peak_allocated_bytes", "peak_since_start_ns", "peak_reserved_bytes", "oom_events")
        .sort("device")
    )


def _segment_summary(tables: SnapshotTables) -> pl.DataFrame:
    """Per segment at dump: sizes, free bytes, the split part of them, the largest free block, fragmentation.

    `inactive_split_bytes`: free blocks in a segment that also holds other blocks (what empty_cache() cannot
    return); `fragmentation_fraction` = 1 - largest free block / free bytes (0: all free bytes in one block).

        blocks 3 MB allocated, 1 MB free, 2 MB free  ->  free 3 MB, split 3 MB, largest 2 MB, fragmentation 1/3
    """
    inactive = pl.col("state") == "inactive"
    return (
        tables.blocks.group_by("device", "segment_address").agg(
            blocks=pl.len(),
            free_bytes=pl.col("size").filter(inactive).sum(),
            largest_free_bytes=pl.col("size").filter(inactive).max(),
        )
        .join(tables.segments.select("device", "segment_type", "total_bytes", "allocated_bytes", "active_bytes",
                                     segment_address="address"), on=["device", "segment_address"], how="full",
              coalesce=True)
        .with_columns(
            pl.col("blocks", "free_bytes").fill_null(0),
            inactive_split_bytes=pl.when(pl.col("blocks") > 1).then(pl.col("free_bytes")).otherwise(0),
            fragmentation_fraction=pl.when(pl.col("free_bytes") > 0)
            .then(1 - pl.col("largest_free_bytes") / pl.col("free_bytes")).otherwise(None),
        )
        .sort("free_bytes", "total_bytes", "segment_address", descending=[True, True, False])
        .with_columns(segment_address=pl.col("segment_address").map_elements(hex, return_dtype=pl.String))
        .select("device", "segment_address", "segment_type", "total_bytes", "allocated_bytes", "active_bytes",
                "free_bytes", "inactive_split_bytes", "largest_free_bytes", "fragmentation_fraction", "blocks")
    )


def _bucketed(series: pl.DataFrame, buckets: int) -> pl.DataFrame:
    """allocated/reserved per device in at most `buckets` steps (the maximum of each bucket)."""
    if series.height == 0:
        return pl.DataFrame(schema={"device": pl.Int64, "since_start_ns": pl.Int64, "allocated_bytes": pl.Int64,
                                    "reserved_bytes": pl.Int64})
    last_seq = series.group_by("device").agg(pl.col("seq").max())
    return (
        series.with_columns(bucket=(pl.col("seq") * buckets // (_by_device(last_seq, "seq") + 1)))
        .group_by("device", "bucket").agg(since_start_ns=pl.col("since_start_ns").last(),
                                          allocated_bytes=pl.col("allocated_bytes").max(),
                                          reserved_bytes=pl.col("reserved_bytes").max())
        .sort("device", "bucket").drop("bucket")
    )


@dataclass(frozen=True, kw_only=True)
class ActivationEstimate:
    """Seed exercise: which layer's activations hold the most memory at the peak, and what checkpointing saves.

    Rule: an *activation* is a block live at the peak whose allocation stack passes through a `forward`
    method outside torch (the user's or a library's module, e.g. `model.py:39 forward`), else, for a model built
    of torch's own modules (nn.TransformerEncoder), through one of theirs (`torch/nn/modules/activation.py:1275
    forward`); its *layer* is the innermost such frame. Activation checkpointing keeps about one layer's
    activations alive at a time and recomputes the rest in backward, so the saving is estimated as all
    activations minus the largest layer's: an upper bound (it ignores the layer inputs that checkpointing
    keeps). Where a layer is a torch module's frame, every instance of that module shares it (two encoder
    layers, one frame), so the saving is refused (None, `note` says why) rather than understated.
    """

    rule: str
    peak_device: int | None
    peak_allocated_bytes: int
    activations_bytes: int
    activations_of_peak_fraction: float | None
    largest_layer: str | None
    largest_layer_activations_bytes: int
    checkpoint_saving_estimate_bytes: int | None
    note: str | None
    layers: pl.DataFrame


def _layer_name() -> pl.Expr:
    """A forward frame as a layer: `model.py:54 forward`, and a torch module's by its path from torch/
    (`torch/nn/modules/activation.py:1275 forward`: torch's MultiheadAttention, not a file of the user's)."""
    path = pl.col("file").str.replace_all("\\\\", "/").str.extract(r"(torch/nn/.*)$")
    return (pl.when(pl.col("file").str.contains(TORCH_MODULE.pattern))
            .then(pl.format("{}:{} {}", path, pl.col("line"), pl.col("function"))).otherwise(pl.col("frame")))


def activation_estimate(tables: SnapshotTables, *, device: int | None = None) -> ActivationEstimate:
    """Activations live at the peak, by the layer (forward frame) that allocated them; see ActivationEstimate.

        live at peak: 10 MB weights (no forward frame), 4 MB via model.py:54 forward, 6 MB via model.py:60 forward
            -> activations 10 MB, largest layer model.py:60 forward (6 MB), checkpoint saving estimate 4 MB
    """
    tables = _on_device(tables, device)
    peaks = _peaks(tables, _series(tables)).sort("peak_allocated_bytes", "device", descending=[True, False]).head(1)
    layers = (
        live_blocks_at_peak(tables, peaks).filter(pl.col("forward_frame_id").is_not_null())
        .join(tables.frames.select(forward_frame_id="frame_id", layer=_layer_name()), on="forward_frame_id",
              how="left", maintain_order="left")
        .group_by("layer").agg(activations_bytes=pl.col("size").sum(), blocks=pl.len())
        .sort("activations_bytes", "layer", descending=[True, False])
    )
    total = int(layers["activations_bytes"].sum() or 0)
    shared = bool(layers["layer"].str.starts_with("torch/").any()) if layers.height else False
    largest = layers.row(0, named=True) if layers.height else None
    largest_bytes = int(largest["activations_bytes"]) if largest else 0
    peak = int(peaks["peak_allocated_bytes"][0]) if peaks.height else 0
    return ActivationEstimate(
        rule=ESTIMATE_RULE,
        peak_device=int(peaks["device"][0]) if peaks.height else None,
        peak_allocated_bytes=peak,
        activations_bytes=total,
        activations_of_peak_fraction=total / peak if peak else None,
        largest_layer=largest["layer"] if largest else None,
        largest_layer_activations_bytes=largest_bytes,
        checkpoint_saving_estimate_bytes=None if shared else total - largest_bytes,
        note=SHARED_FRAMES if shared else None,
        layers=layers,
    )
