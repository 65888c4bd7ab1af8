"""Overlap: utilization, CPU busy, both-at-once, launch latency, queue depth, sync sources."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import cpu_op, kernel, load_events, python_fn, runtime, step, trace

from stepscope.analyze.overlap import cpu_gpu_overlap
from stepscope.analyze.summary import verdict


def test_shares_latency_depth_and_syncs(tmp_path: Path) -> None:
    doc = trace(
        step(1, ts=0, dur=100),
        cpu_op("aten::mm", ts=0, dur=40, external_id=1),
        runtime("cudaLaunchKernel", ts=5, dur=2, correlation=1, external_id=1),
        runtime("cudaLaunchKernel", ts=8, dur=2, correlation=2, external_id=1),
        kernel("k1", ts=20, dur=30, correlation=1),
        kernel("k2", ts=50, dur=30, correlation=2),
        python_fn("train.py(9): step", ts=85, dur=10),
        runtime("cudaDeviceSynchronize", ts=86, dur=5),
        runtime("cudaStreamWaitEvent", ts=92, dur=1),  # a GPU-side wait: not a host sync
    )
    r = cpu_gpu_overlap(load_events(tmp_path, doc))
    assert r.window_ns == 100_000
    assert (r.gpu_busy_fraction, r.cpu_busy_fraction, r.both_busy_fraction) == pytest.approx((0.6, 0.4, 0.2))
    lat = r.launch_latency.row(0, named=True)
    assert (lat["launches"], lat["max_ns"]) == (2, 42_000)
    q = r.queue_depth.row(0, named=True)
    assert q["max_depth"] == 2
    assert r.sync_sources.rows() == [("cudaDeviceSynchronize", "train.py(9): step", 1, 5_000)]


def test_the_syncs_are_those_in_the_window_as_summary_counts_them(tmp_path: Path) -> None:
    # GIVEN a step that synchronizes once (5 µs), and the profiler harness's own syncs before and after it
    events = [runtime("cudaDeviceSynchronize", ts=0, dur=20),
              step(1, ts=30, dur=100),
              runtime("cudaLaunchKernel", ts=35, dur=2, correlation=1), kernel("k", ts=40, dur=50, correlation=1),
              runtime("cudaStreamSynchronize", ts=60, dur=5),
              runtime("cudaDeviceSynchronize", ts=140, dur=7)]
    t = load_events(tmp_path / "steps", trace(*events))
    r = cpu_gpu_overlap(t)
    # THEN only the step's sync is counted and listed, as summary counts it
    assert (r.sync_calls, r.sync_ns) == (1, 5_000)
    assert r.sync_sources["name"].to_list() == ["cudaStreamSynchronize"]
    summary = verdict(t)
    assert summary.sync_calls == 1 and summary.sync_fraction == pytest.approx(5_000 / r.window_ns)
    # AND without steps, in the window then the GPU's span [40, 90) µs: the harness's 20 + 7 µs outside it once
    # counted, 32 µs of a 50 µs window (64%; on a vLLM capture profile, 209%)
    t = load_events(tmp_path / "no_steps", trace(*events[:1], *events[2:]))
    r = cpu_gpu_overlap(t)
    assert (r.sync_calls, r.sync_ns, r.window_ns) == (1, 5_000, 50_000)
    summary = verdict(t)
    assert summary.sync_calls == 1 and summary.sync_fraction == pytest.approx(5_000 / 50_000)


def test_a_sync_counts_in_the_window_it_ran_in(tmp_path: Path) -> None:
    # GIVEN step 2's CPU span opening with a sync (100..190 µs) that waits for step 1's kernel (15..200), so step 2's
    # window opens at 200, after the call: step 1's window is [0, 200), step 2's [200, 250)
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=10, dur=2, correlation=1),
        kernel("k1", ts=15, dur=185, correlation=1),
        step(2, ts=100, dur=100), runtime("cudaDeviceSynchronize", ts=100, dur=90),
        runtime("cudaLaunchKernel", ts=195, dur=2, correlation=2), kernel("k2", ts=200, dur=50, correlation=2)))
    per = verdict(t).per_step.select("step", "wall_ns", "sync_fraction").rows()
    # THEN its 90 µs are step 1's, the window it blocked in, not 90 µs of step 2's 50 (180%)
    assert per == [(1, 200_000, pytest.approx(90 / 200)), (2, 50_000, 0.0)]


def test_cpu_only_trace_has_no_gpu_shares(tmp_path: Path) -> None:
    r = cpu_gpu_overlap(load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=10), cpu_op("aten::mul", ts=20,
                                                                                              dur=10))))
    assert (r.gpu_events, r.gpu_busy_fraction, r.both_busy_fraction, r.window_ns) == (0, None, None, 30_000)
    assert r.cpu_busy_fraction == pytest.approx(20 / 30)
