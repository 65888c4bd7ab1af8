"""Step windows extended to the GPU work they launched; the per-device analysis window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from builders import kernel, load_events, runtime, step, trace

from stepscope.analyze import Trace, intervals, load
from stepscope.analyze.frames import TraceFrames


def test_steps_extend_to_their_gpu_work(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=100), step(2, ts=100, dur=100),
        runtime("cudaLaunchKernel", ts=90, dur=5, correlation=1),
        kernel("k1", ts=110, dur=20, correlation=1),            # launched in step 1, ends at 130
        runtime("cudaLaunchKernel", ts=150, dur=5, correlation=2),
        kernel("k2", ts=160, dur=10, correlation=2, device=1),
    ))
    w = TraceFrames(t).step_windows.select("step", "start_ns", "cpu_end_ns", "end_ns", "wall_ns")
    assert w.rows() == [(1, 0, 100_000, 130_000, 130_000), (2, 130_000, 200_000, 200_000, 70_000)]
    assert TraceFrames(t).analysis_window().rows() == [(0, 0, 200_000), (1, 0, 200_000)]


def test_a_gpu_bound_loop_whose_cpu_runs_ahead(tmp_path: Path) -> None:
    # GIVEN what torch 2.11 on an H200 wrote for a GPU-bound loop: the CPU launches each step in 20 µs, the
    # GPU takes 400 µs a step, the warm-up step's kernel (launched before the trace: no launch call recorded,
    # a lower correlation id) still runs when step 2 starts, and Kineto copies each ProfilerStep onto the GPU
    # timeline (gpu_user_annotation, longer than the CPU span)
    def gpu_step(n: int, ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur,
                "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}}

    t = load_events(tmp_path, trace(
        kernel("warmup_gemm", ts=0, dur=500, correlation=1),
        step(2, ts=10, dur=20), runtime("cudaLaunchKernel", ts=12, dur=2, correlation=5),
        kernel("gemm", ts=500, dur=400, correlation=5), gpu_step(2, 500, 400),
        step(3, ts=30, dur=20), runtime("cudaLaunchKernel", ts=32, dur=2, correlation=9),
        kernel("gemm", ts=900, dur=400, correlation=9), gpu_step(3, 900, 400),
    ))
    frames = TraceFrames(t)
    # THEN the steps are the CPU spans (never the GPU copies), the warm-up kernel belongs to no step, and step 2
    # starts where it ends: each step is its 400 µs of GPU work, as CUDA events would time it
    assert frames.profiler_steps.select("step", "ts_ns", "dur_ns").rows() == [(2, 10_000, 20_000), (3, 30_000, 20_000)]
    assert frames.gpu_by_step.select("step", "name").rows() == [(2, "gemm"), (3, "gemm")]
    w = frames.step_windows.select("step", "start_ns", "end_ns", "wall_ns")
    assert w.rows() == [(2, 500_000, 900_000, 400_000), (3, 900_000, 1_300_000, 400_000)]


def test_without_steps_first_to_last_gpu_event_per_device(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        kernel("a", ts=10, dur=5), kernel("b", ts=40, dur=5),
        kernel("c", ts=20, dur=1, device=1),
    ))
    assert TraceFrames(t).step_windows.height == 0
    assert TraceFrames(t).analysis_window().rows() == [(0, 10_000, 45_000), (1, 20_000, 21_000)]


def test_cpu_only_trace_has_no_window(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(step(1, ts=0, dur=10)))
    assert TraceFrames(t).analysis_window().height == 0


def _gpu_busy_in_window(t: Trace) -> int:
    gpu = t.gpu.select("device", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    busy = intervals.clip(gpu, TraceFrames(t).analysis_window().lazy(), by=["device"])
    return int(busy.select((pl.col("end_ns") - pl.col("start_ns")).sum()).collect().item())


def test_step_window_busy_matches_reference_script(corpus: Path, tmp_path: Path) -> None:
    path = corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    ref = json.loads(subprocess.run([sys.executable, str(corpus.parent / "tools/reference_figures.py"), str(path)],
                                    capture_output=True, text=True, check=True).stdout)
    t = load(path, cache_dir=tmp_path)
    assert _gpu_busy_in_window(t) == pytest.approx(ref["step_busy_us"] * 1000, abs=1)


def test_no_steps_window_is_first_to_last_gpu_event(corpus: Path, tmp_path: Path) -> None:
    t = load(next((corpus / "traces/tracelens/mi210/gpu_only_trace").iterdir()), cache_dir=tmp_path)
    w = TraceFrames(t).analysis_window()
    assert w.height == 1
    assert (w["end_ns"] - w["start_ns"]).item() == pytest.approx(5_980_000, abs=1_000)   # 5.980 ms
    assert _gpu_busy_in_window(t) == pytest.approx(5_343_000, abs=1_000)                # 5.343 ms busy


def _tail_loop() -> dict[str, object]:
    """Two steps that launch a kernel each, then the span a last prof.step() opens (no launch) and, between the
    first two, a step that launches nothing (an idle step inside the loop: a step, not a tail)."""
    return trace(
        step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=10, dur=5, correlation=1),
        kernel("k1", ts=20, dur=50, correlation=1),
        step(2, ts=100, dur=100),  # launches nothing, but a later step does: kept
        step(3, ts=200, dur=100), runtime("cudaLaunchKernel", ts=210, dur=5, correlation=2),
        kernel("k2", ts=250, dur=80, correlation=2),
        step(4, ts=300, dur=3),  # the loop's exit: left out
        step(5, ts=303, dur=1),  # (and a second one, as a schedule's repeat=0 may leave: left out too)
    )


def test_trailing_steps_without_gpu_work_are_left_out(tmp_path: Path) -> None:
    frames = TraceFrames(load_events(tmp_path, _tail_loop()))
    # THEN steps 4 and 5 are the tail; step 2, idle in the middle of the loop, stays a step
    assert frames.tail["step"].to_list() == [4, 5]
    assert frames.profiler_steps["step"].to_list() == [1, 2, 3]
    assert frames.step_windows.select("step", "start_ns", "end_ns").rows() == [
        (1, 0, 100_000), (2, 100_000, 200_000), (3, 200_000, 330_000)]
    assert frames.left_out == ["steps 4, 5 (3 µs, 1 µs): no GPU work launched, unlike the steps before (the span a "
                               "last prof.step() opens until the profiler stops, or work the profiler missed)"]
    # AND every analysis counts the same three steps: the mean over them, computed here by hand
    from stepscope.analyze.info import trace_info
    from stepscope.analyze.steps import step_breakdown
    from stepscope.analyze.summary import verdict
    result = step_breakdown(frames)
    assert result.steps_found == 3 and result.mean_wall_ns == (100_000 + 100_000 + 130_000) / 3
    assert result.left_out == frames.left_out[0]
    assert verdict(frames).wall_ns == 330_000
    info = trace_info(frames)
    assert info.steps_found == 3
    assert info.warnings.filter(pl.col("code") == "tail_steps_excluded")["count"].to_list() == [2]


def test_no_tail_without_gpu_work_or_with_work_at_the_end(tmp_path: Path) -> None:
    # a CPU-only loop: nothing tells a tail from a step
    cpu = TraceFrames(load_events(tmp_path, trace(step(1, ts=0, dur=100), step(2, ts=100, dur=1)), "cpu.json"))
    assert cpu.tail.height == 0 and cpu.profiler_steps.height == 2 and cpu.left_out == []
    # the last step launched work: no tail, though it is short
    end = TraceFrames(load_events(tmp_path, trace(
        step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=10, dur=5, correlation=1),
        kernel("k1", ts=20, dur=50, correlation=1),
        step(2, ts=100, dur=6), runtime("cudaLaunchKernel", ts=101, dur=5, correlation=2),
        kernel("k2", ts=110, dur=50, correlation=2)), "end.json"))
    assert end.tail.height == 0 and end.profiler_steps["step"].to_list() == [1, 2]
    # no launch recorded: a GPU-bound loop's last kernels start after the last step's CPU side, and say nothing
    unlinked = TraceFrames(load_events(tmp_path, trace(
        step(1, ts=0, dur=10), kernel("k1", ts=5, dur=50), step(2, ts=10, dur=10), kernel("k2", ts=55, dur=50)),
        "unlinked.json"))
    assert unlinked.gpu_by_step["step"].to_list() == [1]  # (k2 starts in no step's CPU span)
    assert unlinked.tail.height == 0 and unlinked.profiler_steps["step"].to_list() == [1, 2]


def test_the_span_after_the_last_prof_step_on_a_real_trace(corpus: Path, tmp_path: Path) -> None:
    # GIVEN HTA's MI250 trace, recorded with prof.step() at the end of each iteration and no schedule: its
    # ProfilerStep#2 is the 49 µs from the last prof.step() to the profiler's exit, with no GPU work
    t = load(corpus / "traces/hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", cache_dir=tmp_path)
    all_steps = t.steps.collect()
    assert all_steps["step"].to_list() == [1, 2] and all_steps["dur_ns"][1] < 50_000
    frames = TraceFrames(t)
    # THEN it is left out, and the one step is the iteration (its window from the reference rule)
    assert frames.tail["step"].to_list() == [2]
    assert frames.step_windows["step"].to_list() == [1]
    assert frames.left_out[0].startswith("step 2 (49.1 µs): no GPU work launched")
