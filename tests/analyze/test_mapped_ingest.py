"""Large traces are mapped, not read: the same tables as a trace read into memory, pages behind given back, and
a gzip trace inflated into a file beside the output (gone afterwards) with every member and error kept.

MAP_MIN_BYTES is lowered here so that small synthetic traces take the mapped path; the real sizes are measured
in benchmarks/bounded_memory.py.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, flow, kernel, thread_name, trace, write_trace

from stepscope.analyze import _read, _spans
from stepscope.analyze._columns import scanner_available
from stepscope.analyze._read import FileMap, read_trace, release
from stepscope.analyze.dataset import ingest_many
from stepscope.analyze.ingest import ingest_trace
from stepscope.errors import FileChanged, TraceFormatError


def _doc() -> dict[str, Any]:
    events = []
    for i in range(300):
        events.append(cpu_op("aten::add }, { tricky \u00e9", ts=i * 10, dur=5, external_id=i))
        events.append(kernel(f"k{i}", ts=i * 10 + 1, dur=3, correlation=i))
        events.append(flow(i, "s", i * 10 + 2, pid=1000, tid=1))
    doc: dict[str, Any] = trace(thread_name("main"), *events, traceName="t")
    return doc


def _tables(out: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    return pl.read_parquet(out / "events.parquet"), pl.read_parquet(out / "flows.parquet")


@pytest.fixture
def mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_read, "MAP_MIN_BYTES", 1)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("jobs", [1, 2, 16])
def test_a_mapped_trace_gives_the_tables_of_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool,
                                                     jobs: int) -> None:
    # GIVEN a trace read into memory (the usual size) and the same trace mapped (as from MAP_MIN_BYTES)
    path = write_trace(tmp_path / "src", _doc(), "t.json", gz=gz)
    read = ingest_trace(path, tmp_path / "read", chunk_bytes=900, jobs=jobs)
    monkeypatch.setattr(_read, "MAP_MIN_BYTES", 1)
    data, sha = read_trace(path, spill_dir=tmp_path)
    assert isinstance(data, FileMap) and bytes(data) == json.dumps(_doc()).encode()
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()  # of the file as stored
    data.close()
    mapped = ingest_trace(path, tmp_path / "out" / "mapped", chunk_bytes=900, jobs=jobs)
    # THEN every table is the same, row for row, and nothing was left beside the output
    for a, b in zip(_tables(read.out_dir), _tables(mapped.out_dir), strict=True):
        assert a.height > 0 and a.equals(b)
    meta = [json.loads((d / "meta.json").read_text()) for d in (read.out_dir, mapped.out_dir)]
    assert meta[0]["counts"] == meta[1]["counts"] and meta[0]["source"]["sha256"] == meta[1]["source"]["sha256"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mapped"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".stepscope-")]


def test_pages_given_back_read_as_before(tmp_path: Path) -> None:
    # GIVEN a mapped file whose first pages are given back THEN they read as the file still says
    path = tmp_path / "f.json"
    path.write_bytes(bytes(range(256)) * (3 * mmap.PAGESIZE // 256))
    with open(path, "rb") as fh:
        data = FileMap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    release(data, 2 * mmap.PAGESIZE + 7)
    assert bytes(data) == path.read_bytes()
    plain = bytearray(b"x" * 3 * mmap.PAGESIZE)  # anything else is left alone (its pages are not the file's)
    release(plain, len(plain))
    assert plain == b"x" * 3 * mmap.PAGESIZE
    data.close()


def test_a_mapped_trace_whose_cut_falls_in_a_string_reads_the_released_pages_again(tmp_path: Path,
                                                                                     mapped: None) -> None:
    # GIVEN cuts that land inside strings, so spans are merged and re-decoded after pages were given back
    path = write_trace(tmp_path, _doc(), "t.json")
    out = ingest_trace(path, tmp_path / "o", chunk_bytes=64, jobs=1)
    events, _ = _tables(out.out_dir)
    assert events.filter(pl.col("name").str.contains("tricky")).height == 300


def test_several_gzip_members_and_padding_are_one_stream(tmp_path: Path, mapped: None) -> None:
    body = json.dumps(_doc()).encode()
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(body[:1000]) + gzip.compress(body[1000:]) + b"\x00" * 512)
    data, _ = read_trace(path, spill_dir=tmp_path)
    assert isinstance(data, FileMap) and bytes(data) == body
    data.close()


@pytest.mark.parametrize(("damage", "message"), [
    (lambda z: z[: len(z) // 2], "truncated gzip file"),
    (lambda z: z[:20] + b"\xff" * 40 + z[60:], "corrupt gzip data"),
])
def test_a_damaged_gzip_trace_is_one_error_and_leaves_nothing(tmp_path: Path, mapped: None, damage: Any,
                                                              message: str) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(damage(gzip.compress(json.dumps(_doc()).encode())))
    with pytest.raises(TraceFormatError, match=message):
        ingest_trace(path, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.gz"]


_CUT_SHORT = r"""
import os, sys
from pathlib import Path
from stepscope.analyze import _read, _spans
from stepscope.analyze.ingest import ingest_trace
from stepscope.errors import StepscopeError

