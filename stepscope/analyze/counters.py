"""`stepscope counters`: the GPU hardware counters the CUPTI range profiler measured, kernel by kernel, with the op
that launched each kernel and the FLOPs its instruction counters add up to.

torch's profiler in its CUPTI range-profiler mode (`experimental_config=_ExperimentalConfig(profiler_metrics=[…],
profiler_measure_per_kernel=True)`) replays each kernel to read its counters and records one `cuda_profiler_range`
event per kernel: the kernel's name, and its counters in `args` (metric names such as
`smsp__sass_thread_inst_executed_op_ffma_pred_on.sum`). The event carries no correlation id and no stream, and its
time is the measuring range's, not the kernel's: such a trace has no GPU timeline (`info` warns
`counter_ranges_only`), and this is what it has instead.

**Which op launched each kernel.** Kernels run in the order they were launched, and the profiler measures them one
at a time, so the i-th range (in time order) belongs to the i-th kernel launch call (HTA's rule,
`CuptiCounterAnalysis`): `cudaLaunchKernel` and the runtime's and driver's other kernel-launch calls, those nested
in another launch call (a runtime call's own driver call) counted once. Where the counts differ the pairing is
unknown, and no range is given an op (`note` says so), rather than pairing them wrongly. `op` is the innermost CPU
op enclosing the launch call, `top_op` the outermost, `python` the user's line (with_stack traces).

**FLOPs from the instruction counters** (NVIDIA's rule, as Nsight Compute counts them; HTA's
`CUDA_SASS_INSTRUCTION_COUNTER_FLOPS`): a fused multiply-add is two operations, an add or a multiply one, per
precision, from `smsp__sass_thread_inst_executed_op_<x>_pred_on.sum`:

    fp64 = dadd + dmul + 2 dfma      fp32 = fadd + fmul + 2 ffma      fp16 = hadd + hmul + 2 hfma

A precision's FLOPs need its three counters, and `flops` needs all nine: otherwise None, never a partial sum.
Tensor-core instructions (HMMA and the like) are not among these counters, so a GEMM on tensor cores shows few
FLOPs here: compare with `stepscope flops`, which counts from shapes.

Totals over kernels and ops add only additive counters (a metric ending in `.sum`); a rate, percentage or
average (`.avg`, `.pct_of_peak…`, `.max`) is shown per range only.

    HTA's cupti_profiler trace: 77 ranges, 77 cudaLaunchKernel calls; range 6 is fft2d_r2c_32x32, fadd
    86,114,304, launched under aten::conv2d (top) > … > aten::cudnn_convolution (innermost), as HTA's test has it
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import polars as pl

from stepscope.analyze._text import plural
from stepscope.analyze.blame import nested, python_lines
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.nesting import Nested
from stepscope.analyze.schema import GPU_KINDS, Kind
from stepscope.analyze.trace import Trace

#: the name CUPTI gives a range whose kernel it could not name, and how `counters` shows it
CUPTI_NO_NAME, NO_NAME = "__missing__", "(no kernel name recorded)"
#: the category Kineto gives each kernel the CUPTI range profiler measured
RANGE_CATEGORY = "cuda_profiler_range"

#: the code of `info`'s warning for a trace whose GPU work is counter ranges alone (its count: the ranges)
COUNTER_RANGES_ONLY = "counter_ranges_only"

#: kernel-launch calls of the CUDA/HIP runtime and driver (not graph launches, copies or memsets)
LAUNCH_CALL = r"^(cuda|hip|cu|hipExtModule|hipModule)?Launch(Cooperative)?Kernel(ExC|Ex|_v\d+)?(_ptsz)?$"

_SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
#: precision -> (counter, operations per instruction)
FLOP_COUNTERS: dict[str, tuple[tuple[str, int], ...]] = {
    precision: tuple((_SASS.format(f"{letter}{op}"), 2 if op == "fma" else 1) for op in ("add", "mul", "fma"))
    for precision, letter in (("fp64", "d"), ("fp32", "f"), ("fp16", "h"))
}


@dataclass(frozen=True, kw_only=True)
class CountersResult:
    """The counter ranges of a trace (module docstring): one row per kernel measured, totals per kernel name and
    per op, the FLOPs their instruction counters add up to."""

    ranges_found: int
    launches_found: int
    matched: bool  # every range paired with its launch call (the counts agree)
    counters: list[str]  # the metric names measured, in the order first seen
    flops: int | None  # all ranges, all three precisions (None where a range lacks one of the nine counters)
    note: str
    ranges: pl.DataFrame  # range, name, op, top_op, python, fp64/fp32/fp16_flops, flops, one column per counter
    by_kernel: pl.DataFrame  # name, ranges, flops, fp64/fp32/fp16_flops, additive counters summed
    by_op: pl.DataFrame  # top_op, op, ranges, the same sums (empty where not matched)


def counter_ranges(source: Source) -> CountersResult:
    """The CUPTI range profiler's counters per kernel, matched to their launch calls and ops (module docstring)."""
    frames = frames_of(source)
    trace = frames.trace
    events = range_events(trace)
    values = [_counters_of(text) for text in events["args"].to_list()]
    unreadable = sum(v is None for v in values)
    read = [v or {} for v in values]
    counters = list(dict.fromkeys(name for v in read for name in v))
    launches = _launch_calls(trace) if events.height else pl.DataFrame()
    matched = events.height > 0 and launches.height == events.height
    # CUPTI names a kernel it could not name `__missing__`: said so, not passed on as if it were a kernel's name
    ranges = events.select(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("range"),
                           pl.col("name").replace(CUPTI_NO_NAME, NO_NAME))
    ranges = ranges.with_columns(_ops(trace, launches) if matched else [
        pl.lit(None, pl.String).alias(c) for c in ("op", "top_op", "python")])
    columns = [pl.Series(name, [v.get(name) for v in read], strict=False) for name in counters]
    flops = {p: [_flops(v, p) for v in read] for p in FLOP_COUNTERS}
    total = [None if any(flops[p][i] is None for p in flops) else sum(flops[p][i] or 0 for p in flops)
             for i in range(events.height)]
    ranges = ranges.with_columns(*(_exact(f"{p}_flops", f) for p, f in flops.items()), _exact("flops", total),
                                 *columns)
    additive = [c for c in counters if c.endswith(".sum") and ranges[c].dtype.is_integer()]
    by_kernel = _totals(ranges, ["name"], additive)
    by_op = _totals(ranges if matched else ranges.clear(), ["top_op", "op"], additive)
    return CountersResult(
        ranges_found=events.height, launches_found=launches.height, matched=matched, counters=counters,
        flops=None if not events.height or None in total else sum(int(t or 0) for t in total),
        note=_note(events.height, launches.height, unreadable, trace), ranges=ranges, by_kernel=by_kernel,
        by_op=by_op)


