"""What the figure modules share: pyplot on the Agg backend, PNG output, axis units, label text.

pyplot is reached only through `subplots` here, so every figure is drawn off-screen (no display needed).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator  # noqa: E402

from stepscope.reports.units import human_bytes  # noqa: E402

DPI = 100
LABEL_CHARS = 48
_BREAKS = " _:<>,.(/"  # a cut name starts a word after one of these
_NS_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
_NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def subplots(*args: Any, **kwargs: Any) -> Any:
    """`plt.subplots` on the Agg backend: (figure, axes)."""
    return plt.subplots(*args, **kwargs)


def literal(text: str) -> str:
    """Trace-derived text drawn as plain text: a '$' would otherwise start matplotlib's math mode (and a name
    like '$\\frac' would fail the whole figure)."""
    return text.replace("$", r"\$")


def short(label: str, n: int = LABEL_CHARS) -> str:
    """A trace-derived label on one line, at most n characters (cut at the end), drawn as plain text."""
    label = " ".join(str(label).split())
    return literal(label if len(label) <= n else label[: n - 1] + "…")


def short_labels(names: Sequence[str], n: int = LABEL_CHARS) -> list[str]:
    """Labels, at most n characters each, for names drawn side by side (bars of a chart). A long name is cut in
    the middle, its start and end kept; names whose cut forms would be equal keep, after a short start, the
    part that tells them from their closest neighbour. Plain text: `literal` it before drawing.

        n=40, two ROCm GEMMs sharing their first 46 characters:
        Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_…_WG32_8_1
            -> Cijk_Ali…MT256x128x64_MI16x16x1_…G32_8_1
        Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT128x224x64_MI16x16x1_…_WG32_8_1
            -> Cijk_Ali…MT128x224x64_MI16x16x1_…G32_8_1
    """
    flat = [" ".join(str(x).split()) for x in names]
    out = [_cut_middle(x, n) for x in flat]
    groups: dict[str, set[str]] = {}
    for name, label in zip(flat, out, strict=True):
        groups.setdefault(label, set()).add(name)
    for i, name in enumerate(flat):
        rivals = groups[out[i]] - {name}
        if rivals:
            out[i] = _cut_around(name, max(_common_prefix(name, r) for r in rivals), n)
    taken: dict[str, str] = {}  # label -> the name it stands for; what still collides is numbered
    for i, name in enumerate(flat):
        k = 2
        while taken.get(out[i], name) != name:
            tag = f" #{k}"
            out[i] = _cut_middle(name, n - len(tag)) + tag
            k += 1
        taken[out[i]] = name
    return out


def _cut_middle(text: str, n: int) -> str:
    """At most n characters: the first two thirds and the last third of the room, '…' between."""
    if len(text) <= n:
        return text
    if n < 5:
        return text[: max(n - 1, 0)] + "…"
    head = (2 * (n - 1) + 2) // 3
    return text[:head] + "…" + text[len(text) - (n - 1 - head):]


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _cut_around(text: str, at: int, n: int) -> str:
    """At most n characters showing text[at] (where it first differs from its rival): a short start, '…', the
    text from `at` (moved back to the start of its word, a few characters at most), '…', a short end."""
    if len(text) <= n or n < 12:
        return _cut_middle(text, n)
    word = max((text.rfind(c, max(at - n // 3, 0), at) for c in _BREAKS), default=-1)
    at = word + 1 if word >= 0 else at
    start = min(at, max(4, n // 5))
    prefix = text[:at] if at <= start else text[:start] + "…"
    rest, room = text[at:], n - len(prefix)
    if len(rest) <= room:
        return prefix + rest
    end = (room - 2) // 4
    return prefix + rest[: room - 1 - end] + "…" + (rest[len(rest) - end:] if end else "")


def to_png(fig: Any) -> bytes:
    """The figure as PNG bytes (tight bounding box); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


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


def ns_tick(v: float) -> str:
    """A log-axis tick in its own unit, no trailing zeros: 1e5 -> '100 µs', 1e6 -> '1 ms'."""
    scale, unit = next(((f, u) for f, u in _NS_UNITS if v >= f), (1.0, "ns"))
    return f"{v / scale:g} {unit}"


def style(ax: Any) -> None:
    """No top/right spines, a light vertical grid."""
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(axis="x", alpha=0.3)
