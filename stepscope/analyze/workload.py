"""What kind of GPU work a trace holds, as shares of its kernel time: replayed from CUDA/HIP graphs, compiled
(Triton / inductor kernels), and, among the ops with FLOPs, memory-bound on the device's roofline. The
verdict (`summary.RULES`) reads them so its advice fits code that is already compiled or graph-replayed, and a
busy GPU whose matmuls are bandwidth-bound (decode, small batches) is not told to "speed up the math".

    vLLM decode, 96% of kernel time replayed from hipGraphLaunch      graph_replay_fraction 0.96
    a diffusion pipeline under torch.compile, triton_* kernels 70%    compiled_fraction     0.70
    decode GEMMs at intensity 60 FLOP/B on an H100 (ridge 295)        memory_bound_fraction 0.9
"""

from __future__ import annotations

import polars as pl

from stepscope.analyze.frames import TraceFrames
from stepscope.analyze.graph_capture import GRAPH_LAUNCH
from stepscope.analyze.kernels import triton_kernel_expr
from stepscope.analyze.roofline import RooflineResult
from stepscope.analyze.schema import Kind


def workload_evidence(frames: TraceFrames, limits: RooflineResult | None) -> dict[str, float | None]:
    """graph_replay_fraction and compiled_fraction (of the trace's kernel time; None without kernels; compiled: the
    inductor-generated `triton_*` kernels, `kernels.triton_kernel_expr`, whatever ops their names say they fused) and
    memory_bound_fraction (of the GPU time of the ops with FLOPs, those below the ridge point; None where the
    roofline has no peak, no such op, or FLOP-bearing ops it could not count)."""
    kernels = frames.launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("dur_ns").is_not_null())
    total = int(kernels["dur_ns"].sum() or 0)
    shares = kernels.select(
        replayed=pl.col("dur_ns").filter(pl.col("runtime_name").fill_null("").str.contains(GRAPH_LAUNCH)).sum(),
        compiled=pl.col("dur_ns").filter(triton_kernel_expr()).sum(),
    ).row(0, named=True) if total else {}
    return {
        "graph_replay_fraction": shares["replayed"] / total if total else None,
        "compiled_fraction": shares["compiled"] / total if total else None,
        "memory_bound_fraction": _memory_bound(limits),
    }


def _memory_bound(limits: RooflineResult | None) -> float | None:
    """Share of the FLOP ops' GPU time in ops below the ridge point. None without a peak to place them by, and
    None where matmul/convolution/attention ops went uncounted (shapes not recorded as lists): the share would
    be of the few that were counted (a 2021 resnet trace: two small matmuls, not its convolutions)."""
    if limits is None or limits.peak_tflops is None or limits.bandwidth_gbps is None or limits.uncounted_ops:
        return None
    ops = limits.ops.filter((pl.col("flops") > 0) & pl.col("bound").is_not_null())
    total = int(ops["gpu_ns"].sum() or 0)
    if not total:
        return None
    return int(ops.filter(pl.col("bound") == "memory")["gpu_ns"].sum() or 0) / total
