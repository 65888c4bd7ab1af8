"""Reading a trace file's bytes: gunzip into one preallocated buffer, whatever the stream's shape."""

from __future__ import annotations

import gzip
import hashlib
import mmap
import random
import threading
import zlib
from pathlib import Path

import pytest

from stepscope.analyze import _read
from stepscope.analyze._read import _CORRUPT_GZIP, _gunzip, read_trace


@pytest.fixture(autouse=True, params=["isal", "zlib"])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test with ISA-L's inflate (the dependency) and with zlib's (where isal is not installed)."""
    if request.param == "zlib":
        monkeypatch.setattr(_read, "_inflate", zlib)
    else:
        isal_zlib = pytest.importorskip("isal.isal_zlib")
        assert _read._inflate is isal_zlib  # the faster one is what stepscope uses


def _text(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    words = [b'{"ph": "X", "name": "aten::mm", "ts": ', b"1234.5", b', "args": {"External id": ', b"}},\n"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + str(rng.randrange(10**9)).encode()
    return bytes(out[:n])


@pytest.mark.parametrize("raw", [
    _text(3_000_000),  # many compressed pieces fed, many written
    b"x" * 5_000_000,  # compresses 1000-fold: one piece fed yields many written
    b"{}",
], ids=["text", "repetitive", "tiny"])
def test_gunzip_gives_what_gzip_gives(raw: bytes) -> None:
    assert bytes(_gunzip(bytearray(gzip.compress(raw)))) == raw


def test_read_trace_gives_the_file_and_its_sha256_whatever_its_size(tmp_path: Path) -> None:
    # GIVEN files below and above the size read in pieces (each hashed while the next is read)
    for size in (1000, 2 * _read._READ_PIECE + 12345):
        raw = _text(size, size)
        path = tmp_path / f"{size}.json"
        path.write_bytes(raw)
        data, sha = read_trace(path)
        assert bytes(data) == raw
        assert sha == hashlib.sha256(raw).hexdigest()
        assert read_trace(path, sha256="given")[1] == "given"  # not hashed again


def test_a_large_buffer_is_a_mapping_faulted_in_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN buffers of this size and more are mappings whose pages a helper thread faults in (32 MiB in use)
    monkeypatch.setattr(_read, "_PREFAULT_MIN", 1 << 20)
    raw = _text(6_000_000, 4)
    stored = gzip.compress(raw, compresslevel=1)
    (tmp_path / "t.json.gz").write_bytes(stored)
    (tmp_path / "t.json").write_bytes(raw)
    monkeypatch.setattr(_read, "_READ_PIECE", 1 << 20)  # (and read in pieces, hashed as they come)
    # WHEN a gzip trace (its JSON) and a plain one are read THEN their bytes are the file's
    for name in ("t.json.gz", "t.json"):
        data, sha = read_trace(tmp_path / name)
        assert isinstance(data, mmap.mmap)
        assert data[:] == raw and sha == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    # AND with no core to spare (a batch on every core), the same without a helper thread
    def no_thread(*_: object, **__: object) -> None:
        raise AssertionError("a helper thread was started")

    monkeypatch.setattr(threading, "Thread", no_thread)
    for name in ("t.json.gz", "t.json"):
        data, sha = read_trace(tmp_path / name, helpers=False)
        assert data[:] == raw and sha == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()


def test_faulting_pages_in_ahead_leaves_what_is_written_alone() -> None:
    # GIVEN a mapping half filled already (the filler overtook the helper)
    with _read._prefaulted(_read._PREFAULT_MIN + 3 * _read._PREFAULT_STEP + 5) as buffer:
        pattern = bytes(range(256)) * (len(buffer) // 512)
        buffer[: len(pattern)] = pattern
        # WHEN the pages are faulted in (again) from the start
        _read._populate(buffer, threading.Event())  # type: ignore[arg-type]
        # THEN the bytes written stay, and the rest is zeros
        assert buffer[: len(pattern)] == pattern
        assert buffer[len(pattern) :] == bytes(len(buffer) - len(pattern))


def test_gunzip_reads_every_member_and_ignores_zero_padding() -> None:
    # GIVEN two gzip members (the trailer states only the last one's size), and a member padded with zeros
    a, b = _text(400_000, 1), _text(300_000, 2)
    assert bytes(_gunzip(bytearray(gzip.compress(a) + gzip.compress(b)))) == a + b
    assert bytes(_gunzip(bytearray(gzip.compress(a) + b"\x00" * 100))) == a


def test_gunzip_reports_a_truncated_or_corrupt_stream() -> None:
    blob = gzip.compress(_text(1_000_000, 3))
    for cut in (len(blob) // 3, len(blob) - 9, len(blob) - 1):
        with pytest.raises(EOFError):
            _gunzip(bytearray(blob[:cut]))
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2 : len(blob) // 2 + 64] = b"\xff" * 64
    with pytest.raises((EOFError, *_CORRUPT_GZIP)):
        _gunzip(corrupt)
