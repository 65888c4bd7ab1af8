"""Reading a trace file: bytes from disk (gzip sniffed), traceEvents located and cut into spans of whole events.

    file --read_trace--> JSON bytes --locate_events--> traceEvents byte span + other top-level keys
                                     --iter_chunks--> spans of ~chunk_bytes, cut between two events

`locate_events` validates only what lies outside traceEvents (the spans are validated as they are decoded);
`split_document` validates the whole document, for its exact error messages and when the quick way cannot
be sure. A cut is made at a ``}, {`` boundary; one that falls inside a string makes a span that fails to
decode, and the caller merges it with the next (see ingest.iter_chunk_tables).
"""

from __future__ import annotations

import ctypes
import functools
import gzip
import hashlib
import mmap
import os
import queue
import re
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias

import msgspec

from stepscope.analyze._native import scan as _scan
from stepscope.analyze._utf8 import first_invalid, repair
from stepscope.errors import InputError, TraceFormatError

_inflate: ModuleType  # ISA-L's inflate: the same bytes as zlib's, in less time
try:
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - isal is a dependency; a Python without it falls back on zlib
    _inflate = zlib
_CORRUPT_GZIP: tuple[type[Exception], ...] = (gzip.BadGzipFile, zlib.error, _inflate.error, OSError)

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
#: msgspec reads nested arrays and objects recursively: deeper than Python's recursion limit is refused
NESTED_TOO_DEEP = "arrays and objects nested too deeply to read (beyond Python's recursion limit)"

class FileMap(mmap.mmap):
    """A file's JSON mapped into memory rather than read (`read_trace`, from MAP_MIN_BYTES): its pages are the
    file's, read in as they are touched, and pages already decoded can be given back (`release`), so a trace
    larger than memory is ingested in a window of it. Private: a write would change this mapping, not the file.

    A user's file may be truncated by another process while it is mapped; a page beyond its new end then faults
    (SIGBUS), which kills a process with no word. `guard` names the file for that case (the compiled scanner's
    `_scan.guard`): a scan of the mapping then fails with a TraceFormatError naming the file, and any other read
    of it ends the process with that one line and status 2. Without the compiled scanner, nothing is guarded."""

    _guard = -1
    _fd = -1
    _seen: tuple[int, int, int] | None = None

    def guard(self, path: Path, fd: int, seen: tuple[int, int, int]) -> None:
        """Guard the mapping (see above), and keep the file open as `fd` with its state `seen` (`_state`, taken
        before it was hashed), so that `changed` can tell whether another process has written to it since."""
        self._fd = os.dup(fd)
        self._seen = seen
        if _scan is not None and hasattr(_scan, "guard"):  # (not built on Windows: no SIGBUS there)
            self._guard = _scan.guard(self, os.fsencode(path))

    def changed(self) -> bool:
        """Whether the mapped file (the same file even where another took its name) was written to since `guard`:
        its bytes read then may not be its bytes read now."""
        return self._seen is not None and _state(self._fd) != self._seen

    def _unguard(self) -> None:
        if self._guard >= 0 and _scan is not None:
            _scan.unguard(self._guard)
            self._guard = -1
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self._unguard()  # (before the address range can be given to another mapping)
        super().close()

    def __del__(self) -> None:
        self._unguard()


#: A trace's JSON in memory: a bytearray, from LARGE_BUFFER_BYTES an anonymous mapping (see _prefaulted), or
#: from MAP_MIN_BYTES the file itself mapped (FileMap)
Document: TypeAlias = bytearray | mmap.mmap

#: From this many bytes of JSON, a trace is mapped (a plain file) or inflated into a file beside the output and
#: mapped (gzip), never held whole in memory: ingest then holds the spans being decoded, not the trace
MAP_MIN_BYTES = 256 << 20


