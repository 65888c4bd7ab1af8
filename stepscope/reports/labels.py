"""Figure labels as plain text: trace-derived names cut to fit a bar and escaped for matplotlib.

No matplotlib here: the report's page builders use these (the kernel labels table beside the kernels figure)
in a process that leaves drawing to the figure workers (`_render`) and never imports matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from stepscope.analyze.kernels import KernelsResult

LABEL_CHARS = 48
KERNEL_LABEL_CHARS = 56
_BREAKS = " _:<>,.(/"  # a cut name starts a word after one of these


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
            out[i] = _cut_around(name, max(common_prefix(name, r) for r in rivals), n)
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


def metric_labels(names: Sequence[str]) -> tuple[dict[str, str], str]:
    """Short column labels for metrics that share a long start and end (the CUPTI counters of one trace), and the
    pattern that gives the names back: the shared start (cut after a '_') and end (cut before a '_' or '.') stand
    as '*'.
    Fewer than two names, or names that would be left empty or alike, keep their own.

        smsp__sass_thread_inst_executed_op_dadd_pred_on.sum, …_ffma_pred_on.sum
        -> dadd, ffma; "smsp__sass_thread_inst_executed_op_*_pred_on.sum"
    """
    if len(names) < 2:
        return {n: n for n in names}, ""
    first = min(names)
    start = min(common_prefix(first, n) for n in names)
    end = min(common_prefix(first[::-1], n[::-1]) for n in names)
    start = first.rfind("_", 0, start) + 1  # after the last '_' the names share (0 where none)
    tail = first[len(first) - end:]
    cut = [i for i, c in enumerate(tail) if c in "_."]
    end = end - cut[0] if cut else 0
    short = {n: n[start:len(n) - end] for n in names}
    if not start and not end or any(not v for v in short.values()) or len(set(short.values())) < len(names):
        return {n: n for n in names}, ""
    return short, f"{first[:start]}*{first[len(first) - end:]}"


def common_prefix(a: str, b: str) -> int:
    """How many leading characters a and b share: where they first differ (also `text.cut_texts`')."""
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


def top_kernels(result: KernelsResult, n: int = 12) -> pl.DataFrame:
    """The kernels `figures.kernels_figure` draws (most GPU time first) with the label of each bar: long names
    cut in the middle, distinct (a table beside the figure gives the full names). A leading 'void ' is left
    out."""
    top = result.by_name.sort("total_ns", "name", descending=[True, False]).head(n)
    names = [x.removeprefix("void ") for x in top["name"].to_list()]
    return top.with_columns(label=pl.Series(short_labels(names, KERNEL_LABEL_CHARS), dtype=pl.String))
