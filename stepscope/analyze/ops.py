"""The op table: the offline equivalent of `prof.key_averages().table()`, from the exported trace alone.

It follows torch's own rules (torch/autograd/profiler_util.py and profiler.py, `_parse_kineto_results`):

- Rows are every CPU-thread event (cpu_op, user_annotation, python_function, CUDA runtime and driver
  calls) plus every device event (kernel, memcpy, memset, gpu_user_annotation), grouped by name and kind
  (and by input shapes with `group_by_shape`). torch drops a few utility ops before anything else
  (`FILTERED_NAMES`); so do we. Like torch, every `ProfilerStep#N` is named `ProfilerStep*`
  (`blame.step_row_name`), so the steps are one row whose calls are the steps.
- Nesting is per thread (`stepscope.analyze.nesting`): self CPU = duration minus the durations of the
  direct children, where children are *all* CPU-thread events above: python_function frames and runtime
  calls are children too (with_stack=True lowers the self CPU of the ops that call Python).
- A child with its parent's name that is the parent's only child is merged into the parent (torch's
  `_remove_dup_nodes`): it is not counted as a call and its kernels replace the parent's.
- Device time: each kernel/memcpy/memset belongs to the CPU op whose External id its launching runtime
  call carries (the innermost op at launch, `Trace.launches()`); self device = those; device total = self
  plus the children's device totals. Device events are rows of their own (self = total = duration).
- Memory: an event's CPU Mem / CUDA Mem is the sum of `Bytes` of every `[memory]` instant with
  start <= ts <= end, on *any* thread (torch's `MemRecordsAcc.in_interval`); self = that minus the direct
  children's. `[memory]` instants inside no CPU event at all become rows named `[memory]`.

    aten::linear 0..10 µs, 4 KiB inside     ->  CPU total 10 µs, self CPU 10-6 = 4 µs, CPU Mem 4 KiB,
      aten::addmm 3..9 µs, 4 KiB inside          Self CPU Mem 0 B; aten::addmm self CPU 6 µs, 4 KiB self

What the exported trace cannot tell apart: an event that started and ended on different threads is
"async" for torch and has no children or self time; the Chrome trace keeps only its start thread, so such
events (rare: none in ordinary eager training) are nested as if synchronous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from stepscope.analyze.blame import step_row_name
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.nesting import children_sum, collapse_repeated, parent_index, sort_for_nesting, subtree_sum
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace
from stepscope.analyze.vocab import CPU_ROW_KINDS, DEVICE_ROW_KINDS, SORT_COLUMNS
from stepscope.analyze.vocab import ROW_KINDS as ROW_KINDS  # re-exported with SortColumn for the op table's callers
from stepscope.analyze.vocab import SortColumn as SortColumn
from stepscope.errors import UsageError

#: torch's `_filter_name`: events dropped before the table is built
FILTERED_NAMES: tuple[str, ...] = (
    "[memory]", "[OutOfMemory]",
    "profiler::_record_function_enter", "profiler::_record_function_enter_new", "profiler::_record_function_exit",
    "aten::is_leaf", "aten::output_nr", "aten::_version",
)
#: c10 DeviceType codes torch counts as CPU memory (CPU, MKLDNN, IDEEP) and as device memory
CPU_DEVICE_TYPES: tuple[int, ...] = (0, 2, 5)
DEVICE_DEVICE_TYPES: tuple[int, ...] = (1, 6, 12, 20)

#: torch's sort_by keys -> ours, so `--sort self_cuda_time_total` works as pasted from a notebook
TORCH_SORT_KEYS: dict[str, str] = {
    "count": "calls", "self_cpu_time_total": "self_cpu_ns", "cpu_time_total": "cpu_total_ns",
    "cpu_time": "cpu_avg_ns", "self_cuda_time_total": "self_device_ns", "self_device_time_total": "self_device_ns",
    "cuda_time_total": "device_total_ns", "device_time_total": "device_total_ns", "cuda_time": "device_avg_ns",
    "device_time": "device_avg_ns", "cpu_memory_usage": "cpu_mem_bytes", "self_cpu_memory_usage": "self_cpu_mem_bytes",
    "cuda_memory_usage": "device_mem_bytes", "device_memory_usage": "device_mem_bytes",
    "self_cuda_memory_usage": "self_device_mem_bytes", "self_device_memory_usage": "self_device_mem_bytes",
}

_SUMS = ("cpu_total_ns", "self_cpu_ns", "device_total_ns", "self_device_ns", "cpu_mem_bytes", "self_cpu_mem_bytes",
         "device_mem_bytes", "self_device_mem_bytes")


@dataclass(frozen=True, kw_only=True)
class OpTable:
    """Per-op totals as torch's key_averages() computes them.

    `ops` columns: name, kind, [input_shapes], calls, self_cpu_ns, self_cpu_fraction, cpu_total_ns,
    cpu_total_fraction, cpu_avg_ns, self_device_ns, self_device_fraction, device_total_ns, device_avg_ns,
    cpu_mem_bytes, self_cpu_mem_bytes, device_mem_bytes, self_device_mem_bytes, flops (null where not
    recorded). Fractions are of the summed self times, as torch's percentages are.
    """

    sort_by: str
    group_by_shape: bool
    device_name: str | None  # "CUDA" (torch's name, also on ROCm) when the trace has device time or memory
    self_cpu_total_ns: int
    self_device_total_ns: int
    has_memory: bool
    has_flops: bool
    ops_shown: int
    ops_total: int
    ops: pl.DataFrame


def resolve_sort(sort_by: str, has_device_time: bool, *, has_flops: bool = True) -> str:
    """Our column for a --sort value (ours or torch's key); `auto` is self device time, else self CPU.

    Sorting by flops on a trace without any is a UsageError: every row is null, so the order would silently be
    by name."""
    if sort_by == "auto":
        return "self_device_ns" if has_device_time else "self_cpu_ns"
    key = TORCH_SORT_KEYS.get(sort_by, sort_by)
    if key not in SORT_COLUMNS:
        raise UsageError(f"cannot sort by {sort_by!r}; choose one of: auto, {', '.join(SORT_COLUMNS)} "
                         f"(torch's keys such as self_cpu_time_total work too)")
    if key == "flops" and not has_flops:
        raise UsageError("cannot sort by flops: the trace has no FLOPs (record them with "
                         "torch.profiler.profile(with_flops=True)); choose another --sort")
    return key


def _shapes_key() -> pl.Expr:
    """input_shapes as torch groups by it, str(input_shapes): "[[4, 3], []]"; "[]" for an event without."""
    return (pl.col("input_dims").str.replace_all(r"\s+", "").str.replace_all(",", ", ")
            .fill_null("[]").alias("input_shapes"))


def _memory_bytes(trace: Trace) -> tuple[np.ndarray[Any, Any], pl.DataFrame]:
    """[memory] instants sorted by time, with their bytes split into cpu_bytes and device_bytes."""
    no_type = pl.col("device_type").is_null()
    is_cpu = pl.col("device_type").is_in(CPU_DEVICE_TYPES) | (no_type & pl.col("device").is_null())
    is_dev = pl.col("device_type").is_in(DEVICE_DEVICE_TYPES) | (no_type & pl.col("device").is_not_null())
    mem = (
        trace.memory.filter(pl.col("ts_ns").is_not_null())
        .select("ts_ns", bytes=pl.col("alloc_bytes").fill_null(0), cpu=is_cpu, dev=is_dev)
        .sort("ts_ns", maintain_order=True)
        .select("ts_ns", cpu_bytes=pl.when("cpu").then("bytes").otherwise(0),
                device_bytes=pl.when("dev").then("bytes").otherwise(0))
        .collect(engine="in-memory")
    )
    return mem["ts_ns"].to_numpy(), mem


def _interval_sums(mem_ts: np.ndarray[Any, Any], values: pl.Series, start: np.ndarray[Any, Any],
                   end: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Sum of values whose time is in [start, end] (both ends included), for each interval."""
    cs = np.concatenate([[0], np.cumsum(values.to_numpy().astype(np.int64))])
    lo = np.searchsorted(mem_ts, start, side="left")
    hi = np.searchsorted(mem_ts, end, side="right")
    out: np.ndarray[Any, Any] = cs[hi] - cs[lo]
    return out


def _inside_any(
    mem_ts: np.ndarray[Any, Any], start: np.ndarray[Any, Any], end: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """Whether each time lies in at least one [start, end] interval (any thread)."""
    if len(start) == 0:
        return np.zeros(len(mem_ts), dtype=bool)
    order = np.argsort(start, kind="stable")
    s, reach = start[order], np.maximum.accumulate(end[order])
    idx = np.searchsorted(s, mem_ts, side="right") - 1
    out: np.ndarray[Any, Any] = (idx >= 0) & (reach[np.maximum(idx, 0)] >= mem_ts)
    return out


def _cpu_events(trace: Trace, graph_ops: pl.DataFrame) -> pl.DataFrame:
    """The CPU-thread events that become rows (CPU_ROW_KINDS with a duration, FILTERED_NAMES dropped), plus the
    ops a graph capture attributes to replayed kernels (`TraceFrames.graph_ops`, each replay on a thread of its
    own), in nesting order, with their input_shapes key."""
    columns = ("event_id", "name", "kind", "pid", "tid", "ts_ns", "dur_ns", _shapes_key(), "flops")
    events = trace.events.filter(
        pl.col("kind").is_in([k.value for k in CPU_ROW_KINDS]) & pl.col("dur_ns").is_not_null()
        & pl.col("ts_ns").is_not_null() & ~pl.col("name").is_in(FILTERED_NAMES)
    ).select(*columns).with_columns(step_row_name(pl.col("name")).alias("name")).collect(engine="in-memory")
    if graph_ops.height:
        events = pl.concat([events, graph_ops.select(*columns)], how="vertical_relaxed")
    return sort_for_nesting(events)


def _launched_ns(cpu: pl.DataFrame, launches: pl.DataFrame) -> np.ndarray[Any, Any]:
    """Per row of `cpu`, the summed duration of the GPU work it launched itself (0 where none)."""
    return (
        cpu.select("event_id")
        .join(launches.filter(pl.col("op_event_id").is_not_null())
              .group_by("op_event_id").agg(k=pl.col("dur_ns").sum()),
              left_on="event_id", right_on="op_event_id", how="left", maintain_order="left")["k"]
        .fill_null(0).to_numpy().astype(np.int64)
    )


_ZERO = pl.lit(0, pl.Int64)


def _memory_rows(mem: pl.DataFrame) -> pl.DataFrame:
    """`[memory]` rows for the given instants (ts_ns, cpu_bytes, device_bytes): no time, self = total bytes."""
    return mem.select(
        event_id=pl.lit(None, pl.Int64), name=pl.lit("[memory]"), kind=pl.lit(Kind.MEMORY.value),
        pid=pl.lit(None, pl.String), tid=pl.lit(None, pl.String), ts_ns="ts_ns", input_shapes=pl.lit("[]"),
        flops=pl.lit(None, pl.Float64), cpu_total_ns=_ZERO, self_cpu_ns=_ZERO, device_total_ns=_ZERO,
        self_device_ns=_ZERO, cpu_mem_bytes="cpu_bytes", self_cpu_mem_bytes="cpu_bytes",
        device_mem_bytes="device_bytes", self_device_mem_bytes="device_bytes", parent_event_id=pl.lit(None, pl.Int64),
    )


def _device_rows(trace: Trace) -> pl.DataFrame:
    """One row per device event (DEVICE_ROW_KINDS with a duration): self = total device time = its duration."""
    return trace.of_kind(*DEVICE_ROW_KINDS).filter(pl.col("dur_ns").is_not_null()).select(
        "event_id", step_row_name(pl.col("name")).alias("name"), "kind", "pid", "tid", "ts_ns",
        input_shapes=pl.lit("[]"), flops=pl.lit(None, pl.Float64),
        cpu_total_ns=_ZERO, self_cpu_ns=_ZERO, device_total_ns="dur_ns", self_device_ns="dur_ns",
        cpu_mem_bytes=_ZERO, self_cpu_mem_bytes=_ZERO, device_mem_bytes=_ZERO, self_device_mem_bytes=_ZERO,
        parent_event_id=pl.lit(None, pl.Int64),
    ).collect(engine="in-memory")


def op_rows(source: Source) -> pl.DataFrame:
    """One row per event as torch's FunctionEvent list holds it, before grouping (see the module docstring).

    Columns: event_id, name, kind, pid, tid, ts_ns, input_shapes, flops, cpu_total_ns, self_cpu_ns,
    device_total_ns, self_device_ns, cpu_mem_bytes, self_cpu_mem_bytes, device_mem_bytes, self_device_mem_bytes,
    parent_event_id (the CPU parent after torch's merge; null at top level).
    """
    frames = frames_of(source)
    trace = frames.trace
    graph_ops = frames.graph_ops
    cpu = _cpu_events(trace, graph_ops)
    parent, _ = parent_index(cpu)
    codes = cpu["name"].rank("dense").to_numpy().astype(np.int64) if cpu.height else np.zeros(0, np.int64)
    par, removed, own_kernels, depth = collapse_repeated(parent, codes, _launched_ns(cpu, frames.launches))
    keep = ~removed
    par_kept = np.where(keep, par, -1)

    # a graph-replayed op ran no CPU time and allocated nothing in this run: its capture interval only nests it
    real = ~cpu["event_id"].is_in(graph_ops["event_id"].implode()).to_numpy()
    start = cpu["ts_ns"].to_numpy()
    dur = np.where(real, cpu["dur_ns"].to_numpy().astype(np.int64), 0)
    end = start + dur
    mem_ts, mem = _memory_bytes(trace)
    cpu_mem = np.where(real, _interval_sums(mem_ts, mem["cpu_bytes"], start, end), 0)
    dev_mem = np.where(real, _interval_sums(mem_ts, mem["device_bytes"], start, end), 0)
    device_total = subtree_sum(par_kept, depth, np.where(keep, own_kernels, 0))

    event_ids = cpu["event_id"].to_numpy()
    cpu_rows = cpu.select("event_id", "name", "kind", "pid", "tid", "ts_ns", "input_shapes", "flops").with_columns(
        cpu_total_ns=pl.Series(dur),
        self_cpu_ns=pl.Series(dur - children_sum(par, dur, keep)),
        device_total_ns=pl.Series(device_total),
        self_device_ns=pl.Series(device_total - children_sum(par, device_total, keep)),
        cpu_mem_bytes=pl.Series(cpu_mem),
        self_cpu_mem_bytes=pl.Series(cpu_mem - children_sum(par, cpu_mem, keep)),
        device_mem_bytes=pl.Series(dev_mem),
        self_device_mem_bytes=pl.Series(dev_mem - children_sum(par, dev_mem, keep)),
        parent_event_id=pl.Series(np.where(par >= 0, event_ids[np.maximum(par, 0)], -1)).replace(-1, None),
    ).filter(pl.Series(keep))
    unclaimed = mem.filter(pl.Series(~_inside_any(mem_ts, start[real], end[real])))
    return pl.concat([cpu_rows, _memory_rows(unclaimed), _device_rows(trace)], how="vertical_relaxed")


def op_table(source: Source, *, group_by_shape: bool = False, sort_by: str = "auto", top: int | None = None,
             kinds: Sequence[str] | None = None) -> OpTable:
    """key_averages() from the trace: per op name (and input shapes), calls, CPU/device times, memory, FLOPs.

    `sort_by` is one of SORT_COLUMNS or torch's sort keys (descending), `auto` = self device time when the
    trace has any, else self CPU; `top` keeps the first N rows and `kinds` only rows of those kinds (e.g.
    cpu_op, kernel); percentages and totals stay of the whole table, as torch's do.
    """
    frames = frames_of(source)
    trace = frames.trace
    rows = op_rows(frames)
    keys = ["name", "kind"] + (["input_shapes"] if group_by_shape else [])
    grouped = rows.group_by(keys, maintain_order=True).agg(
        pl.len().alias("calls"), *[pl.col(c).sum() for c in _SUMS],
        flops=pl.when(pl.col("flops").is_not_null().any()).then(pl.col("flops").sum()),
    )
    self_cpu_total = int(grouped["self_cpu_ns"].sum())
    device_kinds = [Kind.KERNEL.value, Kind.MEMCPY.value, Kind.MEMSET.value]
    self_device_total = int(grouped.filter(pl.col("kind").is_in(device_kinds))["self_device_ns"].sum())
    has_device_time = bool((grouped["self_device_ns"] > 0).any())
    has_device_mem = bool((grouped["device_mem_bytes"] != 0).any())
    has_flops = bool(rows["flops"].is_not_null().any())
    sort_col = resolve_sort(sort_by, has_device_time, has_flops=has_flops)

    def share(col: str, total: int) -> pl.Expr:
        return (pl.col(col) / total) if total else pl.lit(None, pl.Float64)

    ops = grouped.with_columns(
        self_cpu_fraction=share("self_cpu_ns", self_cpu_total),
        cpu_total_fraction=share("cpu_total_ns", self_cpu_total),
        cpu_avg_ns=pl.col("cpu_total_ns") // pl.col("calls"),
        self_device_fraction=share("self_device_ns", self_device_total),
        device_avg_ns=pl.col("device_total_ns") // pl.col("calls"),
    ).select(
        *keys, "calls", "self_cpu_ns", "self_cpu_fraction", "cpu_total_ns", "cpu_total_fraction", "cpu_avg_ns",
        "self_device_ns", "self_device_fraction", "device_total_ns", "device_avg_ns",
        "cpu_mem_bytes", "self_cpu_mem_bytes", "device_mem_bytes", "self_device_mem_bytes", "flops",
    ).sort(sort_col, "name", descending=[True, False], nulls_last=True)
    if kinds is not None:
        ops = ops.filter(pl.col("kind").is_in(list(kinds)))
    total = ops.height
    if top is not None:
        ops = ops.head(top)
    return OpTable(
        sort_by=sort_col, group_by_shape=group_by_shape,
        device_name="CUDA" if has_device_time or has_device_mem or self_device_total else None,
        self_cpu_total_ns=self_cpu_total, self_device_total_ns=self_device_total,
        has_memory=bool(trace.memory.select(pl.len()).collect(engine="in-memory").item()),
        has_flops=has_flops, ops_shown=ops.height, ops_total=total, ops=ops,
    )
