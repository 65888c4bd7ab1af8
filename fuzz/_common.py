"""What the fuzz targets share: the contract every input is held to, and a NaN-aware comparison.

The contract: an input either gives a result or raises a StepscopeError (the one-line error the CLI prints);
any other exception is a finding, as are a crash, a hang (libFuzzer's -timeout) and unbounded memory
(-rss_limit_mb). A target raises AssertionError for a disagreement between two paths that must agree.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import atheris

T = TypeVar("T")


def outcome(read: Callable[[], T], allowed: tuple[type[BaseException], ...]) -> T | str:
    """What `read` gives, or its error as `ExceptionType: message` when it is one of `allowed`; any other
    exception propagates (the fuzzer reports it with its traceback)."""
    try:
        return read()
    except allowed as exc:
        return f"{type(exc).__name__}: {exc}"


def plain(value: Any) -> Any:
    """`value` with every NaN replaced by a marker, so that == compares two results value for value."""
    if isinstance(value, float) and math.isnan(value):
        return "<NaN>"
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def run(test_one_input: Callable[[bytes], None]) -> None:
    """Hand the target to libFuzzer with the command line's options (corpus folders, -runs=N, -max_len=...)."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
