"""The timeline's data: the step shown, its span (the step window), the events and idle gaps inside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace

from stepscope.analyze.frames import TraceFrames
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.timeline import gpu_timeline, median_step
from stepscope.errors import UsageError


def _doc() -> dict[str, Any]:
    # step 1 CPU [0, 100) launches k1, which runs [110, 130): its window is [0, 130); step 2 is [130, 200)
    doc: dict[str, Any] = trace(
        step(1, ts=0, dur=100), step(2, ts=100, dur=100),
        runtime("cudaLaunchKernel", ts=90, dur=5, correlation=1), kernel("k1", ts=110, dur=20, correlation=1),
        runtime("cudaLaunchKernel", ts=150, dur=5, correlation=2), kernel("k2", ts=160, dur=10, correlation=2),
    )
    return doc


def test_the_span_is_the_step_window_the_steps_table_uses(tmp_path: Path) -> None:
    # GIVEN a kernel launched in step 1 that runs past step 1's CPU end
    frames = TraceFrames(load_events(tmp_path, _doc()))
    # WHEN the timeline of step 1 is asked for
    tl = gpu_timeline(frames, step=1)
    # THEN its span is step 1's window [0, 130 µs), the same as in the step windows
    assert tl is not None and tl.step == 1
    w = frames.step_windows.filter(pl.col("step") == 1).row(0, named=True)
    assert (tl.start_ns, tl.length_ns, tl.cpu_ns) == (w["start_ns"], w["end_ns"] - w["start_ns"], 100_000)
    assert tl.events.select("name", "offset_ns", "dur_ns").rows() == [("k1", 110_000, 20_000)]
    # and the idle gaps inside it add up to the window less the busy time
    assert int(tl.idle["dur_ns"].sum()) == 130_000 - 20_000


def test_idle_gaps_are_those_of_gaps(tmp_path: Path) -> None:
    t = load_events(tmp_path, _doc())
    gaps = gpu_gaps(t)
    tl = gpu_timeline(t, step=2, gaps=gaps)
    assert tl is not None
    inside = gaps.gaps.filter((pl.col("start_ns") < 200_000) & (pl.col("end_ns") > 130_000))
    assert sorted(tl.idle["dur_ns"].to_list()) == sorted(inside["dur_ns"].to_list())


def test_unknown_step_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no step 9"):
        gpu_timeline(load_events(tmp_path, _doc()), step=9)


def test_no_gpu_work_gives_none_and_no_steps_the_whole_trace(tmp_path: Path) -> None:
    assert gpu_timeline(load_events(tmp_path / "a", trace(cpu_op("aten::add", ts=0, dur=5)))) is None
    tl = gpu_timeline(load_events(tmp_path / "b", trace(kernel("a", ts=10, dur=5), kernel("b", ts=40, dur=5))))
    assert tl is not None and tl.step is None and (tl.start_ns, tl.length_ns) == (10_000, 35_000)


def test_default_is_the_lower_median_step_among_those_with_gpu_work() -> None:
    # GIVEN windows of 180, 175, 190, 166 ns with GPU work, and a longer step 5 without any
    windows = pl.DataFrame({"step": [1, 2, 3, 4, 5], "wall_ns": [180, 175, 190, 166, 900]})
    launched = pl.DataFrame({"step": [1, 1, 2, 3, 4]})
    # THEN the lower median of the steps with GPU work is picked: step 2 (175 ns), row 1
    assert median_step(windows, launched) == 1
    # and with no GPU work anywhere, all steps count: the lower median of 166..900 is 180 (step 1)
    assert median_step(windows, launched.clear()) == 0
