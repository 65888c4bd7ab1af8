"""The spans' tables appended to events.parquet and flows.parquet, in turn or from background threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stepscope.analyze._arrow import conform
from stepscope.analyze._columns import ChunkTables
from stepscope.analyze._ingest_meta import Totals
from stepscope.analyze.schema import EVENT_SCHEMA, FLOW_SCHEMA

# Integer columns that grow with the file's order (ids, start times): delta-encoded, each value is stored as
# its small difference from the one before, where plain encoding leaves zstd eight bytes a value to squeeze
# (less time writing Parquet and smaller files).
_DELTA_COLUMNS = frozenset({"event_id", "ts_ns", "correlation", "external_id", "sequence_number",
                            "record_function_id", "ev_idx", "python_id", "python_parent_id"})


def parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A zstd Parquet writer with the encodings and statistics that suit the events and flows tables."""
    # Dictionary-encode only the text columns, whose values repeat (names, kinds, shapes); the raw args
    # text is nearly unique per event and numbers do better plain (faster, and a smaller file).
    text = [f.name for f in schema if pa.types.is_string(f.type)]
    dictionary = [name for name in text if name != "args"]
    delta = {f.name: "DELTA_BINARY_PACKED" for f in schema if f.name in _DELTA_COLUMNS}
    # Statistics (min, max) for the numbers only, which let a reader skip row groups by time, device,
    # stream or id; a span's text ranges over most of its values (kinds, names and args mixed in file
    # order), so its min and max would cost time writing and help no reader.
    numbers = [f.name for f in schema if f.name not in text]
    return pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=dictionary, column_encoding=delta,
                            write_statistics=numbers)


class BackgroundWriter:
    """Appends tables to a Parquet file from a thread: pyarrow releases the GIL while it encodes and
    compresses, so writing chunk N overlaps with decoding chunk N + 1 (on a core that would otherwise
    idle: see ingest_trace's `spare_core`). At most two tables wait."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._writer = parquet_writer(path, schema)
        self._queue: queue.Queue[pa.Table | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"write-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (table := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._writer.write_table(table)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = exc

    def write_table(self, table: pa.Table) -> None:
        """Queue one table (blocks while two are already waiting)."""
        if self._error is not None:
            raise self._error
        self._queue.put(table)

    def close(self) -> None:
        """Flush, close the file and re-raise any write error."""
        self._queue.put(None)
        self._thread.join()
        self._writer.close()
        if self._error is not None:
            raise self._error


def write_tables(tmp: Path, chunks: Iterator[ChunkTables], spare_core: bool) -> Totals:
    """Append every span's tables to tmp/events.parquet and tmp/flows.parquet (new files each call), from
    background threads when `spare_core`; return the spans' totals for meta.json."""
    totals = Totals()

    def open_writer(name: str, schema: pa.Schema) -> BackgroundWriter | pq.ParquetWriter:
        writer = BackgroundWriter(tmp / name, schema) if spare_core else parquet_writer(tmp / name, schema)
        writers.callback(writer.close)
        return writer

    with ExitStack() as writers:  # each writer is closed (its thread ended), whatever fails
        events, flows = open_writer("events.parquet", EVENT_SCHEMA), open_writer("flows.parquet", FLOW_SCHEMA)
        for chunk in chunks:
            events.write_table(conform(chunk.events, EVENT_SCHEMA))
            flows.write_table(chunk.flows)
            totals.add(chunk)
    return totals
