"""Durations and lists of numbers in the analyses' own notes and descriptions (the reports and the CLI have their
own units)."""

from __future__ import annotations

from collections.abc import Iterable

#: what `steps`, `plot steps` and the report say of a trace with no steps, read or inferred (iterations.py)
NO_STEPS = ("no ProfilerStep#N spans in this trace, and no repeating structure to infer iterations from "
            "(optimizer steps, DataLoader calls, top-level annotations or module calls)")
#: and what to do about it
STEPS_ADVICE = "profile with a schedule and call prof.step() once per iteration to get per-step figures"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """A count and its noun, singular for one: (1, 'trace') -> '1 trace', (2, 'copy', 'copies') -> '2 copies'.
    Also the HTML templates' filter `plural` (`reports.units` re-exports it)."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


def numbered(noun: str, values: Iterable[int]) -> str:
    """A noun and the numbers it names (`numbers`), plural for several: ('rank', [70]) -> 'rank 70',
    ('rank', [2, 3, 4]) -> 'ranks 2..4'."""
    ordered = sorted(set(values))
    return f"{noun}{'s' if len(ordered) > 1 else ''} {numbers(ordered)}"


def duration(ns: float) -> str:
    """A duration in the unit that reads best: 26.4 ms, 812 µs, 1.2 s, 40 ns."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def numbers(values: Iterable[int]) -> str:
    """Integers (ranks, steps) with each run of consecutive ones as first..last, in order.

        [2, 3, 4, ..., 127]  -> 2..127          [0, 2, 3, 4, 9]  -> 0, 2..4, 9          [1, 2]  -> 1, 2
    """
    ordered = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts += [f"{ordered[i]}..{ordered[j]}"] if j - i >= 2 else [str(v) for v in ordered[i:j + 1]]
        i = j + 1
    return ", ".join(parts)
