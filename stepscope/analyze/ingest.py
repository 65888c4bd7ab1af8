"""Chrome trace -> normalized Parquet (`events.parquet`, `flows.parquet`, `meta.json`), once.

How a trace is read, fast and in bounded memory:

1. ``_read``: the file is read whole (gzip is sniffed by its magic bytes, not its name); the top-level keys
   around ``traceEvents`` are decoded and validated, and the array is cut into spans of about
   ``chunk_bytes`` at event boundaries. The array itself is validated as its spans are decoded: the first
   span that fails has the whole document validated (a truncated or malformed file is reported with its
   byte offset, as msgspec finds it) before it is taken for a cut inside a string.
2. ``_columns``: each span is read into columns by the compiled scanner (``_scan.c``), or where it cannot
   be sure, decoded into small Structs and built in bulk (the time rule and the coercion of args values are
   documented there; both paths give the same tables).
3. Here: spans are decoded in file order (with ``jobs`` > 1 on threads that read them in place, or without
   the scanner in worker processes for a large trace), each one's tables appended to Parquet from a
   background thread (or in turn: see ingest_trace's spare_core), and ``meta.json`` written last; the output
   directory appears whole or not at all.

``ts_ns`` stays on the trace's own clock; ``baseTimeNanoseconds`` (when present) is kept in meta.json.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import queue
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from stepscope._io import atomic_dir
from stepscope.analyze._columns import (
    ChunkTables,
    conform,
    decode_range,
    decode_span,
    scanner_available,
    to_series,
    warm_up,
)
from stepscope.analyze._read import (
    LARGE_BUFFER_BYTES,
    Document,
    iter_chunks,
    json_size,
    locate_events,
    read_trace,
    split_document,
)
from stepscope.analyze._workers import widen_result_pipe, worker_context
from stepscope.analyze.schema import EVENT_SCHEMA, FLOW_SCHEMA, INGEST_SCHEMA_VERSION
from stepscope.errors import InputError, TraceFormatError

# Spans of about a quarter of a core's share of the array (threads stay balanced, the Parquet writer starts
# early), within these bounds (each span costs a few ms of fixed work).
MIN_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
# Without the compiled scanner, spans are decoded in worker processes, and below this their start costs more
# than it saves (54 MB: 1.5 s alone, 2.0 s on 2 cores; 608 MB: 13.2 s alone, 10.5 s on 2 cores).
PARALLEL_MIN_BYTES = 128 * 1024 * 1024
TRACE_SUFFIXES = (".json", ".json.gz")


# Integer columns that grow with the file's order (ids, start times): delta-encoded, each value is stored as
# its small difference from the one before, where plain encoding leaves zstd eight bytes a value to squeeze.
# The 54 MB and 607 MB traces: 8-16% less time writing Parquet, 20% smaller files (the corpus 16%).
_DELTA_COLUMNS = frozenset({"event_id", "ts_ns", "correlation", "external_id", "sequence_number",
                            "record_function_id", "ev_idx", "python_id", "python_parent_id"})


def _parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    # Dictionary-encode only the text columns, whose values repeat (names, kinds, shapes); the raw args
    # text is nearly unique per event and numbers do better plain: 25% less time, a third smaller file.
    text = [f.name for f in schema if pa.types.is_string(f.type)]
    dictionary = [name for name in text if name != "args"]
    delta = {f.name: "DELTA_BINARY_PACKED" for f in schema if f.name in _DELTA_COLUMNS}
    # Statistics (min, max) for the numbers only, which let a reader skip row groups by time, device,
    # stream or id; a span's text ranges over most of its values (kinds, names and args mixed in file
    # order), and its min and max were a tenth of the time writing events.parquet.
    numbers = [f.name for f in schema if f.name not in text]
    return pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=dictionary, column_encoding=delta,
                            write_statistics=numbers)


class _BackgroundWriter:
    """Appends tables to a Parquet file from a thread: pyarrow releases the GIL while it encodes and
    compresses, so writing chunk N overlaps with decoding chunk N + 1 (on a core that would otherwise
    idle: see ingest_trace's `spare_core`). At most two tables wait."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._writer = _parquet_writer(path, schema)
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


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    """What `ingest_trace` did: where the tables are and whether the work was skipped (unchanged file)."""

    source: Path
    out_dir: Path
    skipped: bool
    n_events: int
    seconds: float


def decode_file_span(source: str, a: int, b: int, path: str) -> ChunkTables | None:
    """Decode the span data[a:b] of traceEvents from the uncompressed JSON file `source` (a worker's job).

    The worker reads its own bytes (one byte either side, the separators, which become the array's
    brackets), so only the span's position crosses between processes, and only its tables come back.
    """
    with open(source, "rb") as fh:
        fh.seek(a - 1)
        document = bytearray(fh.read(b - a + 2))
    if len(document) != b - a + 2:
        raise TraceFormatError("the file changed while it was being read", path=path)
    document[0], document[-1] = 0x5B, 0x5D
    return decode_span(document, path, a)


def _warm_up() -> None:
    """A no-op task: submitted first, it starts the worker processes while the document is validated."""


def _warm_up_workers(pool: Executor, workers: int, ready: threading.Event) -> None:
    try:
        for _ in range(workers):
            pool.submit(_warm_up)
    except RuntimeError:  # the pool was shut down first (an unchanged file is skipped): nothing to start
        return
    ready.set()


def _shifted(chunk: ChunkTables, first_index: int) -> ChunkTables:
    """The chunk with its span-local event ids made file-wide (polars, not pyarrow.compute, which costs
    30-50 ms to import and with a Python scalar imports pandas when it is installed: see to_series)."""
    if first_index == 0:
        return chunk

    def shift(table: pa.Table) -> pa.Table:
        ids = to_series(table["event_id"]) + first_index
        return table.set_column(0, "event_id", ids.to_arrow())

    return dataclasses.replace(chunk, events=shift(chunk.events), flows=shift(chunk.flows))


class _Relocated(Exception):
    """The quick locate_events found the wrong end of traceEvents (a valid document whose last ']' lies in a
    later key's value): the exact span and top-level keys, to start over with."""

    def __init__(self, start: int, end: int, top: dict[str, Any]) -> None:
        super().__init__(start, end)
        self.start, self.end, self.top = start, end, top


def _verify(data: Document, start: int, end: int, path: Path) -> None:
    """After a span failed to decode: raise the document's own error if it is malformed, _Relocated if the
    array's span was not (start, end); return when the failure was only a cut inside a string."""
    exact_start, exact_end, top = split_document(data, path)
    if (exact_start, exact_end) != (start, end):
        raise _Relocated(exact_start, exact_end, top)


def span_bytes(array_bytes: int, jobs: int) -> int:
    """How long a span to cut: about four per core, MIN_CHUNK_BYTES to DEFAULT_CHUNK_BYTES."""
    return min(DEFAULT_CHUNK_BYTES, max(MIN_CHUNK_BYTES, array_bytes // (4 * jobs)))


# glibc's mallopt parameters (malloc.h) and the values ingest sets
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3
TOP_PAD_BYTES = 64 * 1024 * 1024
MMAP_THRESHOLD_BYTES = LARGE_BUFFER_BYTES  # glibc's largest; where its own moving threshold would stop


@functools.cache
def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep up to TOP_PAD_BYTES of freed memory at the top of its heap rather than hand
    it back to the kernel at once (M_TOP_PAD), and to serve blocks of up to MMAP_THRESHOLD_BYTES from that
    heap (M_MMAP_THRESHOLD, which setting either stops malloc from moving by itself).

    Ingest frees and allocates buffers of megabytes for every span and every file; with glibc's defaults
    many rounds get fresh pages from the kernel, and a page fault is dear on a virtual machine. In paired
    runs on this project's VM: the corpus batch 4-6% faster on one core with a third less system time, the
    607 MB trace 4% faster at the same peak RSS. Process-wide, once; where the C library is not glibc,
    nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no C library to load by name, or no mallopt in it
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(_M_TOP_PAD, TOP_PAD_BYTES)


@functools.cache
def _warm_up_once() -> threading.Thread:
    """The decoder's first calls, made once per process in a thread while the first file is read."""
    thread = threading.Thread(target=warm_up, name="stepscope-warm-up", daemon=True)
    thread.start()
    return thread


def iter_chunk_tables(data: Document, start: int, end: int, path: Path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                      pool: Executor | None = None, pool_ready: threading.Event | None = None,
                      source: Path | None = None, jobs: int = 1, certain: bool = True) -> Iterator[ChunkTables]:
    """Yield the tables of each span of traceEvents in file order.

    With a `pool` of jobs - 1 workers, threads that read their spans from `data` in place (the compiled
    scanner releases the GIL) or, given `source` (the trace's uncompressed JSON file), processes that read
    them from the file, spans go to the workers in order, two in flight per worker, once `pool_ready` is set
    (until then this process decodes spans alone rather than wait for the workers to start), and whenever the
    next span to yield is not ready this process decodes the next unassigned one itself, or once all are
    assigned takes back one still queued for a worker (so the last spans are not left to one worker in
    turn); results wait in order, so memory stays bounded. A span whose cut fell inside a string is merged
    with the next one and rebuilt here. A span decoded ahead of its turn keeps its error until its turn (it
    may be merged into the one before, its error void). When the document was not validated whole
    (`certain` False: see _read.locate_events), the first span that fails has it validated first (_verify).

        workers: span 0, 1, 4 …   this process: span 2, 3 …   yielded: 0, 1, 2, 3, 4 …
    """
    spans = list(iter_chunks(data, start, end, chunk_bytes))
    workers = jobs - 1 if pool is not None else 0

    def submit(a: int, b: int) -> Future[ChunkTables | None]:
        assert pool is not None
        if source is not None:
            return pool.submit(decode_file_span, str(source), a, b, str(path))
        return pool.submit(decode_range, data, a, b, str(path))

    in_flight: dict[int, Future[ChunkTables | None]] = {}
    done: dict[int, _Outcome] = {}
    assigned = index = i = 0
    while i < len(spans):
        ready = pool_ready is None or pool_ready.is_set()
        while ready and assigned < len(spans) and len(in_flight) < 2 * workers:
            a, b = spans[assigned]
            in_flight[assigned] = submit(a, b)
            assigned += 1
        if (i not in done and i in in_flight and not in_flight[i].done() and assigned < len(spans)
                and len(done) < 2 * jobs):
            a, b = spans[assigned]  # rather than wait, decode a later span here
            done[assigned] = _decoded_here(data, a, b, path)
            assigned += 1
            continue
        if i not in done and i in in_flight and not in_flight[i].done() and (j := _take_back(in_flight)) is not None:
            done[j] = _decoded_here(data, *spans[j], path)  # rather than wait, decode a span still queued here
            continue
        if i not in done:
            done[i] = _outcome(in_flight.pop(i)) if i in in_flight else _decoded_here(data, *spans[i], path)
            assigned = max(assigned, i + 1)
        result = done.pop(i)
        if not isinstance(result, ChunkTables) and not certain:
            _verify(data, start, end, path)
            certain = True
        if isinstance(result, TraceFormatError):
            raise result
        chunk, following = _whole_span(data, spans, i, result, path)
        for j in range(i + 1, following):  # merged into span i: their own results are void
            done.pop(j, None)
            if j in in_flight:
                in_flight.pop(j).cancel()
        i = following
        assigned = max(assigned, i)
        yield _shifted(chunk, index)
        index += chunk.n_input


_Outcome: TypeAlias = ChunkTables | None | TraceFormatError  # a span's tables, None for a bad cut, or its error


def _take_back(in_flight: dict[int, Future[ChunkTables | None]]) -> int | None:
    """The latest span submitted that no worker has started, withdrawn from the pool (at the end of the file a
    worker's queue would otherwise hold the last spans while this thread waits), or None."""
    for j in sorted(in_flight, reverse=True):
        if in_flight[j].cancel():
            del in_flight[j]
            return j
    return None


def _decoded_here(data: Document, a: int, b: int, path: Path) -> _Outcome:
    try:
        return decode_range(data, a, b, str(path))
    except TraceFormatError as exc:
        return exc


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


def _is_plain(path: Path, data: Document) -> bool:
    """Whether the file on disk is the JSON itself (not gzip), so workers can read their spans from it."""
    return path.stat().st_size == len(data) and data[:2] != b"\x1f\x8b"


@contextmanager
def _spilled(data: Document, directory: Path) -> Iterator[Path]:
    """The uncompressed JSON of a gzip trace written to a temporary file for the workers, removed after."""
    fd, name = tempfile.mkstemp(prefix=".stepscope-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------- metadata

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_OPTION_KEYS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
_VERSION_KEYS = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
                 "hip_driver_version", "roctracer_version", "torch_version")


def _device_properties(top: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for d in top.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        major, minor = d.get("computeMajor"), d.get("computeMinor")
        out.append({
            "id": d.get("id"),
            "name": d.get("name"),
            "total_memory_bytes": d.get("totalGlobalMem"),
            "num_sms": d.get("numSms"),
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "properties": d,
        })
    return out


def _rank(top: dict[str, Any], path: Path) -> tuple[int | None, int | None, str | None]:
    info = top.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        if isinstance(rank, int):
            return rank, world if isinstance(world, int) else None, "distributedInfo"
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), None, "file name"
    return None, None, None


def _jsonable(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))


def trace_id_for(path: Path, sha256: str) -> str:
    """A stable, readable id: the file's stem (without .pt.trace.json.gz) plus 8 hex digits of its hash."""
    stem = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "trace"
    return f"{stem}-{sha256[:8]}"


def file_sha256(path: Path) -> str:
    """sha256 of the file as stored (compressed bytes for .gz)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# ----------------------------------------------------------------------------------------------- ingest


def is_ingested(out_dir: Path, sha256: str | None = None) -> bool:
    """Whether out_dir holds a complete ingest of the current schema (of the file with this hash, if given)."""
    meta_path = out_dir / "meta.json"
    if not (meta_path.is_file() and (out_dir / "events.parquet").is_file() and (out_dir / "flows.parquet").is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("ingest_schema_version") != INGEST_SCHEMA_VERSION:
        return False
    return sha256 is None or meta.get("source", {}).get("sha256") == sha256


def ingest_trace(path: Path, out_dir: Path, *, force: bool = False, jobs: int = 1,
                 chunk_bytes: int | None = None, extra_meta: dict[str, Any] | None = None,
                 sha256: str | None = None, spare_core: bool = True) -> IngestResult:
    """Parse one Chrome trace into out_dir (events.parquet, flows.parquet, meta.json), atomically.

    `jobs` > 1 decodes the spans on that many cores: this thread and jobs - 1 threads that read their spans
    in place, with the compiled scanner; without it, for a large trace only (>= PARALLEL_MIN_BYTES of JSON),
    this process and jobs - 1 worker processes, which read their spans from the file (a gzip trace's JSON is
    first written to a temporary file beside out_dir). This thread also validates, writes Parquet and keeps
    the order. With `spare_core`, helper threads take work off this one: Parquet is written in the
    background while the next spans are decoded, and reading the file faults its memory in ahead and hashes
    it as it goes (see _read.read_trace). Without it (where every core already runs an ingest of its own, as
    in a batch), all is done in turn, which saves the switching and the work helpers would duplicate.

    Skipped when out_dir already holds this file's ingest (same sha256, same schema version) unless
    `force`. `sha256`: the file's, when the caller has just computed it (load() and batch ingest key their
    outputs by it), so it is not computed twice. Raises TraceFormatError / InputError with a one-line
    message naming the file.
    """
    started = time.perf_counter()
    path = Path(path)
    out_dir = Path(out_dir)
    if not path.exists():
        raise InputError("not found", path=path)
    with ExitStack() as stack:
        pool: Executor | None = None
        pool_ready = None
        if jobs > 1 and scanner_available():  # the scanner releases the GIL: threads decode spans in place
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=jobs - 1, thread_name_prefix="stepscope-span"))
        elif jobs > 1 and json_size(path) >= PARALLEL_MIN_BYTES:
            # the workers start (about half a second) while this process reads the file
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs - 1, mp_context=worker_context()))
            widen_result_pipe(pool)
            # from a thread: the first submit blocks until the fork server has imported stepscope
            pool_ready = threading.Event()
            threading.Thread(target=_warm_up_workers, args=(pool, jobs - 1, pool_ready), daemon=True).start()
        keep_freed_memory()
        warming = _warm_up_once()
        try:
            data, sha = read_trace(path, sha256, helpers=spare_core)
        finally:  # a daemon thread still inside pyarrow's C++ when the interpreter exits aborts the process
            warming.join()
        if not force and is_ingested(out_dir, sha):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
            return IngestResult(source=path, out_dir=out_dir, skipped=True, n_events=int(meta["counts"]["events"]),
                                seconds=time.perf_counter() - started)
        return _ingest(path, out_dir, data, sha, stack, pool=pool, pool_ready=pool_ready, jobs=jobs,
                       chunk_bytes=chunk_bytes, extra_meta=extra_meta or {}, started=started,
                       spare_core=spare_core)


def _ingest(path: Path, out_dir: Path, data: Document, sha: str, stack: ExitStack, *, pool: Executor | None,
            pool_ready: threading.Event | None, jobs: int, chunk_bytes: int | None, extra_meta: dict[str, Any],
            started: float, spare_core: bool) -> IngestResult:
    with atomic_dir(out_dir) as tmp:
        start, end, top, certain = locate_events(data, path)
        chunk_bytes = chunk_bytes or span_bytes(end - start, jobs)
        source = None
        if isinstance(pool, ProcessPoolExecutor):
            source = path if _is_plain(path, data) else stack.enter_context(_spilled(data, tmp.parent))
        while True:
            chunks = iter_chunk_tables(data, start, end, path, chunk_bytes=chunk_bytes, pool=pool,
                                       pool_ready=pool_ready, source=source, jobs=jobs, certain=certain)
            try:
                totals = _write_tables(tmp, chunks, spare_core)
                break
            except _Relocated as exc:  # a valid document that fooled locate_events: start over, exactly
                start, end, top = exc.start, exc.end, exc.top
                certain = True
        if totals.n_input == 0:
            raise TraceFormatError("empty trace: traceEvents holds no events", path=path)
        if totals.n_events == 0:
            raise TraceFormatError("empty trace: no timed events (only metadata or flow events)", path=path)
        meta = _build_meta(path=path, sha=sha, top=top, totals=totals, extra=extra_meta)
        # (json.dumps with an indent takes its pure-Python encoder: up to 5 ms for a large meta, msgspec 0.4 ms)
        (tmp / "meta.json").write_bytes(msgspec.json.format(msgspec.json.encode(meta, enc_hook=str), indent=1))
    return IngestResult(source=path, out_dir=out_dir, skipped=False, n_events=totals.n_events,
                        seconds=time.perf_counter() - started)


@dataclass
class _Totals:
    """What meta.json says about all the spans together."""

    n_input: int = 0
    n_events: int = 0
    n_flows: int = 0
    kind_counts: Counter[str] = field(default_factory=Counter)
    metadata_events: list[dict[str, Any]] = field(default_factory=list)
    ts_min: int | None = None
    end_max: int | None = None
    unknown_categories: Counter[str] = field(default_factory=Counter)

    def add(self, chunk: ChunkTables) -> None:
        self.n_input += chunk.n_input
        self.n_events += chunk.events.num_rows
        self.n_flows += chunk.flows.num_rows
        self.kind_counts.update(chunk.kind_counts)
        self.metadata_events.extend(chunk.metadata)
        if chunk.ts_min_ns is not None:
            self.ts_min = chunk.ts_min_ns if self.ts_min is None else min(self.ts_min, chunk.ts_min_ns)
        if chunk.end_max_ns is not None:
            self.end_max = chunk.end_max_ns if self.end_max is None else max(self.end_max, chunk.end_max_ns)
        self.unknown_categories.update(chunk.unknown_categories)


def _write_tables(tmp: Path, chunks: Iterator[ChunkTables], spare_core: bool) -> _Totals:
    """Append every span's tables to tmp/events.parquet and tmp/flows.parquet (new files each call), from
    background threads when `spare_core`."""
    totals = _Totals()

    def open_writer(name: str, schema: pa.Schema) -> _BackgroundWriter | pq.ParquetWriter:
        writer = _BackgroundWriter(tmp / name, schema) if spare_core else _parquet_writer(tmp / name, schema)
        writers.callback(writer.close)
        return writer

    with ExitStack() as writers:  # each writer is closed (its thread ended), whatever fails
        events, flows = open_writer("events.parquet", EVENT_SCHEMA), open_writer("flows.parquet", FLOW_SCHEMA)
        for chunk in chunks:
            events.write_table(conform(chunk.events, EVENT_SCHEMA))
            flows.write_table(chunk.flows)
            totals.add(chunk)
    return totals


_KNOWN_CATEGORIES = {"Trace", "overhead", "cpu_instant_event", "cuda_profiler_range"}


def _build_meta(*, path: Path, sha: str, top: dict[str, Any], totals: _Totals, extra: dict[str, Any]) -> dict[str, Any]:
    processes: dict[str, dict[str, Any]] = {}
    threads: dict[str, dict[str, Any]] = {}
    for m in totals.metadata_events:
        pid = str(m.get("pid"))
        raw_args = m.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        name = m.get("name")
        if name == "process_name":
            processes.setdefault(pid, {})["name"] = args.get("name")
        elif name == "process_labels":
            processes.setdefault(pid, {})["labels"] = args.get("labels")
        elif name == "process_sort_index":
            processes.setdefault(pid, {})["sort_index"] = args.get("sort_index")
        elif name == "thread_name":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["name"] = args.get("name")
        elif name == "thread_sort_index":
            threads.setdefault(f"{pid}/{m.get('tid')}", {})["sort_index"] = args.get("sort_index")
    rank, world_size, rank_source = _rank(top, path)
    base_time = top.get("baseTimeNanoseconds")
    return {
        "ingest_schema_version": INGEST_SCHEMA_VERSION,
        "trace_id": trace_id_for(path, sha),
        "source": {"path": str(path.resolve()), "name": path.name, "size_bytes": path.stat().st_size,
                   "sha256": sha, "mtime": path.stat().st_mtime},
        "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trace_schema_version": top.get("schemaVersion"),
        "trace_name": top.get("traceName"),
        "display_time_unit": top.get("displayTimeUnit"),
        "base_time_ns": base_time if isinstance(base_time, int) else None,
        "rank": rank,
        "world_size": world_size,
        "rank_source": rank_source,
        "distributed": _jsonable(top.get("distributedInfo")),
        "devices": _jsonable(_device_properties(top)),
        "versions": {k: top[k] for k in _VERSION_KEYS if k in top},
        "profiler_options": {k: top[k] for k in _OPTION_KEYS if k in top},
        "counts": {"events": totals.n_events, "flows": totals.n_flows, "metadata_events": len(totals.metadata_events),
                   "by_kind": dict(sorted(totals.kind_counts.items()))},
        "time": {"first_ns": totals.ts_min, "last_ns": totals.end_max,
                 "span_ns": (totals.end_max - totals.ts_min)
                 if totals.ts_min is not None and totals.end_max is not None else None},
        "unknown_categories": {k: v for k, v in sorted(totals.unknown_categories.items())
                               if k not in _KNOWN_CATEGORIES},
        "processes": processes,
        "threads": threads,
        "top_level": _jsonable({k: v for k, v in top.items() if k not in ("deviceProperties",)}),
        **extra,
    }


def find_trace_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into trace files (.json / .json.gz), sorted."""
    found: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.is_file() and _looks_like_trace(q)))
        elif p.exists():
            found.append(p)
        else:
            matches = sorted(Path().glob(str(p))) if not p.is_absolute() else sorted(
                Path(p.anchor).glob(str(p.relative_to(p.anchor))))
            if not matches:
                raise InputError("no such file, directory or glob match", path=p)
            found.extend(m for m in matches if m.is_file())
    seen: set[Path] = set()
    unique = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _looks_like_trace(p: Path) -> bool:
    name = p.name
    if name.startswith(("manifest", ".")) or name == "meta.json":  # capture manifests (manifest.rank<N>.json too)
        return False
    if ".raw.json" in name or "memory_timeline" in name:
        return False
    return name.endswith(TRACE_SUFFIXES)
