"""`stepscope steps`: per ProfilerStep wall time, GPU busy/idle, GPU work by kind, and the CPU phase split.

Without ProfilerStep, the steps are the iterations inferred from the loop's repeating structure, the set-up
iteration left out (`stepscope.analyze.iterations`; `TraceFrames.iterations` says which): the same window
rule turns either into step windows. Exposed data loading is `stepscope.analyze.loading`'s figure, the one
`gaps` and `summary` report too.

Step window (tb_plugin's rule): a step starts where its ProfilerStep span starts (or where the previous
step's window ended, if later) and ends at the later of its CPU end and the end of the last GPU work it
launched. GPU work belongs to the step whose CPU span holds its launch (runtime call); GPU work with no
launch link belongs to the step whose window holds its start.

CPU phases (exclusive; each instant of the step's CPU span counts once, the first phase in this order
that covers it wins; `other_cpu_ns` is what none covers):

1. data_loading: `enumerate(DataLoader)#…__next__` annotations,
2. optimizer: `Optimizer.step#…` / `Optimizer.zero_grad#…`,
3. backward: ops on an autograd thread (ops carrying `fwd_thread_id`, and the rest of their thread) and
   ops named `autograd::engine::evaluate_function: …` or `…Backward…`,
4. forward: every other CPU op on the step's own thread.

Before/after, a 100 µs step on the main thread (M) with an autograd thread (A):

    M: [DataLoader 0-30][aten::conv 30-60]               [Optimizer.step 80-100]
    A:                        [ConvBackward 55-80]
    -> data_loading 30, forward 25 (30-55), backward 25 (55-80), optimizer 20, other 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze._text import duration, plural
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.gaps import GapCause, GapsResult, gpu_gaps
from stepscope.analyze.loading import DATALOADER_PATTERN as DATALOADER_PATTERN  # summary reads it here
from stepscope.analyze.loading import exposed_data_loading
from stepscope.analyze.loading import merge as _merge
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace

OPTIMIZER_PATTERN = r"^Optimizer\.(step|zero_grad)#"
BACKWARD_NAME_PATTERN = r"^autograd::engine::evaluate_function: |Backward"
PHASES: tuple[str, ...] = ("data_loading", "optimizer", "backward", "forward")

#: A step is an outlier when its wall time is more than 3 robust standard deviations (1.4826 × MAD)
#: from the median AND more than 10% away from it (so near-identical steps never flag each other).
OUTLIER_MADS = 3.0
OUTLIER_MIN_REL = 0.10


@dataclass(frozen=True, kw_only=True)
class StepsResult:
    """Per-step table, stats across steps, outlier steps, GPU idle by cause per step and (with nn.Module
    frames) per-module time.

    `idle_by_cause`: step, then one `idle_<cause>_ns` column per `gaps.GapCause` (host_sync, data_loading,
    communication_wait, memcpy_wait, launch_overhead, other): the idle gaps of `gaps.gpu_gaps` split at the
    step windows, summed over devices. On a one-device trace the causes add up to the step's gpu_idle_ns.
    No rows when the trace has no GPU work.
    """

    steps_found: int
    mean_wall_ns: float | None
    gpu_busy_fraction: float | None  # over all the steps: their GPU busy time / their wall time (not a mean of ratios)
    mean_data_loading_ns: float | None
    mean_data_loading_exposed_ns: float | None
    outlier_steps: list[int]
    steps: pl.DataFrame
    stats: pl.DataFrame
    idle_by_cause: pl.DataFrame
    modules: pl.DataFrame
    note: str = ""  # why a step's CPU time can exceed its wall time, where one does (`_cpu_beyond_wall`)
    left_out: str = ""  # the step spans left out and why (`TraceFrames.left_out`, joined by "; "); "" in most traces


def _cpu_beyond_wall(steps: pl.DataFrame) -> str:
    """What the reader needs where a step's `cpu` exceeds its `wall`: the two are different spans by the window
    rule (analyze/window.py), and nothing is counted twice.

        step 6: CPU span 47.2 ms from ts 0, its window [14.2, 49.4 ms)  ->  a note naming step 6
    """
    over = steps.filter(pl.col("cpu_ns") > pl.col("wall_ns"))
    if over.height == 0:
        return ""
    first = over.row(0, named=True)
    return (f"{over.height:,} of {plural(steps.height, 'step')} with more CPU time than wall time "
            f"(step {first['step']}: cpu {duration(first['cpu_ns'])}, wall {duration(first['wall_ns'])}): a step's "
            "window opens only once the GPU work before it is done (the previous step's, or work launched before the "
            "trace or in a set-up iteration left out), while its CPU span (cpu, which the phases split) starts "
            "with its ProfilerStep, or its inferred iteration")


def _covered_length(windows: pl.DataFrame, ivs: pl.DataFrame) -> pl.DataFrame:
    """Union length of `ivs` (step, s, e) clipped to each step's [start_ns, end_ns): step, busy_ns."""
    clipped = intervals.clip(ivs.lazy().select("step", start_ns="s", end_ns="e"),
                             windows.lazy().select("step", "start_ns", "end_ns"), by=["step"])
    return clipped.group_by("step").agg(busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum()).collect(
        engine="in-memory")


