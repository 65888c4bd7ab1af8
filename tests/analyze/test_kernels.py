"""Kernel categories (ordered rule table) and the per-name / per-category tables."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from builders import kernel, load_events, memcpy, memset, trace

from stepscope.analyze import load
from stepscope.analyze.kernels import (
    CATEGORY_RULES,
    KernelCategory,
    category_expr,
    kernel_summary,
    own_names,
    triton_kernel_expr,
)

REAL_NAMES = {  # real kernel names from the corpus (GPU in brackets) -> expected category
    "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int)": KernelCategory.CONVOLUTION,  # V100
    "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int)":
        KernelCategory.CONVOLUTION,  # V100: conv before GEMM's sgemm
    "volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1": KernelCategory.CONVOLUTION,  # V100
    "volta_sgemm_64x64_nt": KernelCategory.GEMM,  # V100
    "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float)": KernelCategory.NORMALIZATION,
    "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw": KernelCategory.CONVOLUTION,  # A100
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(Params)": KernelCategory.GEMM,  # A100
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": KernelCategory.COMMUNICATION,
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas": KernelCategory.GEMM,  # H100
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::bfloat16_t>>": KernelCategory.ATTENTION,  # H100: attention before GEMM's cutlass
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float>>>":
        KernelCategory.REDUCTION,  # H100
    "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT": KernelCategory.GEMM,  # B200
    "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext": KernelCategory.ATTENTION,
    "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)":
        KernelCategory.COMMUNICATION,  # B200
    "std::enable_if<vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<>":
        KernelCategory.NORMALIZATION,  # B200: typeConvert is not a convolution
    "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1": KernelCategory.GEMM,  # MI300
    "attn_fwd": KernelCategory.ATTENTION,  # MI300
    "igemm_wrw_gtcx2_nhwc_bf16_bx0_ex1_bt256x128x16_wt32x32x8": KernelCategory.CONVOLUTION,  # MI210 (MIOpen)
    "void at::native::batch_norm_backward_kernel<c10::BFloat16, c10::BFloat16, float, int>()":
        KernelCategory.NORMALIZATION,  # MI210
    "batched_transpose_16x64_pack_1x4_ediv_1x2_half": KernelCategory.ELEMENTWISE,  # MI210
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": KernelCategory.ELEMENTWISE,
    "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1": KernelCategory.TRITON,  # MI300 compile: before reduction
    "triton_poi_fused__unsafe_view_mul_silu_2": KernelCategory.TRITON,
    "void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*, float*, float*, long*, float*, int)":
        KernelCategory.REDUCTION,  # V100: the loss
    "void cudnn::ops::scalePackedTensor_kernel<float, float>(cudnnTensor4dStruct, float*, float)":
        KernelCategory.ELEMENTWISE,  # V100
}


def classify(name: str, kind: str = "kernel") -> KernelCategory:
    """The category `category_expr` gives one GPU event."""
    return KernelCategory(pl.DataFrame({"name": [name], "kind": [kind]}).select(category_expr()).item())


@pytest.mark.parametrize(("name", "expected"), list(REAL_NAMES.items()))
def test_real_names_land_in_their_category(name: str, expected: KernelCategory) -> None:
    assert classify(name) is expected


def test_rule_order_matters() -> None:
    """Reversing the table changes the answer for names two rules match: the first rule wins."""
    flash = "void pytorch_flash::flash_fwd_kernel<cutlass::bfloat16_t>"
    conv = "void implicit_convolve_sgemm<float, float, 128>"
    order = [c for c, _, _ in CATEGORY_RULES]
    assert order.index(KernelCategory.ATTENTION) < order.index(KernelCategory.GEMM)
    assert order.index(KernelCategory.CONVOLUTION) < order.index(KernelCategory.GEMM)
    flash_own, conv_own = "pytorch_flash::flash_fwd_kernel_cutlass", "implicit_convolve_sgemm"
    reversed_first = next(c for c, rx, _ in reversed(CATEGORY_RULES) if rx.search(flash_own))
    assert reversed_first is KernelCategory.GEMM and classify(flash) is KernelCategory.ATTENTION
    assert next(c for c, rx, _ in reversed(CATEGORY_RULES) if rx.search(conv_own)) is KernelCategory.GEMM
    assert classify(conv) is KernelCategory.CONVOLUTION


OWN_NAMES = {  # full demangled name -> the own name the rules read
    "void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, "
    "__nv_bfloat16, 32, true>(int, __nv_bfloat16 const*, flashinfer::QuantizationSFLayout)":
        "tensorrt_llm::kernels::quantize_with_block_size",
    "void at::native::(anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>"
    "(float*, float const*, int, int, int, bool const*, int, bool)":
        "at::native::(anonymous namespace)::softmax_warp_forward",
    "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
    "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)": "vllm::fused_add_rms_norm_kernel",
    "void at::native::vectorized_elementwise_kernel<4, at::native::sin_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, std::array<char*, 2ul>)":
        "at::native::vectorized_elementwise_kernel",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
    "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)":
        "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>",
    "void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<ck_tile::Pipeline<int>>>(ck_tile::Args)":
        "ck_tile::kentry<ck_tile::Rmsnorm2dFwd>",
    "triton_poi_fused_convolution_0": "triton_poi_fused_convolution_0",
    "Cijk_Alik_Bljk_HHS_BH_MT128x128x32": "Cijk_Alik_Bljk_HHS_BH_MT128x128x32",
    "void foo<int, bar<float": "foo",  # truncated: an unbalanced bracket is cut off
}


def test_own_names_drop_return_type_template_arguments_and_parameters() -> None:
    names = pl.Series("name", [*OWN_NAMES, None])
    assert own_names(names).to_list() == [*OWN_NAMES.values(), None]


READ_BY_OWN_NAME = {  # names whose template / parameter TYPES match another rule -> the category of the kernel
    # B200 (tracelens eager_trace): "flash" only in a parameter type, "cutlass" only in a template argument
    "void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, "
    "__nv_bfloat16, 32, true>(int, int, int, int, __nv_bfloat16 const*, float const*, unsigned int*, "
    "unsigned int*, int, int, flashinfer::QuantizationSFLayout)": KernelCategory.ELEMENTWISE,
    "void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
    "cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, 4, "
    "true>)": KernelCategory.OTHER,
    # DLRM (param): "fbgemm" in the functor's namespace or a parameter type
    "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&, long, "
    "long, double)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)":
        KernelCategory.ELEMENTWISE,
    "void split_embedding_codegen_forward_unweighted_kernel<float, float, float, false, long, 1ul, 8ul>"
    "(at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, long>, fbgemm_gpu::FixedDivisor)":
        KernelCategory.ELEMENTWISE,
    # V100: cuDNN's FFT kernels take a cudnn::reduced_divisor; not a reduction
    "void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, cudnn::reduced_divisor, bool)":
        KernelCategory.OTHER,
    # a launcher's identity IS its template argument
    "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4>"
    "(cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4::Params)": KernelCategory.CONVOLUTION,
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_align1"
    "::Params)": KernelCategory.GEMM,
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<int>>>(flash::Params)":
        KernelCategory.ATTENTION,
    "void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<ck_tile::Rmsnorm2dFwdPipelineOnePass<int>>>(ck_tile::Args)":
        KernelCategory.NORMALIZATION,
    # FlashInfer (vLLM, SGLang): its namespace says "flash" for every kernel; the attention ones say what they are
    "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, "
    "unsigned int, unsigned int, unsigned int, float, float)": KernelCategory.NORMALIZATION,
    "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, float)":
        KernelCategory.NORMALIZATION,
    "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>(__nv_bfloat16*, __nv_bfloat16 const*, "
    "int)": KernelCategory.ELEMENTWISE,
    "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0, 4u, true, float, "
    "int>(float*, int*, int*)": KernelCategory.REDUCTION,
    "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<(flashinfer::MaskMode)1, 128u>, "
    "false>(flashinfer::BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)":
        KernelCategory.ATTENTION,
    "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u>"
    "(flashinfer::BatchDecodeParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)": KernelCategory.ATTENTION,
    "void flashinfer::MergeStatesKernel<8u, 16u, 8u, 4u, __nv_bfloat16, __nv_bfloat16>(__nv_bfloat16*, float*)":
        KernelCategory.ATTENTION,
    "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>"
    "(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)": KernelCategory.ELEMENTWISE,
    # cuBLAS's helper kernels name cuBLAS only in their parameter types: GEMM work, as before
    "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>"
    "(cublasSplitKParams<float>, float const*, float const*, float*)": KernelCategory.GEMM,
    "void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, float*)":
        KernelCategory.GEMM,
    # inductor's Triton kernels are triton whatever ops they fused
    "triton_poi_fused_convolution_0": KernelCategory.TRITON,
    "triton_red_fused__native_batch_norm_legit_functional_convolution_backward_div_expand_1":
        KernelCategory.TRITON,
    "triton_per_fused_native_batch_norm_backward_7": KernelCategory.TRITON,
    "triton_poi_fused_all_reduce_0": KernelCategory.TRITON,  # a copy into a collective's buffer, not NCCL
}


@pytest.mark.parametrize(("name", "expected"), list(READ_BY_OWN_NAME.items()))
def test_rules_read_the_kernels_own_name(name: str, expected: KernelCategory) -> None:
    assert classify(name) is expected


def test_triton_kernels_are_the_triton_category() -> None:
    """`triton_kernel_expr` (workload's compiled share) and the category agree: triton is the first rule."""
    names = [*REAL_NAMES, *READ_BY_OWN_NAME]
    frame = pl.DataFrame({"name": names, "kind": ["kernel"] * len(names)}).select(
        triton=triton_kernel_expr(), category=category_expr())
    assert frame["triton"].to_list() == (frame["category"] == KernelCategory.TRITON.value).to_list()
    assert CATEGORY_RULES[0][0] is KernelCategory.TRITON


def test_memcpy_and_memset_by_kind_not_name() -> None:
    assert classify("Memcpy HtoD (Pageable -> Device)", "memcpy") is KernelCategory.MEMCPY
    assert classify("Memset (Device)", "memset") is KernelCategory.MEMSET
    assert classify("mystery_kernel") is KernelCategory.OTHER


OCC = "est. achieved occupancy %"


def test_summary_exact(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        kernel("volta_sgemm_64x64_nt", ts=0, dur=10, grid=[4, 1, 1], block=[256, 1, 1], **{OCC: 50}),
        kernel("volta_sgemm_64x64_nt", ts=20, dur=30, grid=[4, 1, 1], block=[256, 1, 1], **{OCC: 25}),
        kernel("volta_sgemm_64x64_nt", ts=60, dur=20, grid=[8, 1, 1], block=[256, 1, 1]),
        kernel("ncclKernel_AllReduce", ts=5, dur=10, stream=9),  # overlaps the first sgemm 5..10
        memcpy("HtoD", ts=100, dur=5, nbytes=1024),
        memset(ts=110, dur=5, nbytes=64),
    ))
    r = kernel_summary(t)
    assert (r.gpu_events, r.kernels, r.gpu_total_ns) == (6, 4, 80_000)
    assert r.gpu_busy_ns == (15 + 30 + 20 + 5 + 5) * 1000  # 0..15 is one busy stretch
    row = r.by_name.row(0, named=True)
    assert row["name"] == "volta_sgemm_64x64_nt" and row["category"] == "gemm"
    assert (row["count"], row["total_ns"], row["min_ns"], row["max_ns"]) == (3, 60_000, 10_000, 30_000)
    assert row["mean_ns"] == pytest.approx(20_000)
    assert row["grid"] == "[4, 1, 1]" and row["block"] == "[256, 1, 1]"
    assert row["mean_occupancy_pct"] == pytest.approx(37.5)
    assert row["busy_share"] == pytest.approx(60 / 75)
    cats = dict(zip(r.by_category["category"], r.by_category["total_ns"], strict=True))
    assert cats == {"gemm": 60_000, "communication": 10_000, "memcpy": 5_000, "memset": 5_000}
    assert r.by_category["time_share"].sum() == pytest.approx(1.0)
    assert r.other_share == 0.0
    assert kernel_summary(t, top=1).by_name.height == 1


