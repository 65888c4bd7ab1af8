"""Batch ingest: parallel, one hive partition per trace and rank, bad files reported, the rest go on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow.dataset as ds
import pytest
from builders import kernel, trace, write_trace
from click.testing import CliRunner
from dying_jobs import killer_env

from stepscope.analyze import dataset
from stepscope.analyze._workers import worker_context
from stepscope.analyze.dataset import ingest_many
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.inputs import file_sha256, hash_meanwhile, trace_id_for
from stepscope.cli import cli
from stepscope.errors import InputError


def _inputs(tmp_path: Path) -> Path:
    src = tmp_path / "traces"
    for rank in range(3):
        doc = trace(*[kernel(f"k{i}", ts=i * 10, dur=5) for i in range(rank + 2)],
                    distributedInfo={"rank": rank, "world_size": 3})
        write_trace(src, doc, f"rank{rank}.pt.trace.json", gz=rank == 1)
    write_trace(src / "sub", trace(kernel("solo", ts=1, dur=1)), "norank.json")
    (src / "broken.json").write_bytes(b'{"traceEvents": [{"ph": "X"')
    return src


def test_batch_ingest_writes_a_hive_dataset_every_reader_sees_as_one_table(tmp_path: Path) -> None:
    src = _inputs(tmp_path)
    result = ingest_many([src], tmp_path / "ds", jobs=2)
    assert [o.status for o in result.outcomes].count("ingested") == 4
    assert result.failed == 1
    failed = next(o for o in result.outcomes if o.status == "failed")
    assert failed.error is not None and "broken.json" in failed.error and "truncated JSON" in failed.error
    lf = pl.scan_parquet(str(tmp_path / "ds" / "**" / "events.parquet"), hive_partitioning=True)
    table = lf.select("trace", "rank", "name").collect()
    assert table.height == 2 + 3 + 4 + 1
    assert sorted(table.filter(pl.col("rank").is_not_null())["rank"].unique().to_list()) == [0, 1, 2]
    assert table.filter(pl.col("name") == "solo")["rank"].to_list() == [None]
    n = duckdb.execute(f"SELECT count(*) FROM read_parquet('{tmp_path}/ds/*/*/events.parquet', hive_partitioning=true)"
                       ).fetchall()
    assert n == [(10,)]
    arrow = ds.dataset(str(tmp_path / "ds"), format="parquet", partitioning="hive",
                       exclude_invalid_files=True).to_table(columns=["name"])
    assert arrow.num_rows == 10


def test_unchanged_files_are_skipped_on_a_second_run(tmp_path: Path) -> None:
    src = _inputs(tmp_path)
    (src / "broken.json").unlink()
    ingest_many([src], tmp_path / "ds", jobs=1)
    again = ingest_many([src], tmp_path / "ds", jobs=1)
    assert {o.status for o in again.outcomes} == {"skipped"}
    assert not list((tmp_path / "ds").glob(".staging-*"))


def test_a_file_that_changed_replaces_its_earlier_version(tmp_path: Path) -> None:
    # GIVEN a dataset of two runs' rank0.json (one name, two files) WHEN one of them changes and is ingested again
    # THEN its new version replaces the old one (once both stayed: two rank-0 rows in the fleet table, the old
    # version's verdict counted), and the other run's file of the same name stays
    for run, dur in (("a", 5), ("b", 7)):
        write_trace(tmp_path / run, trace(kernel("k", ts=0, dur=dur)), "rank0.json")
    ingest_many([tmp_path / "a", tmp_path / "b"], tmp_path / "ds", jobs=1)
    write_trace(tmp_path / "a", trace(kernel("k", ts=0, dur=5), kernel("k2", ts=10, dur=5)), "rank0.json")
    again = ingest_many([tmp_path / "a", tmp_path / "b"], tmp_path / "ds", jobs=1)
    assert sorted(o.status for o in again.outcomes) == ["ingested", "skipped"]
    table = pl.scan_parquet(str(tmp_path / "ds" / "**" / "events.parquet"), hive_partitioning=True).select(
        "trace").collect()
    assert table["trace"].n_unique() == 2 and table.height == 2 + 1  # a's two kernels, b's one


def test_a_run_again_reads_no_unchanged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             cache_hashes: list[Path]) -> None:
    """Resuming a batch hashes each file once (its hash then remembered against its stat, in the trace cache):
    after that, an unchanged file is skipped without a read; a rewritten one is hashed and ingested."""
    from stepscope.analyze import cache

    monkeypatch.setattr(cache, "RACY_S", 0.0)  # (the test's files are seconds old)
    src = _inputs(tmp_path)
    (src / "broken.json").unlink()
    ingest_many([src], tmp_path / "ds", jobs=1)  # (a new partition: hashed as it is ingested, where a core is spare)
    del cache_hashes[:]
    hashed = cache_hashes
    runs = [ingest_many([src], tmp_path / "ds", jobs=1) for _ in range(2)]
    assert all({o.status for o in r.outcomes} == {"skipped"} for r in runs) and len(hashed) == 4  # the first only
    write_trace(src, trace(kernel("new", ts=0, dur=9)), "rank0.pt.trace.json")
    changed = ingest_many([src], tmp_path / "ds", jobs=1)
    assert hashed[4:] == [src / "rank0.pt.trace.json"]
    assert sorted(o.status for o in changed.outcomes) == ["ingested", "skipped", "skipped", "skipped"]


def test_a_file_with_nothing_to_skip_is_hashed_while_it_is_ingested(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A file no partition of its name exists for cannot be skipped, so its sha256 is computed by a thread while
    it is ingested; a file whose name has a partition is hashed first, and skipped where unchanged. Either way
    the partition, its meta.json and its outcome are what hashing first gave."""
    src = _inputs(tmp_path)
    (src / "broken.json").unlink()
    meanwhile: list[Path] = []
    real = hash_meanwhile

    def spied(path: Path) -> Any:
        meanwhile.append(path)
        return real(path)

    monkeypatch.setattr(dataset, "hash_meanwhile", spied)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # (a core for the thread)
    first = ingest_many([src], tmp_path / "ds", jobs=1)
    assert len(meanwhile) == 4 and {o.status for o in first.outcomes} == {"ingested"}
    for outcome in first.outcomes:
        sha = file_sha256(Path(outcome.source))
        assert outcome.trace_id == trace_id_for(Path(outcome.source), sha)
        meta = json.loads((Path(str(outcome.out_dir)) / "meta.json").read_text())
        assert meta["source"]["sha256"] == sha and meta["trace_id"] == outcome.trace_id
    assert not any(t.name == "stepscope-sha256" for t in threading.enumerate())
    # a second run: every name has its partition, so each file is hashed first, and skipped
    meanwhile.clear()
    again = ingest_many([src], tmp_path / "ds", jobs=1)
    assert meanwhile == [] and {o.status for o in again.outcomes} == {"skipped"}
    # a file changed under the same name: hashed first, ingested into a partition of its own, which replaces its
    # earlier version's
    write_trace(src, trace(kernel("new", ts=0, dur=9)), "rank0.pt.trace.json")
    changed = ingest_many([src / "rank0.pt.trace.json"], tmp_path / "ds", jobs=1)
    assert meanwhile == [] and changed.outcomes[0].status == "ingested"
    assert [p.name for p in (tmp_path / "ds").glob("trace=rank0-*")] == [f"trace={changed.outcomes[0].trace_id}"]
    # --force: nothing is skipped, so it is hashed meanwhile
    ingest_many([src / "rank0.pt.trace.json"], tmp_path / "ds", jobs=1, force=True)
    assert meanwhile == [src / "rank0.pt.trace.json"]
    # no core to spare (a process on every core): hashed first, as every helper thread is left out then
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    ingest_many([src / "rank1.pt.trace.json.gz"], tmp_path / "one-core", jobs=1)
    assert meanwhile == [src / "rank0.pt.trace.json"]
    forced = ingest_many([src / "rank1.pt.trace.json.gz"], tmp_path / "one-core", jobs=1, force=True)
    assert meanwhile == [src / "rank0.pt.trace.json"] and forced.outcomes[0].status == "ingested"


