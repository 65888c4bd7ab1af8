"""Reading a trace file's bytes: gunzip into one preallocated buffer, whatever the stream's shape."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from stepscope.analyze import _read
from stepscope.analyze._read import _CORRUPT_GZIP, _gunzip


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
    assert _gunzip(bytearray(gzip.compress(raw))) == raw


def test_gunzip_reads_every_member_and_ignores_zero_padding() -> None:
    # GIVEN two gzip members (the trailer states only the last one's size), and a member padded with zeros
    a, b = _text(400_000, 1), _text(300_000, 2)
    assert _gunzip(bytearray(gzip.compress(a) + gzip.compress(b))) == a + b
    assert _gunzip(bytearray(gzip.compress(a) + b"\x00" * 100)) == a


def test_gunzip_reports_a_truncated_or_corrupt_stream() -> None:
    blob = gzip.compress(_text(1_000_000, 3))
    for cut in (len(blob) // 3, len(blob) - 9, len(blob) - 1):
        with pytest.raises(EOFError):
            _gunzip(bytearray(blob[:cut]))
    corrupt = bytearray(blob)
    corrupt[len(blob) // 2 : len(blob) // 2 + 64] = b"\xff" * 64
    with pytest.raises((EOFError, *_CORRUPT_GZIP)):
        _gunzip(corrupt)
