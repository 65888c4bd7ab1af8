"""How far from the hardware limit: achieved TFLOP/s and GB/s per op, the roofline, MFU per step, and which
kernels to hand to the vendor's kernel profiler (Nsight Compute, ROCm Compute Profiler).

Each op that `flops.op_flops` counts (the outermost op with a FLOP model) gets the GPU time of the kernels
launched by it or by any op nested inside it (launch -> op by correlation / External id). Then, per op
(name, family, dtype):

    achieved TFLOP/s = FLOPs / GPU time        achieved GB/s = bytes / GPU time
    intensity        = FLOPs / bytes (FLOP/byte)
    attainable       = min(peak TFLOP/s at the op's dtype, intensity x bandwidth)      (the roofline)
    bound            = compute where intensity >= ridge point (peak / bandwidth), else memory
    roofline share   = achieved / attainable (for an op with no FLOPs, a copy or a norm: GB/s / bandwidth)

    aten::mm bf16 on an H100 SXM (989.5 TFLOP/s, 3,350 GB/s, ridge 295 FLOP/B): 2*4096^3 FLOPs, 3*4096^2*2 B,
    in 200 us -> 687 TFLOP/s, intensity 1365 FLOP/B (compute-bound), 69% of its roofline

MFU per step = the model FLOPs of the counted ops that start inside the step's window / (the step's wall time
x the peak at the dominant dtype, the dtype holding most FLOPs). On a GPU trace only ops that launched
kernels count (an op with none ran on the CPU: a data-loading transform). A step holding a matmul,
convolution or attention op whose recorded inputs do not resolve its FLOPs has no MFU: its FLOPs would be a
lower bound. Where activation checkpointing's recomputation is visible (reentrant `torch.utils.checkpoint`:
the forward ops re-run directly inside `CheckpointFunctionBackward`, not inside a backward node of their
own), those FLOPs are recomputed work: they count in HFU (hardware FLOPs utilization) and not in MFU.
An MFU (or HFU) above 100% is refused, the headline's and each step's: no GPU runs past its peak, so the peak
is not the one the kernels ran at (bf16 matmuls held to the fp32 peak by `--dtype fp32`) or the shapes are
wrong; `note` says so and which option to pass.

An fp32 op whose kernels run on TF32 tensor cores (by their cuBLAS / CUTLASS names, `TF32_KERNEL`) is
held to the TF32 peak and shows as dtype tf32. An op above its attainable figure is flagged: either the
peak is wrong for it or its shapes are; an op with no FLOPs above the bandwidth read its inputs at less
than their full size (a broadcast operand, a view) or from cache. Peaks come from `peaks` (the device
table, or the user's overrides); on an unknown device the FLOPs are still reported, the figures needing a
peak are None and `note` says which option supplies it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import polars as pl

from stepscope.analyze.blame import innermost, short_name
from stepscope.analyze.flops import FLOP_FAMILIES, FlopsResult, op_flops
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.graph_capture import replayed
from stepscope.analyze.peaks import (
    DTYPES,
    Dtype,
    ResolvedDevice,
    Vendor,
    busiest_gpu,
    gpu_vendor,
    resolve_peaks,
)
from stepscope.analyze.schema import Kind
from stepscope.analyze.window import cpu_spans, with_step

#: an fp32 op's kernel that runs on TF32 tensor cores (cuBLAS / CUTLASS names): the op is held to the TF32 peak
#:   cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4   ampere_tf32_s1688gemm_tf32_128x128_16x3_nn
#:   sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32   (not: ampere_sgemm_128x64_nn, SIMT fp32)
TF32_KERNEL = r"(?i)tf32|tensorop_s\d{3,}"

#: ops below this share of their roofline are worth a look in Nsight Compute: the HANDOFF_TOP that lose the most
#: GPU time below it (gpu time x (1 - share)) come with an `ncu` command
HANDOFF_BELOW = 0.9
HANDOFF_TOP = 3


@dataclass(frozen=True, kw_only=True)
class RooflineResult:
    """Headline: the device and its peaks, model FLOPs, achieved TFLOP/s (the FLOPs over `flop_ops_gpu_ns`, the
    GPU time of the ops that have FLOPs; `modelled_gpu_ns` is the time of every op with a model, bytes-only ones
    too) and MFU and HFU over the steps (HFU is MFU where nothing is recomputed). On a trace without GPU kernels
    (a CPU capture) the ops and families carry their FLOPs and bytes with no GPU time, and every figure that
    holds time to a GPU's peak (achieved, roofline, MFU) is None: CPU time is not held to it.

    `families`: family, calls, flops, bytes, gpu_ns, tflops, gbps (the ops below, summed per family).
    `ops`: name, family, dtype, calls, flops, bytes, gpu_ns, tflops, gbps, intensity_flop_per_byte,
    attainable_tflops, roofline_fraction, bound, above_peak (one row per op name x family x dtype, most GPU
    time first). `steps`: step, wall_ns, flops (model FLOPs), hardware_flops (with recomputation),
    uncounted_ops (FLOP-bearing ops whose FLOPs could not be counted: the step's tflops and MFU are then
    None), tflops, mfu_fraction; the headline's `uncounted_ops` counts them over the whole trace. `handoff`: the
    kernels far below their roofline that cost most, each with the command of the vendor's kernel profiler that
    profiles it (`kernel_profile_command`). `vendor`: who made the GPU (`peaks.gpu_vendor`; None where the trace
    does not say, and the commands are then NVIDIA's). `unmodelled`: the kernel time no FLOP model covers
    (`unmodelled_gpu_fraction`) by the outermost op around its launch, largest first: name, gpu_ns,
    of_kernel_time_fraction.
    """

    shapes_recorded: bool
    device: str | None
    vendor: Vendor | None
    peak_from: str | None
    dtype: str | None
    peak_tflops: float | None
    bandwidth_gbps: float | None
    ridge_flop_per_byte: float | None
    model_flops: int
    recomputed_flops: int
    modelled_gpu_ns: int | None
    flop_ops_gpu_ns: int | None
    achieved_tflops: float | None
    mfu_fraction: float | None
    hfu_fraction: float | None
    unmodelled_gpu_fraction: float | None
    ops_above_peak: int
    uncounted_ops: int
    note: str
    families: pl.DataFrame
    ops: pl.DataFrame
    steps: pl.DataFrame
    handoff: pl.DataFrame
    unmodelled: pl.DataFrame = field(default_factory=pl.DataFrame)  # `flops.FlopsResult.unmodelled_ops`


def roofline(source: Source, *, flops: FlopsResult | None = None, peak_tflops: float | None = None,
             peak_bandwidth_gbps: float | None = None, dtype: Dtype | None = None) -> RooflineResult:
    """Achieved performance per op against the device's roofline, and MFU per step (module docstring).

    `flops` is `op_flops(...)` of the trace when the caller has it; `peak_tflops` / `peak_bandwidth_gbps`
    override the device table, `dtype` the dominant dtype the MFU is measured at.
    """
    frames = frames_of(source)
    flops_result = op_flops(frames) if flops is None else flops
    every = _with_recompute(frames, _counted(frames, flops_result))
    # on a GPU trace, an op that launched no kernel ran on the CPU (a data-loading transform): not GPU work
    gpu_trace = bool(frames.launches.height)
    counted = every.filter(pl.col("gpu_ns") > 0) if gpu_trace else every
    main_dtype = dtype or _dominant_dtype(counted)
    vendor = gpu_vendor(frames)
    device = _device(frames, peak_tflops, peak_bandwidth_gbps, main_dtype)
    ops = _per_op(frames, counted, device, peak_tflops, peak_bandwidth_gbps, gpu_trace=gpu_trace)
    missing = _uncounted(flops_result)
    peak = device.peak_tflops if device is not None else None
    held = peak if gpu_trace else None  # a GPU's peak is never held to CPU time: without GPU work, no MFU
    steps = _per_step(frames, counted, missing, held)
    gpu_ns = int(ops["gpu_ns"].sum() or 0) if gpu_trace else None
    flop_ns = int(ops.filter(pl.col("flops") > 0)["gpu_ns"].sum() or 0) if gpu_trace else None
    total = int(counted["flops"].sum() or 0)
    recomputed = int(counted.filter("recomputed")["flops"].sum() or 0)
    wall = int(steps["wall_ns"].sum() or 0)
    hardware = int(steps["hardware_flops"].sum() or 0)
    exact = steps.height > 0 and int(steps["uncounted_ops"].sum()) == 0
    mfu = int(steps["flops"].sum()) / (wall * held * 1e3) if wall and held and exact else None
    hfu = hardware / (wall * held * 1e3) if wall and held and exact else None  # = MFU where nothing is recomputed
    impossible = max(mfu or 0.0, hfu or 0.0)
    return RooflineResult(
        shapes_recorded=flops_result.shapes_recorded,
        device=device.name if device is not None else None, vendor=vendor,
        peak_from=_origin(device),
        dtype=main_dtype, peak_tflops=peak,
        bandwidth_gbps=device.peak_bandwidth_gbps if device is not None else None,
        ridge_flop_per_byte=device.ridge_point_flop_per_byte if device is not None else None,
        model_flops=total - recomputed, recomputed_flops=recomputed, modelled_gpu_ns=gpu_ns,
        flop_ops_gpu_ns=flop_ns, achieved_tflops=total / flop_ns / 1e3 if flop_ns else None,
        mfu_fraction=mfu if impossible <= 1.0 else None,
        hfu_fraction=hfu if impossible <= 1.0 else None,
        unmodelled_gpu_fraction=flops_result.unmodelled_gpu_fraction,
        ops_above_peak=int(ops["above_peak"].sum() or 0) if ops.height else 0,
        uncounted_ops=missing.height,
        note=_note(flops_result, device, main_dtype, steps, gpu_trace=gpu_trace,
                   cpu_side=every.filter(pl.col("flops") > 0).height - counted.filter(pl.col("flops") > 0).height,
                   above_peak=impossible if impossible > 1.0 else None, dominant=_dominant_dtype(counted),
                   unmapped_replays=_unmapped_replays(frames),
                   bytes_above=ops.filter(pl.col("above_peak") & (pl.col("flops") == 0)).height),
        families=_families(ops), ops=ops, steps=steps, handoff=_handoff(frames, ops, vendor),
        unmodelled=flops_result.unmodelled_ops,
    )


#: graph-replayed kernels no capture profile maps past this share of kernel time: the note asks for the capture
UNMAPPED_REPLAYS_NOTED = 0.5


def _unmapped_replays(frames: TraceFrames) -> float:
    """The share of kernel time held by graph-replayed kernels that no capture op was mapped to: a replayed kernel
    has no CPU op of its own, so no FLOP model counts it (`graphs.with_graph_capture` maps them)."""
    kernels = frames.launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("dur_ns").is_not_null())
    total = int(kernels["dur_ns"].sum() or 0)
    if total == 0:
        return 0.0
    mapped = frames.graph_ops["event_id"].implode()
    unmapped = replayed(kernels).filter(~pl.col("op_event_id").is_in(mapped).fill_null(False))
    return int(unmapped["dur_ns"].sum() or 0) / total


def _counted(frames: TraceFrames, flops: FlopsResult) -> pl.DataFrame:
    """The counted ops (event_id, name, family, dtype, flops, bytes, ts_ns) with the GPU time of every kernel
    launched under them (gpu_ns)."""
    rows = flops.ops
    if rows.height == 0:
        return pl.DataFrame(schema={"event_id": pl.Int64, "name": pl.String, "family": pl.String,
                                    "dtype": pl.String, "flops": pl.Int64, "bytes": pl.Int64, "ts_ns": pl.Int64,
                                    "pid": pl.String, "tid": pl.String, "gpu_ns": pl.Int64})
    kernel_ns = (
        frames.launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("op_event_id").is_not_null())
        .group_by("op_event_id").agg(ns=pl.col("dur_ns").sum(),
                                     tf32=pl.col("name").str.contains(TF32_KERNEL).any())
        .join(rows.select("event_id", "counting_event_id"), left_on="op_event_id", right_on="event_id")
        .group_by("counting_event_id").agg(gpu_ns=pl.col("ns").sum(), tf32=pl.col("tf32").any())
    )
    return (
        rows.filter(pl.col("counted"))
        .select("event_id", "name", "family", "dtype", pl.col("flops").cast(pl.Int64), pl.col("bytes").cast(pl.Int64),
                "ts_ns", "pid", "tid")
        .join(kernel_ns, left_on="event_id", right_on="counting_event_id", how="left", maintain_order="left")
        .with_columns(pl.col("gpu_ns").fill_null(0).cast(pl.Int64),
                      dtype=pl.when((pl.col("dtype") == "fp32") & pl.col("tf32").fill_null(False))
                      .then(pl.lit("tf32")).otherwise(pl.col("dtype")))
        .drop("tf32")
    )


def _with_recompute(frames: TraceFrames, counted: pl.DataFrame) -> pl.DataFrame:
    """`counted` plus `recomputed`: the op runs directly inside CheckpointFunctionBackward (the innermost
    autograd node around it is the checkpoint's own, so it is the forward re-run, not a backward op).

        evaluate_function: CheckpointFunctionBackward > aten::linear              -> recomputed
        evaluate_function: CheckpointFunctionBackward > evaluate_function: AddmmBackward0 > aten::mm -> not
    """
    nodes = frames.trace.cpu.filter(pl.col("name").str.starts_with(_NODE))
    points = counted.select(pl.col("pid", "tid").fill_null(""), "ts_ns")
    node = innermost(nodes, points)["name"] if counted.height else pl.Series("name", [], dtype=pl.String)
    return counted.with_columns(recomputed=(node == _NODE + "CheckpointFunctionBackward").fill_null(False))


_NODE = "autograd::engine::evaluate_function: "


def _dominant_dtype(counted: pl.DataFrame) -> Dtype | None:
    """The dtype holding most FLOPs, where it is one the peak table knows."""
    by = counted.filter(pl.col("flops") > 0).group_by("dtype").agg(pl.col("flops").sum()).sort(
        "flops", "dtype", descending=[True, False])
    for value in by["dtype"].to_list():
        if value in DTYPES:
            return value  # type: ignore[no-any-return]
    return None


def _device(frames: TraceFrames, peak_tflops: float | None, peak_bandwidth_gbps: float | None,
            dtype: Dtype | None) -> ResolvedDevice | None:
    """The GPU whose peaks apply: the one that ran the most kernel time (the first listed when unknown)."""
    resolved = resolve_peaks(frames, peak_tflops=peak_tflops, peak_bandwidth_gbps=peak_bandwidth_gbps, dtype=dtype)
    if not resolved.devices:
        return None
    busiest = busiest_gpu(frames.launches)
    device = resolved.for_device(busiest) if busiest is not None else None
    return device or resolved.devices[0]


_OP_COLUMNS = ("name", "family", "dtype", "calls", "flops", "bytes", "gpu_ns", "tflops", "gbps",
               "intensity_flop_per_byte", "attainable_tflops", "roofline_fraction", "bound", "above_peak")


def _per_op(frames: TraceFrames, counted: pl.DataFrame, device: ResolvedDevice | None,
            peak_tflops: float | None, peak_bandwidth_gbps: float | None, *, gpu_trace: bool = True) -> pl.DataFrame:
    """Achieved figures and the roofline per op name x family x dtype (see the module docstring). Without GPU
    work (`gpu_trace` False: a CPU capture) every op with a model, its FLOPs, bytes and intensity; no GPU time,
    and nothing held to a peak."""
    grouped = (
        counted.group_by("name", "family", "dtype")
        .agg(calls=pl.len(), flops=pl.col("flops").sum(), bytes=pl.col("bytes").sum(), gpu_ns=pl.col("gpu_ns").sum())
    )
    if not gpu_trace:
        nothing = pl.lit(None, pl.Float64)
        return grouped.select(
            "name", "family", "dtype", "calls", "flops", "bytes", gpu_ns=pl.lit(None, pl.Int64), tflops=nothing,
            gbps=nothing, attainable_tflops=nothing, roofline_fraction=nothing,
            intensity_flop_per_byte=pl.when((pl.col("bytes") > 0) & (pl.col("flops") > 0))
            .then(pl.col("flops") / pl.col("bytes")),
            bound=pl.lit(None, pl.String), above_peak=pl.lit(False),
        ).select(_OP_COLUMNS).sort("flops", "bytes", "name", "dtype", descending=[True, True, False, False],
                                   nulls_last=True)
    grouped = grouped.filter(pl.col("gpu_ns") > 0)
    peaks = pl.DataFrame(
        [{"dtype": d, "peak_tflops": _peak_at(device, d, peak_tflops)} for d in grouped["dtype"].unique().to_list()],
        schema={"dtype": pl.String, "peak_tflops": pl.Float64})
    bandwidth = device.peak_bandwidth_gbps if device is not None else peak_bandwidth_gbps
    intensity = pl.col("flops") / pl.col("bytes")
    attainable = pl.min_horizontal("peak_tflops", intensity * pl.lit(bandwidth, pl.Float64) / 1e3)
    out = (
        grouped.join(peaks, on="dtype", how="left", maintain_order="left")
        .with_columns(tflops=pl.when(pl.col("flops") > 0).then(pl.col("flops") / pl.col("gpu_ns") / 1e3),
                      gbps=pl.col("bytes") / pl.col("gpu_ns"),
                      intensity_flop_per_byte=pl.when((pl.col("bytes") > 0) & (pl.col("flops") > 0)).then(intensity))
        .with_columns(attainable_tflops=pl.when(pl.col("flops") > 0).then(attainable))
        .with_columns(roofline_fraction=pl.when(pl.col("flops") > 0)
                      .then(pl.col("tflops") / pl.col("attainable_tflops"))
                      .otherwise(pl.col("gbps") / pl.lit(bandwidth, pl.Float64)),
                      bound=pl.when(pl.col("flops") == 0).then(pl.lit("memory"))
                      .when(pl.col("intensity_flop_per_byte").is_null() | pl.col("peak_tflops").is_null()
                            | pl.lit(bandwidth is None)).then(None)
                      .when(pl.col("intensity_flop_per_byte") * pl.lit(bandwidth, pl.Float64) / 1e3
                            >= pl.col("peak_tflops")).then(pl.lit("compute")).otherwise(pl.lit("memory")))
        .with_columns(above_peak=pl.col("roofline_fraction").fill_null(0.0) > 1.0)
    )
    return out.select(_OP_COLUMNS).sort(  # (an op in two dtypes: by name, then dtype)
        "gpu_ns", "name", "dtype", descending=[True, False, False], nulls_last=True)


def plotted(ops: pl.DataFrame) -> pl.DataFrame:
    """The ops a roofline figure places: those with FLOPs, GPU time and bytes (an achieved TFLOP/s and an
    arithmetic intensity)."""
    return ops.filter(pl.col("tflops").is_not_null() & pl.col("intensity_flop_per_byte").is_not_null()
                      & (pl.col("tflops") > 0))


def why_nothing_plotted(result: RooflineResult) -> str | None:
    """Why no op of `result` can be placed on a roofline (None where one can), the first missing piece named:
    input shapes, FLOPs at all, GPU time for them, then bytes. The device's peaks are not needed: without them
    the figure shows the points alone."""
    if plotted(result.ops).height:
        return None
    if not result.shapes_recorded:
        return "the trace has no input shapes, so no op has FLOPs (profile with record_shapes=True)"
    if result.model_flops + result.recomputed_flops == 0:
        return "no op in this trace has a FLOP count (see `stepscope flops`)"
    if result.ops.filter((pl.col("flops") > 0) & (pl.col("gpu_ns").fill_null(0) > 0)).height == 0:
        return "no op with FLOPs ran GPU work (a roofline places achieved TFLOP/s on the GPU)"
    return "no op with FLOPs and GPU time has a byte count, so none has an arithmetic intensity"


def _families(ops: pl.DataFrame) -> pl.DataFrame:
    """The per-op rows summed per family: calls, FLOPs, bytes, GPU time, achieved TFLOP/s and GB/s."""
    return (
        ops.group_by("family").agg(pl.col("calls", "flops", "bytes").sum(),
                                   gpu_ns=pl.when(pl.col("gpu_ns").count() > 0).then(pl.col("gpu_ns").sum()))
        .with_columns(tflops=pl.when(pl.col("flops") > 0).then(pl.col("flops") / pl.col("gpu_ns") / 1e3),
                      gbps=pl.col("bytes") / pl.col("gpu_ns"))
        .sort("gpu_ns", "flops", "bytes", "family", descending=[True, True, True, False], nulls_last=True)
    )


def _peak_at(device: ResolvedDevice | None, dtype: str | None, override: float | None) -> float | None:
    """The peak TFLOP/s an op of `dtype` is held to: the override, else the device row's figure."""
    if override is not None:
        return override
    if device is None or device.row is None or dtype not in DTYPES:
        return None
    return device.row.peak_tflops(dtype)


def _uncounted(flops: FlopsResult) -> pl.DataFrame:
    """ts_ns of each matmul / convolution / attention op whose recorded inputs did not resolve its FLOPs and
    that no counted op encloses (`aten::conv2d` and the `aten::cudnn_convolution` inside it: both)."""
    rows = flops.ops.filter(pl.col("skip_reason").is_not_null() & pl.col("counting_event_id").is_null()
                            & pl.col("family").is_in(list(FLOP_FAMILIES)))
    return rows.select("ts_ns")


def _per_step(frames: TraceFrames, counted: pl.DataFrame, missing: pl.DataFrame,
              peak: float | None) -> pl.DataFrame:
    """step, wall_ns, flops, hardware_flops, uncounted_ops, tflops, mfu_fraction: the counted ops' FLOPs by
    the step whose CPU span holds their start (`window.cpu_spans`: in a GPU-bound loop the CPU runs ahead, and
    an op starts before its step's window does), over the step's window. A step holding a FLOP-bearing op
    that could not be counted (`_uncounted`) has no TFLOP/s or MFU: its FLOPs would be a lower bound; a step whose
    MFU would pass 100% has none either (the module docstring); `steps_above_peak` counts them."""
    windows = frames.step_windows
    schema = {"step": pl.Int64, "wall_ns": pl.Int64, "flops": pl.Int64, "hardware_flops": pl.Int64,
              "uncounted_ops": pl.Int64, "tflops": pl.Float64, "mfu_fraction": pl.Float64}
    if windows.height == 0:
        return pl.DataFrame(schema=schema)
    spans = cpu_spans(frames.profiler_steps)
    stepped = with_step(counted.select("ts_ns", "flops", "recomputed"), spans, at="ts_ns")
    per = stepped.filter(pl.col("step").is_not_null()).group_by("step").agg(
        flops=pl.col("flops").filter(~pl.col("recomputed")).sum(), hardware_flops=pl.col("flops").sum())
    gaps = with_step(missing, spans, at="ts_ns").filter(pl.col("step").is_not_null()).group_by("step").agg(
        uncounted_ops=pl.len())
    return (
        windows.select("step", "wall_ns")
        .join(per, on="step", how="left", maintain_order="left")
        .join(gaps, on="step", how="left", maintain_order="left")
        .with_columns(pl.col("flops", "hardware_flops", "uncounted_ops").fill_null(0))
        .with_columns(tflops=pl.when(pl.col("uncounted_ops") == 0).then(pl.col("flops") / pl.col("wall_ns") / 1e3))
        .with_columns(mfu_fraction=pl.col("tflops") / peak if peak else pl.lit(None, pl.Float64))
        .with_columns(mfu_fraction=pl.when(pl.col("mfu_fraction") <= 1.0).then("mfu_fraction"))
        .select(list(schema)).cast(schema)  # type: ignore[arg-type]
        .sort("step")
    )


def _handoff(frames: TraceFrames, ops: pl.DataFrame, vendor: Vendor | None) -> pl.DataFrame:
    """The longest kernel of each op that loses the most GPU time below its roofline (its GPU time x (1 - its
    share of the roofline), HANDOFF_TOP of them, each below HANDOFF_BELOW), with the command that profiles it
    (`kernel_profile_command`).

        GEMMs 51 ms at 78% (11 ms lost), a fill 2.6 µs at 0% (2.6 µs lost)  ->  the GEMMs' kernel first
    """
    schema = {"op": pl.String, "kernel": pl.String, "gpu_ns": pl.Int64, "roofline_fraction": pl.Float64,
              "command": pl.String}
    lost = pl.col("gpu_ns") * (1 - pl.col("roofline_fraction").clip(0, 1))
    slow = ops.filter(pl.col("roofline_fraction") < HANDOFF_BELOW).sort(
        lost, "gpu_ns", descending=True, maintain_order=True).head(HANDOFF_TOP)
    if slow.height == 0:
        return pl.DataFrame(schema=schema)
    kernels = frames.launches.filter(pl.col("kind") == Kind.KERNEL.value).select(
        "name", "op_name", "ts_ns", "dur_ns").sort("ts_ns")
    rows = []
    for op in slow.iter_rows(named=True):  # a handful of rows
        mine = kernels.filter(pl.col("op_name") == op["name"])
        if mine.height == 0:
            continue
        top = mine.group_by("name").agg(ns=pl.col("dur_ns").sum()).sort("ns", "name", descending=[True, False])[
            "name"][0]
        short = str(pl.select(short_name(pl.lit(top))).item())
        name = short.split("::")[-1]
        same = kernels.filter(pl.col("name").str.contains(name, literal=True)).height
        rows.append({"op": op["name"], "kernel": short, "gpu_ns": int(mine["dur_ns"].sum()),
                     "roofline_fraction": op["roofline_fraction"],
                     "command": kernel_profile_command(vendor, name, same)})
    return pl.DataFrame(rows, schema=schema)


#: the kernel profiler `kernel_profile_command` names, by GPU vendor
KERNEL_PROFILER: dict[Vendor, str] = {"NVIDIA": "Nsight Compute", "AMD": "ROCm Compute Profiler"}


def kernel_profile_command(vendor: Vendor | None, name: str, launches: int) -> str:
    """The command that profiles kernel `name` (its name without namespaces) in the user's `python train.py`,
    with the kernel profiler of the GPU's vendor (NVIDIA's where None), given the trace recorded `launches` of
    kernels whose names hold it.

    NVIDIA: Nsight Compute on one instance from the middle of the capture (past warm-up: `--launch-skip`
    half of `launches`), its speed-of-light, memory and compute sections. AMD: ROCm Compute Profiler on the
    kernels whose names hold it (`-k` takes a name substring; its `-d` counts dispatches over the whole run,
    which a trace cannot number), every block and the roofline.
    """
    if vendor == "AMD":
        return shlex.join(["rocprof-compute", "profile", "-n", "stepscope", "-k", name, "--", "python", "train.py"])
    return shlex.join(["ncu", "--kernel-name", f"regex:{re.escape(name)}", "--launch-skip", str(max(0, launches // 2)),
                       "--launch-count", "1", "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis",
                       "--section", "ComputeWorkloadAnalysis", "-o", "stepscope_ncu", "python", "train.py"])


def _origin(device: ResolvedDevice | None) -> str | None:
    """Where the peaks came from, in words: the table row and its source, or the override."""
    if device is None:
        return None
    if device.tflops_from == "override" or device.bandwidth_from == "override":
        return "--peak-tflops / --peak-bandwidth"
    return f"{device.row.name} ({device.row.source})" if device.row is not None else None


def _note(flops: FlopsResult, device: ResolvedDevice | None, dtype: Dtype | None, steps: pl.DataFrame, *,
          cpu_side: int, gpu_trace: bool = True, above_peak: float | None = None, dominant: Dtype | None = None,
          unmapped_replays: float = 0.0, bytes_above: int = 0) -> str:
    """What the reader must know before trusting the figures: graph replays holding most kernel time with no
    capture profile to map them (`unmapped_replays`, their share), no shapes, an unknown device, no peak, ops
    whose recorded inputs do not resolve their FLOP model (and the MFU refused for it), no steps to hold
    MFU to, an MFU above 100% (`above_peak`, refused; `dominant`: the dtype holding most FLOPs, to suggest), ops
    with FLOPs that ran on the CPU and are left out, a trace without GPU work (`gpu_trace` False), ops with no
    FLOPs above the bandwidth in a trace without Input Strides (`bytes_above`: a broadcast input counted at its
    full size)."""
    parts = []
    if unmapped_replays > UNMAPPED_REPLAYS_NOTED:
        parts.append(f"graph-replayed kernels hold {unmapped_replays:.1%} of kernel time and no profile of the graph "
                     "capture maps them to ops, so their FLOPs are not counted: pass one (--graph-capture FILE)")
    if gpu_trace or not flops.shapes_recorded:
        parts.append(_peak_note(flops, device, dtype))
    else:
        parts.append("the trace has no GPU kernels: ops and families show their FLOPs and bytes with no GPU time, "
                     "and nothing is held to a GPU's peak (achieved TFLOP/s, the roofline and MFU need GPU kernel "
                     "time, not CPU time)")
    if flops.ops_skipped and flops.shapes_recorded:
        reasons = flops.ops.filter(pl.col("skip_reason").is_not_null()).group_by("skip_reason").len().sort(
            "len", descending=True)
        first = f" (most: {reasons['skip_reason'][0]})" if reasons.height else ""
        parts.append(f"{_ops(flops.ops_skipped)} with a FLOP model could not be counted from what was "
                     f"recorded{first}")
    uncounted = int(steps["uncounted_ops"].sum()) if steps.height else 0
    if uncounted:
        parts.append(f"no MFU: {_ops(uncounted, 'matmul/convolution/attention')} of the steps are among them, so "
                     "the steps' FLOPs would be a lower bound")
    elif steps.height == 0 and flops.shapes_recorded and dtype is not None and gpu_trace:
        parts.append("no MFU: the trace has no ProfilerStep# windows to hold the FLOPs to (MFU is per step)")
    elif above_peak is not None and device is not None:
        which = (f"most FLOPs are {dominant}: pass --dtype {dominant}" if dominant is not None and dominant != dtype
                 else "pass --dtype with the dtype they ran at")
        parts.append(f"no MFU: the steps' FLOPs come to {above_peak:.0%} of the {dtype + ' ' if dtype else ''}peak "
                     f"({device.peak_tflops:,.4g} TFLOP/s), more than the GPU can do: the kernels ran at another "
                     f"peak ({which}) or the peak is wrong (pass --peak-tflops)")
    elif gpu_trace and device is not None and device.peak_tflops and (above := _steps_above_peak(steps)):
        parts.append(f"{above:,} {'step has' if above == 1 else 'steps have'} no MFU: the FLOPs of the ops that "
                     "start in it pass 100% of the peak over its window")
    if bytes_above and not flops.strides_recorded:
        parts.append(f"{_ops(bytes_above)} with no FLOPs {'passes' if bytes_above == 1 else 'pass'} the memory "
                     "bandwidth: the trace records no Input Strides, so an input broadcast to a larger shape "
                     "(expand) counts at its full size and its bytes are overcounted")
    if cpu_side:
        parts.append(f"{_ops(cpu_side)} with FLOPs launched no GPU kernel (they ran on the CPU) and "
                     f"{'is' if cpu_side == 1 else 'are'} left out")
    return "; ".join(p for p in parts if p)


def _steps_above_peak(steps: pl.DataFrame) -> int:
    """Steps whose MFU was refused for passing 100% (a TFLOP/s and a peak, but no MFU)."""
    if steps.height == 0:
        return 0
    return steps.filter(pl.col("tflops").is_not_null() & pl.col("mfu_fraction").is_null()).height


def _ops(count: int, kind: str = "") -> str:
    """'1 op', '1,272 ops', '3 matmul ops': a count of ops in a note."""
    return f"{count:,} {kind + ' ' if kind else ''}{'op' if count == 1 else 'ops'}"


def _peak_note(flops: FlopsResult, device: ResolvedDevice | None, dtype: Dtype | None) -> str:
    """The part of the note about shapes and peaks."""
    if not flops.shapes_recorded:
        return ("the trace has no input shapes: profile with record_shapes=True to get FLOPs, the roofline "
                "and MFU")
    if device is None:
        return "the trace lists no GPU: pass --peak-tflops and --peak-bandwidth to compare with a peak"
    if device.row is None and (device.peak_tflops is None or device.peak_bandwidth_gbps is None):
        which = f"unknown device {device.name!r}" if device.name else "the trace does not name its GPU"
        return (f"{which}: pass --peak-tflops (at {dtype or 'the dominant dtype'}) and --peak-bandwidth (GB/s) to "
                "compare with its peak")
    if dtype is None:
        return "no op in this trace has a FLOP model (matmul, convolution, attention): nothing to hold to a peak"
    if device.peak_tflops is None:
        return f"{device.name} has no {dtype} figure in the peak table: pass --peak-tflops"
    return ""