def range_events(trace: Trace) -> pl.DataFrame:
    """The counter ranges in time order (name, ts_ns, args). A trace whose counts by kind hold no `other` event
    has none, and is not scanned for them."""
    schema = {"name": pl.String, "ts_ns": pl.Int64, "args": pl.String}
    if not trace.meta.counts.by_kind.get(Kind.OTHER.value):
        return pl.DataFrame(schema=schema)
    return (trace.events.filter(pl.col("cat") == RANGE_CATEGORY).select("event_id", *schema)
            .sort("ts_ns", "event_id").drop("event_id").collect(engine="in-memory"))


def _counters_of(args: str | None) -> dict[str, int | float] | None:
    """The counters of one range's `args`: its numeric values under metric names (`unit__metric.rollup`); None
    where the text cannot be read (a number out of any float's range)."""
    if not args:
        return {}
    try:
        decoded = msgspec.json.decode(args)
    except msgspec.DecodeError:
        return None
    if not isinstance(decoded, dict):
        return {}
    return {k: v for k, v in decoded.items()
            if "__" in k and isinstance(v, int | float) and not isinstance(v, bool)}


def _launch_calls(trace: Trace) -> pl.DataFrame:
    """The kernel-launch calls (pid, tid, ts_ns) in time order, a call inside another launch call on its thread
    (the runtime's own driver call) left out."""
    calls = (trace.runtime.filter(pl.col("name").str.contains(LAUNCH_CALL) & pl.col("dur_ns").is_not_null())
             .select("pid", "tid", "ts_ns", "dur_ns", "event_id").collect(engine="in-memory"))
    if calls.height == 0:
        return calls.select("pid", "tid", "ts_ns")
    nesting = Nested.of(calls, keep=("pid", "tid", "ts_ns", "event_id"))
    outer = nesting.rows.filter(pl.Series(nesting.parents < 0))
    return outer.sort("ts_ns", "event_id").select("pid", "tid", "ts_ns")


