"""Human units for durations, sizes and shares; shared by the text tables, figures and HTML."""

from __future__ import annotations

import math

from stepscope.analyze._text import plural as plural  # (also the HTML templates' filter `plural`)


def missing(value: float | int | None) -> bool:
    """None or NaN: shown as '-'."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _three_digits(v: float) -> str:
    """About three significant digits, never in exponent form: 1.5, 12.3, 123, 1023 (not 1.02e+03)."""
    return f"{v:.0f}" if v >= 1000 else f"{v:.3g}"


def _short(v: float) -> str:
    """Three significant digits below 100, one decimal from 100 up, no trailing '.0': 12.4, 177.6, 705."""
    text = f"{v:.3g}" if v < 100 else f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text


def human_ns(value: float | int | None) -> str:
    """Nanoseconds as a short human duration: 850 ns, 12.4 µs, 3.21 ms, 1.50 s."""
    if value is None or missing(value):
        return "-"
    v = float(value)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v < 1_000:
        return f"{sign}{v:.0f} ns"
    if v < 1_000_000:
        return f"{sign}{_short(v / 1e3)} µs"
    if v < 1_000_000_000:
        return f"{sign}{_short(v / 1e6)} ms"
    return f"{sign}{v / 1e9:.3g} s"


def human_bytes(value: float | int | None) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 3.25 MiB, 2.00 GiB."""
    if value is None or missing(value):
        return "-"
    v = float(value)
    sign = "-" if v < 0 else ""
    v = abs(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{_three_digits(v)} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def human_fraction(value: float | None) -> str:
    """A 0..1 share as a percentage with one decimal."""
    if value is None or missing(value):
        return "-"
    return f"{100 * value:.1f}%"
