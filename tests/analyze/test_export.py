"""`analyze.export`: the tables the Perfetto export draws, against the analyses they come from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, memcpy, runtime, step, trace
from polars.testing import assert_frame_equal

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.export import exposed_copies, phase_segments, queue_depth, step_window, trace_annotations
from stepscope.errors import UsageError

US = 1000


def _steps() -> dict[str, Any]:
    """Two steps: data loading, a forward op launching two kernels back to back, backward on an autograd
    thread, an optimizer step; one HtoD copy half hidden by a kernel."""
    events: list[dict[str, Any]] = []
    for n, base in ((1, 0), (2, 1000)):
        c = 10 * n
        events += [step(n, base, 900), cpu_op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", base, 100),
                   cpu_op("aten::mm", base + 100, 200, external_id=c),
                   runtime("cudaLaunchKernel", base + 110, 10, correlation=c, external_id=c),
                   runtime("cudaLaunchKernel", base + 130, 10, correlation=c + 1, external_id=c),
                   kernel("sgemm", base + 150, 100, correlation=c), kernel("sgemm", base + 250, 50, correlation=c + 1),
                   runtime("cudaMemcpyAsync", base + 260, 5, correlation=c + 2),
                   memcpy("HtoD", base + 270, 60, nbytes=4096, correlation=c + 2),
                   cpu_op("MmBackward0", base + 400, 300, tid=2, fwd_thread_id=1),
                   cpu_op("Optimizer.step#SGD.step", base + 700, 200)]
    doc: dict[str, Any] = trace(*events)
    return doc


def test_phase_segments_add_up_to_the_step_table(tmp_path: Path) -> None:
    # GIVEN the phase slices of a trace
    bundle = TraceAnalysis.of(load_events(tmp_path, _steps()))
    segments = phase_segments(bundle)
    # THEN they never overlap, and per step and phase they add up to what `steps` reports
    ordered = segments.sort("start_ns")
    assert (ordered["start_ns"].shift(-1) >= ordered["end_ns"]).drop_nulls().all()
    sums = segments.group_by("step", "phase").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
    table = (bundle.steps.steps.unpivot(index="step", on=["data_loading_ns", "forward_ns", "backward_ns",
                                                          "optimizer_ns"], variable_name="phase", value_name="ns")
             .with_columns(pl.col("phase").str.strip_suffix("_ns")).filter(pl.col("ns") > 0))
    assert_frame_equal(sums.sort("step", "phase"), table.sort("step", "phase"), check_dtypes=False)
    # and read in order: data loading, forward, backward, optimizer
    assert segments.filter(pl.col("step") == 1)["phase"].to_list() == ["data_loading", "forward", "backward",
                                                                       "optimizer"]
    assert segments.filter(pl.col("step") == 1)["start_ns"].to_list() == [0, 100 * US, 400 * US, 700 * US]


def test_queue_depth_follows_launches_and_ends(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, _steps()))
    depth = queue_depth(bundle).filter(pl.col("stream") == 7, pl.col("ts_ns") < 1000 * US)
    # launches at 110 and 130 (+1 each), the copy's call at 260, work ends at 250, 300 and 330
    assert list(zip(depth["ts_ns"], depth["depth"], strict=True)) == [
        (110 * US, 1), (130 * US, 2), (250 * US, 1), (260 * US, 2), (300 * US, 1), (330 * US, 0)]


def test_exposed_copies_are_the_part_no_kernel_hides(tmp_path: Path) -> None:
    copies = exposed_copies(TraceAnalysis.of(load_events(tmp_path, _steps())))
    # the copy [270, 330) is covered by the kernel [250, 300): 30 µs exposed, in each step
    assert copies["exposed_ns"].to_list() == [30 * US, 30 * US]
    assert copies["bytes"].to_list() == [4096, 4096]


def test_annotations_of_some_steps(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, _steps()))
    lo, hi = step_window(bundle, (2, 5))
    ann = trace_annotations(bundle, steps=(2, 5))
    assert ann.window_ns == (lo, hi) and ann.steps["step"].to_list() == [2]
    assert set(ann.phases["step"]) == {2}
    assert ann.gaps.height and ((ann.gaps["start_ns"] >= lo) & (ann.gaps["end_ns"] <= hi)).all()
    with pytest.raises(UsageError, match=r"no step in 3\.\.4 in this trace \(steps 1\.\.2\)"):
        step_window(bundle, (3, 4))