def read_trace(path: Path, sha256: str | None = None, *, helpers: bool = True,
               spill_dir: Path | None = None, hash_file: bool = True) -> tuple[Document, str]:
    """The uncompressed JSON of a trace file (gzip sniffed by its magic bytes) and the sha256 of the file
    as stored, from one read (or `sha256` as given, when the caller has just hashed the file; or "" without
    `hash_file`, where the caller hashes the file meanwhile, though a gzip file inflated into a temporary file
    still comes with its sha256, which costs nothing more there). Writable
    memory, so spans of it can be decoded in place (see iter_chunk_tables). `helpers`: a core is spare for
    helper threads, which fault a large buffer's memory in ahead and hash the file while it is read.

    From MAP_MIN_BYTES of JSON the trace is not read into memory: a plain file is mapped (`FileMap`), and a
    gzip file, given `spill_dir`, is inflated piece by piece into a temporary file there, which is mapped and
    unlinked at once (the mapping keeps its pages until it is closed)."""
    try:
        mapped = _mapped(path, sha256, spill_dir, hash_file)
    except IsADirectoryError:
        raise InputError("is a directory, expected a trace file", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=path) from None
    except EOFError:
        raise TraceFormatError("truncated gzip file (the compressed stream ends early)", path=path) from None
    except _CORRUPT_GZIP as exc:
        raise TraceFormatError(f"corrupt gzip data ({exc})", path=path) from None
    if mapped is not None:
        return mapped
    try:
        with open(path, "rb") as fh, _prefaulted(os.fstat(fh.fileno()).st_size, helpers) as stored:
            got, sha = _read_into(fh, stored, hashing=sha256 is None and hash_file, helpers=helpers)
    except IsADirectoryError:
        raise InputError("is a directory, expected a trace file", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=path) from None
    if got < len(stored):  # the file shrank after its size was taken
        stored = bytearray(memoryview(stored)[:got])
    sha = sha256 or sha
    if stored[:2] != b"\x1f\x8b":
        return stored, sha
    try:
        return _gunzip(stored, helpers), sha
    except EOFError:
        raise TraceFormatError("truncated gzip file (the compressed stream ends early)", path=path) from None
    except _CORRUPT_GZIP as exc:
        raise TraceFormatError(f"corrupt gzip data ({exc})", path=path) from None


def _mapped(path: Path, sha256: str | None, spill_dir: Path | None,
            hash_file: bool = True) -> tuple[FileMap, str] | None:
    """The trace's JSON as a FileMap and the file's sha256 (a plain file's "" without `hash_file`), where it
    holds MAP_MIN_BYTES of JSON or more (a gzip file only with a `spill_dir`); None otherwise (it is read into
    memory)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        gzipped = fh.read(2) == b"\x1f\x8b"
        if not gzipped:
            if size < MAP_MIN_BYTES:
                return None
            fh.seek(0)
            seen = _state(fh.fileno())
            sha = sha256 or (hashlib.file_digest(fh, "sha256").hexdigest() if hash_file else "")
            mapped = FileMap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            mapped.guard(path, fh.fileno(), seen)
            _advise(mapped, "MADV_SEQUENTIAL")
            return mapped, sha
        if spill_dir is None or json_size(path) < MAP_MIN_BYTES:
            return None
        fh.seek(0)
        fd, name = tempfile.mkstemp(prefix=".stepscope-", suffix=".json", dir=spill_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                digest = _inflate_to(fh, out)
                out.flush()
                spilled = FileMap(out.fileno(), 0, access=mmap.ACCESS_COPY) if out.tell() else None
        finally:
            os.unlink(name)  # (the mapping keeps the file's pages: nothing is left behind, whatever happens)
    if spilled is None:  # an empty stream: read as it is (the reader says what is wrong)
        return None
    _advise(spilled, "MADV_SEQUENTIAL")
    return spilled, sha256 or digest


def _inflate_to(fh: Any, out: Any) -> str:
    """Inflate the gzip stream `fh` (every member, then zero padding at most) into the file `out`, a piece at
    a time; the sha256 of the compressed bytes. EOFError when the stream ends early, _inflate.error when it is
    corrupt."""
    hasher = hashlib.sha256()
    decompressor = _inflate.decompressobj(wbits=31)
    while chunk := fh.read(_SPILL_READ):
        hasher.update(chunk)
        data: bytes = chunk
        while data:
            if decompressor.eof:  # a member ended: another follows, or padding
                if not data.strip(b"\x00"):
                    break
                decompressor = _inflate.decompressobj(wbits=31)
            out.write(decompressor.decompress(data, _PIECE))
            data = decompressor.unused_data if decompressor.eof else decompressor.unconsumed_tail
    while not decompressor.eof:  # what the last piece left in the inflater, if it holds the stream's end
        piece = decompressor.decompress(b"", _PIECE)
        if not piece:
            raise EOFError("compressed stream ends early")
        out.write(piece)
    return hasher.hexdigest()


def release(data: Document, end: int) -> None:
    """Give back the pages of a FileMap that lie wholly before `end` (already decoded): they are the file's, so
    they come back as they were if read again. Other documents are left as they are."""
    advice = getattr(mmap, "MADV_DONTNEED", None)  # (where there is none, the pages stay until the end)
    if isinstance(data, FileMap) and advice is not None and end >= mmap.PAGESIZE:
        data.madvise(advice, 0, end - end % mmap.PAGESIZE)


def _state(fd: int) -> tuple[int, int, int]:
    """What changes when a file is written to: its size, modification and change times."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _advise(mapped: FileMap, name: str) -> None:
    """madvise advice by name, where this system has it (a hint: nothing depends on it)."""
    advice = getattr(mmap, name, None)
    if advice is not None:
        try:
            mapped.madvise(advice)
        except OSError:
            pass


