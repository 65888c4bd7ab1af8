"""Fuzz target: the restricted unpickler (`_unpickle.PlainUnpickler`), on any bytes.

Each input is a pickle file's bytes. It is interpreted twice, read in pieces of 1 MiB (whole) and of 7 bytes
(every opcode's argument split across reads): both must give the same value or the same error, a
SnapshotFormatError (code refused, truncated, corrupt). Where Python's own unpickler, allowed no globals, also
reads the input, the values must be the same (compared by repr, which shows shared and recursive structure
the same way and tells 1 from True and 0.0 from -0.0).

    python fuzz/fuzz_unpickle.py /tmp/corpus-unpickle fuzz/seeds/unpickle -max_len=4096
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import atheris
from _common import outcome, run

with atheris.instrument_imports(include=["stepscope"]):
    from stepscope.analyze._unpickle import PlainUnpickler
    from stepscope.errors import StepscopeError

_PATH = Path("fuzz.pickle")
_TINY_PIECE = 7


class _NoGlobals(pickle.Unpickler):
    """Python's C unpickler, refusing every global: plain data only, like PlainUnpickler."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def load(data: bytes, piece_bytes: int) -> str:
    """The value PlainUnpickler reads, as its repr."""
    return _shown(PlainUnpickler(io.BytesIO(data), _PATH, piece_bytes=piece_bytes).load())


def _shown(value: Any) -> str:
    try:
        return "value: " + repr(value)
    except RecursionError:  # nested deeper than repr goes: compared no further
        return "value: (too deep to show)"


def _reference(data: bytes) -> str | None:
    """What Python's unpickler reads (from memory, so a corrupt length cannot make it allocate), or None where it
    refuses the input: how it refuses is its own business."""
    try:
        return _shown(_NoGlobals(io.BytesIO(data)).load())
    except Exception:  # noqa: BLE001 - any refusal: the reference has nothing to say about this input
        return None


def test_one_input(data: bytes) -> None:
    whole = outcome(lambda: load(data, 1 << 20), (StepscopeError,))
    tiny = outcome(lambda: load(data, _TINY_PIECE), (StepscopeError,))
    assert whole == tiny, "read whole and in tiny pieces, the pickle reads differently"
    if whole.startswith("value: ") and whole != "value: (too deep to show)":
        reference = _reference(data)
        assert reference is None or reference == whole, "PlainUnpickler and pickle read different values"


if __name__ == "__main__":
    run(test_one_input)