def test_grid_and_block_whitespace_normalized(tmp_path: Path) -> None:
    """Pretty-printed traces (tracelens h100/b200/mi300) keep the list's whitespace in the raw text."""
    t = load_events(tmp_path, trace(kernel("k", ts=0, dur=1, grid="[   30,\n   4,   1 ]", block=[256, 1, 1])))
    row = kernel_summary(t).by_name.row(0, named=True)
    assert (row["grid"], row["block"]) == ("[30, 4, 1]", "[256, 1, 1]")


def test_cpu_only_trace_is_empty(tmp_path: Path) -> None:
    from builders import cpu_op
    r = kernel_summary(load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5))))
    assert (r.gpu_events, r.gpu_busy_ns, r.other_share, r.note) == (0, 0, None, "")
    assert r.by_name.height == 0 and r.by_category.height == 0


def counter_range(name: str, ts: float) -> dict[str, object]:
    """A kernel the CUPTI range profiler measured: counters in args, no stream, no correlation."""
    return {"ph": "X", "cat": "cuda_profiler_range", "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": 121,
            "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 8}}


def test_a_trace_of_counter_ranges_says_so_in_its_note(tmp_path: Path) -> None:
    # GIVEN a trace recorded with profiler_metrics: two measured kernels, no kernel events
    from builders import cpu_op
    r = kernel_summary(load_events(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=5), counter_range("sgemm", 10),
                                                   counter_range("sgemm", 200))))
    # THEN there is no GPU event, and the note says the two kernels were measured, and where to read them
    assert r.gpu_events == 0 and "measured 2 kernels" in r.note and "stepscope counters" in r.note


