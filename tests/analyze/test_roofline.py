"""Achieved TFLOP/s and GB/s against the roofline, MFU per step, the Nsight hand-off: exact on a synthetic
trace, and never above the peak on the corpus GPU traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace
from click.testing import CliRunner

from stepscope.analyze import load
from stepscope.analyze.frames import frames_of
from stepscope.analyze.peaks import gpu_vendor
from stepscope.analyze.roofline import plotted, roofline, why_nothing_plotted
from stepscope.analyze.summary import SYSTEMS_COMMANDS, Verdict, profile_next_command, verdict
from stepscope.analyze.workload import workload_evidence
from stepscope.cli import cli

N = 4096
MM_FLOPS = 2 * N**3  # 137,438,953,472
MM_BYTES = 3 * N * N * 2  # two bf16 inputs read, one bf16 output written


def _doc(device: str = "NVIDIA H100 80GB HBM3", kernel_us: float = 200.0, *, launch: str = "cudaLaunchKernel",
         kernel_name: str = "sm90_xmma_gemm_bf16bf16_bf16f32", **top: Any) -> dict[str, Any]:
    # one step [0, 1000) µs; aten::mm (bf16, 4096^3) launches one kernel of `kernel_us`
    doc: dict[str, Any] = trace(
        step(1, ts=0, dur=1000),
        cpu_op("aten::mm", ts=10, dur=20, external_id=5, **{
            "Input Dims": [[N, N], [N, N]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
            "Concrete Inputs": ["", ""]}),
        runtime(launch, ts=12, dur=3, correlation=1, external_id=5),
        kernel(kernel_name, ts=100, dur=kernel_us, correlation=1, external_id=5),
        deviceProperties=[{"id": 0, "name": device, "totalGlobalMem": 80 * 2**30, "computeMajor": 9,
                           "computeMinor": 0, "numSms": 132}],
        **top,
    )
    return doc


def test_achieved_roofline_and_mfu_by_hand(tmp_path: Path) -> None:
    # GIVEN a bf16 4096^3 matmul whose kernel ran 200 µs on an H100 SXM (989.5 TFLOP/s bf16, 3,350 GB/s)
    result = roofline(load_events(tmp_path, _doc()))
    # THEN the figures are the hand calculation
    assert (result.device, result.dtype, result.peak_tflops, result.bandwidth_gbps) == (
        "NVIDIA H100 80GB HBM3", "bf16", 989.5, 3350.0)
    (op,) = result.ops.iter_rows(named=True)
    assert (op["flops"], op["bytes"], op["gpu_ns"]) == (MM_FLOPS, MM_BYTES, 200_000)
    assert op["tflops"] == pytest.approx(MM_FLOPS / 200e-6 / 1e12)            # 687.2 TFLOP/s
    assert op["intensity_flop_per_byte"] == pytest.approx(MM_FLOPS / MM_BYTES)  # 1365.3 FLOP/B
    assert op["bound"] == "compute" and op["attainable_tflops"] == 989.5       # above the 295 FLOP/B ridge
    assert op["roofline_fraction"] == pytest.approx(MM_FLOPS / 200e-6 / 1e12 / 989.5)
    # AND MFU over the one 1 ms step is its FLOPs over (1 ms x the bf16 peak)
    assert result.steps["mfu_fraction"][0] == pytest.approx(MM_FLOPS / (1e-3 * 989.5e12))
    assert result.mfu_fraction == pytest.approx(MM_FLOPS / (1e-3 * 989.5e12))
    assert result.note == "" and result.ops_above_peak == 0


def test_why_nothing_is_plotted_names_the_first_missing_piece(tmp_path: Path) -> None:
    """`plot roofline` refuses with the reason no op can be placed: shapes, then FLOPs, then GPU time; the
    device's peaks are never the reason (without them the figure shows the points alone)."""
    def reason(*events: dict[str, Any], device: str = "NVIDIA H100 80GB HBM3") -> str | None:
        doc = trace(step(1, ts=0, dur=1000), *events, deviceProperties=[
            {"id": 0, "name": device, "totalGlobalMem": 80 * 2**30, "computeMajor": 9, "computeMinor": 0}])
        result = roofline(load_events(tmp_path / str(len(list(tmp_path.iterdir()))), doc))
        assert (plotted(result.ops).height == 0) == (why_nothing_plotted(result) is not None)
        return why_nothing_plotted(result)

    shapes = {"Input Dims": [[N, N], [N, N]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
              "Concrete Inputs": ["", ""]}
    gpu = (runtime("cudaLaunchKernel", ts=12, dur=3, correlation=1, external_id=5),
           kernel("sm90_xmma_gemm_bf16bf16_bf16f32", ts=100, dur=200, correlation=1, external_id=5))
    assert reason(cpu_op("aten::mm", ts=10, dur=20, external_id=5, **shapes), *gpu) is None
    assert reason(cpu_op("aten::mm", ts=10, dur=20, external_id=5, **shapes), *gpu, device="Unknown GPU") is None
    assert reason(cpu_op("aten::mm", ts=10, dur=20, external_id=5), *gpu) == (
        "the trace has no input shapes, so no op has FLOPs (profile with record_shapes=True)")
    assert reason(cpu_op("aten::relu", ts=10, dur=20, external_id=5, **{
        "Input Dims": [[N, N]], "Input type": ["float"], "Concrete Inputs": [""]}), *gpu) == (
        "no op in this trace has a FLOP count (see `stepscope flops`)")
    assert reason(cpu_op("aten::mm", ts=10, dur=20, external_id=5, **shapes)) == (
        "no op with FLOPs ran GPU work (a roofline places achieved TFLOP/s on the GPU)")


def test_overrides_win_and_a_slow_kernel_gets_an_ncu_command(tmp_path: Path) -> None:
    # GIVEN the same matmul taking 10 ms, and the user's own peak
    result = roofline(load_events(tmp_path, _doc(kernel_us=10_000)), peak_tflops=100.0, peak_bandwidth_gbps=1000.0)
    assert (result.peak_tflops, result.bandwidth_gbps, result.peak_from) == (
        100.0, 1000.0, "--peak-tflops / --peak-bandwidth")
    (op,) = result.ops.iter_rows(named=True)
    assert op["roofline_fraction"] == pytest.approx(MM_FLOPS / 10e-3 / 1e12 / 100.0)  # 13.7%
    # THEN the kernel far below its roofline is handed to Nsight Compute, one instance of it
    (hand,) = result.handoff.iter_rows(named=True)
    assert hand["kernel"] == "sm90_xmma_gemm_bf16bf16_bf16f32"
    assert hand["command"].startswith("ncu --kernel-name regex:sm90_xmma_gemm_bf16bf16_bf16f32 --launch-skip 0 "
                                      "--launch-count 1 --section SpeedOfLight")


def test_on_an_amd_gpu_the_commands_name_rocm_s_profilers(tmp_path: Path) -> None:
    # GIVEN the same slow matmul on an MI300X, launched by hipLaunchKernel (a ROCm trace records no versions
    # before ROCm 6.3: the runtime calls' names tell)
    doc = _doc("AMD Instinct MI300X", kernel_us=10_000, launch="hipLaunchKernel",
               kernel_name="Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI16x16x1")
    result = roofline(load_events(tmp_path, doc))
    # THEN the kernel goes to ROCm Compute Profiler (by a name substring: it cannot pick one instance), not ncu
    assert result.vendor == "AMD"
    (hand,) = result.handoff.iter_rows(named=True)
    assert hand["command"] == ("rocprof-compute profile -n stepscope -k Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI16x16x1 "
                               "-- python train.py")
    assert profile_next_command(Verdict.GPU_BOUND, result) == hand["command"]
    # AND a launch-, sync- or transfer-bound step to rocprofv3's runtime trace, not Nsight Systems
    for bound in (Verdict.LAUNCH_BOUND, Verdict.SYNC_BOUND, Verdict.TRANSFER_BOUND):
        assert profile_next_command(bound, result) == SYSTEMS_COMMANDS["AMD"]
    assert SYSTEMS_COMMANDS["AMD"].startswith("rocprofv3 --runtime-trace ")


def test_who_made_the_gpu(tmp_path: Path) -> None:
    hip: dict[str, Any] = {"hip_runtime_version": 60443483, "roctracer_version": 4.1}
    cases = {
        # the versions Kineto writes win over everything else
        "versions": (_doc("Synthetic GPU", launch="cudaLaunchKernel", **hip), "AMD"),
        "cuda versions": (_doc("Synthetic GPU", launch="hipLaunchKernel", cupti_version=28), "NVIDIA"),
        # else the runtime calls' names (the driver API's cuLaunchKernel too)
        "hip calls": (_doc("Synthetic GPU", launch="hipLaunchKernel"), "AMD"),
        "driver calls": (_doc("Synthetic GPU", launch="cuLaunchKernel"), "NVIDIA"),
        # else the device table's row
        "device": (trace(kernel("k", ts=0, dur=1), deviceProperties=[{"id": 0, "name": "AMD Instinct MI210"}]),
                   "AMD"),
        # nothing says, or the signs disagree (both runtimes' calls): no vendor, and NVIDIA's commands
        "unknown": (trace(kernel("k", ts=0, dur=1)), None),
        "both": (trace(runtime("hipLaunchKernel", ts=0, dur=1), runtime("cudaLaunchKernel", ts=2, dur=1)), None),
    }
    for name, (doc, vendor) in cases.items():
        assert gpu_vendor(load_events(tmp_path / name.replace(" ", "_"), doc)) == vendor, name
    assert roofline(load_events(tmp_path / "nvidia", _doc(kernel_us=10_000)), peak_tflops=1.0).vendor == "NVIDIA"


def test_the_corpus_traces_vendors(corpus: Path) -> None:
    # the corpus's own directories say which GPU ran each trace (its README: MI210, MI250, MI300X, B200, V100)
    expect = {"tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": "AMD",
              "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz": "AMD",
              "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": "AMD",  # no versions: its hip* calls
              "tracelens/b200/eager_trace.json.gz": "NVIDIA",
              "hta/df_index_resolver/df_index_resolver.json.gz": "NVIDIA"}  # no versions: its cuda* calls
    for path, vendor in expect.items():
        assert gpu_vendor(load(corpus / "traces" / path)) == vendor, path


def test_an_unknown_device_keeps_the_flops_and_says_which_option_to_pass(tmp_path: Path) -> None:
    result = roofline(load_events(tmp_path, _doc(device="Mystery Accelerator 9000")))
    assert result.model_flops == MM_FLOPS and result.peak_tflops is None and result.mfu_fraction is None
    assert "unknown device 'Mystery Accelerator 9000'" in result.note and "--peak-tflops" in result.note


def _fp32_mm(kernel_name: str, *, launch_external_id: int = 5) -> dict[str, Any]:
    # the same 4096^3 matmul in fp32 on an A100 SXM4 40GB (fp32 19.5, tf32 156 TFLOP/s), its kernel 20 ms
    return trace(
        step(1, ts=0, dur=30_000),
        cpu_op("aten::mm", ts=10, dur=20, external_id=5, **{
            "Input Dims": [[N, N], [N, N]], "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}),
        runtime("cudaLaunchKernel", ts=12, dur=3, correlation=9, external_id=launch_external_id),
        kernel(kernel_name, ts=100, dur=20_000, correlation=9, external_id=launch_external_id),
        deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 40 * 2**30,
                           "computeMajor": 8, "computeMinor": 0, "numSms": 108}],
    )


@pytest.mark.parametrize(("kernel_name", "dtype", "peak"), [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)", "tf32", 156.0),
    ("ampere_tf32_s1688gemm_tf32_128x128_16x3_nn", "tf32", 156.0),
    ("ampere_sgemm_128x64_nn", "fp32", 19.5),  # SIMT fp32: no tensor cores
])
def test_an_fp32_matmul_on_tf32_tensor_cores_is_held_to_the_tf32_peak(tmp_path: Path, kernel_name: str, dtype: str,
                                                                      peak: float) -> None:
    result = roofline(load_events(tmp_path, _fp32_mm(kernel_name)))
    (op,) = result.ops.iter_rows(named=True)
    assert (op["dtype"], result.dtype, result.peak_tflops) == (dtype, dtype, peak)
    assert result.mfu_fraction == pytest.approx(MM_FLOPS / (30e-3 * peak * 1e12))