def test_a_file_hashed_meanwhile_that_fails_leaves_no_thread_and_a_bad_read_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_bytes(b'{"traceEvents": [{"ph": "X"')
    result = ingest_many([tmp_path / "broken.json"], tmp_path / "ds", jobs=1)
    assert result.failed == 1 and "truncated JSON" in str(result.outcomes[0].error)
    assert not any(t.name == "stepscope-sha256" for t in threading.enumerate())
    with pytest.raises(InputError, match="gone.json: cannot read"):
        hash_meanwhile(tmp_path / "gone.json").result()
    with pytest.raises(ValueError, match="force=True"):
        ingest_trace(tmp_path / "broken.json", tmp_path / "out", sha256=hash_meanwhile(tmp_path / "broken.json"))


@pytest.mark.parametrize(("cores", "jobs", "behind"), [(1, None, False), (4, 1, True)])
def test_a_batch_uses_helper_threads_only_where_a_core_is_spare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  cores: int, jobs: int | None, behind: bool) -> None:
    """Held to one core (taskset, a container's cpuset), a batch runs one process by default, which writes
    in turn; with a core to spare, one process writes behind. The tables are the same."""
    src = _inputs(tmp_path)
    (src / "broken.json").unlink()
    seen: list[tuple[int, bool]] = []

    def recorded(*args: Any, jobs: int = 1, spare_core: bool = True, **kwargs: Any) -> Any:
        seen.append((jobs, spare_core))
        return ingest_trace(*args, jobs=jobs, spare_core=spare_core, **kwargs)

    monkeypatch.setattr(dataset, "ingest_trace", recorded)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    ingest_many([src], tmp_path / "ds", jobs=jobs)
    assert seen == [(1, behind)] * 4
    monkeypatch.undo()
    ingest_many([src], tmp_path / "reference", jobs=1)
    events = sorted((tmp_path / "ds").glob("*/*/events.parquet"))
    assert len(events) == 4
    for path in events:
        reference = tmp_path / "reference" / path.relative_to(tmp_path / "ds")
        assert pl.read_parquet(path).equals(pl.read_parquet(reference))


