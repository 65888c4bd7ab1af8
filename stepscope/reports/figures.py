"""Figures of the trace analyses as PNG bytes (matplotlib, Agg backend): they draw results, they compute
nothing. The memory figures are in `memory_figures`; the shared plumbing is in `_plot`.

Every function returns PNG bytes, or None when there is nothing to draw (e.g. no GPU work); the caller says
so in words. Colours come from `palette`, units from `units`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from stepscope.reports._plot import log_labels, ns_axis, ns_tick, spans, style, subplots, to_png
from stepscope.reports.labels import literal, short, short_labels, top_kernels
from stepscope.reports.palette import color, idle_color, path_color
from stepscope.reports.units import human_ns

if TYPE_CHECKING:
    from stepscope.analyze.diff import TraceDiff
    from stepscope.analyze.gaps import GapsResult
    from stepscope.analyze.kernels import KernelsResult
    from stepscope.analyze.ops import OpTable
    from stepscope.analyze.overlap import OverlapResult
    from stepscope.analyze.roofline import RooflineResult
    from stepscope.analyze.steps import StepsResult
    from stepscope.analyze.timeline import GpuTimeline
    from stepscope.analyze.transfers import TransfersResult


def ops_figure(table: OpTable, n: int = 12) -> bytes | None:
    """Top ops by self CPU time and (when the trace has device time) by self GPU time, as bars (`ops_panels`)."""
    panels = ops_panels(table, n)
    if not panels:
        return None
    fig, axes = subplots(1, len(panels), figsize=(6.5 * len(panels), 0.32 * n + 1.4), squeeze=False)
    for ax, (col, title, cat, top) in zip(axes[0], panels, strict=True):
        labels = [literal(x) for x in short_labels(top["name"].to_list(), 40)][::-1]
        values = top[col].to_list()[::-1]
        ax.barh(range(len(values)), values, color=color(cat))
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        ax.set_title(title, fontsize=11)
        for i, v in enumerate(values):
            ax.text(v, i, " " + human_ns(v), va="center", fontsize=7)
        ax.margins(x=0.18)
        ax.set_xlabel(f"time over the whole trace ({ns_axis(ax)})")
        style(ax)
    fig.tight_layout()
    return to_png(fig)


def ops_panels(table: OpTable, n: int = 12) -> list[tuple[str, str, str, pl.DataFrame]]:
    """(column, title, palette category, its top `n` rows) of each panel of `ops_figure`: self CPU time of the
    ops, annotations and runtime calls (ProfilerStep spans left out); where the trace has device time, self GPU
    time of the ops that launched it, or where no op did (a trace of GPU activity alone) of its kernels and
    copies, as the op table lists them. A panel with nothing to show is left out."""
    ops = table.ops
    if ops.height == 0:
        return []
    not_step = ~pl.col("name").str.starts_with("ProfilerStep")  # ProfilerStep#N, and the table's ProfilerStep*
    cpu = pl.col("kind").is_in(["cpu_op", "user_annotation", "runtime", "driver"]) & not_step
    on_gpu = (pl.col("kind") == "cpu_op") & not_step
    if ops.filter(on_gpu & (pl.col("self_device_ns") > 0)).height == 0:
        on_gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    candidates: list[tuple[str, str, str, pl.Expr]] = [("self_cpu_ns", "Top ops by self CPU time", "cpu", cpu)]
    if table.self_device_total_ns > 0:
        candidates.append(("self_device_ns", "Top ops by self GPU time", "device", on_gpu))
    tops = [(col, title, cat, ops.filter(keep & (pl.col(col) > 0)).sort(col, descending=True).head(n))
            for col, title, cat, keep in candidates]
    return [p for p in tops if p[3].height]


#: legend names of critical-path time off the GPU (`depgraph.PathKind`)
_PATH_LABELS = {"cpu": "CPU work", "launch_overhead": "launch overhead", "sync_wait": "sync wait",
                "data_loading": "data loading", "idle": "idle (order, unrecorded waits)"}


def timeline_figure(timeline: GpuTimeline | None) -> bytes | None:
    """GPU timeline strip of one span (`analyze.timeline.gpu_timeline`), one row per device/stream: kernels,
    memcpy and memset coloured by category, each memcpy also marked above its lane, idle gaps shaded by cause.
    Above them, where the timeline has it, the step's critical path: kernels and copies on it in their category's
    colour, other time by kind (`palette.path_color`); where it has none, a note says why."""
    if timeline is None:
        return None
    gpu, length = timeline.events, timeline.length_ns
    path = timeline.path if timeline.path is not None and timeline.path.height else None
    top = 1 if path is not None else 0  # the GPU lanes sit below the path's
    lanes = gpu.select("device", "stream").unique().sort("device", "stream", nulls_last=True)
    fig, ax = subplots(figsize=(12, 0.55 * max(lanes.height + top, 1) + 1.6))
    idle = timeline.idle
    causes = idle.group_by("cause").agg(pl.col("dur_ns").sum()).sort("dur_ns", "cause", descending=[True, False])[
        "cause"].to_list()
    for i, (dev, _stream) in enumerate(lanes.iter_rows(), start=top):
        for cause, part in idle.filter(pl.col("device") == dev).group_by("cause", maintain_order=True):
            spans(ax, part["offset_ns"], part["dur_ns"], (i - 0.5, 1.0), facecolors=idle_color(str(cause[0])),
                  linewidth=0, zorder=0)
    for i, (dev, stream) in enumerate(lanes.iter_rows(), start=top):
        lane = gpu.filter((pl.col("device") == dev) & (pl.col("stream") == stream))
        for cat, part in lane.group_by("category", maintain_order=True):
            spans(ax, part["offset_ns"], part["dur_ns"], (i - 0.4, 0.8), facecolors=color(str(cat[0])), linewidth=0)
        copies = lane.filter(pl.col("kind") == "memcpy")
        if copies.height:  # copies are short: a marker above the lane so none is lost at this scale
            mid = (copies["offset_ns"] + copies["dur_ns"] / 2).to_list()
            ax.plot(mid, [i - 0.47] * len(mid), "v", color=color("memcpy"), markersize=5, markeredgecolor="#8a4b08",
                    markeredgewidth=0.5, linestyle="none", zorder=4)
    path_kinds = _path_lane(ax, path) if path is not None else []
    labels = [f"GPU {d} stream {s}" for d, s in lanes.iter_rows()]
    ax.set_yticks(range(lanes.height + top), ["critical path"] * top + labels, fontsize=8)
    if top:
        ax.get_yticklabels()[0].set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlim(0, length)
    unit = ns_axis(ax, top=length)
    if timeline.step is not None:
        ax.set_xlabel(f"time since step start ({unit})")
        title = f"GPU timeline, step {timeline.step} ({human_ns(timeline.cpu_ns or 0)} on the CPU)"
        if path is not None:
            title += "; top row: the step's critical path"
    else:
        ax.set_xlabel(f"time since the first GPU event ({unit})")
        title = "GPU timeline (whole trace)"
    ax.set_title(title, fontsize=11, loc="left")
    if path is None and timeline.path_note:
        ax.text(1.0, 1.01, timeline.path_note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                color="#666666")
    kinds = (gpu.group_by("category").agg(pl.col("dur_ns").sum()).sort("dur_ns", "category", descending=[True, False])
             ["category"].to_list())
    kinds += [k for k in path_kinds if k in _PATH_LABELS or k not in kinds]  # what only the path shows
    handles: list[Any] = [Line2D([], [], color=color(k), marker="v", markersize=6, markeredgecolor="#8a4b08",
                                 linewidth=6) if k == "memcpy" else Rectangle((0, 0), 1, 1, color=color(k))
                          for k in kinds if k not in _PATH_LABELS]
    handles += [Rectangle((0, 0), 1, 1, color=path_color(k, None)) for k in kinds if k in _PATH_LABELS]
    names = [k for k in kinds if k not in _PATH_LABELS] + [f"path: {_PATH_LABELS[k]}" for k in kinds
                                                          if k in _PATH_LABELS]
    idle_labels = [f"idle: {c.replace('_', ' ')}" for c in causes] or ["idle (blank)"]
    handles += [Rectangle((0, 0), 1, 1, facecolor=idle_color(c), edgecolor="#999999") for c in causes]
    if not causes:
        handles.append(Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#999999"))
    fig.legend(handles, [*names, *idle_labels], loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(handles), 6), fontsize=8, frameon=False)  # (8 ran past a 12-inch figure)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def _path_lane(ax: Any, path: pl.DataFrame) -> list[str]:
    """Draw the critical path in row 0 with a rule under it; the legend keys it shows (a kernel or copy by its
    category, other time by its kind), most time first."""
    gpu_kinds = pl.col("kind").is_in(["kernel", "copy"])
    parts = path.with_columns(key=pl.when(gpu_kinds).then(pl.col("category")).otherwise(pl.col("kind")))
    for (key, kind), part in parts.group_by("key", "kind"):
        spans(ax, part["offset_ns"], part["dur_ns"], (-0.4, 0.8), facecolors=path_color(str(kind), str(key)),
              linewidth=0)
    ax.axhline(0.5, color="#999999", linewidth=0.8)
    return (parts.group_by("key").agg(pl.col("dur_ns").sum()).sort("dur_ns", "key", descending=[True, False])
            ["key"].to_list())


def step_breakdown_figure(result: StepsResult) -> bytes | None:
    """Per step, side by side: CPU time by phase (data loading first), and the step's GPU time as compute
    (kernels), memcpy, memset and idle by cause (steps.py's `idle_by_cause`).

    The GPU bar's height is the step window (gpu_busy_ns + gpu_idle_ns). Busy is split in proportion to
    kernel/memcpy/memset time (they can overlap across streams); idle by cause is scaled to gpu_idle_ns
    (a no-op on one device; on several devices the causes are summed over devices): busy 100 ms with
    kernel 98 + memcpy 2, idle 80 ms = data loading 60 + other 20 -> bars 98, 2, 60, 20.
    """
    steps = result.steps
    if steps.height == 0:
        return None
    labels = [str(s) for s in steps["step"].to_list()]
    x = np.arange(len(labels))
    has_gpu = bool(steps["gpu_busy_ns"].fill_null(0).sum() or steps["kernel_ns"].fill_null(0).sum())
    width = max(11.0, min(15.0, 4 + 0.5 * len(labels))) if has_gpu else max(6.0, min(10.0, 3 + 0.3 * len(labels)))
    fig, axes = subplots(1, 2 if has_gpu else 1, figsize=(width, 3.8), sharey=True, squeeze=False)
    cpu_ax = axes[0, 0]
    bottom = np.zeros(len(labels))
    for phase in ("data_loading", "forward", "backward", "optimizer", "other_cpu"):
        vals = steps[f"{phase}_ns"].fill_null(0).to_numpy().astype(float)
        cpu_ax.bar(x, vals, bottom=bottom, color=color(phase), label=phase.replace("_", " "))
        bottom += vals
    top = float(max(bottom.max(initial=0), steps["cpu_ns"].max() or 0))
    panels = [(cpu_ax, "CPU time per step, by phase")]
    if has_gpu:  # a CPU-only trace gets no GPU panel (it would be all idle)
        gpu_ax = axes[0, 1]
        bottom = np.zeros(len(labels))
        for label, vals, fill, edge in _gpu_step_parts(steps, result.idle_by_cause):
            gpu_ax.bar(x, vals, bottom=bottom, color=fill, edgecolor=edge, linewidth=0.4 if edge else 0,
                       label=label)
            bottom += vals
        top = max(top, float(bottom.max(initial=0)))
        panels.append((gpu_ax, "GPU time per step: busy and idle by cause"))
    pad = max(0.0, (6 - len(labels)) / 2)  # a few steps: keep the bars narrow
    for ax, title in panels:
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("step")
        step_every = max(1, len(labels) // 15)
        ax.set_xticks(x[::step_every], labels[::step_every])
        ax.set_xlim(-0.6 - pad, len(labels) - 0.4 + pad)
        ax.grid(axis="y", alpha=0.3)
        ax.spines["top"].set_visible(False)
        ax.spines["right"].set_visible(False)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
    cpu_ax.set_ylim(0, top * 1.05 if top > 0 else 1)
    cpu_ax.set_ylabel(f"time ({ns_axis(cpu_ax, 'y', top=top)})")
    fig.tight_layout()
    return to_png(fig)


def _gpu_step_parts(steps: pl.DataFrame, idle_by_cause: pl.DataFrame) -> list[tuple[str, Any, str, str | None]]:
    """(label, values per step, fill, edge) for the GPU bar of `step_breakdown_figure`; `idle_by_cause` is
    steps.py's table (step, idle_<cause>_ns ...)."""
    busy = steps["gpu_busy_ns"].fill_null(0).to_numpy().astype(float)
    idle = steps["gpu_idle_ns"].fill_null(0).to_numpy().astype(float)
    work = {k: steps[f"{k}_ns"].fill_null(0).to_numpy().astype(float) for k in ("kernel", "memcpy", "memset")}
    work_sum = sum(work.values())
    scale = np.divide(busy, work_sum, out=np.zeros_like(busy), where=work_sum > 0)
    parts: list[tuple[str, Any, str, str | None]] = [
        ("compute (kernels)" if k == "kernel" else k, v * scale, color(k), None)
        for k, v in work.items() if v.any()]
    cols = [c for c in idle_by_cause.columns if c.startswith("idle_") and c.endswith("_ns")]
    if idle_by_cause.height and cols:
        wide = steps.select("step").join(idle_by_cause, on="step", how="left", maintain_order="left").fill_null(0)
        cols = [c for c in sorted(cols, key=lambda c: -float(wide[c].sum())) if wide[c].sum() > 0]
        total = wide.select(cols).sum_horizontal().to_numpy().astype(float) if cols else np.zeros(len(idle))
        share = np.divide(idle, total, out=np.zeros_like(idle), where=total > 0)
        for c in cols:
            cause = c.removeprefix("idle_").removesuffix("_ns")
            parts.append((f"idle: {cause.replace('_', ' ')}", wide[c].to_numpy().astype(float) * share,
                          idle_color(cause), "#999999"))
        unexplained = np.where(total > 0, 0.0, idle)
        if unexplained.any():
            parts.append(("GPU idle", unexplained, color("gpu_idle"), None))
    else:
        parts.append(("GPU idle", idle, color("gpu_idle"), None))
    return parts


def kernels_figure(result: KernelsResult, n: int = 12) -> bytes | None:
    """GPU time by kernel category and the top kernels by total time (bars coloured by category; the labels
    are `top_kernels`')."""
    if result.gpu_events == 0 or result.by_category.height == 0:
        return None
    cats = result.by_category.sort("total_ns", "category", descending=[True, False]).with_columns(
        label=pl.col("category"))
    top = top_kernels(result, n)
    fig, (cat_ax, name_ax) = subplots(1, 2, figsize=(13, 0.3 * max(n, cats.height) + 1.6),
                                          gridspec_kw={"width_ratios": [1, 1.6]})
    for ax, frame, title in ((cat_ax, cats, "GPU time by kernel category"),
                             (name_ax, top, "Top kernels by total GPU time (full names in the table below)")):
        labels = [literal(v) for v in frame["label"].to_list()][::-1]
        values = frame["total_ns"].to_list()[::-1]
        colors = [color(c) for c in frame["category"].to_list()][::-1]
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        for i, v in enumerate(values):
            ax.text(v, i, " " + human_ns(v), va="center", fontsize=7)
        ax.margins(x=0.2)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(f"summed duration ({ns_axis(ax)})")
        style(ax)
    fig.tight_layout()
    return to_png(fig)


def roofline_figure(result: RooflineResult, n: int = 12) -> bytes | None:
    """The roofline (log-log): attainable TFLOP/s against arithmetic intensity for the device, and each op
    with FLOPs as a point at its achieved TFLOP/s, sized by its GPU time and coloured by family; the longest
    ops are labelled."""
    from stepscope.analyze.roofline import plotted

    ops = plotted(result.ops)
    if ops.height == 0:
        return None
    fig, ax = subplots(figsize=(9, 5.2))
    x = ops["intensity_flop_per_byte"].to_list()
    y = ops["tflops"].to_list()
    sizes = ops["gpu_ns"].cast(pl.Float64).to_numpy()
    area = (20 + 600 * sizes / max(float(sizes.max()), 1.0)).tolist()
    ridge = result.ridge_flop_per_byte
    lo, hi = min(min(x) / 4, (ridge or min(x)) / 2), max(max(x) * 4, (ridge or max(x)) * 4)
    if result.peak_tflops and result.bandwidth_gbps:
        xs = np.geomspace(lo, hi, 200)
        ax.plot(xs, np.minimum(result.peak_tflops, xs * result.bandwidth_gbps / 1e3), color="#333333", linewidth=1.5,
                label=f"roofline: {result.device} ({result.dtype}, {result.peak_tflops:g} TFLOP/s, "
                      f"{result.bandwidth_gbps:g} GB/s)")
    else:  # the points alone: say why the line is missing rather than leave the reader looking for it
        ax.text(0.99, 0.99, "no roofline: the device's peaks are unknown (flops --peak-tflops, --peak-bandwidth)",
                transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#555555")
    ax.set_xlim(lo, hi)  # room for the labels right of the points
    for family in sorted(set(ops["family"].to_list())):
        mask = [f == family for f in ops["family"].to_list()]
        ax.scatter([v for v, m in zip(x, mask, strict=True) if m], [v for v, m in zip(y, mask, strict=True) if m],
                   s=[v for v, m in zip(area, mask, strict=True) if m], color=color(family), alpha=0.7,
                   edgecolors="#333333", linewidths=0.5, label=family, zorder=3)
    placed: list[tuple[float, float]] = []  # labelled points (log10 x, log10 y): a neighbour's label goes below
    for row in ops.sort("gpu_ns", descending=True, maintain_order=True).head(n).iter_rows(named=True):
        at = (math.log10(row["intensity_flop_per_byte"]), math.log10(row["tflops"]))
        near = sum(1 for px, py in placed if abs(px - at[0]) < 0.15 and abs(py - at[1]) < 0.15)
        placed.append(at)
        ax.annotate(short(row["name"].removeprefix("aten::"), 28), (row["intensity_flop_per_byte"], row["tflops"]),
                    xytext=(6, 4 - 11 * near), textcoords="offset points", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_labels(ax.xaxis, lambda v: f"{v:g}")
    log_labels(ax.yaxis, lambda v: f"{v:g}")  # (once 9×10^2 between 480 and 1000 TFLOP/s)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Ops against the roofline (point size: GPU time)", fontsize=11, loc="left")
    # upper left: above the memory-bound slope, where no op can be; one marker size for every family (a family's
    # first point's size would say nothing there, and a large one covers the entries below it)
    legend = ax.legend(loc="upper left", fontsize=7, frameon=True, framealpha=0.85)
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([30])
    ax.grid(True, which="both", alpha=0.2)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def diff_figure(result: TraceDiff, n: int = 10) -> bytes | None:
    """Before vs after: median step time, and the ops whose self time changed most (after - before)."""
    ops = result.ops.head(n)
    if result.before_median_step_ns is None and ops.height == 0:
        return None
    fig, (step_ax, ops_ax) = subplots(1, 2, figsize=(13, 0.32 * max(n, 4) + 1.6),
                                          gridspec_kw={"width_ratios": [1, 2.2]})
    values = [result.before_median_step_ns or 0, result.after_median_step_ns or 0]
    step_ax.bar(["before", "after"], values, color=[color("before"), color("after")])
    for i, v in enumerate(values):
        step_ax.text(i, v, human_ns(v), ha="center", va="bottom", fontsize=8)
    step_ax.set_title("Median step time", fontsize=11)
    step_ax.set_ylabel(f"time ({ns_axis(step_ax, 'y', top=float(max(values) or 1))})")
    step_ax.spines["top"].set_visible(False)
    step_ax.spines["right"].set_visible(False)
    labels = [literal(x) for x in short_labels(ops["name"].to_list(), 40)][::-1]
    y = np.arange(len(labels))
    cpu = ops["delta_self_cpu_ns"].to_numpy()[::-1].astype(float)
    dev = ops["delta_self_device_ns"].to_numpy()[::-1].astype(float)
    ops_ax.barh(y + 0.2, cpu, height=0.4, color=color("cpu"), label="self CPU")
    ops_ax.barh(y - 0.2, dev, height=0.4, color=color("device"), label="self device")
    ops_ax.axvline(0, color="#333333", linewidth=0.8)
    ops_ax.set_yticks(y, labels, fontsize=8)
    top = float(max(np.abs(cpu).max(initial=0), np.abs(dev).max(initial=0)) or 1)
    ops_ax.set_xlim(-top * 1.1, top * 1.1)
    ops_ax.set_xlabel(f"after - before ({ns_axis(ops_ax, top=top)}; negative = less time)")
    ops_ax.set_title("Ops whose self time changed most", fontsize=11)
    ops_ax.legend(loc="lower right", fontsize=8, frameon=False)
    style(ops_ax)
    fig.tight_layout()
    return to_png(fig)


def _trace_label(name: str) -> str:
    """A trace file's name without the suffixes every trace shares: w0.123.pt.trace.json.gz -> w0.123."""
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


def compare_figure(labels: list[str], p50_ns: list[float | None], p95_ns: list[float | None],
                   busy_fraction: list[float | None], idle_shares: list[dict[str, float] | None],
                   mark: int | None = None) -> bytes | None:
    """Traces (or ranks) side by side, one row each: step time p50 with a whisker to p95 (the `mark`ed row,
    e.g. the straggler rank, in red), and the analysis window split into GPU busy and idle by cause."""
    if len(labels) < 2:
        return None
    n = len(labels)
    y = np.arange(n)[::-1]
    fig, (s_ax, u_ax) = subplots(1, 2, figsize=(13, 0.42 * n + 1.9), sharey=True)
    p50 = np.array([v if v is not None else np.nan for v in p50_ns], dtype=float)
    p95 = np.array([v if v is not None else np.nan for v in p95_ns], dtype=float)
    colors = [color("peak") if i == mark else color("kernel") for i in range(n)]
    s_ax.barh(y, np.nan_to_num(p50), color=colors, height=0.6, label="p50")
    err = np.clip(np.nan_to_num(p95 - p50), 0, None)
    s_ax.errorbar(np.nan_to_num(p50), y, xerr=[np.zeros(n), err], fmt="none", ecolor="#333333", capsize=3,
                  linewidth=1, label="to p95")
    top = float(np.nanmax(np.concatenate([p95, p50, [1.0]])))
    s_ax.set_xlim(0, top * 1.25)
    for yi, v in zip(y, p50, strict=True):
        s_ax.text(0, yi, " no steps" if np.isnan(v) else "", va="center", fontsize=7, color="#777777")
    s_ax.set_yticks(y, [literal(v) for v in short_labels([_trace_label(v) for v in labels], 40)], fontsize=8)
    s_ax.set_title("Step time: p50 bar, whisker to p95" + (" (straggler in red)" if mark is not None else ""),
                   fontsize=11)
    s_ax.set_xlabel(f"step wall time ({ns_axis(s_ax, top=top * 1.25)})")
    style(s_ax)
    causes = sorted({c for d in idle_shares if d for c in d},
                    key=lambda c: -sum((d or {}).get(c, 0.0) for d in idle_shares))
    left = np.array([v if v is not None else 0.0 for v in busy_fraction], dtype=float)
    u_ax.barh(y, left, color=color("gpu_busy"), height=0.6, label="GPU busy")
    for c in causes:
        vals = np.array([(d or {}).get(c, 0.0) for d in idle_shares], dtype=float)
        u_ax.barh(y, vals, left=left, color=idle_color(c), edgecolor="#999999", linewidth=0.4, height=0.6,
                  label=f"idle: {c.replace('_', ' ')}")
        left += vals
    for yi, v in zip(y, busy_fraction, strict=True):
        # a trace without GPU work (a CPU or gloo rank) has no busy share: say so, not an empty row
        u_ax.text(0.01, yi, " no GPU work" if v is None else f"{100 * v:.0f}%", va="center", fontsize=7,
                  color="#777777" if v is None else "white")
    u_ax.set_xlim(0, 1)
    u_ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{100 * v:.0f}%"))
    u_ax.set_title("GPU busy and idle by cause (share of the analysis window)", fontsize=11)
    u_ax.set_xlabel("share of the window")
    axes_h = 0.42 * n + 0.9  # inches, about: the figure less titles and tick labels
    u_ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5 / axes_h), ncol=4, fontsize=8, frameon=False)
    style(u_ax)
    fig.tight_layout()
    return to_png(fig)


def gaps_figure(result: GapsResult, n_labels: int = 3) -> bytes | None:
    """Idle time by cause, and the gap-length histogram (log bins) with the longest gaps labelled."""
    gaps = result.gaps
    if result.gaps_total == 0 or gaps.height == 0:
        return None
    fig, (cause_ax, hist_ax) = subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [1, 1.7]})
    by_cause = result.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum()).sort("idle_ns")
    causes = by_cause["cause"].to_list()
    values = by_cause["idle_ns"].to_list()
    cause_ax.barh(range(len(causes)), values, color=[idle_color(c) for c in causes], edgecolor="#777777")
    cause_ax.set_yticks(range(len(causes)), [c.replace("_", " ") for c in causes], fontsize=8)
    for i, v in enumerate(values):
        cause_ax.text(v, i, " " + human_ns(v), va="center", fontsize=7)
    cause_ax.margins(x=0.2)
    cause_ax.set_title("GPU idle time by cause", fontsize=11)
    cause_ax.set_xlabel(f"idle time ({ns_axis(cause_ax)})")
    style(cause_ax)
    dur = gaps["dur_ns"].drop_nulls().to_numpy().astype(float)
    dur = dur[dur > 0]
    lo, hi = max(float(dur.min()), 1.0), float(dur.max())
    bins = np.logspace(np.log10(lo), np.log10(hi * 1.0001) if hi > lo else np.log10(lo) + 1, 30)
    heights, _edges, _patches = hist_ax.hist(dur, bins=bins, weights=dur, color=color("idle"), edgecolor="#777777")
    hist_ax.set_xscale("log")
    log_labels(hist_ax.xaxis, ns_tick)  # (minor ticks too: once "1 µs, 2×10^3, 3×10^3")
    tallest = float(heights.max(initial=0)) or 1.0
    hist_ax.set_ylim(0, tallest * 1.6)  # headroom: the box of the longest gaps sits above the bars
    hist_ax.set_ylabel(f"idle time in the bin ({ns_axis(hist_ax, 'y', top=tallest * 1.6)})")
    hist_ax.set_xlabel("gap length (log scale)")
    noun = "gap" if len(dur) == 1 else "gaps"
    hist_ax.set_title(f"Idle gaps by length ({len(dur):,} {noun}; bar height = their total idle time)", fontsize=11)
    top = gaps.sort("dur_ns", descending=True, maintain_order=True).head(n_labels)
    lines = ["longest gaps:"]
    for row in top.iter_rows(named=True):
        op = row.get("blamed_op") or row.get("blamed_runtime")
        where = row.get("blamed_python")  # the Python line, when the trace has stacks
        what = (f"{short(str(op), 28)} @ {short(str(where), 40)}" if op and where else
                short(str(where or op or (f"before {row['next_kernel']}" if row.get("next_kernel") else "-")), 44))
        cause = str(row.get("cause") or "-").replace("_", " ")
        step = f", step {row['step']}" if row.get("step") is not None else ""
        lines.append(f"{human_ns(row['dur_ns'])}  {cause}{step}: {what}")
    hist_ax.text(0.02, 0.97, "\n".join(lines), transform=hist_ax.transAxes, va="top", ha="left", fontsize=7.5,
                 bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#cccccc", "alpha": 0.9})
    hist_ax.grid(axis="y", alpha=0.3)
    hist_ax.spines["top"].set_visible(False)
    hist_ax.spines["right"].set_visible(False)
    fig.tight_layout()
    return to_png(fig)


def _bandwidth_panel(ax: Any, copies: pl.DataFrame) -> None:
    """Every copy in time order with its bandwidth (GB/s, log scale; marker area ~ bytes), coloured by
    direction, pageable copies circled."""
    order = np.arange(1, copies.height + 1)
    gbps = copies["gbps"].cast(pl.Float64).fill_null(0).to_numpy()
    size = copies["size_bytes"].cast(pl.Float64).fill_null(0).to_numpy()
    area = 12 + 120 * np.sqrt(size / size.max()) if size.max() > 0 else np.full(len(size), 20.0)
    # a copy of unknown size (no `bytes`: ROCm's), of 0 B or of no duration has no bandwidth to draw on a log
    # axis: left off, never drawn at 0
    drawn = np.isfinite(gbps) & (gbps > 0)
    pageable = copies["pageable"].fill_null(False).to_numpy().astype(bool) & drawn
    directions = copies["direction"].fill_null("other").to_list()
    for d in dict.fromkeys(directions):
        m = np.array([x == d for x in directions]) & drawn
        if not m.any():
            continue
        ax.scatter(order[m], gbps[m], s=area[m], color=color(f"memcpy_{d.lower()}"), alpha=0.8,
                   edgecolors="#555555", linewidths=0.3, label=d, zorder=3)
    if pageable.any():
        ax.scatter(order[pageable], gbps[pageable], s=area[pageable] * 2.2, facecolors="none",
                   edgecolors=color("peak"), linewidths=1.4, label="pageable (host memory not pinned)", zorder=4)
    if drawn.any():
        ax.set_yscale("log")
        log_labels(ax.yaxis, lambda v: f"{v:g}")
        ax.margins(y=0.25)
    else:
        ax.set_yticks([])
        why = ("no copy records its size in bytes" if copies["size_bytes"].is_null().all()
               else "no copy has both a size above 0 B and a duration")
        ax.text(0.5, 0.5, f"{why}:\nno bandwidth to draw", transform=ax.transAxes, ha="center", va="center",
                fontsize=10, color="#555555")
    noun = "copy" if copies.height == 1 else "copies"
    unsized = int((~drawn).sum())
    left_out = f"; {unsized:,} without a bandwidth not drawn" if unsized and drawn.any() else ""
    ax.set_title(f"Each copy's bandwidth ({copies.height:,} {noun}; marker area ~ bytes{left_out})", fontsize=11)
    ax.set_xlabel("copy number, in time order")
    ax.set_xlim(0.5, copies.height + 0.5)
    ax.set_ylabel("GB/s")
    if copies.height <= 10:
        ax.set_xticks(range(1, copies.height + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    if drawn.any():
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
    style(ax)
    ax.grid(axis="y", alpha=0.3)


def copy_time_parts(by_step: pl.DataFrame, steps: list[str]) -> list[tuple[str, Any, bool]]:
    """(direction, time per step, exposed) for the stacked bars of the copy-time panel, bottom first: each
    direction's exposed time (no kernel running) and then its hidden time (under a kernel), so a bar's
    exposed share is drawn in proportion; `by_step` is transfers.py's table with `step` as text.

        H2D 10 µs of which 10 exposed, D2H 4 µs of which 1 exposed  ->
        (H2D, 10, exposed), (H2D, 0, hidden), (D2H, 1, exposed), (D2H, 3, hidden)
    """
    parts = []
    for d in by_step["direction"].unique(maintain_order=True).to_list():
        rows = list(by_step.filter(pl.col("direction") == d).iter_rows(named=True))
        dur = {r["step"]: float(r["dur_ns"] or 0) for r in rows}
        exposed = {r["step"]: min(float(r["exposed_ns"] or 0), dur[r["step"]]) for r in rows}
        ex = np.array([exposed.get(st, 0.0) for st in steps])
        parts.append((str(d), ex, True))
        parts.append((str(d), np.array([dur.get(st, 0.0) for st in steps]) - ex, False))
    return parts


def _copy_time_panel(ax: Any, by_step: pl.DataFrame, steps: list[str]) -> None:
    """Copy time per step, stacked by direction, the exposed part (no kernel running) of each hatched."""
    x = np.arange(len(steps))
    bottom = np.zeros(len(steps))
    parts = copy_time_parts(by_step, steps)
    for d, vals, exposed in parts:
        fill = color(f"memcpy_{d.lower()}")
        if exposed:
            ax.bar(x, vals, bottom=bottom, color=fill, edgecolor=color("peak"), hatch="////", linewidth=0.8,
                   label=f"{d}, exposed")
        else:
            ax.bar(x, vals, bottom=bottom, color=fill, label=f"{d}, under a kernel")
        bottom += vals
    handles, labels = ax.get_legend_handles_labels()
    keep = [i for i, (_d, vals, _e) in enumerate(parts) if vals.any()]  # no legend entry for an empty part
    ax.set_ylim(0, float(bottom.max() or 1) * 1.15)
    ax.set_title("Copy time per step (hatched: exposed, no kernel running)", fontsize=11)
    ax.set_ylabel(f"time ({ns_axis(ax, 'y', top=float(bottom.max() or 1))})")
    every = max(1, len(steps) // 15)
    ax.set_xticks(x[::every], steps[::every], fontsize=8)
    ax.set_xlim(-0.6 - max(0.0, (6 - len(steps)) / 2), len(steps) - 0.4 + max(0.0, (6 - len(steps)) / 2))
    ax.set_xlabel("step")
    ax.grid(axis="y", alpha=0.3)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.legend([handles[i] for i in keep], [labels[i] for i in keep], loc="upper center",
              bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)


def transfers_figure(result: TransfersResult) -> bytes | None:
    """Left: every copy in time order with its bandwidth (GB/s, log scale; marker area ~ bytes), pageable
    copies highlighted. Right: copy time per step by direction (stacked), the exposed part of each hatched."""
    copies = result.copies
    if result.copies_total == 0 or copies.height == 0:
        return None
    by_step = result.by_step.with_columns(pl.col("step").cast(pl.String))
    steps = by_step["step"].unique(maintain_order=True).to_list()
    panels = 2 if steps else 1
    fig, axes = subplots(1, panels, figsize=(13 if panels == 2 else 8, 3.8), squeeze=False,
                         gridspec_kw={"width_ratios": [1.6, 1][:panels]})
    _bandwidth_panel(axes[0, 0], copies)
    if panels == 2:
        _copy_time_panel(axes[0, 1], by_step, steps)
    fig.tight_layout()
    return to_png(fig)


def overlap_figure(result: OverlapResult) -> bytes | None:
    """One bar: the analysis window (the steps, else the GPU span) split into CPU and GPU both busy, GPU only,
    CPU only, neither."""
    parts = [("both busy", result.both_busy_fraction, "#4e79a7"), ("GPU only", result.gpu_only_fraction, "#a0cbe8"),
             ("CPU only", result.cpu_only_fraction, "#59a14f")]
    if any(v is None for _, v, _c in parts):
        return None
    known = sum(float(v or 0) for _, v, _c in parts)
    parts.append(("neither", max(0.0, 1.0 - known), "#eeeeee"))
    fig, ax = subplots(figsize=(10, 1.5))
    left = 0.0
    for label, v, c in parts:
        share = float(v or 0)
        ax.barh([0], [share], left=left, color=c, edgecolor="white", label=f"{label} {100 * share:.1f}%")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{100 * v:.0f}%"))
    ax.set_title(f"CPU/GPU overlap over the analysis window: the steps, else the GPU span "
                 f"({human_ns(result.window_ns)})", fontsize=11, loc="left")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=8, frameon=False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return to_png(fig)