def test_kernels_link_to_their_op_by_nesting_where_external_ids_do_not(tmp_path: Path) -> None:
    # GIVEN a trace whose launch call and kernel carry the correlation as External id (PARAM's DLRM traces):
    # no op has External id 9, but the launch call runs inside aten::mm on its thread
    result = roofline(load_events(tmp_path, _fp32_mm("ampere_sgemm_128x64_nn", launch_external_id=9)))
    (op,) = result.ops.iter_rows(named=True)
    assert (op["name"], op["gpu_ns"], op["flops"]) == ("aten::mm", 20_000_000, MM_FLOPS)


def test_work_the_flops_cannot_count_refuses_mfu_and_cpu_ops_are_left_out(tmp_path: Path) -> None:
    doc = _doc()
    doc["traceEvents"] += [
        # a convolution whose recorded inputs lack its stride/padding (2021 Kineto: no Concrete Inputs)
        cpu_op("aten::conv2d", ts=40, dur=20, external_id=6, **{
            "Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [16]], "Input type": ["float", "float", "float"]}),
        # a matmul on the CPU (a data-loading transform): FLOPs, but no kernel
        cpu_op("aten::mm", ts=70, dur=20, external_id=7, **{
            "Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}),
    ]
    result = roofline(load_events(tmp_path, doc))
    assert result.model_flops == MM_FLOPS  # the CPU matmul is not GPU work
    assert result.mfu_fraction is None and result.steps["mfu_fraction"].to_list() == [None]
    assert result.steps["uncounted_ops"].to_list() == [1] and result.uncounted_ops == 1
    assert "1 op with a FLOP model could not be counted" in result.note and "no MFU: 1 matmul" in result.note
    assert "1 op with FLOPs launched no GPU kernel" in result.note
    # AND the memory-bound share is refused too: of the counted matmul alone it would speak for the convolution
    for name, d, refused in (("again", doc, True), ("plain", _doc(), False)):
        t = load_events(tmp_path / name, d)
        limits = roofline(t, peak_tflops=100, peak_bandwidth_gbps=1000)
        assert (workload_evidence(frames_of(t), limits)["memory_bound_fraction"] is None) is refused


def test_an_mfu_above_100_percent_is_refused_with_what_to_pass(tmp_path: Path) -> None:
    # GIVEN the bf16 matmul (137.4 TFLOP in a 1 ms step) held to the H100's fp32 peak (67 TFLOP/s): 205%
    t = load_events(tmp_path, _doc())
    result = roofline(t, dtype="fp32")
    # THEN no MFU, in the headline or the step, and the note says why and which dtype the FLOPs are
    assert result.peak_tflops == 67.0 and result.mfu_fraction is None and result.hfu_fraction is None
    assert result.steps["mfu_fraction"].to_list() == [None]
    assert result.steps["tflops"][0] == pytest.approx(MM_FLOPS / 1e-3 / 1e12)  # the measured rate stays
    assert "no MFU: the steps' FLOPs come to 205% of the fp32 peak" in result.note
    assert "pass --dtype bf16" in result.note and "--peak-tflops" in result.note
    # AND a peak override the FLOPs pass (137%) is refused the same way
    low = roofline(t, peak_tflops=100)
    assert low.mfu_fraction is None and "137% of the bf16 peak (100 TFLOP/s)" in low.note
    # AND on the command line the headline shows no figure for it
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc()))
    out = CliRunner().invoke(cli, ["flops", str(path), "--dtype", "fp32"])
    assert out.exit_code == 0, out.output
    mfu = next(line for line in out.output.splitlines() if line.startswith("mfu "))
    assert mfu.split() == ["mfu", "-"] and "205%" in out.output


def test_a_step_above_the_peak_has_no_mfu_while_the_run_has_one(tmp_path: Path) -> None:
    # GIVEN the matmul in a 1 ms step, then the same matmul in a 10 ms step, on a 100 TFLOP/s peak
    doc = _doc()
    doc["traceEvents"] += [
        step(2, ts=1000, dur=10_000),
        cpu_op("aten::mm", ts=1010, dur=20, external_id=15, **{
            "Input Dims": [[N, N], [N, N]], "Input type": ["c10::BFloat16", "c10::BFloat16"],
            "Concrete Inputs": ["", ""]}),
        runtime("cudaLaunchKernel", ts=1012, dur=3, correlation=11, external_id=15),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", ts=1100, dur=200, correlation=11, external_id=15)]
    result = roofline(load_events(tmp_path, doc), peak_tflops=100)
    # THEN step 1 (137%) has no MFU, step 2 has 13.7%, and the run's 2 x 137.4 TFLOP over 11 ms is 25%
    assert result.steps["mfu_fraction"].to_list() == [None, pytest.approx(MM_FLOPS / (10e-3 * 100e12))]
    assert result.mfu_fraction == pytest.approx(2 * MM_FLOPS / (11e-3 * 100e12))
    assert "1 step has no MFU" in result.note


@pytest.mark.parametrize("strides", [None, [[2048, 1, 0, 0], []]], ids=["no strides", "strides"])
def test_a_broadcast_read_past_the_bandwidth_is_explained_where_strides_are_missing(
        tmp_path: Path, strides: list[Any] | None) -> None:
    # GIVEN a div of a [32, 2048, 1, 1] gradient expanded to [32, 2048, 7, 7] (resnet50's MeanBackward1) whose
    # kernel ran 16 µs, held to 1,000 GB/s: 25.7 MB at full shape is 1,606 GB/s, 13.1 MB read once is 819
    recorded = {"Input Strides": strides} if strides is not None else {}
    doc = trace(
        cpu_op("aten::div", ts=10, dur=20, external_id=5, **{
            "Input Dims": [[32, 2048, 7, 7], []], "Input type": ["float", "long int"], "Concrete Inputs": ["", ""],
            **recorded}),
        runtime("cudaLaunchKernel", ts=12, dur=3, correlation=1, external_id=5),
        kernel("elementwise_kernel", ts=100, dur=16, correlation=1, external_id=5),
        deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 80 * 2**30,
                           "computeMajor": 9, "computeMinor": 0, "numSms": 132}])
    result = roofline(load_events(tmp_path, doc), peak_bandwidth_gbps=1000)
    (op,) = result.ops.iter_rows(named=True)
    if strides is None:
        # THEN without strides the input counts at its full shape, above the bandwidth, and the note says why
        assert op["bytes"] == 2 * 4 * 32 * 2048 * 49 + 8 and op["above_peak"]
        assert "records no Input Strides" in result.note and "overcounted" in result.note
    else:
        # THEN with strides it is read once per distinct element: below the bandwidth, nothing to explain
        assert op["bytes"] == 4 * 32 * 2048 + 8 + 4 * 32 * 2048 * 49 and not op["above_peak"]
        assert "Input Strides" not in result.note


def test_the_flops_command(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc()))
    out = CliRunner().invoke(cli, ["flops", str(path), "--by", "step", "--peak-tflops", "1000"])
    assert out.exit_code == 0, out.output
    assert "mfu" in out.output and "13.7%" in out.output  # 137.4 TFLOP in 1 ms on a 1000 TFLOP/s peak
    js = CliRunner().invoke(cli, ["flops", str(path), "--json"])
    assert js.exit_code == 0 and '"model_flops": 137438953472' in js.output
    every = CliRunner().invoke(cli, ["flops", str(path), "--csv"]).output
    assert "# ops" in every and "# steps" in every  # every table
    steps = CliRunner().invoke(cli, ["flops", str(path), "--csv", "--by", "step", "--peak-tflops", "1000"]).output
    assert not steps.startswith("# ") and "mfu_fraction" in steps.splitlines()[0]  # the step table only