path, out, where, jobs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
_read.MAP_MIN_BYTES = 1  # (mapped, as a trace of 256 MB or more is)
found = _spans.iter_chunks


def cut_short_after_the_cuts_are_found(data, *args):
    spans = list(found(data, *args))
    os.truncate(path, 1 << 20)  # another process truncates the file (its pages past 1 MiB fault: SIGBUS)
    if where == "python":
        bytes(data[len(data) - 10:])  # a read of the mapping outside the scanner
    return iter(spans)


_spans.iter_chunks = cut_short_after_the_cuts_are_found
if where == "unguarded":
    _read.FileMap.guard = lambda self, p, fd, seen: None
try:
    ingest_trace(path, out, jobs=jobs)
except StepscopeError as exc:
    print(exc)
    sys.exit(exc.exit_code)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGBUS") or not scanner_available(), reason="POSIX, the compiled scanner")
@pytest.mark.parametrize(("where", "jobs"), [("scan", 1), ("scan", 2), ("python", 1), ("unguarded", 1)])
def test_a_mapped_file_cut_short_while_it_is_read_is_one_line_naming_it(tmp_path: Path, where: str, jobs: int) -> None:
    # GIVEN a mapped trace (in a process of its own) that another process truncates once ingest has found its cuts
    # WHEN the scanner reads past the new end (SIGBUS) THEN that file fails with one line naming it (exit code 2,
    # bad input), nothing is written; read by other code than the scanner, the process ends with that line; and a
    # mapping that is not guarded still dies of SIGBUS (the signal is only taken where the file is ours to name)
    doc = trace(*[cpu_op(f"op{i}", ts=i * 10, dur=5, external_id=i) for i in range(40_000)])
    path = write_trace(tmp_path, doc, "big.pt.trace.json")
    assert path.stat().st_size > 4 << 20
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", _CUT_SHORT, str(path), str(out), where, str(jobs)],
                         capture_output=True, text=True, timeout=120)
    if where == "unguarded":
        assert res.returncode == -signal.SIGBUS
        return
    line = f"{path}: the file was cut short while it was being read (another process truncated or rewrote it)"
    assert res.returncode == 2, res.stderr
    assert (res.stdout if where == "scan" else res.stderr).splitlines() == (
        [line] if where == "scan" else [f"stepscope: error: {line}"])
    assert not out.exists() or not any(out.iterdir())


def _rewrite_after_the_cuts(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make another process rewrite `path` in place (same size, still valid JSON: one name's letter) once ingest
    has found its cuts."""
    at = path.read_bytes().index(b'"k150"') + 2
    found = _read.iter_chunks  # (as _spans imported it)

    def rewritten_after_the_cuts(data: Any, *args: Any) -> Any:
        spans = list(found(data, *args))
        with open(path, "r+b") as fh:
            os.pwrite(fh.fileno(), b"X", at)
        return iter(spans)

    monkeypatch.setattr(_spans, "iter_chunks", rewritten_after_the_cuts)


def test_a_mapped_file_written_to_while_it_is_read_is_refused(tmp_path: Path, mapped: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a mapped trace that another process rewrites in place (same size, still valid JSON: one name's letter)
    # once ingest has found its cuts THEN the ingest fails with one line naming the file, writes nothing, and the
    # same file left alone ingests
    path = write_trace(tmp_path, _doc(), "t.pt.trace.json")
    found = _read.iter_chunks  # (as _spans imported it)
    _rewrite_after_the_cuts(path, monkeypatch)
    with pytest.raises(FileChanged, match=r"t\.pt\.trace\.json: the file changed while it was being read \(another "
                                          r"process wrote to it\)$"):
        ingest_trace(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(_spans, "iter_chunks", found)
    assert ingest_trace(path, tmp_path / "out").n_events > 0


def test_a_mapped_file_hashed_while_it_is_ingested_is_refused_when_written_to(tmp_path: Path, mapped: None,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a mapped trace ingested into a new dataset, so hashed by a thread meanwhile (nothing to skip)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # (a core for the thread)
    path = write_trace(tmp_path / "src", _doc(), "t.pt.trace.json")
    first = ingest_many([path], tmp_path / "ds", jobs=2).outcomes[0]
    # THEN its meta.json has the file's sha256, as when it is hashed first
    meta = json.loads((Path(str(first.out_dir)) / "meta.json").read_text())
    assert first.status == "ingested" and meta["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # AND WHEN another process writes to it once its cuts are found THEN that file fails with the one line
    _rewrite_after_the_cuts(path, monkeypatch)
    failed = ingest_many([path], tmp_path / "new", jobs=2).outcomes[0]
    assert failed.status == "failed" and str(failed.error).endswith("the file changed while it was being read "
                                                                    "(another process wrote to it)")
    assert not (tmp_path / "new").exists()