def _ops(trace: Trace, launches: pl.DataFrame) -> list[pl.Series]:
    """op (innermost), top_op (outermost) and python (the user's line) at each launch call."""
    ops = nested(trace, "cpu_ops")
    names = ops.rows["name"].cast(pl.String)
    found = ops.enclosing(launches)
    inner = names.gather(found).alias("op")
    row = found.fill_null(-1).to_numpy().copy()
    while True:  # walk up to the outermost op, all launches a level at a time
        up = np.where(row >= 0, ops.parents[np.maximum(row, 0)], -1)
        climbing = up >= 0
        if not climbing.any():
            break
        row[climbing] = up[climbing]
    top = names.gather(pl.Series(row).replace(-1, None)).alias("top_op")
    return [inner, top, python_lines(trace, launches)[0].alias("python")]


def _flops(counters: dict[str, int | float], precision: str) -> int | None:
    """One range's FLOPs of one precision, in Python's integers (exact at any size): None where one of its three
    counters is missing or not a whole number."""
    parts = [(counters.get(name), weight) for name, weight in FLOP_COUNTERS[precision]]
    if any(not isinstance(value, int) for value, _ in parts):
        return None
    return sum(int(value or 0) * weight for value, weight in parts)


def _exact(name: str, values: list[int | None]) -> pl.Series:
    """Whole numbers as Int64, or as Int128 where one does not fit: never wrapped."""
    return pl.Series(name, values, dtype=pl.Int64, strict=False) if all(
        v is None or -(2**63) <= v < 2**63 for v in values) else pl.Series(name, values, dtype=pl.Int128)


def _totals(ranges: pl.DataFrame, by: list[str], additive: list[str]) -> pl.DataFrame:
    """Ranges, FLOPs (all and per precision) and the additive counters summed per `by` (each exact or null), most
    FLOPs first."""
    figures = ("flops", *(f"{p}_flops" for p in FLOP_COUNTERS), *additive)
    # summed in 128 bits, so a sum never wraps; exact or null: a part unknown leaves the total unknown
    exact = [pl.when(pl.col(c).null_count() == 0).then(pl.col(c).cast(pl.Int128).sum()).alias(c) for c in figures]
    out = ranges.group_by(by).agg(pl.len().cast(pl.Int64).alias("ranges"), *exact)
    fits = [c for c in figures if out[c].is_between(-(2**63), 2**63 - 1).all()]  # (nulls pass: unknown either way)
    return (out.with_columns(pl.col(fits).cast(pl.Int64))
            .sort(["flops", "ranges", *by], descending=[True, True, *[False] * len(by)], nulls_last=True))


def _note(ranges: int, launches: int, unreadable: int, trace: Trace) -> str:
    """Why ops are missing, or why nothing is here; ranges whose counters could not be read."""
    if ranges == 0:
        gpu = any(trace.meta.counts.by_kind.get(k.value) for k in GPU_KINDS)
        return ("no cuda_profiler_range events: this trace was not recorded by the CUPTI range profiler "
                "(torch.profiler's experimental_config with profiler_metrics)" + (
                    "; its kernels' times are in `stepscope kernels`" if gpu else ""))
    notes = []
    if launches != ranges:
        notes.append(f"{ranges:,} counter ranges but {launches:,} kernel launch calls: the ranges cannot be paired "
                     "with their launches by order, so no op is named")
    if unreadable:
        notes.append(f"{plural(unreadable, 'range')} whose counters could not be read "
                     "(a number out of range): their counters and FLOPs are unknown")
    return "; ".join(notes)