def test_achieved_never_above_peak_on_the_corpus_gpu_traces(corpus: Path, tmp_path: Path) -> None:
    # every corpus GPU trace with shapes and a known device: no op with FLOPs above its attainable figure
    checked = 0
    for path in sorted((corpus / "traces").rglob("*.json*")):
        if "capture_traces" in str(path):  # a profile of CUDA-graph capture: its kernels did not really run
            continue
        result = roofline(load(path, cache_dir=tmp_path))
        if result.peak_tflops is None:
            continue
        with_flops = result.ops.filter(pl.col("flops") > 0)
        assert with_flops.filter(pl.col("roofline_fraction") > 1.0).height == 0, path
        checked += 1
    assert checked >= 4  # the Qwen traces on H100 and MI300X, B200, resnet50 on V100, …


def test_the_verdict_carries_mfu_and_names_the_profiler_to_run_next(tmp_path: Path) -> None:
    # GIVEN one 1 ms step whose only kernel runs 200 µs: the GPU idles 80% of the step (launch-bound)
    t = load_events(tmp_path, _doc())
    result = verdict(t)
    # THEN the verdict carries the step's MFU and hands off to Nsight Systems, where the CPU side shows
    assert result.verdict is Verdict.LAUNCH_BOUND
    assert result.mfu_fraction == pytest.approx(MM_FLOPS / (1e-3 * 989.5e12))
    nsys = SYSTEMS_COMMANDS["NVIDIA"]
    assert result.profile_next == nsys and nsys.startswith("nsys profile") and "--capture-range=cudaProfilerApi" in nsys
    # AND a GPU-bound step goes to Nsight Compute on the kernel furthest below its roofline
    slow = roofline(load_events(tmp_path / "slow", _doc(kernel_us=10_000)), peak_tflops=100.0,
                    peak_bandwidth_gbps=1000.0)
    assert profile_next_command(Verdict.GPU_BOUND, slow) == slow.handoff["command"][0]
    assert profile_next_command(Verdict.DATA_LOADING_BOUND, slow) is None


