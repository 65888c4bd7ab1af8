"""Before/after comparison of two traces: step time, GPU busy share, memory peak, and the ops and kernels
whose time changed most. A pure function over two traces' bundles (op table, memory peak, steps, gaps, verdict).

    before: median step 177.4 ms, after: 126.7 ms  ->  step_time_change_fraction = -0.286
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.frames import Source
from stepscope.analyze.memory import memory_timeline
from stepscope.analyze.trace import Trace


@dataclass(frozen=True, kw_only=True)
class TraceDiff:
    """AFTER minus BEFORE; *_verdict: what bounds the step (`stepscope summary`).

    `*_change_fraction` = (after - before) / before (null when before is 0/unknown).

    *_median_step_ns: median step wall time and *_step_gpu_busy_fraction: GPU busy over the steps (busy / wall time),
      both from `step_breakdown` (steps.py: the step window includes the GPU work the step launched).
    *_trace_gpu_busy_fraction: union of GPU work (kernels, memcpy, memset, all devices merged) over the span from
      the first to the last GPU event (null without GPU work).
    ops: name, kind, before_self_cpu_ns, after_self_cpu_ns, delta_self_cpu_ns, before_self_device_ns,
      after_self_device_ns, delta_self_device_ns; CPU ops and runtime calls, largest |delta| (CPU or
      device, whichever is larger) first. A CUDA runtime call and its HIP twin are one row (`_api_key`):
      "cudaLaunchKernel / hipLaunchKernel" where an NVIDIA trace is compared with an AMD one.
    kernels: name, before_ns, after_ns, delta_ns, calls_before, calls_after (GPU kernels, memcpy, memset),
      largest |delta| first.
    idle_by_cause: cause, before_idle_ns, after_idle_ns, delta_idle_ns (GPU idle gaps in step windows, all
      devices; empty where gaps.py is not installed).
    """

    before: str
    after: str
    before_verdict: str
    after_verdict: str
    before_steps: int
    after_steps: int
    before_median_step_ns: int | None
    after_median_step_ns: int | None
    step_time_change_fraction: float | None
    before_step_gpu_busy_fraction: float | None
    after_step_gpu_busy_fraction: float | None
    before_trace_gpu_busy_fraction: float | None
    after_trace_gpu_busy_fraction: float | None
    before_self_device_total_ns: int
    after_self_device_total_ns: int
    before_peak_memory_bytes: int | None
    after_peak_memory_bytes: int | None
    peak_memory_change_fraction: float | None
    ops: pl.DataFrame
    kernels: pl.DataFrame
    idle_by_cause: pl.DataFrame
    note: str | None = None  # where the two sides are one trace (the same bytes): every change is 0


def _idle_by_cause(before: TraceAnalysis, after: TraceAnalysis) -> pl.DataFrame:
    """cause, before_idle_ns, after_idle_ns, delta_idle_ns (gaps.py, all devices)."""
    schema = {"cause": pl.String, "before_idle_ns": pl.Int64, "after_idle_ns": pl.Int64, "delta_idle_ns": pl.Int64}

    def by_cause(bundle: TraceAnalysis, name: str) -> pl.DataFrame:
        return bundle.gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum().cast(pl.Int64).alias(name))

    out = by_cause(before, "before_idle_ns").join(by_cause(after, "after_idle_ns"), on="cause", how="full",
                                                   coalesce=True).fill_null(0)
    out = out.with_columns(delta_idle_ns=pl.col("after_idle_ns") - pl.col("before_idle_ns"))
    return out.sort(pl.col("delta_idle_ns").abs(), descending=True).select(list(schema)).cast(schema)  # type: ignore[arg-type]


def _api_key(name: pl.Expr, kind: pl.Expr) -> pl.Expr:
    """What a row is matched on across the two traces: an op's name; a runtime call's without its vendor prefix.
    HIP mirrors the CUDA runtime API call for call, so a trace from an NVIDIA GPU and one from an AMD GPU compare
    their launches and syncs: cudaLaunchKernel and hipLaunchKernel -> LaunchKernel, cudaDeviceSynchronize and
    hipDeviceSynchronize -> DeviceSynchronize. Calls without a counterpart (cudaLaunchKernelExC,
    hipExtModuleLaunchKernel) stay apart."""
    return pl.when(kind == "runtime").then(name.str.replace(r"^(cuda|hip)([A-Z])", "$2")).otherwise(name)


def _change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before


def gpu_busy_fraction(trace: Trace) -> float | None:
    """Union of GPU busy time over the GPU span (first start to last end), all devices and streams merged.

    Intervals [0,10) and [5,20), then [30,40): busy 30 ns of a 40 ns span -> 0.75.
    """
    gpu = trace.gpu.select("ts_ns", "dur_ns").drop_nulls().sort("ts_ns").collect(engine="in-memory")
    if gpu.height == 0:
        return None
    start = gpu["ts_ns"].to_numpy()
    end = start + gpu["dur_ns"].to_numpy()
    reach = np.maximum.accumulate(end)
    # a new merged interval begins where the start passes everything before it
    new = np.ones(len(start), dtype=bool)
    new[1:] = start[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(reach[idx[1:] - 1], reach[-1])
    busy = float((ends - start[idx]).sum())
    span = float(reach[-1] - start[0])
    return busy / span if span > 0 else None


def _median_step(bundle: TraceAnalysis) -> tuple[int, int | None, float | None]:
    """Steps, median step wall time and mean GPU busy share per step, as `stepscope steps` computes them."""
    result = bundle.steps
    if result.steps.height == 0:
        return 0, None, None
    return result.steps.height, int(result.steps["wall_ns"].median()), result.gpu_busy_fraction  # type: ignore[arg-type]


def diff_traces(before: Source | TraceAnalysis, after: Source | TraceAnalysis, *,
                top: int | None = 15) -> TraceDiff:
    """Compare two traces of the same program (e.g. before and after a fix)."""
    b = before if isinstance(before, TraceAnalysis) else TraceAnalysis.of(before)
    a = after if isinstance(after, TraceAnalysis) else TraceAnalysis.of(after)
    ob, oa = b.ops, a.ops
    mb, ma = memory_timeline(b.frames, buckets=1), memory_timeline(a.frames, buckets=1)
    nb, sb, gb = _median_step(b)
    na, sa, ga = _median_step(a)
    cols = ["self_cpu_ns", "self_device_ns"]
    keep = pl.col("kind").is_in(["cpu_op", "runtime"]) & ~pl.col("name").str.starts_with("ProfilerStep#")

    def side(table: pl.DataFrame, when: str) -> pl.DataFrame:
        return (table.filter(keep).with_columns(key=_api_key(pl.col("name"), pl.col("kind")))
                .group_by("key", "kind", maintain_order=True)
                .agg(pl.col("name").unique(maintain_order=True).str.join(" / ").alias(f"{when}_name"),
                     *[pl.col(c).sum().alias(f"{when}_{c}") for c in cols]))

    ops = side(ob.ops, "before").join(side(oa.ops, "after"), on=["key", "kind"], how="full", coalesce=True)
    ops = ops.with_columns(  # a call both name alike keeps its name; cudaLaunchKernel / hipLaunchKernel otherwise
        pl.when(pl.col("before_name").is_null() | pl.col("after_name").is_null()
                | (pl.col("before_name") == pl.col("after_name")))
        .then(pl.coalesce("before_name", "after_name"))
        .otherwise(pl.concat_str("before_name", pl.lit(" / "), "after_name")).alias("name"),
        *[pl.col(f"{w}_{c}").fill_null(0) for w in ("before", "after") for c in cols])
    ops = ops.with_columns(*[(pl.col(f"after_{c}") - pl.col(f"before_{c}")).alias(f"delta_{c}") for c in cols])
    ops = ops.select("name", "kind", *[f"{w}_{c}" for c in cols for w in ("before", "after", "delta")])
    ops = ops.sort(pl.max_horizontal(pl.col("delta_self_cpu_ns").abs(), pl.col("delta_self_device_ns").abs()),
                   descending=True).head(top or ops.height)
    gpu_kinds = ["kernel", "memcpy", "memset"]
    kb = ob.ops.filter(pl.col("kind").is_in(gpu_kinds)).select(
        "name", before_ns="self_device_ns", calls_before="calls")
    ka = oa.ops.filter(pl.col("kind").is_in(gpu_kinds)).select("name", after_ns="self_device_ns", calls_after="calls")
    kernels = (kb.group_by("name").sum().join(ka.group_by("name").sum(), on="name", how="full", coalesce=True)
               .fill_null(0).with_columns(delta_ns=pl.col("after_ns") - pl.col("before_ns"))
               .select("name", "before_ns", "after_ns", "delta_ns", "calls_before", "calls_after")
               .sort(pl.col("delta_ns").abs(), descending=True))
    kernels = kernels.head(top or kernels.height)
    return TraceDiff(
        before=b.trace.source_name, after=a.trace.source_name,
        before_verdict=b.verdict.verdict.value, after_verdict=a.verdict.verdict.value,
        before_steps=nb, after_steps=na,
        before_median_step_ns=sb, after_median_step_ns=sa, step_time_change_fraction=_change(sb, sa),
        before_step_gpu_busy_fraction=gb, after_step_gpu_busy_fraction=ga,
        before_trace_gpu_busy_fraction=gpu_busy_fraction(b.trace),
        after_trace_gpu_busy_fraction=gpu_busy_fraction(a.trace),
        before_self_device_total_ns=ob.self_device_total_ns, after_self_device_total_ns=oa.self_device_total_ns,
        before_peak_memory_bytes=mb.peak_allocated_bytes, after_peak_memory_bytes=ma.peak_allocated_bytes,
        peak_memory_change_fraction=_change(mb.peak_allocated_bytes, ma.peak_allocated_bytes),
        ops=ops, kernels=kernels, idle_by_cause=_idle_by_cause(b, a),
        note=("BEFORE and AFTER are the same trace (the same bytes), so every change is 0: give the trace of the "
              "run with your change as AFTER") if _same_bytes(b, a) else None,
    )


def _same_bytes(before: TraceAnalysis, after: TraceAnalysis) -> bool:
    """Whether the two sides were ingested from one file's bytes (their sha256; unknown is not the same)."""
    sha = before.trace.meta.source.sha256
    return bool(sha) and sha == after.trace.meta.source.sha256
