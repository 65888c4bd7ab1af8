"""diff_traces and gpu_busy_fraction on synthetic traces with exact expectations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from builders import kernel, load_events, trace
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
