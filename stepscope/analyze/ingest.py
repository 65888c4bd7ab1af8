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
3. ``_spans``: spans are decoded in file order (with ``jobs`` > 1 on threads that read them in place, or
   without the scanner in worker processes for a large trace); ``_parquet_writer`` appends each one's tables
   to Parquet from a background thread (or in turn: see ingest_trace's spare_core); ``_ingest_meta`` builds
   ``meta.json``, written last. Here: the orchestration; the output directory appears whole or not at all.

``ts_ns`` stays on the trace's own clock; ``baseTimeNanoseconds`` (when present) is kept in meta.json.
Bytes that are not UTF-8 inside strings (some torch builds write garbage into names) are read as U+FFFD and
every event is kept; meta.json counts the strings that held any and gives the first one's byte offset in the
uncompressed JSON (``invalid_utf8``), which `info` and `summary` warn of. Outside a string such a byte is
malformed JSON, refused with its offset.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope._io import atomic_dir
from stepscope.analyze._columns import scanner_available, warm_up, without_added
from stepscope.analyze._ingest_meta import build_meta, encode_meta
from stepscope.analyze._parquet_writer import write_tables
from stepscope.analyze._read import Document, FileMap, json_size, locate_events, read_trace
from stepscope.analyze._spans import Relocated, iter_chunk_tables, span_bytes
from stepscope.analyze._utf8 import invalid_strings
from stepscope.analyze._workers import broken_how, pool_processes, widen_result_pipe, worker_pool
from stepscope.analyze.inputs import is_ingested, trace_id_for
from stepscope.errors import FileChanged, InputError, StepscopeError, TraceFormatError

# Without the compiled scanner, spans are decoded in worker processes, and below this their start costs more
# than it saves.
PARALLEL_MIN_BYTES = 128 * 1024 * 1024

# The most cores one trace's spans are decoded on. The Parquet writer is one thread (pyarrow encodes a file's
# columns in turn): four decoders outrun it, and each decoder beyond them only adds spans waiting for it, up to
# four each (on a 16-core machine a 3.5 GB trace's ingest peaked at 2.5 GiB with 16, 1.4 GiB for a 591 MB one;
# benchmarks/bounded_memory.py). More cores go to more files at once (a batch), not to more spans of one.
MAX_SPAN_JOBS = 4


@dataclass(frozen=True, kw_only=True)
class IngestResult:
    """What `ingest_trace` did: where the tables are and whether the work was skipped (unchanged file)."""

    source: Path
    out_dir: Path
    skipped: bool
    n_events: int
    seconds: float


def ingest_trace(path: Path, out_dir: Path, *, force: bool = False, jobs: int = 1,
                 chunk_bytes: int | None = None, extra_meta: dict[str, Any] | None = None,
                 sha256: str | Future[str] | None = None, spare_core: bool = True,
                 drop_added: bool = False) -> IngestResult:
    """Parse one Chrome trace into out_dir (events.parquet, flows.parquet, meta.json), atomically.

    `jobs` > 1 decodes the spans on that many cores (MAX_SPAN_JOBS at most): this thread and jobs - 1 threads that
    read their spans in place, with the compiled scanner; without it, for a large trace only (>=
    PARALLEL_MIN_BYTES of JSON), this process and jobs - 1 worker processes, which read their spans from the
    file (a gzip trace's JSON is first written to a temporary file beside out_dir). This thread also validates,
    writes Parquet and keeps the order. With `spare_core`, helper threads take work off this one: Parquet is
    written in the background while the next spans are decoded, and reading the file faults its memory in ahead
    and hashes it as it goes (see _read.read_trace). Without it (where every core already runs an ingest of its own, as
    in a batch), all is done in turn, which saves the switching and the work helpers would duplicate.

    `drop_added`: leave out the events `stepscope export` added (`_columns.without_added`), so an exported
    file reads as the trace it was made from; meta.json says so (`added_tracks`).

    Skipped when out_dir already holds this file's ingest (same sha256, same schema version, same
    `drop_added`) unless `force`. `sha256`: the file's, when the caller has just computed it (load() and batch
    ingest key their outputs by it), so it is not computed twice; or, with `force` (nothing to skip), a future
    of it being computed meanwhile (`inputs.hash_meanwhile`), taken before the file is checked for changes and
    meta.json written. Raises TraceFormatError / InputError with a one-line message naming the file.
    """
    if isinstance(sha256, Future) and not force:
        raise ValueError("a sha256 still being computed cannot tell an unchanged file: give force=True")
    started = time.perf_counter()
    path = Path(path)
    out_dir = Path(out_dir)
    jobs = min(jobs, MAX_SPAN_JOBS)
    if not path.exists():
        raise InputError("not found", path=path)
    with ExitStack() as stack:
        pool: Executor | None = None
        pool_ready = None
        if jobs > 1 and scanner_available():  # the scanner releases the GIL: threads decode spans in place
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=jobs - 1, thread_name_prefix="stepscope-span"))
        elif jobs > 1 and json_size(path) >= PARALLEL_MIN_BYTES:
            # the workers start (which takes a while) as this process reads the file
            pool = stack.enter_context(worker_pool(jobs - 1))
            widen_result_pipe(pool)
            # from a thread: the first submit blocks until the fork server has imported stepscope
            pool_ready = threading.Event()
            threading.Thread(target=_warm_up_workers, args=(pool, jobs - 1, pool_ready), daemon=True).start()
        warming = _warm_up_once()
        try:
            spill = out_dir.parent if out_dir.parent.is_dir() else None  # (a large gzip trace is inflated there)
            data, read_sha = read_trace(path, sha256 if isinstance(sha256, str) else None, helpers=spare_core,
                                        spill_dir=spill, hash_file=not isinstance(sha256, Future))
        finally:  # a daemon thread still inside pyarrow's C++ when the interpreter exits aborts the process
            warming.join()
        sha = sha256 if isinstance(sha256, Future) else read_sha
        if not force and is_ingested(out_dir, read_sha, drop_added=drop_added):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            meta = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
            return IngestResult(source=path, out_dir=out_dir, skipped=True, n_events=int(meta["counts"]["events"]),
                                seconds=time.perf_counter() - started)
        try:
            return _ingest(path, out_dir, data, sha, stack, pool=pool, pool_ready=pool_ready, jobs=jobs,
                           chunk_bytes=chunk_bytes, extra_meta=extra_meta or {}, started=started,
                           spare_core=spare_core, drop_added=drop_added)
        except BrokenProcessPool:  # a span worker died (the out-of-memory killer): said once the pool is shut down
            workers = pool_processes(pool) if isinstance(pool, ProcessPoolExecutor) else []
    raise StepscopeError(f"{broken_how(workers, 'a')}, decoding this trace's spans", path=path)


