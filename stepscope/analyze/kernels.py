"""`stepscope kernels`: GPU time per kernel name and per category (GEMM, convolution, attention, …).

Categories come from ONE ordered rule table, `CATEGORY_RULES`: the first rule whose regex matches the
name wins (case-insensitive, searched anywhere in the name). Memcpy and memset events are classified by
their kind, before any name rule. The order matters where names overlap:

    pytorch_flash::flash_fwd_kernel<… cutlass::bfloat16_t …>   -> attention (before GEMM's "cutlass")
    implicit_convolve_sgemm<float, …>                          -> convolution (before GEMM's "sgemm")
    vllm::fused_add_rms_norm_kernel<…_typeConvert…>            -> normalization ("typeConvert" is no conv)
    ncclKernel_AllReduce_RING_LL_Sum_float                     -> communication (first name rule)
    cudnn::bn_fw_tr_1C11_kernel_NCHW                           -> normalization (before reduction)
    triton_red_fused_add_mean_mul_pow_rsqrt_0                  -> triton (before reduction's "mean")
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.graph_capture import GRAPH_LAUNCH
from stepscope.analyze.schema import Kind


class KernelCategory(enum.Enum):
    """What a GPU kernel does, from its name."""

    GEMM = "gemm"
    CONVOLUTION = "convolution"
    ATTENTION = "attention"
    NORMALIZATION = "normalization"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    COMMUNICATION = "communication"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    TRITON = "triton"
    OTHER = "other"


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


#: Name rules, first match wins (memcpy/memset are decided by kind before these). Checked against real
#: kernel names from V100/A100/H100/B200 and MI210/MI250/MI300 traces (tests/analyze/test_kernels.py).
CATEGORY_RULES: tuple[tuple[KernelCategory, re.Pattern[str]], ...] = (
    (KernelCategory.COMMUNICATION, _rx(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
                                       r"|multimem|cross_device|sendrecv")),
    (KernelCategory.ATTENTION, _rx(r"flash|fmha|attention|attn|sdpa|\bmha|mha_|efficient_attention")),
    (KernelCategory.CONVOLUTION, _rx(r"convol|conv[0-9_]|[_:]conv|winograd|scudnn|fprop|dgrad|wgrad|igemm_(fwd|bwd|wrw)"
                                     r"|implicit_?gemm|im2col|col2im")),
    (KernelCategory.GEMM, _rx(r"gemm|gemv|cutlass|cublas|Cijk_|nvjet|wgmma|matmul|xmma|^bmm_|\bbmm\b|_mma")),
    (KernelCategory.NORMALIZATION, _rx(r"batch_?norm|bn_fw|bn_bw|layer_?norm|rms_?norm|group_?norm"
                                       r"|instance_?norm|welford")),
    (KernelCategory.TRITON, _rx(r"^triton_|triton")),
    (KernelCategory.REDUCTION, _rx(r"reduce|softmax|\bsum|norm_kernel|argmax|argmin|topk|scan|MeanOps"
                                   r"|max_pool|avg_pool|pool|cross_entropy|nll_loss|NLLCriterion|histogram")),
    (KernelCategory.ELEMENTWISE, _rx(r"elementwise|vectorized|unrolled|fill|copy|cat|index|gather|scatter"
                                     r"|where|pointwise|transpose|nchwToNhwc|nhwcToNchw|TensorOp|functor"
                                     r"|multi_tensor_apply|rotary|quant|embedding|dropout|masked|scalePackedTensor")),
)


def category_expr(name: str = "name", kind: str = "kind") -> pl.Expr:
    """A polars expression giving each GPU event's category value (`CATEGORY_RULES`, first match wins).

    The rules run over the distinct names only (a trace repeats a few hundred kernel names thousands of times;
    every rule's regex over every row took 50-80 ms a call on a 22k-kernel trace) and the answer is joined back."""
    return (
        pl.when(pl.col(kind) == Kind.MEMCPY.value).then(pl.lit(KernelCategory.MEMCPY.value))
        .when(pl.col(kind) == Kind.MEMSET.value).then(pl.lit(KernelCategory.MEMSET.value))
        .otherwise(pl.col(name).map_batches(_name_categories, return_dtype=pl.String))
    )


def _rules_expr(name: pl.Expr) -> pl.Expr:
    """`CATEGORY_RULES` over `name`: the first matching rule's category, else other."""
    expr: pl.Expr = pl.lit(KernelCategory.OTHER.value)
    for category, rx in reversed(CATEGORY_RULES):
        expr = pl.when(name.str.contains("(?i)" + rx.pattern)).then(pl.lit(category.value)).otherwise(expr)
    return expr


def _name_categories(names: pl.Series) -> pl.Series:
    """Each name's rule category (`_rules_expr`), the rules run once per distinct name (null included)."""
    frame = names.cast(pl.String).alias("n").to_frame()
    distinct = frame.unique().with_columns(c=_rules_expr(pl.col("n")))
    return frame.join(distinct, on="n", how="left", nulls_equal=True, maintain_order="left")["c"]


def _dims(col: pl.Expr) -> pl.Expr:
    """A grid/block as '[x, y, z]' whatever the whitespace of the trace's text (pretty-printed traces).

        "[           30,           4,           1         ]"  ->  "[30, 4, 1]"
    """
    return col.str.replace_all(r"\s+", "").str.replace_all(",", ", ")


@dataclass(frozen=True, kw_only=True)
class KernelsResult:
    """GPU time by kernel name and by category.

    gpu_busy_ns is the union of every kernel/memcpy/memset interval per device (overlapping streams counted
    once; `analyze.intervals`), summed over devices; a name's busy_share is its summed time over that busy
    time (shares can add up past 100% with concurrent streams). `by_op`: op, count, total_ns, time_share: GPU
    time per op that launched it (`TraceFrames.launches`; a graph-replayed kernel is `(graph replay)` unless a
    capture profile maps it to its op, `graphs.with_graph_capture`; `(no op)` where nothing links it).
    """

    gpu_events: int
    kernels: int
    gpu_total_ns: int
    gpu_busy_ns: int
    other_share: float | None
    by_category: pl.DataFrame
    by_name: pl.DataFrame
    by_op: pl.DataFrame


_BY_NAME_SCHEMA = {
    "name": pl.String, "category": pl.String, "count": pl.UInt32, "total_ns": pl.Int64, "mean_ns": pl.Float64,
    "min_ns": pl.Int64, "max_ns": pl.Int64, "busy_share": pl.Float64, "grid": pl.String, "block": pl.String,
    "mean_occupancy_pct": pl.Float64,
}


def kernel_summary(source: Source, *, top: int | None = None) -> KernelsResult:
    """Time per kernel name (count, total/mean/min/max, busy share, most common grid/block, occupancy)
    and per category (count, total, time_share of all GPU event time). `top` keeps the N longest names."""
    frames = frames_of(source)
    gpu = frames.trace.gpu.filter(pl.col("dur_ns").is_not_null()).with_columns(category=category_expr())
    ends = gpu.select("device", "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    busy = int(intervals.union_length(ends, by=["device"]).select(pl.col("length_ns").sum()).collect(
        engine="in-memory").item() or 0)
    by_name = (
        gpu.group_by("name", "category")
        .agg(
            count=pl.len(), total_ns=pl.col("dur_ns").sum(), mean_ns=pl.col("dur_ns").mean(),
            min_ns=pl.col("dur_ns").min(), max_ns=pl.col("dur_ns").max(),
            grid=_dims(pl.col("grid")).drop_nulls().mode().sort().first(),
            block=_dims(pl.col("block")).drop_nulls().mode().sort().first(),
            mean_occupancy_pct=pl.col("est_occupancy_pct").mean(),
        )
        .with_columns(busy_share=pl.col("total_ns") / busy if busy else pl.lit(None, pl.Float64))
        .sort("total_ns", "name", descending=[True, False])
        .select(list(_BY_NAME_SCHEMA))
        .collect(engine="in-memory")
    )
    total = int(by_name["total_ns"].sum() or 0)
    by_category = (
        by_name.group_by("category")
        .agg(count=pl.col("count").sum(), total_ns=pl.col("total_ns").sum(), names=pl.len())
        .with_columns(time_share=pl.col("total_ns") / total if total else pl.lit(None, pl.Float64))
        .sort("total_ns", "category", descending=[True, False])
    )
    other = by_category.filter(pl.col("category") == KernelCategory.OTHER.value)["time_share"]
    return KernelsResult(
        gpu_events=int(by_name["count"].sum() or 0),
        kernels=int(by_name.filter(~pl.col("category").is_in(["memcpy", "memset"]))["count"].sum() or 0),
        gpu_total_ns=total,
        gpu_busy_ns=busy,
        other_share=(float(other[0]) if other.len() else 0.0) if total else None,
        by_category=by_category,
        by_name=by_name.head(top) if top is not None else by_name,
        by_op=_by_op(frames.launches, total),
    )


def _by_op(launches: pl.DataFrame, total: int) -> pl.DataFrame:
    """GPU time per launching op name, most first (see `KernelsResult`)."""
    graph = pl.col("runtime_name").fill_null("").str.contains(GRAPH_LAUNCH)
    op = pl.coalesce("op_name", pl.when(graph).then(pl.lit("(graph replay)")).otherwise(pl.lit("(no op)")))
    return (
        launches.filter(pl.col("dur_ns").is_not_null())
        .group_by(op.alias("op")).agg(count=pl.len(), total_ns=pl.col("dur_ns").sum())
        .with_columns(time_share=pl.col("total_ns") / total if total else pl.lit(None, pl.Float64))
        .sort("total_ns", "op", descending=[True, False])
    )
