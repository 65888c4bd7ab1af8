"""Memory figures as PNG bytes (matplotlib, Agg backend): the [memory] timeline, memory by category
(export_memory_timeline) and a CUDA memory snapshot. They draw results, they compute nothing.

Every function returns PNG bytes, or None when there is nothing to draw (e.g. no [memory] events); the
caller says so in words. Colours come from `palette`, units from `units`, the plumbing from `_plot`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from stepscope.reports._plot import bytes_axis, ns_axis, style, subplots, to_png
from stepscope.reports.labels import short
from stepscope.reports.palette import color
from stepscope.reports.units import human_bytes

if TYPE_CHECKING:
    from stepscope.analyze.memory import MemoryTimeline
    from stepscope.analyze.memory_categories import MemoryCategoriesResult
    from stepscope.analyze.snapshot import SnapshotResult


#: a device whose allocated bytes never reach this gets no panel of its own beside others (`memory_figure`)
TINY_PEAK_BYTES = 1 << 20


def memory_figure(result: MemoryTimeline) -> bytes | None:
    """Allocated and reserved bytes over time, one panel per device, the peak marked with its op and step; a
    device that never held TINY_PEAK_BYTES is named below the others instead of drawn."""
    tl = result.timeline
    if result.memory_events == 0 or tl.height == 0:
        return None
    peaks = {r["device_name"]: r for r in result.devices.iter_rows(named=True)}
    known = tl.group_by("device_name", maintain_order=True).agg(pl.col("allocated_bytes").is_not_null().any())
    listed = known.filter("allocated_bytes")["device_name"].to_list()  # (a device without totals: nothing to draw)
    if not listed:
        return None
    # a device that never held TINY_PEAK_BYTES (the CPU's 8 bytes beside a GPU's gigabytes) gets no panel of its
    # own, and the figure says so
    tiny = [dev for dev in listed if (peaks.get(dev) or {}).get("peak_allocated_bytes") is not None
            and peaks[dev]["peak_allocated_bytes"] < TINY_PEAK_BYTES]
    devices = [dev for dev in listed if dev not in tiny] or listed
    left_out = [dev for dev in listed if dev not in devices]
    fig, axes = subplots(len(devices), 1, figsize=(10, 2.8 * len(devices) + 0.6 + 0.3 * bool(left_out)),
                         squeeze=False)
    for ax, dev in zip(axes[:, 0], devices, strict=True):
        d = tl.filter(pl.col("device_name") == dev).sort("offset_ns")
        x = d["offset_ns"].to_list()
        alloc = d["allocated_bytes"].to_list()
        if d["reserved_bytes"].fill_null(0).max():  # (a CPU reserves nothing: no line at zero)
            ax.step(x, d["reserved_bytes"].to_list(), where="post", color=color("reserved"), label="reserved")
        ax.step(x, alloc, where="post", color=color("allocated"), label="allocated")
        ax.fill_between(x, alloc, step="post", color=color("allocated"), alpha=0.15)
        p = peaks.get(dev)
        if p is not None and p.get("peak_offset_ns") is not None and p.get("peak_allocated_bytes") is not None:
            ax.plot([p["peak_offset_ns"]], [p["peak_allocated_bytes"]], "o", color=color("peak"), zorder=5)
            where = short(str(p["peak_op"]), 40) if p.get("peak_op") else "outside any op"
            step = f", step {p['peak_step']}" if p.get("peak_step") is not None else ""
            label = f"peak {human_bytes(p['peak_allocated_bytes'])}\n{where}{step}"
            right = p["peak_offset_ns"] > (x[-1] if x else 0) * 0.6
            ax.annotate(label, (p["peak_offset_ns"], p["peak_allocated_bytes"]), xytext=(-10 if right else 10, -4),
                        textcoords="offset points", ha="right" if right else "left", va="top", fontsize=8,
                        color=color("peak"), bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none",
                                                   "alpha": 0.85})
        ax.set_title(f"Memory on {dev}", fontsize=11)
        ax.set_ylabel("bytes")
        bytes_axis(ax, "y")
        ax.set_xlabel(f"time since trace start ({ns_axis(ax)})")
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.85)
        style(ax)
    if left_out:
        fig.text(0.01, 0.005, "not drawn (peak under " + human_bytes(TINY_PEAK_BYTES) + "): " + ", ".join(
            f"{dev} (peak {human_bytes(peaks[dev]['peak_allocated_bytes'])})" for dev in left_out),
            fontsize=8, color="#555555", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if left_out else 0, 1, 1))
    return to_png(fig)


def memory_categories_figure(result: MemoryCategoriesResult) -> bytes | None:
    """Memory by category over time (export_memory_timeline), stacked, the peak of the total marked."""
    tl = result.timeline.filter(pl.col("since_start_ns").is_not_null()).sort("since_start_ns")
    cats = [c for c in tl.columns if c.endswith("_bytes") and c != "total_bytes" and tl[c].sum() > 0]
    if tl.height == 0 or not cats:
        return None
    fig, ax = subplots(figsize=(10, 3.6))
    x = tl["since_start_ns"].to_numpy()
    ys = [tl[c].to_numpy() for c in cats]
    names = [c.removesuffix("_bytes") for c in cats]
    ax.stackplot(x, ys, labels=[n.replace("_", " ") for n in names], colors=[color(n) for n in names],
                 step="post", alpha=0.9)
    if result.peak_since_start_ns is not None:
        ax.axvline(result.peak_since_start_ns, color=color("peak"), linestyle="--", linewidth=1)
        ax.annotate(f"peak {human_bytes(result.peak_total_bytes)}", (result.peak_since_start_ns, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(4, -4), textcoords="offset points", va="top",
                    fontsize=8, color=color("peak"))
    ax.set_title("Memory by category over time (export_memory_timeline)", fontsize=11)
    ax.set_ylabel("bytes")
    bytes_axis(ax, "y")
    ax.set_xlim(float(x.min()), float(x.max()))
    ax.set_xlabel(f"time since the first record ({ns_axis(ax)})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def snapshot_figure(result: SnapshotResult, n: int = 12) -> bytes | None:
    """A CUDA memory snapshot: allocated and reserved over time on the peak device (peak marked), and the
    bytes live at the peak by user stack frame (the allocation's innermost frame in the user's own code)."""
    tl = result.timeline
    live = result.live_at_peak
    if result.peak_device is not None and "device" in live.columns:
        live = live.filter(pl.col("device") == result.peak_device)
    live = live.sort("live_bytes", descending=True, maintain_order=True).head(n) if live.height else live
    if tl.height == 0 and live.height == 0:
        return None
    panels = [p for p, ok in (("timeline", tl.height > 0), ("frames", live.height > 0)) if ok]
    fig, axes = subplots(1, len(panels), figsize=(7 * len(panels), max(3.6, 0.3 * live.height + 1.6)),
                             squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "timeline":
            dev = result.peak_device if result.peak_device is not None else int(tl["device"].min())  # type: ignore[arg-type]
            d = tl.filter(pl.col("device") == dev).sort("since_start_ns")
            x = d["since_start_ns"].to_list()
            ax.step(x, d["reserved_bytes"].to_list(), where="post", color=color("reserved"), label="reserved")
            ax.step(x, d["allocated_bytes"].to_list(), where="post", color=color("allocated"), label="allocated")
            ax.fill_between(x, d["allocated_bytes"].to_list(), step="post", color=color("allocated"), alpha=0.15)
            if result.peak_since_start_ns is not None:
                ax.plot([result.peak_since_start_ns], [result.peak_allocated_bytes], "o", color=color("peak"))
                ax.annotate(f"peak {human_bytes(result.peak_allocated_bytes)}",
                            (result.peak_since_start_ns, result.peak_allocated_bytes), xytext=(6, -4),
                            textcoords="offset points", va="top", fontsize=8, color=color("peak"),
                            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
            ax.set_title(f"CUDA memory snapshot, device {dev}", fontsize=11)
            ax.set_ylabel("bytes")
            bytes_axis(ax, "y")
            ax.set_ylim(bottom=0)
            ax.set_xlabel(f"time since the first allocator event ({ns_axis(ax)})")
            ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.85)
        else:
            labels = [short(v, 44) for v in live["frame"].to_list()][::-1]
            values = live["live_bytes"].to_list()[::-1]
            ax.barh(range(len(values)), values, color=color("allocated"))
            ax.set_yticks(range(len(values)), labels, fontsize=8)
            for i, v in enumerate(values):
                ax.text(v, i, " " + human_bytes(v), va="center", fontsize=7)
            ax.margins(x=0.2)
            bytes_axis(ax, "x")
            ax.set_title(f"Live at the peak ({human_bytes(result.peak_allocated_bytes)}), by stack frame",
                         fontsize=11)
            ax.set_xlabel("bytes live at the peak")
        style(ax)
    fig.tight_layout()
    return to_png(fig)
