"""`stepscope kernels`: GPU time per kernel name and per category (GEMM, convolution, attention, …).

Categories come from ONE ordered rule table, `CATEGORY_RULES`: the first rule that matches wins
(case-insensitive, searched anywhere). Memcpy and memset events are classified by their kind, before any rule.

A rule reads the kernel's OWN name (`own_names`): its namespaces and function name, without the return type,
the template arguments and the parameter list, which name types (`cutlass::bfloat16_t`,
`flashinfer::QuantizationSFLayout`) and say nothing of what the kernel does. Two exceptions, each where a
kernel's identity lives outside its own name by design: a generic launcher (`LAUNCHERS`: CUTLASS's `Kernel` /
`device_kernel`, Composable Kernel's `kentry`) is named with its first template argument that is a name, the
operator it runs; and the GEMM rule also reads the full name for `cublas`, as cuBLAS's helper kernels (split-K
reduction, scaling, epilogue) name cuBLAS only in their parameter types.

    void tensorrt_llm::kernels::quantize_with_block_size<…>(…, flashinfer::QuantizationSFLayout)
        reads tensorrt_llm::kernels::quantize_with_block_size                 -> elementwise (not attention)
    void moe::dev::finalize::finalizeKernelVecLoad<…KernelParams<cutlass::bfloat16_t…>>(…)
        reads moe::dev::finalize::finalizeKernelVecLoad                       -> other (not GEMM)
    void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps<…>>>(…)
        reads at::native::reduce_kernel                                       -> reduction (var, std, norm stats)
    void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_…>(…)
        reads cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_…>      -> convolution (a launcher)
    void splitKreduce_kernel<…>(cublasSplitKParams<float>, …)
        reads splitKreduce_kernel, and cublas in the full name                -> gemm

ATen's own launchers (`elementwise_kernel`, `vectorized_elementwise_kernel`, `reduce_kernel`, …) are not
`LAUNCHERS`: their own name already says what kind of kernel runs, whichever op's functor it runs (the op is in
the `by op` table).

Triton kernels come first: every `triton_*` kernel (TorchInductor's generated kernels, `triton_poi_`,
`triton_red_`, `triton_per_`, `triton_tem_`) is `triton`, whatever ops its name says it fused
(`triton_poi_fused_convolution_0` is a pointwise kernel, not a convolution). So the triton row is the compiled
code's share, the same kernels `workload` counts as compiled (`triton_kernel_expr`); their names list the ops
they fused.
Then the order matters where names overlap:

    pytorch_flash::flash_fwd_kernel<… cutlass::bfloat16_t …>   -> attention (own name; "cutlass" only in types)
    flashinfer::norm::RMSNormKernel<…>                         -> normalization ("flash" of FlashInfer's namespace
                                                                  is no attention; its BatchPrefillWith… kernels are)
    implicit_convolve_sgemm<float, …>                          -> convolution (before GEMM's "sgemm")
    vllm::fused_add_rms_norm_kernel<…_typeConvert…>            -> normalization ("typeConvert" is no conv)
    ncclKernel_AllReduce_RING_LL_Sum_float                     -> communication (first rule after triton)
    cudnn::bn_fw_tr_1C11_kernel_NCHW                           -> normalization (before reduction)
    at::native::vectorized_elementwise_kernel<4, …silu…>       -> elementwise (ATen's launchers: by their name)
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.counters import RANGE_CATEGORY, range_events
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


#: An inductor-generated Triton kernel, by its name (`triton_poi_fused_add_0`, `triton_red_…`, `triton__0d1d2d`).
TRITON_KERNEL = r"^triton_"

#: Rules, first match wins (memcpy/memset are decided by kind before these): (category, pattern over the own name
#: (`own_names`), pattern over the full name or None). Checked against real kernel names from V100/A100/H100/B200
#: and MI210/MI250/MI300 traces (tests/analyze/test_kernels.py).
CATEGORY_RULES: tuple[tuple[KernelCategory, re.Pattern[str], re.Pattern[str] | None], ...] = (
    (KernelCategory.TRITON, _rx(TRITON_KERNEL), None),
    (KernelCategory.COMMUNICATION, _rx(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
                                       r"|multimem|cross_device|sendrecv"), None),
    # ("flash" but not FlashInfer's namespace, which holds its norm, activation and sampling kernels too: its
    # attention kernels by their own names, `BatchPrefillWithPagedKVCacheKernel`, `MergeStatesKernel`, …)
    (KernelCategory.ATTENTION, _rx(r"flash(?:[^i]|$)|fmha|attention|attn|sdpa|\bmha|mha_|efficient_attention"
                                   r"|(?:prefill|decode)With\w*KVCache|MergeStates?Kernel|PODWithKVCache"), None),
    (KernelCategory.CONVOLUTION, _rx(r"convol|conv[0-9_]|[_:]conv|winograd|scudnn|fprop|dgrad|wgrad|igemm_(fwd|bwd|wrw)"
                                     r"|implicit_?gemm|im2col|col2im"), None),
    (KernelCategory.GEMM, _rx(r"gemm|gemv|cutlass|cublas|Cijk_|nvjet|wgmma|matmul|xmma|^bmm_|\bbmm\b|_mma"),
     _rx(r"cublas")),
    (KernelCategory.NORMALIZATION, _rx(r"batch_?norm|bn_fw|bn_bw|layer_?norm|rms_?norm|group_?norm"
                                       r"|instance_?norm|welford"), None),
    (KernelCategory.REDUCTION, _rx(r"reduce|softmax|\bsum|norm_kernel|argmax|argmin|topk|scan|MeanOps"
                                   r"|max_pool|avg_pool|pool|cross_entropy|nll_loss|NLLCriterion|histogram"), None),
    (KernelCategory.ELEMENTWISE, _rx(r"elementwise|vectorized|unrolled|fill|copy|cat|index|gather|scatter"
                                     r"|where|pointwise|transpose|nchwToNhwc|nhwcToNchw|TensorOp|functor"
                                     r"|multi_tensor_apply|rotary|quant|embedding|dropout|masked|scalePackedTensor"
                                     r"|act_and_mul"),
     None),
)

#: Generic launchers whose template argument is the operator they run: CUTLASS 2.x `Kernel` / `Kernel2` (and
#: cuDNN's copies, `cutlass_cudnn_infer::Kernel`), CUTLASS 3.x `device_kernel`, Composable Kernel's `kentry`.
LAUNCHERS = r"cutlass\w*::(?:Kernel\d*|device_kernel)|ck_tile::kentry"


def category_expr(name: str = "name", kind: str = "kind") -> pl.Expr:
    """A polars expression giving each GPU event's category value (`CATEGORY_RULES`, first match wins).

    The rules run over the distinct names only (a trace repeats a few hundred kernel names thousands of times;
    every rule's regex over every row took 50-80 ms a call on a 22k-kernel trace) and the answer is joined back."""
    return (
        pl.when(pl.col(kind) == Kind.MEMCPY.value).then(pl.lit(KernelCategory.MEMCPY.value))
        .when(pl.col(kind) == Kind.MEMSET.value).then(pl.lit(KernelCategory.MEMSET.value))
        .otherwise(pl.col(name).map_batches(_name_categories, return_dtype=pl.String))
    )


def triton_kernel_expr(name: str = "name") -> pl.Expr:
    """Whether a kernel is an inductor-generated Triton kernel (`TRITON_KERNEL`): compiled code, whatever category
    a rule would give it otherwise (it is also the first rule, so its category is triton)."""
    return pl.col(name).fill_null("").str.contains(TRITON_KERNEL)


def _rules_expr(own: pl.Expr, full: pl.Expr) -> pl.Expr:
    """`CATEGORY_RULES` over `own` (and `full` where a rule reads it): the first matching rule's category, else
    other."""
    expr: pl.Expr = pl.lit(KernelCategory.OTHER.value)
    for category, rx, full_rx in reversed(CATEGORY_RULES):
        hit = own.str.contains("(?i)" + rx.pattern)
        if full_rx is not None:
            hit = hit | full.str.contains("(?i)" + full_rx.pattern)
        expr = pl.when(hit).then(pl.lit(category.value)).otherwise(expr)
    return expr


def _name_categories(names: pl.Series) -> pl.Series:
    """Each name's rule category (`_rules_expr`), the rules run once per distinct name (null included)."""
    frame = names.cast(pl.String).alias("n").to_frame()
    distinct = frame.unique()
    distinct = distinct.with_columns(own=own_names(distinct["n"])).with_columns(
        c=_rules_expr(pl.col("own"), pl.col("n"))).drop("own")
    return frame.join(distinct, on="n", how="left", nulls_equal=True, maintain_order="left")["c"]


_ANON = "(anonymous namespace)"
_ANON_KEPT = "{anonymous namespace}"  # braces: not a group that the parentheses pass removes


def _remove_innermost(names: pl.Series, pattern: str) -> pl.Series:
    """`names` with the groups `pattern` matches removed, innermost first, until none is left (one pass per
    nesting level, each over every name at once)."""
    while True:
        out = names.str.replace_all(pattern, "")
        if out.equals(names):
            return out
        names = out


def own_names(names: pl.Series) -> pl.Series:
    """Each kernel's own name, what the category rules read: namespaces and function name, without the return
    type, template arguments and parameter list; a launcher (`LAUNCHERS`) keeps its first template argument that
    is a name, itself without arguments. Vectorized: one pass per nesting level over all names. An unbalanced
    (truncated) `<` or `(` is cut off with all that follows.

        void tensorrt_llm::kernels::quantize_with_block_size<(…)2, __nv_bfloat16>(int, flashinfer::Layout)
            -> tensorrt_llm::kernels::quantize_with_block_size
        void at::native::(anonymous namespace)::softmax_warp_forward<float, 4>(float*, float const*)
            -> at::native::(anonymous namespace)::softmax_warp_forward
        std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::rms<8>(float*)
            -> vllm::rms
        void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_…::Params)
            -> cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>
        void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<ck_tile::Pipeline<…>>>(ck_tile::Args)
            -> ck_tile::kentry<ck_tile::Rmsnorm2dFwd>
        triton_poi_fused_add_0  -> triton_poi_fused_add_0
    """
    s = names.cast(pl.String).str.replace_all(_ANON, _ANON_KEPT, literal=True)
    s = _remove_innermost(s, r"\([^()]*\)").str.replace(r"\(.*", "")  # parameter lists, casts, lambdas' signatures
    launched = s.str.extract(rf"(?:^|\s)(?:{LAUNCHERS})<(?:\s*-?\d\w*\s*,)*\s*([A-Za-z_][\w:]*)", 1)
    s = _remove_innermost(s, r"<[^<>]*>").str.replace(r"<.*", "")
    s = s.str.replace(r"^(?:void|\S*enable_if\S*)\s+", "").str.strip_chars()
    s = pl.select(pl.when(launched.is_not_null()).then(pl.concat_str(s, pl.lit("<"), launched, pl.lit(">")))
                  .otherwise(s)).to_series()
    return s.str.replace_all(_ANON_KEPT, _ANON, literal=True).alias(names.name)


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
    `note`: what the reader must know; in a trace without GPU events whose kernels the CUPTI range profiler
    measured instead (`counters.range_events`: their hardware counters, not their time), that, and where to read
    them; else empty.
    """

    gpu_events: int
    kernels: int
    gpu_total_ns: int
    gpu_busy_ns: int
    other_share: float | None
    by_category: pl.DataFrame
    by_name: pl.DataFrame
    by_op: pl.DataFrame
    note: str = ""


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
    events = int(by_name["count"].sum() or 0)
    return KernelsResult(
        gpu_events=events,
        kernels=int(by_name.filter(~pl.col("category").is_in(["memcpy", "memset"]))["count"].sum() or 0),
        gpu_total_ns=total,
        gpu_busy_ns=busy,
        other_share=(float(other[0]) if other.len() else 0.0) if total else None,
        by_category=by_category,
        by_name=by_name.head(top) if top is not None else by_name,
        by_op=_by_op(frames.launches, total),
        note="" if events else _ranges_note(range_events(frames.trace).height),
    )


def _ranges_note(ranges: int) -> str:
    """The note of a trace without GPU events that holds `ranges` counter ranges (empty without any)."""
    if not ranges:
        return ""
    return (f"no GPU timeline: the CUPTI range profiler (profiler_metrics) measured {ranges:,} "
            f"{'kernel' if ranges == 1 else 'kernels'}, one {RANGE_CATEGORY} event each with its hardware counters, "
            "not its time on the GPU; `stepscope counters` reads them (profile again without profiler_metrics for "
            "kernel times)")


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
