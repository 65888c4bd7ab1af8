"""What the figure modules share: pyplot on the Agg backend, PNG output, axis units (label text: `labels`).

pyplot is reached only through `subplots` here, so every figure is drawn off-screen (no display needed).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.layout_engine import PlaceHolderLayoutEngine  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, MaxNLocator, MultipleLocator  # noqa: E402

from stepscope.reports.units import human_bytes  # noqa: E402

DPI = 100
_NS_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
_NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def subplots(*args: Any, **kwargs: Any) -> Any:
    """`plt.subplots` on the Agg backend: (figure, axes)."""
    return plt.subplots(*args, **kwargs)


def to_png(fig: Any) -> bytes:
    """The figure as PNG bytes (tight bounding box); the figure is closed.

    The box is found here, as savefig(bbox_inches="tight") finds it, but without the whole figure drawn once
    first with drawing disabled (what savefig does before it measures, and also whenever the figure has a layout
    engine: `tight_layout` leaves a placeholder one behind, which is taken off here, as the layout is done): the
    same bytes, one pass fewer."""
    buf = io.BytesIO()
    pad = float(matplotlib.rcParams["savefig.pad_inches"])
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine(None)
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches=fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad))
    plt.close(fig)
    return buf.getvalue()


def spans(ax: Any, starts: Any, widths: Any, yrange: tuple[float, float], **kwargs: Any) -> None:
    """`ax.broken_barh` of many spans at once: one rectangle per (start, width) in `yrange` (bottom, height), drawn
    as broken_barh draws them, without its per-span unit conversion (the GPU timeline has thousands). Numbers only;
    the data limits grow to hold them as broken_barh's do."""
    x0 = np.asarray(starts, dtype=np.float64)
    x1 = x0 + np.asarray(widths, dtype=np.float64)
    if x0.size == 0:
        return
    y0, y1 = float(yrange[0]), float(yrange[0] + yrange[1])
    verts = np.empty((x0.size, 4, 2), dtype=np.float64)
    verts[:, 0, 0] = verts[:, 1, 0] = x0
    verts[:, 2, 0] = verts[:, 3, 0] = x1
    verts[:, 0, 1] = verts[:, 3, 1] = y0
    verts[:, 1, 1] = verts[:, 2, 1] = y1
    ax.add_collection(PolyCollection(cast(Any, verts), **kwargs), autolim=False)  # an (N, 4, 2) array: its fast path
    ax.update_datalim([(float(min(x0.min(), x1.min())), y0), (float(max(x0.max(), x1.max())), y1)])
    ax.autoscale_view()


def ns_axis(ax: Any, axis: str = "x", top: float | None = None) -> str:
    """Plain numbers in one unit chosen from the axis range (no per-tick units that collide); returns it."""
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    span = top if top is not None else max(abs(lo), abs(hi))
    scale, unit = next(((f, u) for f, u in _NS_UNITS if span >= 2 * f), (1.0, "ns"))
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(MaxNLocator(nbins=7))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / scale:g}"))
    return unit


def bytes_axis(ax: Any, axis: str = "y") -> None:
    """Byte ticks at round multiples of a binary unit (256 MiB, 512 MiB, 1 GiB, ...), labelled like 1.5 GiB.

    Call after the data is drawn: the step is chosen from the axis range (about 6 ticks).
    """
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    span = max(abs(lo), abs(hi), 1.0)
    unit = 1024.0 ** max(0, min(5, int(np.log(span) / np.log(1024))))
    raw = span / unit / 6
    mag = 10.0 ** np.floor(np.log10(raw)) if raw > 0 else 1.0
    step = next((m * mag for m in _NICE_STEPS if m * mag >= raw), 10 * mag)
    if unit == 1.0:
        step = max(1.0, round(step))
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MultipleLocator(step * unit))
    target.set_major_formatter(FuncFormatter(lambda v, _p: human_bytes(v)))


class _LogLabels(LogFormatterSciNotation):
    """A log axis's tick labels where matplotlib would put them (the decades, and the ticks between where the axis
    spans too little for decades alone), written by `fmt`, not in its own 2×10^3 notation beside our units."""

    def __init__(self, fmt: Callable[[float], str]) -> None:
        super().__init__(labelOnlyBase=False)
        self._fmt = fmt

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self._fmt(x) if super().__call__(x, pos) else ""


def log_labels(axis: Any, fmt: Callable[[float], str]) -> None:
    """Label a log-scaled `axis` (ax.xaxis / ax.yaxis) with `fmt`, its minor ticks where they are labelled too."""
    axis.set_major_formatter(_LogLabels(fmt))
    axis.set_minor_formatter(_LogLabels(fmt))


def ns_tick(v: float) -> str:
    """A log-axis tick in its own unit, no trailing zeros: 1e5 -> '100 µs', 1e6 -> '1 ms'."""
    scale, unit = next(((f, u) for f, u in _NS_UNITS if v >= f), (1.0, "ns"))
    return f"{v / scale:g} {unit}"


def style(ax: Any) -> None:
    """No top/right spines, a light vertical grid."""
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(axis="x", alpha=0.3)
