"""Figures (figures.py, memory_figures.py): valid PNGs of sensible size on synthetic and real traces; None
where there is nothing to draw."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import critical_path_traces as cp
import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import polars as pl
from builders import annotation, cpu_op, kernel, load_events, memcpy, memory, step, trace
from matplotlib.figure import Figure
from report_traces import gpu_doc

from stepscope.analyze import load
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.kernels import KernelCategory
from stepscope.analyze.memory import memory_timeline
from stepscope.analyze.ops import op_table
from stepscope.analyze.overlap import cpu_gpu_overlap
from stepscope.analyze.timeline import gpu_timeline
from stepscope.analyze.transfers import transfers
from stepscope.reports import _plot, figures, memory_figures
from stepscope.reports._plot import subplots
from stepscope.reports.palette import PATH_FIXED, color, idle_color, path_color

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(data: bytes | None, min_w: int = 300, min_h: int = 100) -> None:
    assert data is not None and data.startswith(PNG_MAGIC)
    img = mpimg.imread(io.BytesIO(data), format="png")
    h, w = img.shape[:2]
    assert min_w <= w <= 2500 and min_h <= h <= 4000
    assert img.std() > 0.01  # not blank


def test_every_figure_on_a_synthetic_gpu_trace(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    assert_png(figures.timeline_figure(gpu_timeline(t)))
    assert_png(figures.timeline_figure(gpu_timeline(t, step=2)))
    assert_png(figures.ops_figure(op_table(t)))
    assert_png(memory_figures.memory_figure(memory_timeline(t, buckets=50)))


def test_nothing_to_draw_gives_none(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    assert figures.timeline_figure(gpu_timeline(t)) is None
    assert memory_figures.memory_figure(memory_timeline(t)) is None


def test_ops_panels_show_kernels_where_no_op_launched_them_and_annotations_by_self_cpu(tmp_path: Path) -> None:
    # GIVEN a trace of GPU activity alone (kernels, no CPU op: an AMD gpu_only capture has this shape)
    t = load_events(tmp_path / "g", trace(kernel("gemm", ts=0, dur=30), kernel("relu", ts=40, dur=10)))
    # THEN its only panel is the kernels' self GPU time, not an empty CPU panel beside an empty op panel
    panels = figures.ops_panels(op_table(t))
    assert [(title, top["name"].to_list()) for _, title, _, top in panels] == [
        ("Top ops by self GPU time", ["gemm", "relu"])]
    assert_png(figures.ops_figure(op_table(t)))
    # GIVEN a CPU trace whose annotation holds time no op does (Python between ops) THEN it is a bar like an op's,
    # and the step's own time (the table's ProfilerStep*) is not
    t = load_events(tmp_path / "c", trace(step(1, ts=0, dur=200), annotation("model_inference", ts=0, dur=100),
                                          cpu_op("aten::add", ts=10, dur=20)))
    (_, title, _, top), = figures.ops_panels(op_table(t))
    assert title == "Top ops by self CPU time" and top["name"].to_list() == ["model_inference", "aten::add"]


def test_palette_is_stable_and_distinct() -> None:
    assert color("kernel") == color("KERNEL") != color("memcpy")
    assert color("some_new_category") == color("some_new_category")
    assert idle_color("dataloader") == idle_color("dataloader")


def test_real_traces(corpus: Path) -> None:
    t = load(corpus / "traces" / "tracelens" / "h100")
    tl = gpu_timeline(t)
    assert tl is not None and tl.path is not None  # one step: its path is the top row
    assert_png(figures.timeline_figure(tl), min_w=800)
    assert_png(memory_figures.memory_figure(memory_timeline(t, buckets=100)), min_w=600)
    assert_png(figures.ops_figure(op_table(t)), min_w=800)


def png_size(data: bytes | None) -> tuple[int, int]:
    assert data is not None
    h, w = mpimg.imread(io.BytesIO(data), format="png").shape[:2]
    return w, h


def test_timeline_with_and_without_the_critical_path(tmp_path: Path) -> None:
    # GIVEN a step whose path holds CPU work, launch overhead, a kernel and a sync wait
    tl = gpu_timeline(load_events(tmp_path, cp.sync_serializes()), step=1)
    assert tl is not None and tl.path is not None
    # WHEN it is drawn with its path, without one (and a note why), and without either
    with_path = figures.timeline_figure(tl)
    noted = figures.timeline_figure(dataclasses.replace(tl, path=None, path_note="critical path not found (x)"))
    plain = figures.timeline_figure(dataclasses.replace(tl, path=None, path_note=None))
    # THEN each is a PNG, and the path takes one more row than the GPU lanes alone
    for png in (with_path, noted, plain):
        assert_png(png)
    assert png_size(with_path)[1] > png_size(noted)[1] == png_size(plain)[1]
    # and an empty path is drawn as no path
    assert png_size(figures.timeline_figure(dataclasses.replace(tl, path=tl.path.clear())))[1] == png_size(plain)[1]


def test_path_colours_tell_cpu_time_from_kernels() -> None:
    # kernels and copies on the path keep their category's colour, as in the GPU lanes
    assert path_color("kernel", "gemm") == color("gemm") and path_color("copy", "memcpy") == color("memcpy")
    # time off the GPU has one colour per kind, none of them a kernel category's
    off_gpu = [path_color(k, None) for k in ("cpu", "launch_overhead", "sync_wait", "data_loading", "idle")]
    assert len(set(off_gpu)) == len(off_gpu) == len(PATH_FIXED)
    assert not set(off_gpu) & {color(c.value) for c in KernelCategory}


def test_gaps_figures(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    result = gpu_gaps(t)
    assert_png(figures.gaps_figure(result))
    assert_png(figures.timeline_figure(gpu_timeline(t, gaps=result)))


def test_idle_colors_are_distinct_per_cause() -> None:
    causes = ["data_loading", "host_sync", "communication_wait", "memcpy_wait", "launch_overhead", "other"]
    assert len({idle_color(c) for c in causes}) == len(causes)
    assert not {idle_color(c) for c in causes} & {color(k) for k in ("kernel", "memcpy", "memset", "gemm")}


def test_transfers_and_overlap_figures(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    assert_png(figures.transfers_figure(transfers(t)))
    assert_png(figures.overlap_figure(cpu_gpu_overlap(t)), min_h=60)


def test_copies_without_a_size_are_left_off_the_bandwidth_panel_never_drawn_at_zero(tmp_path: Path) -> None:
    # GIVEN three copies: 1 MB in 10 µs (100 GB/s), one without its `bytes` (ROCm's), and 2 MB in 10 µs
    unsized = memcpy("HtoD", ts=30, dur=10, nbytes=0, src="Host")
    del unsized["args"]["bytes"]
    doc = trace(step(1, ts=0, dur=100), memcpy("HtoD", ts=10, dur=10, nbytes=1_000_000), unsized,
                memcpy("HtoD", ts=50, dur=10, nbytes=2_000_000))
    copies = transfers(load_events(tmp_path / "some", doc)).copies
    fig, ax = subplots()
    figures._bandwidth_panel(ax, copies)
    # THEN copies 1 and 3 are drawn at their bandwidth, copy 2 not at all, and the title says one was left off
    points = sorted(tuple(map(float, xy)) for c in ax.collections for xy in c.get_offsets())
    assert points == [(1.0, 100.0), (1.0, 100.0), (3.0, 200.0), (3.0, 200.0)]  # (each pageable one circled too)
    assert "1 without a bandwidth not drawn" in ax.get_title()
    plt.close(fig)
    # AND where no copy has a size, nothing is drawn and the panel says why
    fig, ax = subplots()
    figures._bandwidth_panel(ax, copies.filter(pl.col("size_bytes").is_null()))
    assert not any(len(c.get_offsets()) for c in ax.collections)
    assert "no copy records its size" in " ".join(t.get_text() for t in ax.texts)
    plt.close(fig)


def _copy_steps(tmp_path: Path, doc: dict[str, Any]) -> tuple[pl.DataFrame, list[str]]:
    by_step = transfers(load_events(tmp_path, doc)).by_step.with_columns(pl.col("step").cast(pl.String))
    return by_step, by_step["step"].unique(maintain_order=True).to_list()


def test_a_fully_exposed_copy_is_drawn_as_a_fully_exposed_bar(tmp_path: Path) -> None:
    """GIVEN a copy per step with no kernel running (the report traces' HtoD copies)
    WHEN the copy-time panel is drawn
    THEN the whole bar is the hatched 'exposed' part, not a cap on top of it."""
    by_step, steps = _copy_steps(tmp_path, gpu_doc())
    parts = figures.copy_time_parts(by_step, steps)
    assert [(d, exposed) for d, _v, exposed in parts] == [("HtoD", True), ("HtoD", False)]
    assert parts[0][1].tolist() == [5000.0, 5000.0] and parts[1][1].tolist() == [0.0, 0.0]
    fig, ax = subplots()
    figures._copy_time_panel(ax, by_step, steps)
    hatched = [p.get_height() for p in ax.patches if p.get_hatch()]
    plain = [p.get_height() for p in ax.patches if not p.get_hatch()]
    plt.close(fig)
    assert hatched == [5000.0, 5000.0] and plain == [0.0, 0.0]


def test_a_copy_half_under_a_kernel_is_half_exposed(tmp_path: Path) -> None:
    doc = trace(step(1, ts=0, dur=100), kernel("k", ts=0, dur=30),
                memcpy("DtoH", ts=20, dur=20, nbytes=1 << 20))
    by_step, steps = _copy_steps(tmp_path, doc)
    (d, exposed, _e), (_d, hidden, _h) = figures.copy_time_parts(by_step, steps)
    assert d == "DtoH" and exposed.tolist() == [10_000.0] and hidden.tolist() == [10_000.0]


def test_to_png_is_matplotlibs_tight_png_drawn_once(monkeypatch: Any) -> None:
    """`to_png` gives the bytes of savefig(bbox_inches="tight") after tight_layout (a legend outside the axes
    included), with the figure drawn once: savefig draws it twice, first with drawing disabled to measure the box
    (and it does so for any figure tight_layout has been run on, whose placeholder layout engine it sees), but
    `to_png` measures the box beforehand."""
    def build() -> Any:
        fig, ax = subplots(figsize=(6, 2))
        ax.bar(["a", "b"], [3, 5], label="bars")
        ax.set_title("a title")
        fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2)
        fig.tight_layout()
        return fig

    fig = build()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_plot.DPI, bbox_inches="tight")
    plt.close(fig)
    draws: list[object] = []
    real_draw = Figure.draw

    def counted(self: Figure, renderer: Any) -> None:
        draws.append(renderer)
        real_draw(self, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    assert _plot.to_png(build()) == buf.getvalue()
    assert len(draws) == 1


def test_roofline_without_peaks_says_why_it_has_no_line(corpus: Path, monkeypatch: Any) -> None:
    """Peaks known: the roofline line, its legend label naming the device. Unknown: the points alone, and a note
    saying why the line is missing; the axes leave room right of every point for its label."""
    from stepscope.analyze.roofline import roofline

    drawn: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        drawn.append(fig)
        return b""

    monkeypatch.setattr(figures, "to_png", keep)
    result = roofline(load(corpus / "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    unknown = dataclasses.replace(result, peak_tflops=None, bandwidth_gbps=None, ridge_flop_per_byte=None)
    for res in (result, unknown):
        figures.roofline_figure(res)
    known_ax, unknown_ax = (fig.axes[0] for fig in drawn)
    legend = known_ax.get_legend()
    assert legend is not None and any("roofline: NVIDIA H100" in t.get_text() for t in legend.get_texts())
    assert not any("no roofline" in t.get_text() for t in known_ax.texts)
    assert not unknown_ax.lines and any("no roofline: the device's peaks are unknown" in t.get_text()
                                        for t in unknown_ax.texts)
    x = unknown.ops.filter(pl.col("tflops") > 0)["intensity_flop_per_byte"].drop_nulls().to_list()
    assert unknown_ax.get_xlim()[1] >= 4 * max(x)
    plt.close("all")


def test_memory_figure_names_a_device_too_small_to_draw(tmp_path: Path, monkeypatch: Any) -> None:
    """The CPU's 8 bytes beside a GPU's megabytes: one panel (the GPU's, its reserved line drawn) and a line naming
    the CPU; alone, a small device is still drawn (it is all there is), without a reserved line it never had."""
    drawn: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        drawn.append(fig)
        return b""

    monkeypatch.setattr(memory_figures, "to_png", keep)
    gpu = [memory(10, 4 << 20, total_allocated=4 << 20, total_reserved=8 << 20),
           memory(20, -(4 << 20), total_allocated=0, total_reserved=8 << 20)]
    cpu = [memory(12, 8, total_allocated=8, device=-1), memory(14, -8, total_allocated=0, device=-1)]
    memory_figures.memory_figure(memory_timeline(load_events(tmp_path / "both", trace(*gpu, *cpu))))
    memory_figures.memory_figure(memory_timeline(load_events(tmp_path / "cpu", trace(*cpu))))
    # the CPU's events without totals beside the GPU's with them: no allocated figure of the CPU to draw
    untotalled = [memory(12, 8, device=-1), memory(14, -8, device=-1)]
    memory_figures.memory_figure(memory_timeline(load_events(tmp_path / "untotalled", trace(*gpu, *untotalled))))
    both, alone, gpu_only = drawn
    assert [ax.get_title() for ax in gpu_only.axes] == ["Memory on cuda:0"] and not gpu_only.texts
    assert [ax.get_title() for ax in both.axes] == ["Memory on cuda:0"]
    assert [line.get_label() for line in both.axes[0].get_lines()][:2] == ["reserved", "allocated"]
    assert [t.get_text() for t in both.texts] == ["not drawn (peak under 1 MiB): cpu (peak 8 B)"]
    assert [ax.get_title() for ax in alone.axes] == ["Memory on cpu"] and not alone.texts
    assert "reserved" not in [line.get_label() for line in alone.axes[0].get_lines()]
    plt.close("all")
