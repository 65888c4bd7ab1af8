"""Traces given as fsspec URLs (fsspec's in-memory and local filesystems here): streamed to a local mirror and
read like local files, the same dataset and the same analyses; a missing backend is one line naming the URL
and the package to install."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from builders import kernel, step, trace, write_trace
from click.testing import CliRunner

from stepscope.analyze.dataset import ingest_many
from stepscope.analyze.inputs import TraceBatch, TraceFile, resolve
from stepscope.analyze.remote import as_url, fetch
from stepscope.analyze.trace import load
from stepscope.cli import cli, main
from stepscope.errors import InputError

fsspec = pytest.importorskip("fsspec")


def _doc(rank: int, n: int) -> object:
    return trace(step(1, 0, 100), *[kernel(f"k{i}", ts=i * 10, dur=5) for i in range(n)],
                 distributedInfo={"rank": rank, "world_size": 2})


@pytest.fixture
def bucket(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The same two-rank job as local files and in fsspec's memory filesystem under memory://fleet/jobA/."""
    local = tmp_path / "local" / "jobA"
    mem = fsspec.filesystem("memory")
    for rank in (0, 1):
        path = write_trace(local, _doc(rank, 3 + rank), f"rank{rank}.pt.trace.json", gz=rank == 1)
        mem.pipe(f"/fleet/jobA/{path.name}", path.read_bytes())
    mem.pipe("/fleet/jobA/notes.txt", b"not a trace")
    yield "memory://fleet", local
    mem.rm("/fleet", recursive=True)


def test_urls_survive_click_paths_and_local_paths_stay_local(tmp_path: Path) -> None:
    assert as_url("s3://bucket/a/b.json") == "s3://bucket/a/b.json"
    assert as_url(Path("s3://bucket/a/b.json")) == "s3://bucket/a/b.json"  # Path drops a slash
    assert as_url(Path("file:///tmp/x.json")) == "file:///tmp/x.json"
    assert as_url("C:/traces/x.json") is None and as_url(tmp_path) is None and as_url("rank0.json") is None


def test_a_url_directory_ingests_into_the_same_dataset_as_its_files(bucket: tuple[str, Path], tmp_path: Path) -> None:
    url, local = bucket
    remote = ingest_many([Path(url)], tmp_path / "from_url", jobs=1)  # (as the CLI passes it: memory:/fleet)
    here = ingest_many([local], tmp_path / "from_disk", jobs=1)
    assert [o.trace_id for o in remote.outcomes] == [o.trace_id for o in here.outcomes] and remote.failed == 0
    for part in sorted((tmp_path / "from_disk").glob("trace=*/rank=*")):
        twin = tmp_path / "from_url" / part.relative_to(tmp_path / "from_disk")
        assert pl.read_parquet(twin / "events.parquet").equals(pl.read_parquet(part / "events.parquet"))
    meta = json.loads(next((tmp_path / "from_url").glob("trace=*/rank=0/meta.json")).read_text())
    assert meta["source"]["path"].endswith("remote/memory/fleet/jobA/rank0.pt.trace.json")


def test_one_url_is_one_trace_and_a_glob_a_batch(bucket: tuple[str, Path]) -> None:
    url, _ = bucket
    one = resolve(Path(url + "/jobA/rank1.pt.trace.json.gz"))
    assert isinstance(one, TraceFile)
    assert load(url + "/jobA/rank1.pt.trace.json.gz").events.collect().height == 5
    batch = resolve(url + "/jobA/rank*")
    assert isinstance(batch, TraceBatch) and [p.name for p in batch.traces] == ["rank0.pt.trace.json",
                                                                                 "rank1.pt.trace.json.gz"]


def test_a_changed_remote_file_is_fetched_again_an_unchanged_one_is_not(bucket: tuple[str, Path]) -> None:
    url, _ = bucket
    name = url + "/jobA/rank0.pt.trace.json"
    (first,) = fetch(name)
    before = first.stat().st_mtime_ns
    assert fetch(name) == [first] and first.stat().st_mtime_ns == before
    fsspec.filesystem("memory").pipe("/fleet/jobA/rank0.pt.trace.json", json.dumps(_doc(0, 7)).encode())
    assert load(name).events.collect().height == 8


def test_file_urls(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t", _doc(0, 2), "rank0.pt.trace.json")
    assert load(f"file://{path}").events.collect().height == 3


def test_fleet_and_summary_read_urls(bucket: tuple[str, Path]) -> None:
    url, _ = bucket
    out = CliRunner().invoke(cli, ["fleet", url, "-j", "1", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["fleet"]
    assert [(r["run"], r["rank"]) for r in rows] == [("jobA", 0), ("jobA", 1)]
    out = CliRunner().invoke(cli, ["summary", url + "/jobA/rank0.pt.trace.json", "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["verdict"]


@pytest.mark.parametrize(("url", "message"), [
    ("memory://nothing/here.json", "memory://nothing/here.json: no such file or directory"),
    ("nosuchscheme://b/k.json", "nosuchscheme://b/k.json: no fsspec filesystem for nosuchscheme://"),
])
def test_bad_urls_are_one_line(url: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        fetch(url)


def test_a_missing_backend_names_the_url_and_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fsspec.implementations.memory")
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed")
    except ImportError:
        pass
    with pytest.raises(SystemExit) as exit_info:
        main(["summary", "s3://bucket/jobA/rank0.pt.trace.json"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stepscope: error: s3://bucket/jobA/rank0.pt.trace.json: reading s3:// URLs needs s3fs, which is "
                   "not installed: pip install s3fs"]


def test_without_fsspec_one_line_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(InputError, match=r"gs://b/k.json: reading URLs needs fsspec, .*'stepscope\[fsspec\]'"):
        resolve("gs://b/k.json")


def test_a_bad_remote_trace_is_named_by_its_url(bucket: tuple[str, Path], capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    # GIVEN a URL of an empty file WHEN a command reads it THEN its one line names the URL, not the local mirror
    # under the cache (once "…/stepscope/remote/memory/fleet/jobA/empty.json: empty file")
    url, _ = bucket
    fsspec.filesystem("memory").pipe("/fleet/jobA/empty.json", b"")
    with pytest.raises(SystemExit) as exit_info:
        main(["summary", f"{url}/jobA/empty.json"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"stepscope: error: {url}/jobA/empty.json: empty file"]
    # AND so does a batch's line for that file, the rest ingested
    with pytest.raises(SystemExit):
        main(["ingest", f"{url}/jobA", "-o", str(tmp_path / "ds"), "-q"])
    err = capsys.readouterr().err
    assert f"stepscope: error: {url}/jobA/empty.json: empty file" in err and "/remote/" not in err
