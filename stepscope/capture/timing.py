"""Step timing without the profiler's help: CUDA events on a GPU, `time.perf_counter_ns` on CPU.

A mark is taken at each step boundary; step k lasts from mark k to mark k+1. CUDA events are recorded on
the current stream and read only at the end, so timing adds no synchronization to the loop (the step time
is the GPU timeline's step period, which is what a training loop's throughput follows).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Literal

TimingMethod = Literal["cuda_event", "perf_counter_ns"]


class StepClock:
    """Marks at step boundaries; `durations_ns(steps)` gives the duration of each listed 0-based step."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self._torch = torch
        self._cuda = cuda
        self._marks: dict[int, Any] = {}
        self.method: TimingMethod = "cuda_event" if cuda else "perf_counter_ns"

    def mark(self, boundary: int) -> None:
        """Record the boundary before 0-based step `boundary` (= after `boundary` steps)."""
        if self._cuda:
            event = self._torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks[boundary] = event
        else:
            self._marks[boundary] = time.perf_counter_ns()

    def durations_ns(self, steps: list[int]) -> list[int]:
        """Durations of the steps whose both boundaries were marked (others are left out)."""
        timed = [k for k in steps if k in self._marks and k + 1 in self._marks]
        if not timed:
            return []
        if not self._cuda:
            return [self._marks[k + 1] - self._marks[k] for k in timed]
        self._marks[max(timed) + 1].synchronize()
        return [round(self._marks[k].elapsed_time(self._marks[k + 1]) * 1e6) for k in timed]


def _percentile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of sorted values."""
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def step_stats(durations_ns: list[int], batch_size: int | None = None) -> dict[str, Any]:
    """Summary of step durations: steps, mean/std/p50/p95/p99 (ns), steps/s and samples/s (with batch_size).

    >>> step_stats([10, 20, 30], batch_size=2)["p50_ns"], step_stats([])["mean_ns"]
    (20.0, None)
    """
    if not durations_ns:
        return {"steps": 0, "durations_ns": [], "mean_ns": None, "std_ns": None, "p50_ns": None, "p95_ns": None,
                "p99_ns": None, "steps_per_s": None, "samples_per_s": None}
    ordered = sorted(durations_ns)
    mean = statistics.fmean(ordered)
    steps_per_s = 1e9 / mean if mean > 0 else None
    return {
        "steps": len(ordered),
        "durations_ns": list(durations_ns),
        "mean_ns": mean,
        "std_ns": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "p50_ns": _percentile(ordered, 0.50),
        "p95_ns": _percentile(ordered, 0.95),
        "p99_ns": _percentile(ordered, 0.99),
        "steps_per_s": steps_per_s,
        "samples_per_s": batch_size * steps_per_s if batch_size and steps_per_s else None,
    }