_SPILL_READ = 1 << 20


def json_size(path: Path) -> int:
    """About how many bytes of JSON the file holds, without reading it: its size, or for gzip the size its
    trailer states (modulo 4 GiB; at least the compressed size). 0 when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(fh.read(4), "little"))
    except OSError:
        return 0


# Compressed bytes fed to the inflater at a time, and the most it writes per call: small pieces stay in the CPU's
# cache and reuse the same memory (16 MiB ones took fresh pages from the kernel each time), and what zlib
# leaves unconsumed, which it copies on each call, stays small. A quarter less time than 16 MiB steps.
_FEED = 1 << 16
_PIECE = 1 << 18


class _NotAsStated(Exception):
    """The gzip stream is not one member of the size its trailer states (several members, or over 4 GiB)."""


# Pieces a large file is read in: behind the pages being faulted in ahead (see _prefaulted), and each hashed
# in a helper thread while the next is read (reading, hashing and faulting in all release the GIL)
_READ_PIECE = 8 << 20


def _read_into(fh: Any, buffer: Document, *, hashing: bool, helpers: bool) -> tuple[int, str]:
    """Fill `buffer` from the file; the bytes read and, when `hashing`, their sha256 ("" otherwise). With
    `helpers`, a large file is read in pieces, each hashed in a helper thread while the next is read, so the
    hash costs little time of its own."""
    if len(buffer) < 2 * _READ_PIECE or not helpers:
        got: int = fh.readinto(buffer)
        return got, hashlib.sha256(memoryview(buffer)[:got]).hexdigest() if hashing else ""
    hasher = hashlib.sha256() if hashing else None
    pieces: queue.Queue[memoryview | None] = queue.Queue()

    def hash_pieces() -> None:
        assert hasher is not None
        while (piece := pieces.get()) is not None:
            hasher.update(piece)
            piece.release()

    thread = threading.Thread(target=hash_pieces, name="stepscope-sha256") if hasher else None
    if thread:
        thread.start()
    got = 0
    try:
        with memoryview(buffer) as view:
            while got < len(buffer) and (n := fh.readinto(view[got : got + _READ_PIECE])):
                if thread:
                    pieces.put(view[got : got + n])
                got += n
    finally:
        if thread:
            pieces.put(None)
            thread.join()
    return got, hasher.hexdigest() if hasher else ""


def _gunzip(stored: Document, helpers: bool = True) -> Document:
    """Decompress into one preallocated buffer (the gzip trailer states the size; `helpers`: _prefaulted)."""
    expected = int.from_bytes(stored[-4:], "little")
    if not 0 < expected <= 256 * len(stored):  # a truncated file's "trailer" is arbitrary bytes
        return bytearray(gzip.decompress(bytes(stored)))
    with _prefaulted(expected, helpers) as out:
        try:
            _inflate_into(stored, out)
        except _NotAsStated:
            return bytearray(gzip.decompress(bytes(stored)))
    return out


# From this size malloc serves a buffer from fresh pages whatever is done (glibc's largest mmap threshold, which
# the `stepscope` command sets: see stepscope.keep_freed_memory): such a buffer has its pages faulted in ahead by
# a helper thread. A smaller one comes from malloc's heap, whose pages a batch reuses file after file (fresh
# mappings for them cost a batch time, most of it in the kernel).
LARGE_BUFFER_BYTES = 32 << 20
_PREFAULT_MIN = LARGE_BUFFER_BYTES
_PREFAULT_STEP = 2 << 20
_MADV_POPULATE_WRITE = 23  # linux/mman.h (Linux 5.14)


@contextmanager
def _prefaulted(size: int, helpers: bool = True) -> Iterator[Document]:
    """A zeroed buffer of `size` bytes for the caller to fill from the front. A large one is an anonymous
    mapping whose pages a helper thread faults in ahead of the filling (MADV_POPULATE_WRITE, which leaves
    what is written alone), on another core: a fresh page costs microseconds on a virtual machine, and
    a trace's tens of MB are thousands of them; a bytearray would also be zeroed by hand before it is
    filled. Where the advice is unknown (another OS, an older kernel), and without `helpers` (no core to
    spare), the filler faults the pages in itself."""
    if size < _PREFAULT_MIN or os.name != "posix":
        yield bytearray(size)
        return
    # private: anonymous shared memory would be shmem, whose pages cost more to fault in
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (zeroed as first touched)
    if not helpers:
        yield buffer
        return
    stop = threading.Event()
    thread = threading.Thread(target=_populate, args=(buffer, stop), name="stepscope-prefault")
    thread.start()
    try:
        yield buffer
    finally:
        stop.set()
        thread.join()


def _populate(buffer: mmap.mmap, stop: threading.Event) -> None:
    madvise = _madvise()
    if madvise is None:
        return
    anchor = ctypes.c_char.from_buffer(buffer)  # (keeps the mapping alive while its address is used)
    address = ctypes.addressof(anchor)
    for offset in range(0, len(buffer), _PREFAULT_STEP):  # a foreign call releases the GIL
        if stop.is_set() or madvise(address + offset, min(_PREFAULT_STEP, len(buffer) - offset),
                                    _MADV_POPULATE_WRITE) != 0:
            break
    del anchor


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """The C library's madvise, on Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def _inflate_into(stored: Document, out: Document) -> None:
    """Decompress the gzip `stored` into `out`, which must be exactly its size. EOFError when the stream
    ends early, _inflate.error when it is corrupt, _NotAsStated when it is not one member of len(out) bytes."""
    decompressor = _inflate.decompressobj(wbits=31)
    view = memoryview(stored)
    data: bytes | memoryview = view[:_FEED]
    fed = len(data)
    pos = 0
    while not decompressor.eof:
        piece = decompressor.decompress(data, _PIECE)
        if pos + len(piece) > len(out):
            raise _NotAsStated
        out[pos : pos + len(piece)] = piece
        pos += len(piece)
        data = decompressor.unconsumed_tail
        if not data and fed < len(view):
            data = view[fed : fed + _FEED]
            fed += len(data)
        elif not data and not piece:
            raise EOFError("compressed stream ends early")
    if (decompressor.unused_data + view[fed:]).strip(b"\x00") or pos != len(out):
        raise _NotAsStated


