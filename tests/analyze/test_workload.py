"""The workload shares the verdict reads (stepscope.analyze.workload): graph-replayed, compiled, memory-bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.frames import frames_of
from stepscope.analyze.workload import workload_evidence


def _launched(name: str, ts: float, dur: float, correlation: int) -> list[dict[str, object]]:
    return [runtime("cudaLaunchKernel", ts=ts - 5, dur=2, correlation=correlation),
            kernel(name, ts=ts, dur=dur, correlation=correlation)]


def test_compiled_counts_every_triton_kernel_whatever_it_fused(tmp_path: Path) -> None:
    # GIVEN inductor kernels named after the convolution and batch norm they fused (30 + 20 µs), a Triton
    # pointwise (10 µs), and a cuDNN convolution (40 µs)
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=300), cpu_op("aten::conv2d", ts=1, dur=2),
        *_launched("triton_poi_fused_convolution_0", 10, 30, 1),
        *_launched("triton_red_fused__native_batch_norm_legit_functional_convolution_backward_1", 50, 20, 2),
        *_launched("triton_poi_fused_add_0", 80, 10, 3),
        *_launched("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw", 100, 40, 4)))
    # WHEN the workload shares are taken
    shares = workload_evidence(frames_of(t), None)
    # THEN compiled is the three triton_* kernels' 60 of 100 µs, not the 10 µs whose name fused no conv or norm
    assert shares["compiled_fraction"] == pytest.approx(0.6)


def test_the_compiled_sample_is_a_quarter_compiled() -> None:
    # GIVEN the torch.compile sample: 60 of its 129 kernels are triton_*, 87.552 of 344.898 µs (the raw JSON)
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "compiled_train_cuda"
    if not sample.is_dir():
        pytest.skip("sample_traces/compiled_train_cuda is not present")
    shares = workload_evidence(frames_of(load(sample)), None)
    assert shares["compiled_fraction"] == pytest.approx(87.552 / 344.898, abs=1e-4)
