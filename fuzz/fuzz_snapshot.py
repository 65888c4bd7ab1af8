"""Fuzz target: the streaming snapshot reader (`snapshot_read.read_snapshot`), on any bytes.

Each input is a snapshot pickle's bytes, written to a file and read as `stepscope memory` reads it: by the
streaming reader with its fast path (`_snapshot_walk`'s vectorized walk over device-trace entries), and again
with the fast path off and the file read 5 bytes at a time. Both must give the same tables, or both an
error, a StepscopeError. Where Python's own unpickler (no globals) reads the file, the tables must be those
its plain objects convert to (the reader's oracle in tests/analyze/test_snapshot_stream.py).

    python fuzz/fuzz_snapshot.py /tmp/corpus-snapshot fuzz/seeds/snapshot -max_len=8192
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import atheris
from _common import outcome, plain, run

with atheris.instrument_imports(include=["stepscope"]):
    import polars as pl

    from stepscope.analyze import snapshot_read
    from stepscope.analyze._snapshot_stream import read_traces
    from stepscope.analyze.snapshot_read import SnapshotTables, read_snapshot
    from stepscope.errors import StepscopeError

_FD, _NAME = tempfile.mkstemp(prefix="stepscope-fuzz-", suffix=".pickle")
os.close(_FD)
_FILE = Path(_NAME)
atexit.register(_FILE.unlink, missing_ok=True)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _tables(tables: SnapshotTables) -> Any:
    events = tables.events.with_columns(pl.col("action").cast(pl.String))
    return plain([tables.format, tables.allocator_settings,
                  *({c: f[c].to_list() for c in f.columns} for f in (events, tables.blocks, tables.segments,
                                                                     tables.frames))])


def _read(traces: Callable[..., Any]) -> Any:
    """read_snapshot of the file, with `traces` reading the pickle in place of read_traces."""
    original = snapshot_read.read_traces  # type: ignore[attr-defined]
    snapshot_read.read_traces = traces  # type: ignore[attr-defined]
    try:
        return _tables(read_snapshot(_FILE))
    finally:
        snapshot_read.read_traces = original  # type: ignore[attr-defined]


def _plain_objects(fh: IO[bytes], path: Path, stack_of: Any) -> Any:
    return _NoGlobals(io.BytesIO(fh.read())).load()  # from memory: a corrupt length cannot make it allocate


def test_one_input(data: bytes) -> None:
    _FILE.write_bytes(data)
    fast = outcome(lambda: _tables(read_snapshot(_FILE)), (StepscopeError,))
    general = outcome(lambda: _read(lambda fh, p, stack_of: read_traces(fh, p, stack_of, piece_bytes=5, fast=False)),
                      (StepscopeError,))
    # the same tables, or both an error (not always in the same words: the fast path has turned entries into
    # rows that the general path still holds as dicts, so a corrupt pickle trips over them differently)
    both_errors = isinstance(fast, str) and isinstance(general, str)
    assert both_errors or fast == general, "the fast path (or reading in pieces) changes what the snapshot reads as"
    if not isinstance(fast, str):
        try:
            reference = _read(_plain_objects)
        except Exception:  # noqa: BLE001 - pickle refused it, or the old conversion did: nothing to compare
            return
        assert reference == fast, "the streaming reader and a full unpickle read different tables"


if __name__ == "__main__":
    run(test_one_input)
