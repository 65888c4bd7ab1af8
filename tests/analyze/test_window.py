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
