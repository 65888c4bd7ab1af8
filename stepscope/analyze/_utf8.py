"""Bytes that are not UTF-8 inside a trace's JSON strings, decoded as ``bytes.decode("utf-8", "replace")`` does.

Some torch builds (CUDA 12.4) write garbage into a name now and then, read from freed memory; the rest of the
trace is sound, so such a string is kept with each maximal invalid subpart replaced by U+FFFD, and counted:

    "torch/utils/_config_module.py(0): \\xc0b\\xa4"  ->  "torch/utils/_config_module.py(0): \\ufffdb\\ufffd"

A byte that is not UTF-8 outside a string is left as it is: the JSON is malformed there, and the parser
refuses it at that byte. ``_scan.c`` does the same in C (tests hold the two to one answer).
"""

from __future__ import annotations

import codecs
import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REPLACEMENT = "\ufffd".encode()
_QUOTE_AFTER_BACKSLASHES = re.compile(rb'\\+"')


@dataclass(frozen=True)
class Repaired:
    """A document with the invalid bytes inside its strings replaced; `strings`: the offset (in the original)
    of the first invalid byte of each string that held any, in order."""

    data: bytes
    strings: list[int]
    _ends: list[int]  # where each replacement ends in `data`
    _shifts: list[int]  # how many bytes longer `data` is than the original from there on

    def original(self, pos: int) -> int:
        """The original offset of `data[pos]` (outside the replacements, exact)."""
        i = bisect_right(self._ends, pos)
        return pos - self._shifts[i - 1] if i else pos


def repair(data: Any) -> Repaired | None:
    """`data` (a JSON document) with every invalid UTF-8 subpart inside a string replaced by U+FFFD; None when
    it is UTF-8 throughout (the usual case, checked at C speed)."""
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    if data.isascii():
        return None
    pieces: list[bytes | memoryview] = []
    strings: list[int] = []
    ends: list[int] = []
    shifts: list[int] = []
    view = memoryview(data)
    done = shift = 0
    for a, b, first_of_string in _runs_in_strings(data, 0, len(data)):
        pieces += [view[done:a], REPLACEMENT]
        shift += len(REPLACEMENT) - (b - a)
        ends.append(b + shift)
        shifts.append(shift)
        done = b
        if first_of_string:
            strings.append(a)
    if not ends:
        return None
    pieces.append(view[done:])
    return Repaired(b"".join(pieces), strings, ends, shifts)


def invalid_strings(data: Any, lo: int, hi: int) -> list[int]:
    """The offset of the first invalid byte of each string of data[lo:hi] that holds one (data[lo] must lie
    outside any string, as the top-level keys around traceEvents do)."""
    region = bytes(data[lo:hi])
    if region.isascii():
        return []
    return [lo + a for a, _, first in _runs_in_strings(region, 0, len(region)) if first]


def _runs_in_strings(data: Any, lo: int, hi: int) -> Iterator[tuple[int, int, bool]]:
    """(start, end, first in its string) of each invalid subpart of data[lo:hi] that lies inside a string.

    Whether a byte is inside a string follows from the unescaped quotes before it (JSON has no backslashes
    outside strings, and a run of them escapes the quote after it when its length is odd)."""
    inside = False
    string = last_counted = -1
    cursor = lo
    for a, b in _invalid_runs(data, lo, hi):
        count, last = _unescaped_quotes(data, cursor, a)
        if count % 2:
            inside = not inside
        if count:
            string = last
        cursor = b
        if inside:
            yield a, b, string != last_counted
            last_counted = string


def _invalid_runs(data: Any, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """The maximal invalid subparts of data[lo:hi], each what the "replace" error handler makes one U+FFFD of.
    Each strict decode stops at the next error, so the whole costs one pass."""
    view = memoryview(data)
    pos = lo
    while pos < hi:
        try:
            codecs.utf_8_decode(view[pos:hi], "strict", True)
            return
        except UnicodeDecodeError as exc:
            yield pos + exc.start, pos + exc.end
            pos += exc.end


def _unescaped_quotes(data: Any, lo: int, hi: int) -> tuple[int, int]:
    """How many unescaped quotes data[lo:hi] holds, and where the last one is (-1: none)."""
    count = data.count(b'"', lo, hi)
    if not count:
        return 0, -1
    escaped = sum(1 for m in _QUOTE_AFTER_BACKSLASHES.finditer(data, lo, hi) if (m.end() - m.start()) % 2 == 0)
    last = data.rfind(b'"', lo, hi)
    while _escaped(data, lo, last):
        last = data.rfind(b'"', lo, last)
    return count - escaped, last


def _escaped(data: Any, lo: int, quote: int) -> bool:
    run = quote
    while run > lo and data[run - 1] == 0x5C:  # backslash
        run -= 1
    return (quote - run) % 2 == 1


def first_invalid(data: Any) -> int | None:
    """The offset of the first byte of `data` that is not UTF-8 (None: it is UTF-8 throughout)."""
    return next((a for a, _ in _invalid_runs(data, 0, len(data))), None)
