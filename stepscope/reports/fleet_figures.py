"""Figures of a batch of traces taken together (the index's Fleet section): how many traces each verdict has, the
spread of step time across traces, and the spread of GPU busy. One point per trace, no trace names: they stay
legible for forty traces or four hundred (the index table names them). They render the index rows only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from stepscope.reports._plot import ns_axis, ns_tick, style, subplots, to_png
from stepscope.reports.units import human_fraction

#: one colour per verdict, the same in every fleet figure
VERDICT_COLORS: dict[str, str] = {
    "gpu_bound": "#4e79a7",
    "launch_bound": "#edc948",
    "data_loading_bound": "#f28e2b",
    "sync_bound": "#b07aa1",
    "transfer_bound": "#76b7b2",
    "communication_bound": "#e15759",
    "straggler": "#9c755f",
    "no_gpu": "#bab0ac",
}
_OTHER = "#d3d3d3"
#: a step-time axis turns logarithmic when its largest value is this many times its smallest
LOG_SPAN = 10.0


def verdict_color(verdict: str | None) -> str:
    return VERDICT_COLORS.get(verdict or "", _OTHER)


def _label(verdict: str | None) -> str:
    return (verdict or "no verdict").replace("_", " ")


def verdicts_figure(counts: dict[str, int]) -> bytes | None:
    """One horizontal bar per verdict, its number of traces written at its end (most first, top down)."""
    if not counts:
        return None
    names = list(counts)
    y = np.arange(len(names))[::-1]
    values = [counts[n] for n in names]
    fig, ax = subplots(figsize=(8, 0.38 * len(names) + 1.0))
    ax.barh(y, values, color=[verdict_color(n) for n in names], height=0.6, edgecolor="#666666", linewidth=0.4)
    total = sum(values)
    for yi, v in zip(y, values, strict=True):
        ax.text(v, yi, f"  {v} ({human_fraction(v / total)})", va="center", fontsize=8)
    ax.set_yticks(y, [_label(n) for n in names], fontsize=9)
    ax.set_xlim(0, max(values) * 1.25)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("traces")
    ax.set_title("Traces by verdict", fontsize=11)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def _strip(ax: Any, row: float, values: np.ndarray, colors: list[str], rng: np.random.Generator) -> None:
    """A box (quartiles, median line, whiskers to min and max) with one jittered dot per trace over it."""
    lo, q1, med, q3, hi = np.percentile(values, [0, 25, 50, 75, 100])
    ax.hlines(row, lo, q1, color="#888888", linewidth=1)
    ax.hlines(row, q3, hi, color="#888888", linewidth=1)
    ax.vlines([lo, hi], row - 0.12, row + 0.12, color="#888888", linewidth=1)
    ax.barh(row, q3 - q1, left=q1, height=0.55, color="#f2f2f2", edgecolor="#888888", linewidth=1)
    ax.vlines(med, row - 0.275, row + 0.275, color="#333333", linewidth=1.5)
    jitter = rng.uniform(-0.2, 0.2, len(values))
    ax.scatter(values, row + jitter, s=18, c=colors, edgecolor="#333333", linewidth=0.3, zorder=3)


def step_spread_figure(p50_ns: Sequence[float | None], p95_ns: Sequence[float | None],
                       verdicts: Sequence[str | None]) -> bytes | None:
    """Step wall time across traces: each trace's median step (top) and its p95 step (bottom) as one dot, coloured
    by its verdict, over a box of the quartiles with whiskers to min and max. The axis is logarithmic when the
    times span a decade or more."""
    p50 = np.array([np.nan if v is None else v for v in p50_ns], dtype=float)
    p95 = np.array([np.nan if v is None else v for v in p95_ns], dtype=float)
    every = np.concatenate([p50, p95])
    every = every[np.isfinite(every) & (every > 0)]
    if len(every) < 2:
        return None
    rng = np.random.default_rng(0)  # the same jitter on every run: the same PNG for the same traces
    fig, ax = subplots(figsize=(10, 3.0))
    for row, values in ((1.0, p50), (0.0, p95)):
        keep = np.isfinite(values) & (values > 0)
        if keep.any():
            _strip(ax, row, values[keep], [verdict_color(v) for v, k in zip(verdicts, keep, strict=True) if k], rng)
    ax.set_yticks([1.0, 0.0], [f"median step\n({int(np.isfinite(p50).sum())} traces)",
                               f"p95 step\n({int(np.isfinite(p95).sum())} traces)"], fontsize=9)
    ax.set_ylim(-0.6, 1.6)
    lo, hi = float(every.min()), float(every.max())
    if hi / lo >= LOG_SPAN:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.5, hi * 1.5)
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=12))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: ns_tick(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("step wall time (log scale)")
    else:
        ax.set_xlim(0, hi * 1.1)
        ax.set_xlabel(f"step wall time ({ns_axis(ax, top=hi * 1.1)})")
    ax.set_title("Step time across traces: one dot per trace, coloured by verdict; box: quartiles, whiskers: "
                 "min to max", fontsize=10)
    _legend(ax, verdicts)
    style(ax)
    fig.tight_layout()
    return to_png(fig)


def busy_figure(busy_fraction: Sequence[float | None], verdicts: Sequence[str | None], bins: int = 10) -> bytes | None:
    """GPU busy across traces: how many traces in each tenth (0-10%, ... 90-100%), the bars stacked by verdict."""
    pairs = [(float(b), v) for b, v in zip(busy_fraction, verdicts, strict=True) if b is not None and np.isfinite(b)]
    if len(pairs) < 2:
        return None
    edges = np.linspace(0.0, 1.0, bins + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    fig, ax = subplots(figsize=(10, 3.2))
    bottom = np.zeros(bins)
    for verdict in sorted({v for _, v in pairs}, key=lambda v: (v is None, v or "")):
        values = np.clip([b for b, v in pairs if v == verdict], 0.0, 1.0)
        counts, _ = np.histogram(values, bins=edges)
        ax.bar(centers, counts, bottom=bottom, width=0.9 / bins, color=verdict_color(verdict), edgecolor="#666666",
               linewidth=0.4, label=_label(verdict))
        bottom += counts
    ax.set_xlim(0, 1)
    ax.set_xticks(edges)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{100 * v:.0f}%"))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(float(bottom.max()), 1.0) * 1.15)
    ax.set_xlabel("GPU busy (busy time over all steps' wall time, the verdict's figure)")
    ax.set_ylabel("traces")
    ax.set_title(f"GPU busy across traces ({len(pairs):,} traces), stacked by verdict", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    style(ax)
    ax.grid(axis="x", visible=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return to_png(fig)


def _legend(ax: Any, verdicts: Sequence[str | None]) -> None:
    from matplotlib.lines import Line2D

    shown = sorted(set(verdicts), key=lambda v: (v is None, v or ""))
    handles = [Line2D([], [], marker="o", linestyle="", markersize=6, markerfacecolor=verdict_color(v),
                      markeredgecolor="#333333", markeredgewidth=0.3, label=_label(v)) for v in shown]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
