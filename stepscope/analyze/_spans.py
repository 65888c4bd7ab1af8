"""The spans of traceEvents decoded in file order, on one core or several (ingest's scheduler).

The array is cut into spans at event boundaries (``_read.iter_chunks``); each span is decoded into tables by
``_columns``, here, on threads that read it in place, or in worker processes that read it from the file; the
tables come back in file order with file-wide event ids. A cut that fell inside a string is mended by merging
the span with the next ones.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa

from stepscope.analyze._arrow import to_series
from stepscope.analyze._columns import ChunkTables, decode_range, decode_span
from stepscope.analyze._read import Document, iter_chunks, release, split_document
from stepscope.errors import FileChanged, TraceFormatError

# Spans of about a quarter of a core's share of the array (threads stay balanced, the Parquet writer starts
# early), within these bounds (each span costs a few ms of fixed work). The spans in memory at once grow with the
# cores (up to four a core: decoding, decoded and waiting for the writer), so with more cores they are shorter:
# at most 2 x DEFAULT_CHUNK_BYTES / jobs, which holds those spans' memory to what two cores' hold.
MIN_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024

_Outcome: TypeAlias = ChunkTables | None | TraceFormatError  # a span's tables, None for a bad cut, or its error


def span_bytes(array_bytes: int, jobs: int) -> int:
    """How long a span to cut: about four per core, MIN_CHUNK_BYTES to DEFAULT_CHUNK_BYTES (and at most
    2 x DEFAULT_CHUNK_BYTES / jobs)."""
    longest = max(MIN_CHUNK_BYTES, min(DEFAULT_CHUNK_BYTES, 2 * DEFAULT_CHUNK_BYTES // max(jobs, 1)))
    return min(longest, max(MIN_CHUNK_BYTES, array_bytes // (4 * jobs)))


def decode_file_span(source: str, a: int, b: int, path: str) -> ChunkTables | None:
    """Decode the span data[a:b] of traceEvents from the uncompressed JSON file `source` (a worker's job).

    The worker reads its own bytes (one byte either side, the separators, which become the array's
    brackets), so only the span's position crosses between processes, and only its tables come back.
    """
    with open(source, "rb") as fh:
        fh.seek(a - 1)
        document = bytearray(fh.read(b - a + 2))
    if len(document) != b - a + 2:
        raise FileChanged("the file changed while it was being read", path=path)
    document[0], document[-1] = 0x5B, 0x5D
    return decode_span(document, path, a)


class Relocated(Exception):
    """The quick locate_events found the wrong end of traceEvents (a valid document whose last ']' lies in a
    later key's value): the exact span and top-level keys, to start over with."""

    def __init__(self, start: int, end: int, top: dict[str, Any]) -> None:
        super().__init__(start, end)
        self.start, self.end, self.top = start, end, top


def _verify(data: Document, start: int, end: int, path: Path) -> None:
    """After a span failed to decode: raise the document's own error if it is malformed, Relocated if the
    array's span was not (start, end); return when the failure was only a cut inside a string."""
    exact_start, exact_end, top = split_document(data, path)
    if (exact_start, exact_end) != (start, end):
        raise Relocated(exact_start, exact_end, top)


def iter_chunk_tables(data: Document, start: int, end: int, path: Path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      pool: Executor | None = None, pool_ready: threading.Event | None = None,
                      source: Path | None = None, jobs: int = 1, certain: bool = True) -> Iterator[ChunkTables]:
    """Yield the tables of each span of traceEvents in file order.

    With a `pool` of jobs - 1 workers, threads that read their spans from `data` in place (the compiled
    scanner releases the GIL) or, given `source` (the trace's uncompressed JSON file), processes that read
    them from the file, spans go to the workers as _Schedule says. A span whose cut fell inside a string is
    merged with the next one and rebuilt here. A span decoded ahead of its turn keeps its error until its
    turn (it may be merged into the one before, its error void). When the document was not validated whole
    (`certain` False: see _read.locate_events), the first span that fails has it validated first (_verify).
    """
    spans = list(iter_chunks(data, start, end, chunk_bytes))
    release(data, len(data))  # finding the cuts touched a page (a page cache folio: up to 2 MB) at each cut

    def submit(a: int, b: int) -> Future[ChunkTables | None]:
        assert pool is not None
        if source is not None:
            return pool.submit(decode_file_span, str(source), a, b, str(path))
        return pool.submit(decode_range, data, a, b, str(path))

    schedule = _Schedule(data, spans, path, submit, workers=jobs - 1 if pool is not None else 0, jobs=jobs,
                         pool_ready=pool_ready)
    index = i = 0
    while i < len(spans):
        result = schedule.result(i)
        if isinstance(result, FileChanged):  # (not the document's fault: nothing to verify, nor readable)
            raise result
        if not isinstance(result, ChunkTables) and not certain:
            _verify(data, start, end, path)
            certain = True
        if isinstance(result, TraceFormatError):
            raise result
        chunk, following = _whole_span(data, spans, i, result, path)
        schedule.merged(i, following)
        i = following
        yield _shifted(chunk, index)
        index += chunk.n_input
        release(data, spans[i][0] if i < len(spans) else end)  # (a mapped file's pages behind: decoded)


class _Schedule:
    """Where each span is decoded. Spans go to the workers in order, two in flight per worker, once
    `pool_ready` is set (until then this process decodes spans alone rather than wait for the workers to
    start); whenever the next span to yield is not ready, this process decodes the next unassigned one
    itself, or once all are assigned takes back one still queued for a worker (so the last spans are not
    left to one worker in turn). Results wait in order (at most 2 * jobs here), so memory stays bounded.

        workers: span 0, 1, 4 …   this process: span 2, 3 …   yielded: 0, 1, 2, 3, 4 …
    """

    def __init__(self, data: Document, spans: list[tuple[int, int]], path: Path,
                 submit: Callable[[int, int], Future[ChunkTables | None]], *, workers: int, jobs: int,
                 pool_ready: threading.Event | None) -> None:
        self._data, self._spans, self._path, self._submit = data, spans, path, submit
        self._workers, self._jobs, self._pool_ready = workers, jobs, pool_ready
        self._in_flight: dict[int, Future[ChunkTables | None]] = {}
        self._done: dict[int, _Outcome] = {}
        self._assigned = 0  # spans before this one are submitted or decoded

    def result(self, i: int) -> _Outcome:
        """Span i's outcome; while a worker still has it, this process decodes other spans meanwhile."""
        spans, in_flight, done = self._spans, self._in_flight, self._done
        while True:
            if self._pool_ready is None or self._pool_ready.is_set():
                while self._assigned < len(spans) and len(in_flight) < 2 * self._workers:
                    in_flight[self._assigned] = self._submit(*spans[self._assigned])
                    self._assigned += 1
            if i in done:
                return done.pop(i)
            waiting = i in in_flight and not in_flight[i].done()
            if waiting and self._assigned < len(spans) and len(done) < 2 * self._jobs:
                done[self._assigned] = self._here(self._assigned)  # rather than wait, decode a later span here
                self._assigned += 1
            elif waiting and (j := _take_back(in_flight)) is not None:
                done[j] = self._here(j)  # rather than wait, decode a span still queued here
            else:
                self._assigned = max(self._assigned, i + 1)
                return _outcome(in_flight.pop(i)) if i in in_flight else self._here(i)

    def merged(self, i: int, following: int) -> None:
        """Spans i + 1 … following - 1 were merged into span i: their own results are void."""
        for j in range(i + 1, following):
            self._done.pop(j, None)
            if j in self._in_flight:
                self._in_flight.pop(j).cancel()
        self._assigned = max(self._assigned, following)

    def _here(self, j: int) -> _Outcome:
        a, b = self._spans[j]
        try:
            return decode_range(self._data, a, b, str(self._path))
        except TraceFormatError as exc:
            return exc


def _take_back(in_flight: dict[int, Future[ChunkTables | None]]) -> int | None:
    """The latest span submitted that no worker has started, withdrawn from the pool (at the end of the file a
    worker's queue would otherwise hold the last spans while this thread waits), or None."""
    for j in sorted(in_flight, reverse=True):
        if in_flight[j].cancel():
            del in_flight[j]
            return j
    return None


def _outcome(future: Future[ChunkTables | None]) -> _Outcome:
    try:
        return future.result()
    except TraceFormatError as exc:
        return exc


def _whole_span(data: Document, spans: list[tuple[int, int]], i: int, result: ChunkTables | None,
                path: Path) -> tuple[ChunkTables, int]:
    """Span i's tables; when its cut was bad (result None), those of span i merged with the following spans
    until the cut is good. Also the index of the next span not merged in."""
    a = spans[i][0]
    j = i + 1
    while result is None:
        if j >= len(spans):
            raise TraceFormatError("malformed traceEvents array", path=path, offset=a)
        result = decode_range(data, a, spans[j][1], str(path))
        j += 1
    return result, j


def _shifted(chunk: ChunkTables, first_index: int) -> ChunkTables:
    """The chunk with its span-local event ids made file-wide (polars, not pyarrow.compute, which is slow to
    import and with a Python scalar imports pandas when it is installed: see to_series)."""
    if first_index == 0:
        return chunk

    def shift(table: pa.Table) -> pa.Table:
        ids = to_series(table["event_id"]) + first_index
        return table.set_column(0, "event_id", ids.to_arrow())

    return dataclasses.replace(chunk, events=shift(chunk.events), flows=shift(chunk.flows))