def _decode_error(exc: Exception, data: bytes | Document, path: Path, base: int = 0) -> TraceFormatError:
    text = str(exc)
    if isinstance(exc, UnicodeDecodeError):  # (its start is within the string msgspec decoded, not the file)
        return TraceFormatError(f"not UTF-8 text ({exc.reason})", path=path, offset=first_invalid(data))
    if "truncated" in text:
        return TraceFormatError("truncated JSON (the file ends in the middle of the document)",
                                path=path, offset=len(data))
    match = re.search(r"\(byte (\d+)\)", text)
    offset = base + int(match.group(1)) if match else None
    message = re.sub(r"\s*\(byte \d+\)", "", text)
    if offset is not None and offset < len(data) and data[offset] >= 0x80:
        message = f"byte 0x{data[offset]:02x} outside a string, which is not UTF-8 text"
    if bytes(data[:3]) == b"\xef\xbb\xbf":
        return TraceFormatError("the text starts with a UTF-8 byte order mark (bytes ef bb bf), which JSON does "
                                "not allow: remove those 3 bytes (of the decompressed text, in a .gz)", path=path,
                                offset=0)
    first = re.search(rb"\S", data)
    if first is None or data[first.start()] not in b"{[":
        return TraceFormatError("not a JSON trace file (expected a Chrome trace: JSON with traceEvents)",
                                path=path, offset=offset)
    return TraceFormatError(f"malformed JSON: {message}", path=path, offset=offset)