def phase_intervals(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """(step, phase, s, e) CPU intervals per phase, clipped to the step's CPU span."""
    cpu = trace.cpu.filter(pl.col("dur_ns").is_not_null()).select(
        "name", "kind", "pid", "tid", "fwd_thread_id", s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")
    )
    autograd_tids = (
        cpu.filter(pl.col("fwd_thread_id").is_not_null()).select("pid", "tid").unique()
        .with_columns(autograd=pl.lit(True))
    )
    main = windows.select("pid", "tid").unique().with_columns(main=pl.lit(True)).lazy()
    tagged = (
        cpu.filter(~pl.col("name").str.contains(r"^ProfilerStep#"))
        .join(autograd_tids, on=["pid", "tid"], how="left", maintain_order="left")
        .join(main, on=["pid", "tid"], how="left", maintain_order="left")
        .with_columns(
            phase=pl.when(pl.col("name").str.contains(DATALOADER_PATTERN)).then(pl.lit("data_loading"))
            .when(pl.col("name").str.contains(OPTIMIZER_PATTERN)).then(pl.lit("optimizer"))
            .when(pl.col("autograd").fill_null(False) & pl.col("main").is_null()).then(pl.lit("backward"))
            .when(pl.col("name").str.contains(BACKWARD_NAME_PATTERN)).then(pl.lit("backward"))
            .when(pl.col("main").fill_null(False) & (pl.col("kind") == Kind.CPU_OP.value)).then(pl.lit("forward"))
            .otherwise(None)
        )
        .filter(pl.col("phase").is_not_null())
        .select("phase", "s", "e")
        .collect(engine="in-memory")
        .sort("s")
    )
    spans = windows.select("step", "cpu_start_ns", "cpu_end_ns").sort("cpu_start_ns")
    # An interval belongs to the step whose CPU span holds its start; it is clipped to that span.
    return (
        tagged.join_asof(spans, left_on="s", right_on="cpu_start_ns", strategy="backward")
        .filter(pl.col("s") < pl.col("cpu_end_ns"))
        .select("step", "phase", "s", e=pl.min_horizontal("e", "cpu_end_ns"))
    )


def phase_segments(windows: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """step, b, b_end, phase: each step's CPU span cut at every bound of its phase intervals (`phase_intervals`),
    each piece given the first phase in PHASES that covers it (None: other CPU time), by start. What the
    phase split sums, and what `stepscope export` draws."""
    merged = _merge(phases.lazy(), ["step", "phase"]).collect(engine="in-memory")
    bounds = pl.concat([
        merged.select("step", b="s"), merged.select("step", b="e"),
        windows.select("step", b="cpu_start_ns"), windows.select("step", b="cpu_end_ns"),
    ]).unique().sort("step", "b")
    segs = (
        bounds.with_columns(b_end=pl.col("b").shift(-1).over("step"))
        .filter(pl.col("b_end").is_not_null())
        .join(windows.select("step", "cpu_start_ns", "cpu_end_ns"), on="step")
        .filter((pl.col("b") >= pl.col("cpu_start_ns")) & (pl.col("b_end") <= pl.col("cpu_end_ns")))
        .select("step", "b", "b_end")
        .with_columns(phase=pl.lit(None, pl.String))
        .sort("b")
    )
    for name in reversed(PHASES):  # later assignments win, so walk from the lowest priority up
        ivs = merged.filter(pl.col("phase") == name).select("step", "s", "e").sort("s")
        hit = segs.join_asof(ivs, left_on="b", right_on="s", by="step", strategy="backward",
                              check_sortedness=False)
        segs = hit.with_columns(
            phase=pl.when(pl.col("e").is_not_null() & (pl.col("b") < pl.col("e"))).then(pl.lit(name))
            .otherwise(pl.col("phase"))
        ).drop("s", "e")
    return segs


def _phase_split(windows: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """Exclusive time per (step, phase), summed over `phase_segments`; the first phase in PHASES wins."""
    return (
        phase_segments(windows, phases).group_by("step", "phase").agg(ns=(pl.col("b_end") - pl.col("b")).sum())
        .with_columns(phase=pl.col("phase").fill_null("other_cpu"))
        .pivot(on="phase", index="step", values="ns")
    )


def _stats(steps: pl.DataFrame) -> pl.DataFrame:
    """metric, mean/std/p50/p95/p99/min/max (ns) across steps, for each duration column with a value."""
    clock = ("start_ns", "cpu_start_ns", "cpu_end_ns", "end_ns")
    known = [c for c in steps.columns if steps[c].null_count() < steps.height]  # all-null: no GPU in the trace
    metrics = [c for c in known if c.endswith("_ns") and c not in clock]
    rows = []
    for m in metrics:
        s = steps[m].cast(pl.Float64)
        rows.append({
            "metric": m.removesuffix("_ns"), "mean_ns": s.mean(), "std_ns": s.std() if s.len() > 1 else None,
            "p50_ns": s.quantile(0.5, "linear"), "p95_ns": s.quantile(0.95, "linear"),
            "p99_ns": s.quantile(0.99, "linear"), "min_ns": s.min(), "max_ns": s.max(),
        })
    schema = {"metric": pl.String, **{k: pl.Float64 for k in ("mean_ns", "std_ns", "p50_ns", "p95_ns", "p99_ns",
                                                                "min_ns", "max_ns")}}
    return pl.DataFrame(rows, schema=schema)


def outliers(wall_ns: pl.Series) -> pl.Series:
    """Boolean mask of outlier steps (the OUTLIER_MADS / OUTLIER_MIN_REL rule), all False under 3 steps.

    walls 100, 101, 99, 100, 180 ms -> median 100, MAD 1 -> only 180 is out (|80| > 3 × 1.48 and > 10%).
    """
    if wall_ns.len() < 3:
        return pl.Series([False] * wall_ns.len())
    x = wall_ns.cast(pl.Float64)
    med = float(x.median() or 0.0)  # type: ignore[arg-type]
    mad = float((x - med).abs().median() or 0.0)  # type: ignore[arg-type]
    dev = (x - med).abs()
    return (dev > OUTLIER_MADS * 1.4826 * mad) & (dev > OUTLIER_MIN_REL * med)


def module_times(source: Source, *, top: int = 20) -> pl.DataFrame:
    """Per `nn.Module: …` python frame name: calls, inclusive CPU time and GPU time of the work launched
    under it (launch call inside the frame, same thread); empty when the trace has no such frames."""
    schema = {"module": pl.String, "calls": pl.UInt32, "cpu_ns": pl.Int64, "gpu_ns": pl.Int64}
    frames = frames_of(source)
    mods = frames.trace.python.filter(pl.col("name").str.starts_with("nn.Module: ") & pl.col("dur_ns").is_not_null())
    mods_df = mods.select("name", "pid", "tid", s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).collect(
        engine="in-memory")
    if mods_df.height == 0:
        return pl.DataFrame(schema=schema)
    launches = (
        frames.launches.filter(pl.col("launch_ts_ns").is_not_null())
        .select(pid="launch_pid", tid="launch_tid", t="launch_ts_ns", d="dur_ns")
        .sort("t").with_columns(cum=pl.col("d").fill_null(0).cum_sum().over("pid", "tid"))
    )
    # GPU time launched in [s, e) = cumulative sum at the last launch before e - at the last before s.
    before = launches.select("pid", "tid", "t", "cum").sort("t")

    def cum_at(col: str) -> pl.DataFrame:
        left = mods_df.with_row_index("i").select("i", "pid", "tid", at=pl.col(col) - 1).sort("at")
        return left.join_asof(before, left_on="at", right_on="t", by=["pid", "tid"], strategy="backward",
                              check_sortedness=False).select(
            "i", pl.col("cum").fill_null(0).alias(col))

    with_gpu = (
        mods_df.with_row_index("i").drop("s", "e").join(cum_at("e"), on="i").join(cum_at("s"), on="i", suffix="_s")
        .select("i", gpu_ns=pl.col("e") - pl.col("s"))
    )
    return (
        mods_df.with_row_index("i").join(with_gpu, on="i")
        .group_by(module=pl.col("name").str.strip_prefix("nn.Module: "))
        .agg(calls=pl.len(), cpu_ns=(pl.col("e") - pl.col("s")).sum(), gpu_ns=pl.col("gpu_ns").sum())
        .sort("cpu_ns", "module", descending=[True, False])
        .head(top)
        .cast(schema)  # type: ignore[arg-type]
    )


def idle_by_cause(gaps: GapsResult, windows: pl.DataFrame) -> pl.DataFrame:
    """step, idle_<cause>_ns for every GapCause: each step's part of the idle gaps, summed over devices.

    A gap is a maximal idle stretch of the (merged) window, so it can run over a step boundary; it is split
    at the step windows (`windows`: step, start_ns, end_ns) and each piece counts in its own step, keeping
    the gap's cause:

        step 1 [0, 100), step 2 [100, 200); gap [70, 150) data_loading, gap [170, 200) other
        -> step 1: idle_data_loading_ns 30; step 2: idle_data_loading_ns 50, idle_other_ns 30
    """
    if gaps.gaps.height != gaps.gaps_total:
        raise ValueError("idle_by_cause needs every gap: call gpu_gaps without min_gap_ns or top")
    cols = [f"idle_{c.value}_ns" for c in GapCause]
    schema = {"step": pl.Int64, **{c: pl.Int64 for c in cols}}
    if gaps.devices_with_gpu_work == 0:
        return pl.DataFrame(schema=schema)
    w = windows.select("step", w_start="start_ns", w_end="end_ns")
    pieces = (
        gaps.gaps.select("cause", "start_ns", "end_ns")
        .join_where(w, pl.col("start_ns") < pl.col("w_end"), pl.col("end_ns") > pl.col("w_start"))
        .with_columns(ns=pl.min_horizontal("end_ns", "w_end") - pl.max_horizontal("start_ns", "w_start"))
    )
    per = pieces.group_by("step").agg(
        pl.col("ns").filter(pl.col("cause") == c.value).sum().alias(f"idle_{c.value}_ns") for c in GapCause)
    return (
        w.select("step").join(per, on="step", how="left", maintain_order="left")
        .with_columns(pl.col(cols).fill_null(0)).select(list(schema)).cast(schema)  # type: ignore[arg-type]
        .sort("step")
    )


def _no_steps(modules: pl.DataFrame) -> StepsResult:
    """The result for a trace without ProfilerStep spans: nothing per step, only the module times."""
    return StepsResult(steps_found=0, mean_wall_ns=None, gpu_busy_fraction=None, mean_data_loading_ns=None,
                       mean_data_loading_exposed_ns=None, outlier_steps=[], steps=pl.DataFrame(),
                       stats=pl.DataFrame(), idle_by_cause=pl.DataFrame(), modules=modules)


def _gpu_by_kind(gpu_by_step: pl.DataFrame) -> pl.DataFrame:
    """step, kernel_ns, memcpy_ns, memset_ns: summed durations of the GPU work each step launched."""
    return gpu_by_step.group_by("step").agg(
        kernel_ns=pl.col("dur_ns").filter(pl.col("kind") == Kind.KERNEL.value).sum(),
        memcpy_ns=pl.col("dur_ns").filter(pl.col("kind") == Kind.MEMCPY.value).sum(),
        memset_ns=pl.col("dur_ns").filter(pl.col("kind") == Kind.MEMSET.value).sum(),
    )


def _gpu_busy(windows: pl.DataFrame, all_gpu: pl.DataFrame) -> pl.DataFrame:
    """step, gpu_busy_ns: the union of the GPU work (s, e) inside each step window.

    Any GPU work in a window counts (a previous step's spill-over included); an interval is found by the
    windows holding its start and its end (one spanning three windows is not seen whole).
    """
    return _covered_length(windows, _in_windows(all_gpu, windows)).rename({"busy_ns": "gpu_busy_ns"})


def _step_table(windows: pl.DataFrame, parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The per-step table: each part (step, columns...) joined onto the windows, missing times 0, the
    GPU idle time and busy fraction derived, in StepsResult.steps's column order, sorted by step."""
    out = windows
    for part in parts:
        out = out.join(part, on="step", how="left", maintain_order="left")
    for c in (*PHASES, "other_cpu"):
        if c not in out.columns:
            out = out.with_columns(pl.lit(0, pl.Int64).alias(c))
    out = out.with_columns(pl.col(c).fill_null(0) for c in (
        "gpu_busy_ns", "kernel_ns", "memcpy_ns", "memset_ns", *PHASES, "other_cpu", "data_loading_exposed_ns"))
    return out.select(
        "step", "start_ns", "cpu_start_ns", "cpu_end_ns", "end_ns", "wall_ns", "cpu_ns", "gpu_busy_ns",
        gpu_idle_ns=pl.col("wall_ns") - pl.col("gpu_busy_ns"),
        gpu_busy_fraction=pl.when(pl.col("wall_ns") > 0).then(pl.col("gpu_busy_ns") / pl.col("wall_ns")),
        kernel_ns="kernel_ns", memcpy_ns="memcpy_ns", memset_ns="memset_ns",
        data_loading_ns="data_loading", data_loading_exposed_ns="data_loading_exposed_ns",
        forward_ns="forward", backward_ns="backward", optimizer_ns="optimizer", other_cpu_ns="other_cpu",
    ).sort("step")


def _unknown_gpu(steps: pl.DataFrame) -> pl.DataFrame:
    """The GPU columns set to null: with no GPU work recorded they are unknown, not 0 busy / all idle."""
    gpu_cols = ("gpu_busy_ns", "gpu_idle_ns", "gpu_busy_fraction", "kernel_ns", "memcpy_ns", "memset_ns")
    return steps.with_columns(pl.lit(None, steps.schema[c]).alias(c) for c in gpu_cols)


def step_breakdown(source: Source, *, gaps: GapsResult | None = None) -> StepsResult:
    """Per ProfilerStep: window and CPU span, GPU busy/idle, kernel/memcpy/memset time, CPU phases
    (data loading, forward, backward, optimizer, other), exposed data loading, GPU idle by cause; stats and
    outliers. `gaps` is `gaps.gpu_gaps(trace)` when the caller already has it (every gap, default window)."""
    frames = frames_of(source)
    trace = frames.trace
    windows = frames.step_windows
    modules = module_times(frames)
    if windows.height == 0:
        return _no_steps(modules)
    all_gpu = trace.gpu.filter(pl.col("dur_ns").is_not_null()).select(
        s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory")
    phases_iv = phase_intervals(trace, windows)
    out = _step_table(windows, [_gpu_busy(windows, all_gpu), _gpu_by_kind(frames.gpu_by_step),
                                _phase_split(windows, phases_iv), exposed_data_loading(trace, windows)])
    out = out.with_columns(outlier=outliers(out["wall_ns"]))
    has_gpu = all_gpu.height > 0
    if not has_gpu:
        out = _unknown_gpu(out)
    if gaps is None:
        gaps = gpu_gaps(frames)
    wall_total, busy_total = int(out["wall_ns"].sum()), int(out["gpu_busy_ns"].sum() or 0)
    mean_frac = busy_total / wall_total if wall_total and has_gpu else None
    return StepsResult(
        steps_found=out.height,
        mean_wall_ns=_mean(out["wall_ns"]),
        gpu_busy_fraction=float(mean_frac) if mean_frac is not None else None,
        mean_data_loading_ns=_mean(out["data_loading_ns"]),
        mean_data_loading_exposed_ns=_mean(out["data_loading_exposed_ns"]),
        outlier_steps=out.filter(pl.col("outlier"))["step"].to_list(),
        steps=out,
        stats=_stats(out.drop("outlier")),
        idle_by_cause=idle_by_cause(gaps, out),
        modules=modules,
        note=_cpu_beyond_wall(out),
        left_out="; ".join(frames.left_out),
    )


def _in_windows(ivs: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """(step, s, e) for each interval, once per window holding its start or its last ns."""
    w = windows.select("step", w_s="start_ns", w_e="end_ns").sort("w_s")
    out = []
    for at in (pl.col("s"), pl.col("e") - 1):
        hit = ivs.with_columns(at=at).sort("at").join_asof(w, left_on="at", right_on="w_s", strategy="backward")
        out.append(hit.filter(pl.col("at") < pl.col("w_e")).select("step", "s", "e"))
    return pl.concat(out).unique()


def _mean(s: pl.Series) -> float | None:
    """The mean as a float, None for an empty or all-null series."""
    m = s.cast(pl.Float64).mean()
    return float(m) if isinstance(m, (int, float)) and not math.isnan(m) else None