def test_htas_cupti_profiler_trace_has_77_counter_ranges(corpus: Path, tmp_path: Path) -> None:
    r = kernel_summary(load(corpus / "traces/hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
                            cache_dir=tmp_path))
    assert r.gpu_events == 0 and "measured 77 kernels" in r.note


def test_b200_kernels_whose_argument_types_name_other_libraries(corpus: Path, tmp_path: Path) -> None:
    r = kernel_summary(load(corpus / "traces/tracelens/b200/eager_trace.json.gz", cache_dir=tmp_path))
    category = dict(zip(r.by_name["name"], r.by_name["category"], strict=True))
    quantize = [c for n, c in category.items() if "quantize_with_block_size" in n]
    finalize = [c for n, c in category.items() if "finalizeKernelVecLoad" in n]
    assert quantize == ["elementwise"] and finalize == ["other"]
    assert not [n for n, c in category.items() if c == "attention" and "flashinfer::" in n.partition("(")[0]]


def test_compiled_sample_files_inductors_kernels_as_triton() -> None:
    # GIVEN the torch.compile sample: 60 of its 129 kernels are inductor's triton_*, 87.6 µs of 344.9 µs
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "compiled_train_cuda"
    if not sample.is_dir():
        pytest.skip("sample_traces/compiled_train_cuda is not present")
    r = kernel_summary(load(sample))
    row = r.by_category.filter(pl.col("category") == "triton").row(0, named=True)
    assert (row["count"], row["total_ns"]) == (60, 87_552)


