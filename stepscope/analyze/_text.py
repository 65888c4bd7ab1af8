"""Durations in the analyses' own notes and descriptions (the reports and the CLI have their own units)."""

from __future__ import annotations


def duration(ns: float) -> str:
    """A duration in the unit that reads best: 26.4 ms, 812 µs, 1.2 s, 40 ns."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"
