"""Step statistics and the CPU step clock."""

from __future__ import annotations

import time

import pytest

from stepscope.capture.timing import StepClock, step_stats


def test_stats_match_numpy_linear_percentiles() -> None:
    s = step_stats([40, 10, 30, 20, 100], batch_size=8)
    assert s["steps"] == 5 and s["durations_ns"] == [40, 10, 30, 20, 100]
    assert s["mean_ns"] == 40.0 and s["p50_ns"] == 30.0
    assert s["p95_ns"] == pytest.approx(88.0) and s["p99_ns"] == pytest.approx(97.6)  # numpy.percentile
    assert s["std_ns"] == pytest.approx(35.355, rel=1e-3)
    assert s["steps_per_s"] == pytest.approx(1e9 / 40) and s["samples_per_s"] == pytest.approx(8e9 / 40)


def test_no_steps_gives_nulls_not_zeros() -> None:
    s = step_stats([])
    assert s["steps"] == 0 and s["mean_ns"] is None and s["steps_per_s"] is None


def test_cpu_clock_times_each_step_between_its_two_marks() -> None:
    clock = StepClock(torch=None, cuda=False)
    clock.mark(0)
    time.sleep(0.01)
    clock.mark(1)
    time.sleep(0.03)
    clock.mark(2)
    a, b = clock.durations_ns([0, 1, 5])  # step 5 has no marks: left out
    assert 10_000_000 <= a < 30_000_000 and 30_000_000 <= b < 80_000_000
