"""Memory over time from a trace's `[memory]` instants (profile_memory=True): allocated and reserved bytes
per device (CPU too), the peak and what ran then, bytes allocated per op, blocks never freed, and which
layer's activations hold the most memory at the peak.

Two trace generations:

    today (torch >= 1.10)      args: Bytes, Total Allocated, Total Reserved, Addr, Device Id, Device Type
    2021 (kineto tb samples)   args: Bytes, Device Id, Device Type          (no totals, no Addr)

Allocated bytes are `Total Allocated` where the trace writes it, else the running sum of `Bytes` per
device from the trace's start (so a 2021 figure counts only what the window allocated: memory that was
live before profiling started is not in it). Reserved bytes exist only in today's format, and only for a
device whose `Total Reserved` is above 0 at some event: torch writes 0 for the CPU, whose allocator reserves
nothing, and that is "not recorded", not a reserve below what is allocated.

    cpu   Total Allocated 16 KiB, Total Reserved 0    ->  reserved null, reserved - allocated null (not -16 KiB)
    cuda  Total Allocated 1 GiB,  Total Reserved 2 GiB  ->  reserved 2 GiB, reserved - allocated 1 GiB

Attribution: a `[memory]` instant belongs to the innermost cpu_op enclosing it on the *same thread* (the
allocating thread; torch's own key_averages() instead credits every op on any thread whose interval holds
it: see `stepscope.analyze.ops`). Inclusive bytes add every enclosing op's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.nesting import innermost_enclosing, parent_index, sort_for_nesting, subtree_sum
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import cpu_spans, with_step

MIB = 1024 * 1024
MODULE_PREFIX = "nn.Module: "
_DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 20: "privateuse1"}
RUNNING_SUM = "running sum of Bytes from the trace's start (2021 format)"
#: what one row of `MemoryTimeline.timeline` is (its headline says so)
TIMELINE_ROWS = ("each slice at its allocated peak: the most allocated in the slice, and the reserved bytes and "
                 "reserved minus allocated at that same moment")


@dataclass(frozen=True, kw_only=True)
class MemoryTimeline:
    """Allocated/reserved over time and at the peak, per device.

    Times are offsets from the trace's first event (`*_offset_ns`).

    devices: device_name, device, events, peak_allocated_bytes, peak_offset_ns, peak_step, peak_op,
      peak_reserved_bytes, final_allocated_bytes, max_reserved_minus_allocated_bytes, unfreed_allocations,
      unfreed_bytes.
    mem_ops: name, allocations, self_device_mib, device_mib, self_cpu_mib, cpu_mib (bytes allocated, frees
      not subtracted; self = as the innermost op, inclusive = inside it). "(outside any op)" for the rest.
    never_freed: leak candidates, allocations with no later free of the same address on the same device
      (top by size): device_name, addr (hex), alloc_bytes, offset_ns, step, op.
    timeline: per device, `buckets` equal slices of the trace's memory time span, each at one moment, its
      allocated peak (`TIMELINE_ROWS`): device_name, offset_ns (slice start), allocated_bytes (the slice's
      peak), reserved_bytes and reserved_minus_allocated_bytes (then), so that a row's reserved minus its
      allocated is its third column.
    """

    memory_events: int
    totals_source: str | None  # "Total Allocated", RUNNING_SUM (2021 format), None: no events
    peak_device: str | None
    peak_allocated_bytes: int | None
    peak_offset_ns: int | None
    peak_step: int | None
    peak_op: str | None
    devices: pl.DataFrame
    mem_ops: pl.DataFrame
    never_freed: pl.DataFrame
    timeline: pl.DataFrame
    timeline_rows: str = ""  # TIMELINE_ROWS where there is a timeline: what one of its rows is
    note: str = ""  # `_format_note` and `_device_note`, each where it applies

    def empty_table_note(self, table: str) -> str | None:
        """What an empty table means where that is not "none": `never_freed` of a trace without addresses."""
        unfreed = self.devices["unfreed_allocations"] if self.devices.height else None
        if table == "never_freed" and unfreed is not None and unfreed.null_count() == len(unfreed):
            return "not recorded (the trace has no addresses)"
        return None


def _device_name() -> pl.Expr:
    kind = pl.col("device_type").replace_strict(_DEVICE_TYPE_NAMES, default="device", return_dtype=pl.String)
    gpu = pl.col("device").is_not_null() & (pl.col("device_type").fill_null(1) != 0)
    return pl.when(gpu).then(pl.format("{}:{}", kind.fill_null("cuda"), pl.col("device"))).otherwise(pl.lit("cpu"))


def memory_series(trace: Trace) -> pl.DataFrame:
    """Every [memory] instant in time order with the device's allocated (and reserved) bytes after it.

    Columns: event_id, ts_ns, pid, tid, device_name ("cpu", "cuda:0", …), device (null for CPU),
    device_type, alloc_bytes (+ allocated, - freed), addr, allocated_bytes, reserved_bytes (null in 2021
    traces, and on a device whose Total Reserved is never above 0: the CPU), reserved_minus_allocated_bytes.
    """
    mem = (
        trace.memory.filter(pl.col("ts_ns").is_not_null())
        .select("event_id", "ts_ns", "pid", "tid", "device", "device_type",
                alloc_bytes=pl.col("alloc_bytes").fill_null(0), addr="addr",
                total="total_allocated_bytes", reserved_bytes="total_reserved_bytes")
        .with_columns(device_name=_device_name())
        .sort("ts_ns", "event_id")
        .collect(engine="in-memory")
    )
    has_totals = bool(mem["total"].is_not_null().any())
    allocated = pl.col("total") if has_totals else pl.col("alloc_bytes").cum_sum().over("device_name")
    recorded = (pl.col("reserved_bytes") > 0).any().over("device_name")
    return mem.with_columns(allocated_bytes=allocated, reserved_bytes=pl.when(recorded).then("reserved_bytes")).drop(
        "total").with_columns(reserved_minus_allocated_bytes=pl.col("reserved_bytes") - pl.col("allocated_bytes"))


def _ops_with_parents(trace: Trace) -> pl.DataFrame:
    ops = sort_for_nesting(
        trace.cpu_ops.filter(pl.col("dur_ns").is_not_null() & pl.col("ts_ns").is_not_null())
        .select("event_id", "name", "pid", "tid", "ts_ns", "dur_ns").collect(engine="in-memory"))
    parent, depth = parent_index(ops)
    return ops.with_columns(parent=pl.Series(parent), depth=pl.Series(depth))


def _attributed(frames: TraceFrames) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The memory series with op_row (innermost enclosing cpu_op on the same thread), op name and step (the
    step whose CPU span holds the event, `window.cpu_spans`: allocations are made on the CPU), in the series'
    order."""
    trace = frames.trace
    series = memory_series(trace)
    ops = _ops_with_parents(trace)
    names = ops.select(op_row=pl.int_range(pl.len(), dtype=pl.Int64), op="name")
    series = series.with_columns(op_row=innermost_enclosing(ops, series)).join(
        names, on="op_row", how="left", maintain_order="left")
    stepped = with_step(series.with_row_index("_row"), cpu_spans(frames.profiler_steps), at="ts_ns")
    return stepped.sort("_row").drop("_row"), ops


