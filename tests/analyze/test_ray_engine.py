"""The Ray engine: a real local Ray cluster (one start for the whole module) ingests the same dataset as the local
engine, partition for partition and row for row; bad files and lost tasks are failures like any other; an
unchanged file is skipped; without Ray installed, one line says how to install it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import kernel, memcpy, step, trace, write_trace
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from stepscope.analyze.dataset import ingest_many
from stepscope.analyze.engines import RAY_MISSING, ray_map
from stepscope.analyze.fleet import fleet
from stepscope.cli import cli
from stepscope.errors import BatchFailed, UsageError

ray = pytest.importorskip("ray")


def test_an_unreachable_cluster_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """(first in the module: no cluster is running yet)"""
    assert not ray.is_initialized()
    src = _inputs(tmp_path / "src")
    out = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray",
                                   "--address", "auto"])
    assert isinstance(out.exception, UsageError) and out.exception.exit_code == 2  # (as main() exits)
    assert str(out.exception).startswith("cannot start or reach a Ray cluster at auto: ")
    assert "\n" not in str(out.exception) and not (tmp_path / "ds").exists()


def _inputs(directory: Path) -> Path:
    for rank in range(3):
        events = [step(1, 0, 100), *[kernel(f"k{i}", ts=i * 10, dur=5) for i in range(rank + 2)],
                  memcpy("HtoD", 60, 4, nbytes=1024)]
        write_trace(directory, trace(*events, distributedInfo={"rank": rank, "world_size": 3}),
                    f"rank{rank}.pt.trace.json", gz=rank == 1)
    write_trace(directory / "sub", trace(kernel("solo", ts=1, dur=1)), "norank.json")
    (directory / "broken.json").write_bytes(b'{"traceEvents": [{"ph": "X"')
    return directory


def _tables(dataset: Path) -> dict[str, tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]]:
    """Each partition (its path in the dataset) -> its events, flows and meta.json less the time of ingest."""
    out = {}
    for meta_path in sorted(dataset.glob("trace=*/rank=*/meta.json")):
        part = meta_path.parent
        meta = json.loads(meta_path.read_text())
        meta.pop("ingested_at")
        out[str(part.relative_to(dataset))] = (pl.read_parquet(part / "events.parquet"),
                                               pl.read_parquet(part / "flows.parquet"), meta)
    return out


def assert_same_dataset(a: Path, b: Path) -> None:
    ta, tb = _tables(a), _tables(b)
    assert list(ta) == list(tb) and ta
    for name, (events, flows, meta) in ta.items():
        assert_frame_equal(events, tb[name][0])
        assert_frame_equal(flows, tb[name][1])
        assert meta == tb[name][2], name


def test_ray_writes_the_local_engines_dataset_and_reports_the_same_failures(cluster: None, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths: outcomes name them as given, though the tasks ran elsewhere
    src = _inputs(Path("src"))
    local = ingest_many([src], Path("local"), jobs=2)
    on_ray = ingest_many([src], Path("ray"), engine="ray")
    assert_same_dataset(tmp_path / "local", tmp_path / "ray")
    assert [(o.source, o.status, o.trace_id, o.n_events, o.error, o.out_dir and o.out_dir[5:])
            for o in local.outcomes] == \
        [(o.source, o.status, o.trace_id, o.n_events, o.error, o.out_dir and o.out_dir[3:]) for o in on_ray.outcomes]
    assert all((o.out_dir or "ray/trace=").startswith("ray/trace=") for o in on_ray.outcomes)
    assert on_ray.failed == 1 and not list((tmp_path / "ray").glob(".staging-*"))
    # resumable: unchanged files are skipped, a changed one is ingested again
    write_trace(src / "sub", trace(kernel("solo", ts=1, dur=2)), "norank.json")
    again = ingest_many([src], tmp_path / "ray", engine="ray")
    assert sorted(o.status for o in again.outcomes) == ["failed", "ingested", "skipped", "skipped", "skipped"]
    assert next(o for o in again.outcomes if o.status == "ingested").source.endswith("norank.json")


def test_the_cli_on_ray(cluster: None, tmp_path: Path) -> None:
    src = _inputs(tmp_path / "src")
    out = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray", "-q"])
    assert out.exit_code == 1 and isinstance(out.exception, BatchFailed)  # (main() prints it as a last line)
    assert "4 ingested, 0 unchanged (skipped), 1 failed" in out.stdout
    failures = [line for line in out.stderr.splitlines() if line.startswith("stepscope: error:")]
    assert len(failures) == 1 and "broken.json (byte" in failures[0] and "truncated JSON" in failures[0]
    CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "local"), "-q"])
    assert_same_dataset(tmp_path / "local", tmp_path / "ds")


def test_a_task_that_raises_is_reported_and_the_rest_go_on(cluster: None) -> None:
    results = set(ray_map(json.loads, [("2",), ("{",), ("4.5",)],
                          on_error=lambda args, exc: f"{args[0]}: {type(exc).__name__}"))
    assert results == {"{: JSONDecodeError", 2, 4.5}


def test_the_fleet_table_on_ray_is_the_local_engines(cluster: None, tmp_path: Path) -> None:
    src = _inputs(tmp_path / "src")
    ingest_many([src], tmp_path / "ds", jobs=1)
    for source in (src, tmp_path / "ds"):  # raw files (each worker's cache) and a dataset
        local = fleet(source, jobs=1, cache_dir=tmp_path / "cache-local")
        on_ray = fleet(source, engine="ray", cache_dir=tmp_path / "cache-ray")
        assert on_ray.fleet.equals(local.fleet) and (on_ray.traces, on_ray.failed) == (local.traces, local.failed)
    assert local.traces == 4 and sorted(local.fleet["steps"].to_list()) == [0, 1, 1, 1]
    out = CliRunner().invoke(cli, ["fleet", str(src), "--engine", "ray", "--json"])
    assert isinstance(out.exception, BatchFailed) and "broken.json (byte" in out.stderr
    assert len(json.loads(out.stdout)["fleet"]) == 5


@pytest.mark.corpus
def test_engines_agree_on_the_whole_corpus(cluster: None, corpus: Path, tmp_path: Path) -> None:
    local = ingest_many([corpus / "traces"], tmp_path / "local", jobs=2)
    on_ray = ingest_many([corpus / "traces"], tmp_path / "ray", engine="ray")
    assert_same_dataset(tmp_path / "local", tmp_path / "ray")
    assert [(o.status, o.error) for o in local.outcomes] == [(o.status, o.error) for o in on_ray.outcomes]


def test_without_ray_one_line_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _inputs(tmp_path / "src")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    out = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray"])
    assert isinstance(out.exception, UsageError) and str(out.exception) == RAY_MISSING
    assert "pip install 'stepscope[ray]'" in RAY_MISSING
    assert not (tmp_path / "ds").exists()
    with pytest.raises(UsageError, match="stepscope\\[ray\\]"):
        ingest_many([src], tmp_path / "ds2", engine="ray")
    assert not (tmp_path / "ds2").exists()


def test_address_needs_the_ray_engine(tmp_path: Path) -> None:
    src = _inputs(tmp_path / "src")
    out = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "--address", "auto"])
    assert out.exit_code == 2 and "--address names a Ray cluster" in out.output
