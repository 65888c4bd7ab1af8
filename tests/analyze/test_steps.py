"""Per-step windows, GPU busy, CPU phases, stats, outliers and modules."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from builders import annotation, cpu_op, kernel, load_events, python_fn, runtime, step, trace
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze import intervals, load
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.loading import busy_before
from stepscope.analyze.steps import outliers, step_breakdown

AUTOGRAD_TID = 2


def _docstring_step(n: int, t0: float) -> list[dict[str, object]]:
    """The module docstring's example, shifted by t0, with one kernel launched by aten::conv."""
    c = 100 + n
    return [
        step(n, ts=t0, dur=100),
        annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts=t0, dur=30),
        cpu_op("aten::conv2d", ts=t0 + 30, dur=30, external_id=c),
        runtime("cudaLaunchKernel", ts=t0 + 40, dur=5, correlation=c, external_id=c),
        kernel("implicit_convolve_sgemm", ts=t0 + 50, dur=20, correlation=c),
        cpu_op("ConvolutionBackward0", ts=t0 + 55, dur=25, tid=AUTOGRAD_TID, fwd_thread_id=1),
        annotation("Optimizer.step#SGD.step", ts=t0 + 80, dur=20),
    ]


def test_phase_split_docstring_example(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(*_docstring_step(1, 0)))
    r = step_breakdown(t)
    row = r.steps.row(0, named=True)
    assert (row["data_loading_ns"], row["forward_ns"], row["backward_ns"], row["optimizer_ns"],
            row["other_cpu_ns"]) == (30_000, 25_000, 25_000, 20_000, 0)
    assert row["wall_ns"] == 100_000 and row["gpu_busy_ns"] == 20_000 and row["kernel_ns"] == 20_000
    assert row["gpu_busy_fraction"] == pytest.approx(0.2)
    assert row["data_loading_exposed_ns"] == 30_000  # no GPU work during 0-30


def test_idle_by_cause_from_gaps(tmp_path: Path) -> None:
    """The docstring step alone is idle 0-50 (midpoint 25 inside the DataLoader: data_loading) and 70-100 (no
    next launch, midpoint 85 in Optimizer.step: other). With a second step, the gap 70-150 runs over the step
    boundary (its midpoint 110 is in step 2's DataLoader): 30 µs of it counts in step 1, 50 µs in step 2."""
    one = step_breakdown(load_events(tmp_path / "one", trace(*_docstring_step(1, 0)))).idle_by_cause
    assert one.row(0, named=True) == {"step": 1, "idle_host_sync_ns": 0, "idle_data_loading_ns": 50_000,
                                      "idle_communication_wait_ns": 0, "idle_memcpy_wait_ns": 0,
                                      "idle_launch_overhead_ns": 0, "idle_other_ns": 30_000}
    t = load_events(tmp_path / "two", trace(*_docstring_step(1, 0), *_docstring_step(2, 100)))
    r = step_breakdown(t)
    assert r.idle_by_cause["idle_data_loading_ns"].to_list() == [80_000, 50_000]
    assert r.idle_by_cause["idle_other_ns"].to_list() == [0, 30_000]
    sums = r.idle_by_cause.select(pl.sum_horizontal(pl.exclude("step"))).to_series().to_list()
    assert sums == r.steps["gpu_idle_ns"].to_list()
    assert step_breakdown(t, gaps=gpu_gaps(t)).idle_by_cause.equals(r.idle_by_cause)  # a caller's own gaps
    with pytest.raises(ValueError, match="every gap"):
        step_breakdown(t, gaps=gpu_gaps(t, top=1))


def test_window_extends_to_gpu_end_and_next_step_starts_after(tmp_path: Path) -> None:
    """Step 1's kernel runs until 130 µs: step 1 ends there; step 2 (CPU from 100) starts at 130.
    Step 2's data loading 100-130 is hidden by that kernel, so only 0 µs of it is exposed."""
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=100), cpu_op("aten::mm", ts=10, dur=10, external_id=1),
        runtime("cudaLaunchKernel", ts=12, dur=2, correlation=1, external_id=1),
        kernel("sgemm", ts=20, dur=110, correlation=1),
        step(2, ts=100, dur=100),
        annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", ts=100, dur=30),
        runtime("cudaLaunchKernel", ts=150, dur=2, correlation=2),  # (a last step without GPU work is the
        kernel("relu", ts=160, dur=10, correlation=2),              # loop's exit, window.idle_tail)
    ))
    result = step_breakdown(t)
    s = result.steps
    assert s["start_ns"].to_list() == [0, 130_000]
    assert s["end_ns"].to_list() == [130_000, 200_000]
    assert s["wall_ns"].to_list() == [130_000, 70_000]
    assert s["data_loading_ns"].to_list() == [0, 30_000]
    assert s["data_loading_exposed_ns"].to_list() == [0, 0]
    # step 2's CPU span (100 µs) outlasts its window (70 µs): the note says why, once
    assert s["cpu_ns"].to_list() == [100_000, 100_000]
    assert result.note.startswith("1 of 2 steps with more CPU time than wall time (step 2: cpu 100 µs, wall 70 µs)")


def test_outlier_rule() -> None:
    walls = pl.Series([100, 101, 99, 100, 180]) * 1_000_000
    assert outliers(walls).to_list() == [False, False, False, False, True]
    assert outliers(pl.Series([100, 103, 97, 100]) * 1_000_000).to_list() == [False] * 4  # within 10%
    assert outliers(pl.Series([1, 500])).to_list() == [False, False]  # too few steps