def _mem_ops(series: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    allocs = series.filter(pl.col("alloc_bytes") > 0).with_columns(is_cpu=pl.col("device").is_null())
    n = ops.height
    cols: dict[str, np.ndarray] = {}
    for label, mask in (("device", ~allocs["is_cpu"]), ("cpu", allocs["is_cpu"])):
        own = np.zeros(n, dtype=np.int64)
        sel = allocs.filter(mask & allocs["op_row"].is_not_null())
        np.add.at(own, sel["op_row"].to_numpy(), sel["alloc_bytes"].to_numpy())
        cols[f"self_{label}"] = own
        cols[label] = subtree_sum(ops["parent"].to_numpy(), ops["depth"].to_numpy(), own)
    counts = np.zeros(n, dtype=np.int64)
    np.add.at(counts, allocs["op_row"].drop_nulls().to_numpy(), 1)
    per_op = ops.select("name").with_columns(
        allocations=pl.Series(counts), **{k: pl.Series(v) for k, v in cols.items()})
    outside = allocs.filter(pl.col("op_row").is_null()).select(
        name=pl.lit("(outside any op)"), allocations=pl.len().cast(pl.Int64),
        self_device=pl.col("alloc_bytes").filter(~pl.col("is_cpu")).sum(),
        device=pl.col("alloc_bytes").filter(~pl.col("is_cpu")).sum(),
        self_cpu=pl.col("alloc_bytes").filter(pl.col("is_cpu")).sum(),
        cpu=pl.col("alloc_bytes").filter(pl.col("is_cpu")).sum(),
    ).filter(pl.col("allocations") > 0)
    return (
        pl.concat([per_op, outside], how="vertical_relaxed")
        .group_by("name").agg(pl.col("allocations").sum(), *[pl.col(c).sum() / MIB for c in cols])
        .filter((pl.col("device") > 0) | (pl.col("cpu") > 0))
        .select("name", "allocations", self_device_mib="self_device", device_mib="device",
                self_cpu_mib="self_cpu", cpu_mib="cpu")
        .sort("device_mib", "cpu_mib", "name", descending=[True, True, False])
    )


def _with_free(series: pl.DataFrame) -> pl.DataFrame:
    """Each allocation with the time of the next free of its address on its device (null: never freed)."""
    nxt = (
        series.filter(pl.col("addr").is_not_null())
        .sort("device_name", "addr", "ts_ns", "event_id")
        .with_columns(next_bytes=pl.col("alloc_bytes").shift(-1).over("device_name", "addr"),
                      next_ts=pl.col("ts_ns").shift(-1).over("device_name", "addr"))
        .filter(pl.col("alloc_bytes") > 0)
    )
    # a later allocation of the same address without a free in between: the free was not recorded
    return nxt.with_columns(
        freed_ts_ns=pl.when(pl.col("next_bytes") < 0).then("next_ts"),
        never_freed=pl.col("next_bytes").is_null(),
    )


def memory_timeline(source: Source, *, buckets: int = 100, top: int | None = 20) -> MemoryTimeline:
    """Allocated/reserved over time per device, the peak (time, step, op), mem_ops, leak candidates."""
    frames = frames_of(source)
    trace = frames.trace
    series, ops = _attributed(frames)
    origin = trace.events.select(pl.col("ts_ns").min()).collect(engine="in-memory").item() or 0
    series = series.with_columns(offset_ns=pl.col("ts_ns") - origin)
    allocs = _with_free(series)
    unfreed = allocs.filter("never_freed")
    devices = (
        series.group_by("device_name").agg(
            device=pl.col("device").first(), events=pl.len(),
            peak_allocated_bytes=pl.col("allocated_bytes").max(),
            peak_offset_ns=pl.col("offset_ns").get(pl.col("allocated_bytes").arg_max()),
            peak_step=pl.col("step").get(pl.col("allocated_bytes").arg_max()),
            peak_op=pl.col("op").get(pl.col("allocated_bytes").arg_max()),
            peak_reserved_bytes=pl.col("reserved_bytes").max(),
            final_allocated_bytes=pl.col("allocated_bytes").last(),
            max_reserved_minus_allocated_bytes=pl.col("reserved_minus_allocated_bytes").max(),
            has_addr=pl.col("addr").is_not_null().any(),
        )
        .join(unfreed.group_by("device_name").agg(unfreed_allocations=pl.len(),
                                                  unfreed_bytes=pl.col("alloc_bytes").sum()),
              on="device_name", how="left", maintain_order="left")
        # without Addr (2021 format) frees cannot be matched: unknown, not zero
        .with_columns(pl.when("has_addr").then(pl.col(c).fill_null(0)).alias(c)
                      for c in ("unfreed_allocations", "unfreed_bytes"))
        .drop("has_addr")
        .sort(pl.col("device").is_null(), "device")
    )
    gpu = devices.filter(pl.col("device").is_not_null())
    best = (gpu if gpu.height else devices).sort("peak_allocated_bytes", descending=True, nulls_last=True,
                                                maintain_order=True).head(1)
    head = best.row(0, named=True) if best.height else {}
    never_freed = unfreed.sort("alloc_bytes", "offset_ns", descending=[True, False], nulls_last=True).head(
        top if top is not None else unfreed.height).select(
        "device_name", pl.col("addr").map_elements(hex, return_dtype=pl.String), "alloc_bytes", "offset_ns", "step",
        "op")  # (addresses in hex, as `snapshot` and torch's allocator write them)
    timeline = pl.DataFrame()
    if series.height:
        t0, t1 = int(series["offset_ns"][0]), int(series["offset_ns"][-1])
        width = max(1, -(-(t1 - t0 + 1) // max(1, buckets)))
        timeline = (
            series.with_columns(offset_ns=t0 + (pl.col("offset_ns") - t0) // width * width)
            .group_by("device_name", "offset_ns")
            # one moment per slice, its allocated peak (the first, on a tie), so that the columns agree
            .agg(pl.col("device").first(),
                 *[pl.col(c).sort_by("allocated_bytes", descending=True, nulls_last=True, maintain_order=True)
                   .first() for c in ("allocated_bytes", "reserved_bytes", "reserved_minus_allocated_bytes")])
            .sort(pl.col("device").is_null(), "device", "offset_ns")
            .drop("device")
        )
    work = trace.gpu.select(pl.col("device").drop_nulls().unique()).collect(engine="in-memory")["device"]
    has_totals = trace.memory.select(pl.col("total_allocated_bytes").is_not_null().any()).collect(
        engine="in-memory").item()
    notes = [_format_note(has_totals=has_totals, has_addresses=bool(series["addr"].is_not_null().any()))
             if series.height else "",
             _device_note(gpu.select("device_name", "device"), work)]  # (the GPU ids alone: no launch join)
    note = " ".join(n for n in notes if n)
    mem_ops = _mem_ops(series, ops)
    mem_ops = mem_ops.head(top) if top is not None else mem_ops
    return MemoryTimeline(
        memory_events=series.height,
        totals_source=None if series.height == 0 else "Total Allocated" if has_totals else RUNNING_SUM,
        peak_device=head.get("device_name"), peak_allocated_bytes=head.get("peak_allocated_bytes"),
        peak_offset_ns=head.get("peak_offset_ns"), peak_step=head.get("peak_step"), peak_op=head.get("peak_op"),
        devices=devices, mem_ops=mem_ops, never_freed=never_freed, timeline=timeline,
        timeline_rows=TIMELINE_ROWS if timeline.height else "", note=note,
    )


def _format_note(*, has_totals: bool, has_addresses: bool) -> str:
    """What a trace without totals or without addresses (the 2021 format: only Bytes) lets the figures mean.

        no Total Allocated  ->  allocated figures are relative to the trace's start (final allocated 0 B: as much
                                freed as allocated in the trace, not an empty device)
        no Addr             ->  frees cannot be matched: never freed is not recorded (not "none")
    """
    parts = []
    if not has_totals:
        parts.append("Allocated bytes are relative to the trace's start: it records no Total Allocated, so memory "
                     "live before profiling is not in them (they can end at or below 0).")
    if not has_addresses:
        parts.append("What was never freed is not recorded: the trace has no addresses to match frees to "
                     "allocations.")
    return " ".join(parts)


def _device_note(memory_gpus: pl.DataFrame, work_devices: pl.Series) -> str:
    """Where the [memory] events name one GPU and the trace's GPU work ran on one GPU of another number, that
    they are the same GPU: a process that saw one GPU ran on it, and ROCm numbers the GPUs a process sees from 0
    in its [memory] events while it numbers the work by the physical GPU (`meta.devices_by_id`: the MI300X traces,
    hip:0 and device 2). Empty otherwise (CUDA numbers both alike).

        memory hip:0, work on device 2  ->  "hip:0 is the GPU the trace's work ran on as device 2 (…)"
    """
    work = work_devices.drop_nulls().unique().to_list()
    if memory_gpus.height != 1 or len(work) != 1 or memory_gpus["device"][0] == work[0]:
        return ""
    return (f"{memory_gpus['device_name'][0]} is the GPU the trace's work ran on as device {work[0]}: the process saw "
            "one GPU, which ROCm numbers from 0 in [memory] events and by the physical GPU in its work")


def mem_ops(source: Source, n: int = 20) -> pl.DataFrame:
    """The n ops that allocate the most device memory (then CPU memory), in MiB: see MemoryTimeline.mem_ops."""
    series, ops = _attributed(frames_of(source))
    return _mem_ops(series, ops).head(n)


@dataclass(frozen=True, kw_only=True)
class ActivationMemory:
    """Which layer's activations hold the most memory at the peak, and what checkpointing could save.

    layers: module (the innermost `nn.Module: …` frame the allocation happened in), live_bytes (its
    allocations still live at the peak), allocations; largest first.
    """

    module_frames: int  # nn.Module frames in the trace; 0: captured without with_stack/with_modules
    device: str | None
    peak_allocated_bytes: int | None
    peak_offset_ns: int | None
    activations_bytes: int
    activations_of_peak_fraction: float | None
    largest_layer: str | None
    largest_layer_size_bytes: int
    checkpoint_saving_estimate_bytes: int
    layers: pl.DataFrame


def activation_memory(source: Source, *, timeline: MemoryTimeline | None = None) -> ActivationMemory:
    """Activations by layer at the memory peak (needs with_stack + with_modules: `nn.Module: X_n` frames).

    An activation is a block allocated inside an nn.Module frame that is still live at the peak of the
    device with the highest peak (GPU preferred). Checkpointing every layer keeps only one layer's
    activations live at a time while it is recomputed, so the estimate of what it saves is
    activations_bytes - largest_layer_size_bytes: an upper bound (the inputs kept at checkpoint boundaries and the
    recompute's temporaries are not subtracted).

        Linear_0 2 MiB, Linear_1 4 MiB live at the peak  ->  activations 6 MiB, largest Linear_1,
                                                             checkpointing saves at most 2 MiB

    `timeline`: the trace's `memory_timeline`, where the caller has it (its peak is read; any buckets and top).
    """
    frames = frames_of(source)
    trace = frames.trace
    tl = timeline if timeline is not None else memory_timeline(frames, top=1)
    device = tl.peak_device
    series = memory_series(trace)
    on_device = series.filter(pl.col("device_name") == device) if device is not None else series.clear()
    peak_ts = int(on_device["ts_ns"][on_device["allocated_bytes"].arg_max() or 0]) if on_device.height else None
    modules = sort_for_nesting(
        trace.of_kind(Kind.PYTHON_FUNCTION)
        .filter(pl.col("name").str.starts_with(MODULE_PREFIX) & pl.col("dur_ns").is_not_null())
        .select("event_id", "name", "pid", "tid", "ts_ns", "dur_ns").collect(engine="in-memory"))
    parent, _ = parent_index(modules)
    modules = modules.with_columns(parent=pl.Series(parent))
    rows = innermost_enclosing(modules, series)
    names = modules.select(module_row=pl.int_range(pl.len(), dtype=pl.Int64),
                           module=pl.col("name").str.strip_prefix(MODULE_PREFIX))
    live = pl.DataFrame(schema={"module": pl.String, "live_bytes": pl.Int64, "allocations": pl.UInt32})
    if device is not None and peak_ts is not None and modules.height:
        allocs = _with_free(series.with_columns(module_row=rows))
        live = (
            allocs.filter((pl.col("device_name") == device) & pl.col("module_row").is_not_null()
                          & (pl.col("ts_ns") <= peak_ts)
                          & (pl.col("freed_ts_ns").is_null() | (pl.col("freed_ts_ns") > peak_ts))
                          & ~(pl.col("freed_ts_ns").is_null() & ~pl.col("never_freed")))
            .join(names, on="module_row", how="left", maintain_order="left")
            .group_by("module").agg(live_bytes=pl.col("alloc_bytes").sum(), allocations=pl.len())
            .sort("live_bytes", "module", descending=[True, False])
        )
    total = int(live["live_bytes"].sum()) if live.height else 0
    largest_name: str | None = live["module"][0] if live.height else None
    largest_bytes = int(live["live_bytes"][0]) if live.height else 0
    peak = tl.peak_allocated_bytes
    return ActivationMemory(
        module_frames=modules.height, device=device, peak_allocated_bytes=peak, peak_offset_ns=tl.peak_offset_ns,
        activations_bytes=total, activations_of_peak_fraction=(total / peak) if peak else None,
        largest_layer=largest_name, largest_layer_size_bytes=largest_bytes,
        checkpoint_saving_estimate_bytes=max(0, total - largest_bytes), layers=live,
    )