def test_ingest_cli_reports_failures_and_exit_code(tmp_path: Path) -> None:
    src = _inputs(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "-j", "2", "--json"])
    assert res.exit_code == 1
    outcomes = json.loads(res.stdout)["outcomes"]
    assert sorted(o["status"] for o in outcomes) == ["failed", "ingested", "ingested", "ingested", "ingested"]
    (src / "broken.json").unlink()
    res = runner.invoke(cli, ["ingest", str(src / "*.json*"), "-o", str(tmp_path / "ds2"), "-q"])
    assert res.exit_code == 0, res.output
    assert "3 ingested, 0 unchanged (skipped), 0 failed" in res.stdout


def test_a_worker_killed_by_the_file_it_ingests_fails_that_file_and_the_batch_goes_on(tmp_path: Path) -> None:
    # GIVEN a batch on two processes whose largest file kills the worker process that ingests it (a sitecustomize
    # in every process of the command) WHEN the CLI ingests it THEN that file fails with one line saying how (its
    # retry alone dies too), every other file is ingested, nothing is left half-written, and the exit code is 1
    src = _inputs(tmp_path)
    (src / "broken.json").unlink()
    write_trace(src, trace(*[kernel(f"k{i}", ts=i * 10, dur=5) for i in range(200)]), "kill-me.pt.trace.json")
    env = killer_env(tmp_path / "site", "stepscope.analyze.dataset", "ingest_one")
    out = tmp_path / "ds"
    res = subprocess.run([sys.executable, "-m", "stepscope", "ingest", str(src), "-o", str(out), "-j", "2", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1, res.stderr
    outcomes = {Path(o["source"]).name: o for o in json.loads(res.stdout)["outcomes"]}
    killer = outcomes.pop("kill-me.pt.trace.json")
    assert killer["status"] == "failed" and killer["error"] == (
        f"{src / 'kill-me.pt.trace.json'}: its worker process was killed by SIGKILL (what the out-of-memory killer "
        "sends: try fewer --jobs, or more memory)")
    assert sorted(o["status"] for o in outcomes.values()) == ["ingested"] * 4
    assert sorted(p.name.split("-")[0] for p in out.iterdir()) == ["trace=norank", "trace=rank0", "trace=rank1",
                                                                 "trace=rank2"]


def test_a_batch_where_every_file_fails_leaves_no_dataset_behind(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X"')
    result = ingest_many([bad], tmp_path / "ds")
    assert result.failed == 1 and not (tmp_path / "ds").exists()
    (tmp_path / "kept").mkdir()  # a directory the user made beforehand stays
    assert ingest_many([bad], tmp_path / "kept").failed == 1 and (tmp_path / "kept").is_dir()
    # AND so through the command, which makes the directory before it ingests (once left behind, empty)
    res = CliRunner().invoke(cli, ["ingest", str(bad), "-o", str(tmp_path / "cli")])
    assert res.exit_code == 1 and not (tmp_path / "cli").exists()
    res = CliRunner().invoke(cli, ["ingest", str(bad), "-o", str(tmp_path / "kept")])
    assert res.exit_code == 1 and (tmp_path / "kept").is_dir()


_FRESH = r"""
import json, sys, threading, time
from pathlib import Path
import stepscope.analyze.dataset as dataset
from stepscope.analyze._workers import own_process, worker_context
print(json.dumps({"not_owned": worker_context(fork_if_fresh=True).get_start_method()}))
own_process()  # as stepscope.cli.main does
print(json.dumps({"fresh": worker_context(fork_if_fresh=True).get_start_method()}))
result = dataset.ingest_many([Path(sys.argv[1])], Path(sys.argv[2]), jobs=2, fork_workers=True)
print(json.dumps({"outcomes": [[Path(o.source).name, o.status, o.n_events] for o in result.outcomes]}))
print(json.dumps({"after": worker_context(fork_if_fresh=True).get_start_method()}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="threads are listed from /proc/self/task (Linux)")
def test_workers_are_forked_only_from_a_process_that_has_started_no_thread(tmp_path: Path) -> None:
    # GIVEN a process of its own that has only imported stepscope and says so (as the CLI), and this one
    src = _inputs(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _FRESH, str(src), str(tmp_path / "forked")], capture_output=True,
                          text=True, timeout=120, check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    # THEN the first forks its workers (instantly), and once its own ingest has started threads it no longer
    # would; nor would this process, once it has run an ingest itself
    assert (lines[0]["not_owned"], lines[1]["fresh"], lines[3]["after"]) == ("forkserver", "fork", "forkserver")
    plain = ingest_many([src], tmp_path / "plain", jobs=2)
    assert worker_context(fork_if_fresh=True).get_start_method() == "forkserver"
    # AND the forked workers ingest as the fork server's do
    assert lines[2]["outcomes"] == [[Path(o.source).name, o.status, o.n_events] for o in plain.outcomes]
    assert [o.status for o in plain.outcomes].count("ingested") == 4
    forked = pl.read_parquet(str(tmp_path / "forked" / "**" / "events.parquet"), hive_partitioning=True)
    plain_events = pl.read_parquet(str(tmp_path / "plain" / "**" / "events.parquet"), hive_partitioning=True)
    assert forked.sort("trace", "event_id").equals(plain_events.sort("trace", "event_id"))