TRACES = {  # corpus trace -> max share of GPU time left in "other"
    "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": 0.005,  # V100
    "hta/nccl_parser_config/nccl_data.json.gz": 0.01,  # A100
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": 0.01,
    "tracelens/b200/eager_trace.json.gz": 0.04,  # MoE routing and finalize (combine) kernels: 3.6%
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": 0.01,
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz": 0.01,
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": 0.01,
}


@pytest.mark.parametrize(("rel", "max_other"), list(TRACES.items()))
def test_other_stays_small_on_real_traces(corpus: Path, tmp_path: Path, rel: str, max_other: float) -> None:
    r = kernel_summary(load(corpus / "traces" / rel, cache_dir=tmp_path))
    assert r.other_share is not None and r.other_share <= max_other


def test_resnet50_figures(corpus: Path, tmp_path: Path) -> None:
    """Busy time = the corpus README's 603,558 µs; convolution dominates, then batch norm."""
    r = kernel_summary(load(corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                            cache_dir=tmp_path))
    assert r.kernels == 8_772 and r.gpu_busy_ns == 603_558_000
    share = dict(zip(r.by_category["category"], r.by_category["time_share"], strict=True))
    assert 0.55 < share["convolution"] < 0.61 and 0.14 < share["normalization"] < 0.18


def test_hta_counts(corpus: Path, tmp_path: Path) -> None:
    nccl = kernel_summary(load(corpus / "traces/hta/nccl_parser_config/nccl_data.json.gz", cache_dir=tmp_path))
    assert int(nccl.by_name.filter(pl.col("name").str.starts_with("ncclKernel"))["count"].sum()) == 21
    t = load(corpus / "traces/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", cache_dir=tmp_path)
    ns = kernel_summary(t)
    assert (ns.kernels, ns.gpu_events) == (4_350, 6_095)  # kernel events; kernel + memcpy + memset events
    # HTA's test_get_gpu_kernels_with_user_annotations expects 4,876 "GPU kernels". HTA's frame holds every GPU
    # event (its row for correlation 135139 is a "Memcpy DtoD"), and HTA trims the trace by default to the
    # ProfilerSteps before the last one (include_last_profiler_step=False), keeping GPU events whose launching
    # runtime call starts in [first step start, last step start). That is 4,876 of the file's 6,095.
    steps = t.steps.collect()
    first, last = steps["ts_ns"].min(), steps["ts_ns"].max()
    launched = t.launches().filter(pl.col("launch_ts_ns").is_between(first, last, closed="left")).collect()
    assert launched.height == 4_876


def test_busy_is_per_device_then_summed(tmp_path: Path) -> None:
    """Two devices busy at the same time are two busy GPUs (10 + 10 µs), not one 10 µs union."""
    t = load_events(tmp_path, trace(kernel("sgemm", ts=0, dur=10, device=0), kernel("sgemm", ts=0, dur=10, device=1),
                                    kernel("sgemm", ts=5, dur=10, device=1, stream=8)))
    r = kernel_summary(t)
    assert r.gpu_busy_ns == 10_000 + 15_000
    assert r.by_name["busy_share"].item() == pytest.approx(30 / 25)  # concurrent streams: past 100%
