"""The timeline's data: the step shown, its span (the step window), the events and idle gaps inside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import critical_path_traces as cp
import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace

from stepscope.analyze import timeline as timeline_module
from stepscope.analyze.critical_path import critical_path
from stepscope.analyze.frames import TraceFrames
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.timeline import GpuTimeline, gpu_timeline, median_step
from stepscope.analyze.trace import load
from stepscope.errors import UsageError

US = 1_000


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
    # and without steps there is no critical path to show, and the timeline says so
    assert tl.path is None and tl.path_note is not None and "no steps" in tl.path_note


def test_default_is_the_lower_median_step_among_those_with_gpu_work() -> None:
    # GIVEN windows of 180, 175, 190, 166 ns with GPU work, and a longer step 5 without any
    windows = pl.DataFrame({"step": [1, 2, 3, 4, 5], "wall_ns": [180, 175, 190, 166, 900]})
    launched = pl.DataFrame({"step": [1, 1, 2, 3, 4]})
    # THEN the lower median of the steps with GPU work is picked: step 2 (175 ns), row 1
    assert median_step(windows, launched) == 1
    # and with no GPU work anywhere, all steps count: the lower median of 166..900 is 180 (step 1)
    assert median_step(windows, launched.clear()) == 0


# ------------------------------------------------------------------------------------------------ critical path


def assert_path_tiles_the_span(tl: GpuTimeline) -> None:
    """The path's segments follow one another from the span's start to its end: no gap, no overlap."""
    assert tl.path is not None and tl.path.height
    offsets, durs = tl.path["offset_ns"].to_list(), tl.path["dur_ns"].to_list()
    assert offsets[0] == 0 and all(d > 0 for d in durs)
    assert all(o + d == nxt for o, d, nxt in zip(offsets, durs, offsets[1:], strict=False))
    assert offsets[-1] + durs[-1] == sum(durs) == tl.length_ns


def test_the_top_row_is_the_steps_critical_path(tmp_path: Path) -> None:
    # GIVEN a GEMM the CPU waits for in cudaDeviceSynchronize (its path worked out by hand in the builder)
    t = load_events(tmp_path, cp.sync_serializes())
    # WHEN its timeline is drawn
    tl = gpu_timeline(t, step=1)
    # THEN it carries that path, in order, as offsets into the step
    assert tl is not None and tl.path is not None and tl.path_note is None
    assert [(r["name"], r["kind"], r["offset_ns"] // US, r["dur_ns"] // US) for r in tl.path.iter_rows(named=True)] == [
        ("ProfilerStep#1", "cpu", 0, 10), ("aten::mm", "cpu", 10, 5),
        ("(launch latency)", "launch_overhead", 15, 15), ("sgemm_128x64_nn", "kernel", 30, 100),
        ("cudaDeviceSynchronize", "sync_wait", 130, 5), ("ProfilerStep#1", "cpu", 135, 5),
        ("aten::add", "cpu", 140, 5), ("cudaLaunchKernel", "launch_overhead", 145, 5), ("aten::add", "cpu", 150, 10),
        ("ProfilerStep#1", "cpu", 160, 40),
    ]
    assert tl.path.filter(pl.col("kind") == "kernel")["category"].to_list() == ["gemm"]
    assert_path_tiles_the_span(tl)


@pytest.mark.parametrize("shown", [1, 2])
def test_the_path_shown_is_that_steps_of_critical_path(tmp_path: Path, shown: int) -> None:
    # GIVEN two steps, the first's kernel running past its CPU end
    t = load_events(tmp_path, _doc())
    # WHEN either step's timeline is drawn
    tl = gpu_timeline(t, step=shown)
    # THEN its path is exactly `critical_path`'s segments of that step, and it tiles the step's window
    assert tl is not None and tl.path is not None
    expected = critical_path(t).segments.filter(pl.col("step") == shown).sort("seq").select(
        "name", "kind", "category", offset_ns="start_ns", dur_ns="dur_ns")
    assert tl.path.equals(expected)
    assert_path_tiles_the_span(tl)


def test_a_graph_that_cannot_be_built_leaves_the_timeline_with_a_note(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a dependency graph that fails to build
    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("broken graph")

    monkeypatch.setattr(timeline_module, "build_graph", broken)
    # WHEN the timeline is asked for THEN it is there, without a path, saying why
    tl = gpu_timeline(load_events(tmp_path, _doc()), step=1)
    assert tl is not None and tl.events.height == 1
    assert tl.path is None and tl.path_note is not None and "ValueError: broken graph" in tl.path_note
    # and a caller that does not want the path gets neither path nor note
    plain = gpu_timeline(load_events(tmp_path, _doc()), step=1, with_path=False)
    assert plain is not None and plain.path is None and plain.path_note is None


def test_real_trace_paths_tile_their_step(corpus: Path) -> None:
    t = load(corpus / "traces" / "hta" / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz")
    frames = TraceFrames(t)
    segments = critical_path(frames).segments
    for shown in frames.step_windows["step"].to_list():
        tl = gpu_timeline(frames, step=shown)
        assert tl is not None and tl.path is not None
        assert_path_tiles_the_span(tl)
        assert tl.path["dur_ns"].to_list() == segments.filter(pl.col("step") == shown).sort("seq")["dur_ns"].to_list()
