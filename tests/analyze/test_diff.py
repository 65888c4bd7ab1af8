"""diff_traces and gpu_busy_fraction on synthetic traces with exact expectations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from builders import cpu_op, kernel, load_events, runtime, trace
from hypothesis import given, settings
from hypothesis import strategies as st
from report_traces import gpu_doc

from stepscope.analyze.diff import diff_traces, gpu_busy_fraction


def test_busy_fraction_merges_overlaps(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(kernel("a", ts=0, dur=10), kernel("b", ts=5, dur=15, stream=8),
                                    kernel("c", ts=30, dur=10)))
    assert gpu_busy_fraction(t) == 30 / 40


def _union_brute(iv: list[tuple[int, int]]) -> int:
    covered = np.zeros(max(e for _, e in iv) + 1, dtype=bool)
    for s, e in iv:
        covered[s:e] = True
    return int(covered.sum())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), min_size=1, max_size=12))
def test_busy_fraction_property(tmp_path_factory, iv: list[tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("busy")
    t = load_events(tmp, trace(*[kernel(f"k{i}", ts=s, dur=d) for i, (s, d) in enumerate(iv)]))
    spans = [(s * 1000, (s + d) * 1000) for s, d in iv]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    assert abs(gpu_busy_fraction(t) - _union_brute(spans) / (hi - lo)) < 1e-9  # type: ignore[operator]


def test_diff_of_slower_kernels(tmp_path: Path) -> None:
    before = load_events(tmp_path / "a", gpu_doc(1.0))
    after = load_events(tmp_path / "b", gpu_doc(2.0))
    d = diff_traces(before, after)
    assert d.before_median_step_ns == d.after_median_step_ns == 100_000
    assert d.step_time_change_fraction == 0.0
    row = d.kernels.filter(d.kernels["name"] == "sgemm_128x64").row(0, named=True)
    assert (row["before_ns"], row["after_ns"], row["delta_ns"]) == (20_000, 40_000, 20_000)
    assert d.ops["name"][0] == "aten::mm" and d.ops["delta_self_device_ns"][0] == 20_000
    assert d.before_peak_memory_bytes == d.after_peak_memory_bytes == 2048


def test_an_nvidia_trace_against_an_amd_one_compares_the_runtime_calls_call_for_call(tmp_path: Path) -> None:
    # GIVEN the same loop on each vendor: HIP's runtime calls mirror CUDA's, and each has a call of its own
    before = load_events(tmp_path / "a", trace(
        runtime("cudaLaunchKernel", ts=0, dur=5), runtime("cudaLaunchKernel", ts=10, dur=5),
        runtime("cudaLaunchKernelExC", ts=20, dur=3), runtime("cudaDeviceSynchronize", ts=30, dur=40),
        cpu_op("aten::mm", ts=80, dur=7)))
    after = load_events(tmp_path / "b", trace(
        runtime("hipLaunchKernel", ts=0, dur=4), runtime("hipLaunchKernel", ts=10, dur=4),
        runtime("hipLaunchKernel", ts=20, dur=4), runtime("hipExtModuleLaunchKernel", ts=30, dur=2),
        runtime("hipDeviceSynchronize", ts=40, dur=30), cpu_op("aten::mm", ts=80, dur=9)))
    ops = {r["name"]: r for r in diff_traces(before, after).ops.iter_rows(named=True)}
    # THEN the twins are one row each, their self CPU times summed by hand; the calls without a twin stay apart
    assert set(ops) == {"cudaLaunchKernel / hipLaunchKernel", "cudaDeviceSynchronize / hipDeviceSynchronize",
                        "cudaLaunchKernelExC", "hipExtModuleLaunchKernel", "aten::mm"}
    launch = ops["cudaLaunchKernel / hipLaunchKernel"]
    assert (launch["before_self_cpu_ns"], launch["after_self_cpu_ns"], launch["delta_self_cpu_ns"]) == (
        10_000, 12_000, 2_000)
    assert ops["cudaDeviceSynchronize / hipDeviceSynchronize"]["delta_self_cpu_ns"] == -10_000
    assert (ops["cudaLaunchKernelExC"]["after_self_cpu_ns"], ops["hipExtModuleLaunchKernel"]["before_self_cpu_ns"]) == (
        0, 0)
    assert ops["aten::mm"]["delta_self_cpu_ns"] == 2_000
    # AND two traces of one vendor keep the plain names
    same = diff_traces(before, before).ops["name"].to_list()
    assert "cudaLaunchKernel" in same and not any(" / " in n for n in same)
