"""The per-trace bundle: every analysis reachable, each computed once, the same answers as run alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builders import load_events
from polars.testing import assert_frame_equal
from report_traces import gpu_doc

from stepscope.analyze import steps as steps_mod
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.gaps import GapsResult, gpu_gaps
from stepscope.analyze.steps import step_breakdown
from stepscope.analyze.summary import verdict


def test_each_result_is_computed_once_and_shared(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a bundle, and gaps counted each time they are computed
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> GapsResult:
        calls.append(1)
        return gpu_gaps(*args, **kwargs)

    monkeypatch.setattr(steps_mod, "gpu_gaps", counted)
    # WHEN the steps, the verdict and the timeline are all read
    _ = bundle.steps, bundle.verdict, bundle.timeline()
    # THEN steps used the bundle's gaps rather than computing its own, and repeated reads are the same object
    assert calls == []
    assert bundle.gaps is bundle.gaps and bundle.steps is bundle.steps
    assert bundle.frames.launches is bundle.frames.launches


def test_results_equal_the_analyses_run_alone(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    bundle = TraceAnalysis.of(t)
    assert_frame_equal(bundle.gaps.gaps, gpu_gaps(t).gaps)
    assert_frame_equal(bundle.steps.steps, step_breakdown(t).steps)
    alone = verdict(t)
    assert (bundle.verdict.verdict, bundle.verdict.wall_ns) == (alone.verdict, alone.wall_ns)
    assert_frame_equal(bundle.verdict.places, alone.places)


def test_every_analysis_is_reachable(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    for name in ("info", "gaps", "steps", "kernels", "overlap", "transfers", "ops", "memory", "activations", "roofline",
                 "verdict"):
        assert getattr(bundle, name) is not None
    assert bundle.timeline() is not None


def test_every_query_runs_on_the_in_memory_engine(tmp_path: Path, collect_engines: list[object]) -> None:
    # polars' default engine (streaming) spends much of a query of a trace's size handing work between threads: the
    # analyses name the in-memory engine in every collect (the figures: docs/performance.md)
    from stepscope.reports.html import trace_report

    engines = collect_engines
    # GIVEN a GPU trace; WHEN every analysis of its bundle is computed and its report page built
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    trace_report(bundle, source="gpu_doc")
    _ = bundle.critical_path, bundle.activations
    # THEN every query named the in-memory engine
    assert len(engines) > 50
    assert set(engines) == {"in-memory"}