def split_document(data: bytes | Document, path: Path) -> tuple[int, int, dict[str, Any]]:
    """Validate the whole document; return the byte span of the traceEvents array and the other top keys.
    Bytes that are not UTF-8 inside strings are read as U+FFFD (see _utf8)."""
    try:
        return _split_document(data, path)
    except UnicodeDecodeError as exc:  # in a top-level key: read the document with such bytes replaced
        repaired = repair(data)
        if repaired is None:  # pragma: no cover - msgspec raises this only inside a string
            raise _decode_error(exc, data, path) from None
        try:
            start, end, top = _split_document(repaired.data, path)
        except UnicodeDecodeError as again:  # pragma: no cover - as above
            raise _decode_error(again, data, path) from None
        return repaired.original(start), repaired.original(end), top


def _split_document(data: bytes | Document, path: Path) -> tuple[int, int, dict[str, Any]]:
    first = re.search(rb"\S", data)
    if first is None:
        raise TraceFormatError("empty file", path=path)
    try:
        if data[first.start()] == ord("["):  # a bare array of events is a valid Chrome trace too
            msgspec.json.decode(data, type=msgspec.Raw)
            start = first.start()
            end = data.rfind(b"]") + 1  # (find and slices: what bytes, bytearray and mmap all have)
            return start, end, {}
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError as exc:
        raise _decode_error(exc, data, path) from None
    except RecursionError:
        raise TraceFormatError(NESTED_TOO_DEEP, path=path) from None
    except msgspec.ValidationError:
        raise TraceFormatError("not a Chrome trace (the top level is neither an object nor an array)",
                               path=path) from None
    if "traceEvents" not in top:
        keys = ", ".join(sorted(top)[:8]) or "none"
        raise TraceFormatError(f"not a Chrome trace: no traceEvents key (top-level keys: {keys})", path=path)
    span = _locate(data, top.pop("traceEvents"))
    if span is None:
        raise TraceFormatError("traceEvents is not an array", path=path)
    return span[0], span[1], _decoded(top, path)