def test_stats_and_outliers_over_steps(tmp_path: Path) -> None:
    events = []
    for i, dur in enumerate([100, 100, 100, 100, 300]):
        events.append(step(i + 1, ts=i * 1000, dur=dur))
        events.append(cpu_op("aten::add", ts=i * 1000, dur=dur))
    r = step_breakdown(load_events(tmp_path, trace(*events)))
    assert r.outlier_steps == [5]
    wall = r.stats.filter(pl.col("metric") == "wall").row(0, named=True)
    assert wall["mean_ns"] == pytest.approx(140_000) and wall["p50_ns"] == pytest.approx(100_000)
    assert r.gpu_busy_fraction is None  # no GPU in this trace


def test_modules_inclusive_cpu_and_gpu(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=100),
        python_fn("nn.Module: Net_0", ts=0, dur=90),
        python_fn("nn.Module: Linear_0", ts=10, dur=30),
        runtime("cudaLaunchKernel", ts=20, dur=2, correlation=1),
        kernel("sgemm", ts=25, dur=7, correlation=1),
        runtime("cudaLaunchKernel", ts=60, dur=2, correlation=2),
        kernel("relu", ts=65, dur=3, correlation=2),
    ))
    m = {r["module"]: r for r in step_breakdown(t).modules.to_dicts()}
    assert (m["Net_0"]["cpu_ns"], m["Net_0"]["gpu_ns"]) == (90_000, 10_000)
    assert (m["Linear_0"]["cpu_ns"], m["Linear_0"]["gpu_ns"]) == (30_000, 7_000)


def test_no_steps(tmp_path: Path) -> None:
    r = step_breakdown(load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5))))
    assert r.steps_found == 0 and r.outlier_steps == [] and r.idle_by_cause.height == 0


def test_cpu_only_steps_have_no_idle_causes(tmp_path: Path) -> None:
    r = step_breakdown(load_events(tmp_path, trace(step(1, ts=0, dur=10), cpu_op("aten::add", ts=0, dur=5))))
    assert r.steps_found == 1 and r.idle_by_cause.height == 0 and r.gpu_busy_fraction is None
    row = r.steps.row(0, named=True)
    assert row["wall_ns"] == 10_000 and row["gpu_busy_ns"] is None and row["gpu_idle_ns"] is None  # unknown, not 0
    assert "gpu_idle" not in r.stats["metric"].to_list() and "wall" in r.stats["metric"].to_list()


RESNET = "traces/kineto/resnet50_num_workers_{}/"


@pytest.mark.parametrize(("workers", "step_us", "dataloader_us", "kernel_us"),
                         [(0, 177_592, 59_262, 98_589), (4, 141_068, 1_186, 99_145)])
def test_resnet50_matches_tb_plugin(corpus: Path, tmp_path: Path, workers: int, step_us: int,
                                    dataloader_us: int, kernel_us: int) -> None:
    """tb_plugin's average step, DataLoader and kernel time (references/kineto_tb_plugin_result_check_file.txt).

    Our step window is tb_plugin's rule, so the step time matches to the µs (tolerance 0.1%). tb_plugin's
    DataLoader is the DataLoader time no higher-priority activity (kernel, memcpy, memset, runtime) covers:
    our data_loading_exposed_ns (not hidden by GPU work) is that figure within 2% (it ignores runtime
    calls, which barely overlap data loading). Kernel time is the sum of the step's kernels (0.1%).
    """
    folder = corpus / RESNET.format(workers)
    r = step_breakdown(load(next(folder.glob("*.pt.trace.json.gz")), cache_dir=tmp_path))
    assert r.steps_found == 6
    assert r.mean_wall_ns == pytest.approx(step_us * 1000, rel=1e-3)
    assert r.mean_data_loading_exposed_ns == pytest.approx(dataloader_us * 1000, rel=0.02)
    assert float(r.steps["kernel_ns"].mean()) == pytest.approx(kernel_us * 1000, rel=1e-3)  # type: ignore[arg-type]
    if workers == 0:  # tb_plugin's per-step totals (its tooltips): 187,948 and 175,153 µs
        assert r.steps["wall_ns"].to_list()[:2] == [187_948_000, 175_153_000]
    # one device: the idle causes add up to each step's GPU idle time; data loading is the largest with 0 workers
    sums = r.idle_by_cause.select(pl.sum_horizontal(pl.exclude("step"))).to_series().to_list()
    assert sums == r.steps["gpu_idle_ns"].to_list()
    dl_idle = float(r.idle_by_cause["idle_data_loading_ns"].mean())  # type: ignore[arg-type]
    if workers == 0:
        assert dl_idle == pytest.approx(dataloader_us * 1000, rel=0.05)  # gaps' blame vs tb_plugin: within 5%
    else:
        assert dl_idle < 0.02 * step_us * 1000


# ---------------------------------------------------------------- interval math (hypothesis)
_ivs = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=30)


def _covered(ivs: list[tuple[int, int]]) -> set[int]:
    return {t for s, d in ivs for t in range(s, s + d)}


@settings(max_examples=150, deadline=None)
@given(_ivs, st.lists(st.integers(0, 260), min_size=1, max_size=5))
def test_busy_before_matches_brute_force(ivs: list[tuple[int, int]], times: list[int]) -> None:
    frame = pl.DataFrame({"s": [s for s, _ in ivs], "e": [s + d for s, d in ivs]},
                         schema={"s": pl.Int64, "e": pl.Int64})
    merged = intervals.union(frame.lazy(), start="s", end="e").collect().select(s="start_ns", e="end_ns")
    covered = _covered(ivs)
    got = busy_before(pl.DataFrame({"t": times}, schema={"t": pl.Int64}), merged, "t").to_list()
    assert got == [sum(1 for c in covered if c < t) for t in times]
