"""Figures of a run's ranks side by side (`stepscope ranks`, `stepscope comm`): where each rank's step goes, who
waits in which collective, and the bandwidth the collectives reach by message size. They render results only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from stepscope.reports._plot import ns_axis, style, subplots, to_png
from stepscope.reports.palette import color
from stepscope.reports.units import human_bytes

if TYPE_CHECKING:
    from stepscope.analyze.collectives import CollectivesResult
    from stepscope.analyze.ranks import RanksResult

#: a rank's mean step split in the stacked bars: column, label, colour key (the GPU timeline: they add up to the
#: step on a one-device rank); data loading (CPU) is drawn as its own thin bar under each rank
STEP_PARTS: tuple[tuple[str, str, str], ...] = (
    ("compute_only_ns", "compute kernels", "kernel"),
    ("hidden_comm_ns", "compute with communication under it", "nccl_hidden"),
    ("exposed_comm_ns", "exposed communication", "communication"),
    ("other_gpu_ns", "memcpy / memset only", "memcpy"),
    ("idle_ns", "GPU idle", "idle"),
)
_HIDDEN = "#f4a6a7"  # a lighter communication red: overlapped, so not on the critical path


def rank_parts(ranks: pl.DataFrame) -> pl.DataFrame:
    """`RanksResult.ranks` (mean per step) as the stacked bars' parts, a partition of the step's GPU timeline:
    compute alone, compute with communication under it, exposed communication, memcpy/memset alone, idle; with one
    device they add up to the step (wall).

        wall 1000, compute 250, comm 300 (exposed 250), idle 500  ->  200, 50, 250, 0, 500
    """
    hidden = (pl.col("comm_ns") - pl.col("exposed_comm_ns")).clip(lower_bound=0)
    return ranks.with_columns(
        compute_only_ns=pl.col("compute_ns") - hidden, hidden_comm_ns=hidden,
        other_gpu_ns=(pl.col("wall_ns") - pl.col("idle_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns"))
        .clip(lower_bound=0),
    ).select("rank", *(c for c, _, _ in STEP_PARTS), "data_loading_ns", "wall_ns")


def rank_steps_figure(result: RanksResult) -> bytes | None:
    """One stacked bar per rank, its mean step (`rank_parts`): compute alone, compute with communication under it,
    exposed communication, memcpy/memset alone, GPU idle; under it a thin bar of its data loading (CPU); the
    straggler's label in red."""
    if result.ranks.height < 2 or result.ranks["wall_ns"].null_count() == result.ranks.height:
        return None
    parts = rank_parts(result.ranks).fill_null(0)
    n = parts.height
    y = np.arange(n)[::-1].astype(float)
    fig, ax = subplots(figsize=(11, 0.55 * n + 1.8))
    left = np.zeros(n)
    for col, label, key in STEP_PARTS:
        vals = parts[col].cast(pl.Float64).to_numpy()
        ax.barh(y + 0.12, vals, left=left, height=0.5, label=label,
                color=_HIDDEN if key == "nccl_hidden" else color(key), edgecolor="#ffffff", linewidth=0.4)
        left += vals
    ax.barh(y - 0.3, parts["data_loading_ns"].cast(pl.Float64).to_numpy(), height=0.14, color=color("dataloader"),
            label="data loading (CPU)")
    labels = [f"rank {r}" for r in parts["rank"].to_list()]
    ax.set_yticks(y, labels, fontsize=9)
    for tick, rank in zip(ax.get_yticklabels(), parts["rank"].to_list(), strict=True):
        if rank == result.straggler:
            tick.set_color(color("peak"))
            tick.set_fontweight("bold")
    top = float(max(left.max(), 1.0))
    ax.set_xlim(0, top * 1.05)
    ax.set_xlabel(f"mean per step ({ns_axis(ax, top=top * 1.05)})")
    title = "Each rank's mean step: GPU time by kind, and data loading"
    ax.set_title(title + (f" (straggler: rank {result.straggler}, in red)" if result.straggler is not None else ""),
                 fontsize=11)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55 / (0.55 * n + 0.9)), ncol=3, fontsize=8, frameon=False)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def wait_matrix(waits: pl.DataFrame, calls: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The heatmap's data from `CollectivesResult.waits` and `.calls`: one row per rank, one column per matched
    call (in time order) with that rank's wait in it (null where the rank has no part in the call), and each
    call's label ("#3 all_to_all")."""
    waits = waits.select("call", "rank", "wait_ns")
    calls = calls.select("call", "collective").sort("call")
    matrix = (waits.pivot(on="call", index="rank", values="wait_ns", sort_columns=False)
              .sort("rank"))
    order = [str(c) for c in calls["call"].to_list() if str(c) in matrix.columns]
    labels = [f"#{c} {k}" for c, k in calls.select("call", "collective").iter_rows() if str(c) in order]
    return matrix.select("rank", *order), labels


def skew_heatmap(coll: CollectivesResult, max_calls: int = 80) -> bytes | None:
    """Rank x collective call: each rank's wait in each matched call (its duration minus the call's latency),
    calls in time order; the darker, the longer it waited for the last rank. Beyond `max_calls` calls, the
    `max_calls` with the most skew."""
    if coll.rank_count < 2 or coll.waits.height == 0:
        return None
    calls = coll.calls
    if calls.height > max_calls:
        keep = calls.sort("skew_ns", descending=True, nulls_last=True).head(max_calls).select("call")
        matrix, labels = wait_matrix(coll.waits.join(keep, on="call"), calls.join(keep, on="call"))
    else:
        matrix, labels = wait_matrix(coll.waits, calls)
    data = matrix.drop("rank").cast(pl.Float64).to_numpy() / 1e6  # ms
    ranks = matrix["rank"].to_list()
    fig, ax = subplots(figsize=(min(4 + 0.28 * len(labels), 16), 0.4 * len(ranks) + 2.6))
    cmap = LinearSegmentedColormap.from_list("wait", ["#ffffff", "#f28e2b", "#8a2c1d"]).with_extremes(bad="#d9d9d9")
    image = ax.imshow(np.ma.masked_invalid(data), aspect="auto", cmap=cmap, interpolation="nearest",
                      vmin=0, vmax=max(float(np.nanmax(data)) if np.isfinite(data).any() else 0.0, 1e-3))
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
    step = max(1, len(labels) // 40)
    ax.set_xticks(range(0, len(labels), step), labels[::step], rotation=90, fontsize=7)
    ax.set_xlabel("matched call, in time order" + (f" (the {max_calls} most skewed)" if calls.height > max_calls
                                                   else ""))
    bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    bar.set_label("wait (ms): duration minus the call's latency", fontsize=8)
    ax.set_title("Who waits in which collective: wait per rank and call", fontsize=11)
    fig.tight_layout()
    return to_png(fig)


def busbw_figure(coll: CollectivesResult) -> bytes | None:
    """Bus bandwidth (GB/s, nccl-tests' busbw from the latency) against message size, log-log, one colour per
    collective: small messages are latency-bound; the flat top is what the links give."""
    calls = coll.calls.filter((pl.col("message_bytes") > 0) & (pl.col("busbw_gbps") > 0))
    if calls.height == 0:
        return None
    fig, ax = subplots(figsize=(9, 5))
    for name in sorted(calls["collective"].unique().to_list()):
        part = calls.filter(pl.col("collective") == name)
        ax.scatter(part["message_bytes"].to_numpy(), part["busbw_gbps"].to_numpy(), s=22, alpha=0.75,
                   color=color(name), edgecolor="#333333", linewidth=0.3, label=f"{name} ({part.height:,})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(_bytes_tick))
    if coll.link_bandwidth_gbps:
        ax.axhline(coll.link_bandwidth_gbps, color=color("peak"), linestyle="--", linewidth=1,
                   label=f"link {coll.link_bandwidth_gbps:g} GB/s")
    # plain numbers (0.4, 20), not 4×10⁻¹: the minor ticks labelled too where the axis spans less than a decade
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(FuncFormatter(_gbps_tick))
    ax.yaxis.set_minor_formatter(FuncFormatter(_gbps_tick) if high < 10 * low else NullFormatter())
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("Collective bandwidth by message size (busbw, nccl-tests' factors)", fontsize=11)
    ax.legend(fontsize=8, frameon=False)
    _grid(ax)
    fig.tight_layout()
    return to_png(fig)


def _gbps_tick(value: float, _pos: Any) -> str:
    return f"{value:.3g}"


def _bytes_tick(value: float, _pos: Any) -> str:
    return human_bytes(int(value)) if value >= 1 else ""


def _grid(ax: Any) -> None:
    style(ax)
    ax.grid(axis="both", which="major", alpha=0.3)
