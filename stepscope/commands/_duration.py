"""A click type for human durations: 10us, 1.5ms, 2000ns, 1s (a bare number is µs)."""

from __future__ import annotations

import re
from typing import Any

import click

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Parses a duration into integer nanoseconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)?\s*", str(value))
        if not match:
            self.fail(f"{value!r} is not a duration (e.g. 10us, 1.5ms, 2000ns)", param, ctx)
        return int(round(float(match.group(1)) * _UNITS[match.group(2) or "us"]))