def _ingest(path: Path, out_dir: Path, data: Document, sha: str | Future[str], stack: ExitStack, *,
            pool: Executor | None,
            pool_ready: threading.Event | None, jobs: int, chunk_bytes: int | None, extra_meta: dict[str, Any],
            started: float, spare_core: bool, drop_added: bool) -> IngestResult:
    with atomic_dir(out_dir) as tmp:
        start, end, top, certain = locate_events(data, path)
        chunk_bytes = chunk_bytes or span_bytes(end - start, jobs)
        source = None
        if isinstance(pool, ProcessPoolExecutor):
            source = path if _is_plain(path, data) else stack.enter_context(_spilled(data, tmp.parent))
        while True:
            chunks = iter_chunk_tables(data, start, end, path, chunk_bytes=chunk_bytes, pool=pool,
                                       pool_ready=pool_ready, source=source, jobs=jobs, certain=certain)
            if drop_added:
                chunks = map(without_added, chunks)
            try:
                totals = write_tables(tmp, chunks, spare_core)
                break
            except Relocated as exc:  # a valid document that fooled locate_events: start over, exactly
                start, end, top = exc.start, exc.end, exc.top
                certain = True
        sha = sha if isinstance(sha, str) else sha.result()  # (hashed meanwhile: before the change check below)
        if isinstance(data, FileMap) and data.changed():  # (a mapped file is read as it is now, not as hashed)
            raise FileChanged("the file changed while it was being read (another process wrote to it)", path=path)
        if totals.n_input == 0:
            raise TraceFormatError("empty trace: traceEvents holds no events", path=path)
        if totals.n_events == 0:
            raise TraceFormatError("empty trace: no timed events (only metadata or flow events)", path=path)
        around = invalid_strings(data, 0, start) + invalid_strings(data, end, len(data))  # top-level keys
        totals.add_invalid(len(around), around[0] if around else None)
        meta = build_meta(path=path, sha=sha, trace_id=trace_id_for(path, sha), top=top, totals=totals,
                          extra={**extra_meta, "added_tracks": "dropped" if drop_added else "kept"})
        (tmp / "meta.json").write_bytes(encode_meta(meta))
    return IngestResult(source=path, out_dir=out_dir, skipped=False, n_events=totals.n_events,
                        seconds=time.perf_counter() - started)


def _warm_up() -> None:
    """A no-op task: submitted first, it starts the worker processes while the document is validated."""


def _warm_up_workers(pool: Executor, workers: int, ready: threading.Event) -> None:
    try:
        for _ in range(workers):
            pool.submit(_warm_up)
    except RuntimeError:  # the pool was shut down first (an unchanged file is skipped): nothing to start
        return
    ready.set()


@functools.cache
def _warm_up_once() -> threading.Thread:
    """The decoder's first calls, made once per process in a thread while the first file is read."""
    thread = threading.Thread(target=warm_up, name="stepscope-warm-up", daemon=True)
    thread.start()
    return thread


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