@pytest.mark.torch
def test_recomputation_counts_in_hfu_not_in_model_flops(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    # GIVEN two linear layers under reentrant activation checkpointing, captured with shapes on the CPU
    torch.manual_seed(0)
    first, second = torch.nn.Linear(64, 96), torch.nn.Linear(96, 64)
    x = torch.randn(32, 64, requires_grad=True)

    def segment(v: Any) -> Any:
        return second(torch.relu(first(v)))

    def train_step(checkpointed: bool) -> None:
        out = checkpoint(segment, x, use_reentrant=True) if checkpointed else segment(x)
        out.sum().backward()

    with torch.profiler.profile(record_shapes=True) as prof:
        train_step(True)
    prof.export_chrome_trace(str(tmp_path / "ckpt.json"))
    with FlopCounterMode(display=False) as executed:
        train_step(True)
    with FlopCounterMode(display=False) as model:
        train_step(False)
    # WHEN the roofline reads the capture
    result = roofline(load(tmp_path / "ckpt.json", cache_dir=tmp_path / "cache"))
    # THEN the model FLOPs are those without checkpointing and the recomputed ones the forward re-run
    assert result.model_flops == model.get_total_flops()
    assert result.recomputed_flops == executed.get_total_flops() - model.get_total_flops() > 0


def test_a_trace_without_a_device_name_takes_it_from_the_capture_manifest(tmp_path: Path) -> None:
    # GIVEN a trace whose deviceProperties names no GPU (as vLLM's), captured by stepscope on an H100
    doc = _doc(device="")
    manifest = {"manifest_version": 1, "distributed": {"rank": None},
                "device": {"type": "cuda", "index": 0, "name": "NVIDIA H100 80GB HBM3"}}
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "manifest.json").write_text(json.dumps(manifest))
    with_manifest = roofline(load_events(tmp_path, doc))
    assert (with_manifest.device, with_manifest.peak_tflops) == ("NVIDIA H100 80GB HBM3", 989.5)
    # AND without the manifest it is an unknown device, saying which options to pass
    (tmp_path / "traces" / "manifest.json").unlink()
    without = roofline(load_events(tmp_path / "again", doc))
    assert without.peak_tflops is None and "--peak-tflops" in without.note