def _decoded(top: dict[str, msgspec.Raw], path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, value in top.items():
        try:
            try:
                meta[key] = msgspec.json.decode(value)
            except UnicodeDecodeError:  # inside its strings (a Raw value is valid JSON): read as U+FFFD
                meta[key] = msgspec.json.decode(bytes(value).decode("utf-8", "replace"))
        except RecursionError:
            raise TraceFormatError(f"top-level key {key!r}: {NESTED_TOO_DEEP}", path=path) from None
        except msgspec.ValidationError as exc:  # a number beyond a double (1e400), a 4,301-digit integer
            reason = str(exc).split(" - at ")[0]
            raise TraceFormatError(f"unreadable value in top-level key {key!r} ({reason})", path=path) from None
    return meta


_EVENTS_ARRAY = re.compile(rb'"traceEvents"\s*:\s*\[')
_NO_TOP = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


def locate_events(data: bytes | Document, path: Path) -> tuple[int, int, dict[str, Any], bool]:
    """split_document without reading through traceEvents (a large part of a large trace's ingest): the span of
    the array and the other top-level keys, and whether the span is certain.

    The text before the first ``"traceEvents": [`` must read as the head of an object, and the text after
    the last ``]`` as its tail:

        {"schemaVersion": 1, "traceEvents": [ ...events... ], "traceName": "x.json"}
        head: {"schemaVersion": 1, "traceEvents":0}        tail: {"traceEvents":0, "traceName": "x.json"}

    A valid head proves where the array starts. Its end is the earliest ``]`` near the end of the file (see
    _array_end) whose tail reads: later keys may hold lists (newer Kineto writes ``"INFO": [...]`` and
    ``"deviceProperties": [...]`` after the events). That is a good guess, not a proof (a string could fake
    it), so the span is uncertain: a span that fails to decode is checked against split_document
    (ingest.iter_chunk_tables). Anything unusual (a bare array, a truncated file, an error) goes to
    split_document, which also gives the exact error message.
    """
    first = re.search(rb"\S", data)
    if first is None or data[first.start()] != ord("{") or (match := _EVENTS_ARRAY.search(data)) is None:
        return (*split_document(data, path), True)
    start = match.end() - 1
    found = _array_end(data, start)
    if found is None:  # truncated, or a tail too long to search
        return (*split_document(data, path), True)
    end, tail = found
    try:
        head = msgspec.json.decode(bytes(data[first.start() : match.start()]) + b'"traceEvents":0}',
                                   type=dict[str, msgspec.Raw])
    except _NO_TOP:
        return (*split_document(data, path), True)
    del head["traceEvents"]
    return start, end, _decoded({**head, **tail}, path), False


# How far from the end of the file the end of traceEvents is looked for: the keys Kineto writes after the
# events (INFO log lines, deviceProperties, traceName, ...) take a few KB.
_TAIL_WINDOW = 64 * 1024


def _array_end(data: bytes | Document, start: int) -> tuple[int, dict[str, msgspec.Raw]] | None:
    """Where the traceEvents array that opens at `start` ends (just past its ``]``), and the top-level keys
    after it: the earliest ``]`` in the last _TAIL_WINDOW bytes that follows ``}`` or ``[`` (an event, or
    an empty array) and after which the text reads as the rest of the top-level object, with no second
    traceEvents key. A ``]`` inside the events cannot be followed by such text; a later key's list can, but
    lies after the true end."""
    found = None
    pos = len(data)
    lowest = max(start, len(data) - _TAIL_WINDOW)
    while (pos := data.rfind(b"]", lowest, pos)) > start:
        before = pos - 1
        while data[before] in b" \t\r\n":
            before -= 1
        if data[before] not in b"}[":
            continue
        try:
            tail = msgspec.json.decode(b'{"traceEvents":0' + bytes(data[pos + 1 :]), type=dict[str, msgspec.Raw])
        except _NO_TOP:
            continue
        if bytes(tail.pop("traceEvents")) == b"0":  # else a second traceEvents key: the last one counts
            found = pos + 1, tail
    return found


def _locate(data: bytes | Document, raw: msgspec.Raw) -> tuple[int, int] | None:
    """Byte span of a Raw value inside `data` (Raw keeps no offset: find the key, check both ends)."""
    view = memoryview(raw)
    size = len(view)
    if not size or view[0] != ord("["):
        return None
    head, tail = bytes(view[:4096]), bytes(view[-4096:])
    for match in re.finditer(rb'"traceEvents"\s*:\s*', data):
        start = match.end()
        if data[start : start + len(head)] == head and data[start + size - len(tail) : start + size] == tail:
            return start, start + size
    return None  # pragma: no cover - the key is always there when decode found it


def iter_chunks(data: bytes | Document, start: int, end: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Cut the array data[start:end] ('[' ... ']') into spans of whole events, about chunk_bytes each."""
    body_start = start + 1
    body_end = data.rfind(b"]", start, end)
    pos = body_start
    while pos < body_end:
        target = pos + chunk_bytes
        if target >= body_end:
            yield pos, body_end
            return
        match = _BOUNDARY.search(data, target, body_end)
        if match is None:
            yield pos, body_end
            return
        cut = match.start() + 1  # just after the closing brace
        yield pos, cut
        pos = match.end() - 1  # at the next opening brace
