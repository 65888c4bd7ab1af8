"""Figures: valid PNGs of sensible size on synthetic and real traces; None where there is nothing to draw."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from _report_traces import gpu_doc
from builders import cpu_op, load_events, trace

from stepscope.analyze import load
from stepscope.analyze.memory import memory_timeline
from stepscope.analyze.ops import op_table
from stepscope.errors import StepscopeError
from stepscope.reports import figures
from stepscope.reports.palette import color, idle_color

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(data: bytes | None, min_w: int = 300, min_h: int = 100) -> None:
    assert data is not None and data.startswith(PNG_MAGIC)
    img = mpimg.imread(io.BytesIO(data), format="png")
    h, w = img.shape[:2]
    assert min_w <= w <= 2500 and min_h <= h <= 4000
    assert img.std() > 0.01  # not blank


def test_every_figure_on_a_synthetic_gpu_trace(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    assert_png(figures.timeline_figure(t))
    assert_png(figures.timeline_figure(t, step=2))
    assert_png(figures.steps_figure(t))
    assert_png(figures.ops_figure(op_table(t)))
    assert_png(figures.memory_figure(memory_timeline(t, buckets=50)))


def test_unknown_step_is_a_usage_error(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    with pytest.raises(StepscopeError, match="no step 9"):
        figures.timeline_figure(t, step=9)


def test_nothing_to_draw_gives_none(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    assert figures.timeline_figure(t) is None
    assert figures.steps_figure(t) is None
    assert figures.memory_figure(memory_timeline(t)) is None


def test_palette_is_stable_and_distinct() -> None:
    assert color("kernel") == color("KERNEL") != color("memcpy")
    assert color("some_new_category") == color("some_new_category")
    assert idle_color("dataloader") == idle_color("dataloader")


def test_real_traces(corpus: Path) -> None:
    t = load(corpus / "traces" / "tracelens" / "h100")
    assert_png(figures.timeline_figure(t), min_w=800)
    assert_png(figures.memory_figure(memory_timeline(t, buckets=100)), min_w=600)
    assert_png(figures.ops_figure(op_table(t)), min_w=800)


def test_gaps_figures(tmp_path: Path) -> None:
    gaps_mod = pytest.importorskip("stepscope.analyze.gaps", reason="gaps.py is not installed")
    t = load_events(tmp_path, gpu_doc())
    result = gaps_mod.gpu_gaps(t)
    assert_png(figures.gaps_figure(result))
    assert_png(figures.timeline_figure(t, None, result.gaps))


def test_idle_colors_are_distinct_per_cause() -> None:
    causes = ["data_loading", "host_sync", "communication_wait", "memcpy_wait", "launch_overhead", "other"]
    assert len({idle_color(c) for c in causes}) == len(causes)
    assert not {idle_color(c) for c in causes} & {color(k) for k in ("kernel", "memcpy", "memset", "gemm")}


def test_transfers_and_overlap_figures(tmp_path: Path) -> None:
    transfers_mod = pytest.importorskip("stepscope.analyze.transfers", reason="transfers.py is not installed")
    overlap_mod = pytest.importorskip("stepscope.analyze.overlap", reason="overlap.py is not installed")
    t = load_events(tmp_path, gpu_doc())
    assert_png(figures.transfers_figure(transfers_mod.transfers(t)))
    assert_png(figures.overlap_figure(overlap_mod.cpu_gpu_overlap(t)), min_h=60)


def test_timeline_defaults_to_the_median_duration_step() -> None:
    import numpy as np
    import polars as pl

    # GIVEN steps of 180, 175, 190, 166 ns, all with GPU work (plus a longer step 5 without any)
    steps = pl.DataFrame({"step": [1, 2, 3, 4, 5], "ts_ns": [0, 200, 400, 600, 800],
                          "dur_ns": [180, 175, 190, 166, 900], "end_ns": [180, 375, 590, 766, 1700]})
    gpu_starts = np.array([10, 210, 410, 610])
    # THEN the lower median of the steps with GPU work is picked: step 2 (175 ns)
    assert figures.median_step_index(steps, gpu_starts) == 1
    # and with no GPU work anywhere, all steps count: median of 166..900 is 180 (step 1)
    assert figures.median_step_index(steps, np.array([], dtype=np.int64)) == 0


def test_step_bars_split_idle_by_cause_to_the_step_idle() -> None:
    import polars as pl

    # GIVEN a step with 100 busy (98 kernel + 2 memcpy) and 80 idle: 60 data loading + 20 other
    steps = pl.DataFrame({"step": [7], "gpu_busy_ns": [100], "gpu_idle_ns": [80], "kernel_ns": [98],
                          "memcpy_ns": [2], "memset_ns": [0]})
    idle = pl.DataFrame({"step": [7], "idle_host_sync_ns": [0], "idle_data_loading_ns": [60], "idle_other_ns": [20]})
    parts = {label: list(vals) for label, vals, _f, _e in figures._gpu_step_parts(steps, idle)}
    assert parts == {"compute (kernels)": [98.0], "memcpy": [2.0], "idle: data loading": [60.0],
                     "idle: other": [20.0]}
    # causes summed over two devices (120) are scaled to the step's idle (80)
    two = idle.with_columns(pl.col("idle_data_loading_ns") * 2, pl.col("idle_other_ns") - 20 + 60)
    parts = {label: list(vals) for label, vals, _f, _e in figures._gpu_step_parts(steps, two)}
    assert parts["idle: data loading"] == pytest.approx([80 * 120 / 180])
    assert parts["idle: other"] == pytest.approx([80 * 60 / 180])
    # WITHOUT a table the idle is one part
    assert [p[0] for p in figures._gpu_step_parts(steps, pl.DataFrame())] == ["compute (kernels)", "memcpy",
                                                                                "GPU idle"]


def test_snapshot_figure_shows_frames_at_the_peak(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))
    import snapshot_builder as sb

    from stepscope.analyze.snapshot import analyze_snapshot
    from stepscope.analyze.snapshot_read import read_snapshot

    stack = sb.frames((12, "forward"))
    data = {"segments": [sb.segment(0, [sb.block(0, 2 << 20, "active_allocated", stack)])],
            "device_traces": [[sb.entry("alloc", 0, 2 << 20, t=1, stack=stack),
                               sb.entry("alloc", 4 << 20, 1 << 20, t=2, stack=stack),
                               sb.entry("free_completed", 4 << 20, 1 << 20, t=3, stack=stack)]]}
    result = analyze_snapshot(read_snapshot(sb.write(tmp_path / "s.pickle", data)))
    assert result.live_at_peak.height > 0
    assert_png(figures.snapshot_figure(result), min_w=800)


def test_transfers_figure_on_the_resnet_trace(corpus: Path) -> None:
    transfers_mod = pytest.importorskip("stepscope.analyze.transfers", reason="transfers.py is not installed")
    t = load(corpus / "traces" / "kineto" / "resnet50_num_workers_0")
    result = transfers_mod.transfers(t)
    assert result.pageable_copies == 12  # the corpus README: 12 HtoD copies, all pageable
    assert_png(figures.transfers_figure(result), min_w=900)


def test_dollar_signs_in_names_are_plain_text(tmp_path: Path) -> None:
    # GIVEN op names matplotlib would read as math ('$\frac' is not even valid math)
    t = load_events(tmp_path, trace(cpu_op("my$op$", ts=0, dur=5), cpu_op("$\\frac{", ts=10, dur=5)))
    # THEN the figure still renders, and the labels are escaped for matplotlib
    assert_png(figures.ops_figure(op_table(t)))
    assert figures._short("a$b") == "a\\$b"
