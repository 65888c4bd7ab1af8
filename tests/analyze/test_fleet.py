"""The fleet table: one row per trace and rank, the same figures as each trace's own summary / steps / gaps;
a closed --where language (never evaluated); bad traces are rows with their error, exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import kernel, step, trace, write_trace
from click.testing import CliRunner
from dying_jobs import killer_env

from stepscope.analyze.dataset import ingest_many
from stepscope.analyze.fleet import FLEET_SCHEMA, fleet, parse_condition, select_rows
from stepscope.analyze.summary import verdict
from stepscope.analyze.trace import load
from stepscope.cli import cli
from stepscope.errors import BatchFailed, UsageError


def _rank(rank: int, busy_us: int) -> Any:
    """Three 100 µs steps, each with one kernel of `busy_us` at its start."""
    events = [e for s in range(3) for e in (step(s, s * 100, 100), kernel(f"gemm{s}", s * 100 + 1, busy_us))]
    return trace(*events, distributedInfo={"rank": rank, "world_size": 2})


def _job(directory: Path) -> Path:
    write_trace(directory / "jobA", _rank(0, 90), "rank0.pt.trace.json")
    write_trace(directory / "jobA", _rank(1, 30), "rank1.pt.trace.json")
    write_trace(directory / "jobB", _rank(0, 60), "rank0.pt.trace.json")
    return directory


def test_rows_are_each_traces_own_figures(tmp_path: Path) -> None:
    src = _job(tmp_path / "src")
    result = fleet(src, jobs=1)
    assert result.traces == 3 and result.failed == 0
    table = result.fleet
    assert table.schema == pl.Schema(FLEET_SCHEMA)
    assert table.select("run", "rank", "steps").rows() == [("jobA", 0, 3), ("jobA", 1, 3), ("jobB", 0, 3)]
    assert table["device"].to_list() == ["Synthetic GPU"] * 3
    for row in table.iter_rows(named=True):
        own = verdict(load(Path(row["path"])))
        assert row["verdict"] == own.verdict.value
        assert row["gpu_busy_fraction"] == pytest.approx(own.gpu_busy_fraction)
        assert row["step_p50_ns"] == 100_000 and row["step_p95_ns"] == 100_000
        assert row["error"] is None
    busy = dict(zip(table["path"].map_elements(lambda p: Path(p).parent.name + Path(p).name, return_dtype=pl.String),
                    table["gpu_busy_fraction"], strict=True))
    assert busy["jobArank0.pt.trace.json"] > busy["jobBrank0.pt.trace.json"] > busy["jobArank1.pt.trace.json"]


def test_the_device_is_the_listed_gpu_that_ran_the_work(tmp_path: Path) -> None:
    """Kineto lists every GPU the process could see; the row names the one the kernels ran on, and a name ROCm
    leaves empty is unknown, not ''."""
    listed = [{"id": i, "name": name, "totalGlobalMem": 2**30} for i, name in enumerate(("GPU A", "GPU B", ""))]
    events = [step(0, 0, 100), kernel("gemm", 1, 50, device=1)]
    write_trace(tmp_path / "src" / "b", trace(*events, deviceProperties=listed), "on_b.pt.trace.json")
    write_trace(tmp_path / "src" / "c", trace(step(0, 0, 100), kernel("gemm", 1, 50, device=2),
                                              deviceProperties=listed), "on_c.pt.trace.json")
    write_trace(tmp_path / "src" / "none", trace(step(0, 0, 100), deviceProperties=listed), "cpu.pt.trace.json")
    table = fleet(tmp_path / "src", jobs=1).fleet
    assert dict(table.select("run", "device").rows()) == {"b": "GPU B", "c": None, "none": "GPU A"}


def test_a_dataset_and_its_raw_files_give_the_same_rows(tmp_path: Path) -> None:
    src = _job(tmp_path / "src")
    ingest_many([src], tmp_path / "ds", jobs=1)
    raw = fleet(src, jobs=2).fleet.drop("path").sort("trace")
    ingested = fleet(tmp_path / "ds", jobs=1).fleet.drop("path").sort("trace")
    assert raw.equals(ingested)


def test_a_damaged_partition_is_a_row_saying_what_is_wrong(tmp_path: Path) -> None:
    # GIVEN a dataset whose partitions lost their events.parquet, or hold a meta.json cut short
    src = _job(tmp_path / "src")
    ingest_many([src], tmp_path / "ds", jobs=1)
    parts = sorted((tmp_path / "ds").glob("trace=*/rank=*"))
    (parts[0] / "events.parquet").unlink()
    (parts[1] / "meta.json").write_text("{")
    rows = {r["trace"]: r for r in fleet(tmp_path / "ds", jobs=1).fleet.iter_rows(named=True)}
    # THEN each is a row under its trace id and rank (once the folders' names, trace=… and rank=…) whose error
    # names the file (once "holds no trace (.json / .json.gz), …" for both); the third is computed
    lost = rows[parts[0].parent.name.removeprefix("trace=")]
    cut = rows[parts[1].parent.name.removeprefix("trace=")]
    assert lost["rank"] == int(parts[0].name.removeprefix("rank=")) and lost["run"] == "ds"
    assert lost["error"].endswith("an ingested trace without events.parquet (ingest it again)")
    assert "an ingested trace whose meta.json is unreadable" in cut["error"]
    assert sum(r["error"] is None for r in rows.values()) == 1


def test_where_and_sort(tmp_path: Path) -> None:
    result = fleet(_job(tmp_path / "src"), jobs=1)
    low = select_rows(result, where=["gpu_busy<0.5"])
    assert low.fleet.select("run", "rank").rows() == [("jobA", 1)]
    assert select_rows(result, where=["gpu_busy < 50%"]).fleet.equals(low.fleet)
    assert select_rows(result, where=["run=jobA", "rank!=0"]).fleet.equals(low.fleet)
    assert select_rows(result, where=["step_p95>=100us", "step_p95<=0.1ms"]).fleet.height == 3
    assert select_rows(result, where=["mfu=null"]).fleet.height == 3
    assert select_rows(result, where=["error!=null"]).fleet.height == 0
    assert select_rows(result, where=["peak_memory>1G"]).fleet.height == 0  # unknown never satisfies an order
    ordered = select_rows(result, sort="gpu_busy", descending=True).fleet
    assert ordered.select("run", "rank").rows() == [("jobA", 0), ("jobB", 0), ("jobA", 1)]


@pytest.mark.parametrize(("text", "message"), [
    ("busy<0.5", "no column 'busy'"),
    ("verdict", "expected COLUMN OP VALUE"),
    ("__import__('os').system('true')", "expected COLUMN OP VALUE"),
    ("gpu_busy<lots", "'lots' is not a value for gpu_busy_fraction"),
    ("verdict<null", "null compares with = or != only"),
    # read as a fraction, 50 is 5000% and 0.12 a duration of 0.12 ns: every row once passed; a typo none
    ("gpu_busy<50", "gpu_busy_fraction is a fraction from 0 to 1: write 50% or 0.5"),
    ("step_p95>=0.12", "step_p95_ns is a duration: give its unit (ns, us, ms or s), e.g. 0.12ms"),
    ("verdict=gpu_bund", "'gpu_bund' is no verdict; one of: "),
    ("top_idle_cause=sync", "'sync' is no top_idle_cause; one of: host_sync"),
])
def test_a_bad_condition_is_one_usage_error(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_condition(text)


def test_cli_formats_failures_and_exit_codes(tmp_path: Path) -> None:
    src = _job(tmp_path / "src")
    (src / "jobB" / "rank1.pt.trace.json").write_bytes(b'{"traceEvents": [')
    runner = CliRunner()
    out = runner.invoke(cli, ["fleet", str(src), "-j", "1", "--sort", "rank"])
    assert isinstance(out.exception, BatchFailed) and out.exit_code == 1
    failures = [line for line in out.stderr.splitlines() if line.startswith("stepscope: error:")]
    assert len(failures) == 1 and "jobB/rank1.pt.trace.json (byte" in failures[0]
    assert "traces  4" in out.stdout and "failed  1" in out.stdout and "truncated JSON" in out.stdout
    doc = json.loads(runner.invoke(cli, ["fleet", str(src), "-j", "1", "--json", "--where", "error=null"]).stdout)
    assert len(doc["fleet"]) == 3 and set(doc["fleet"][0]) == set(FLEET_SCHEMA)
    csv = runner.invoke(cli, ["fleet", str(src), "-j", "1", "--csv", "--where", "verdict!=null"]).stdout
    assert csv.splitlines()[0].split(",")[:3] == ["run", "trace", "rank"] and len(csv.splitlines()) == 4
    pq = tmp_path / "fleet.parquet"
    out = runner.invoke(cli, ["fleet", str(src), "-j", "1", "--format", "parquet", "-o", str(pq)])
    written = pl.read_parquet(pq)
    assert written.height == 4 and written.schema == pl.Schema(FLEET_SCHEMA)
    assert written.filter(pl.col("error").is_not_null())["trace"].to_list() == ["rank1.pt.trace.json"]
    assert not list(tmp_path.glob(".fleet.parquet.*"))


def test_a_worker_killed_by_its_trace_fails_that_row_and_the_others_are_computed(tmp_path: Path) -> None:
    # GIVEN a fleet whose one trace kills the worker process that analyses it (SIGKILL, as the out-of-memory killer:
    # a sitecustomize in every process of the command) WHEN the table is computed on 2 workers THEN that trace's row
    # holds one line saying how (its retry alone dies too), every other row is computed, and the exit code is 1
    src = _job(tmp_path / "src")
    write_trace(src / "jobC", _rank(0, 50), "kill-me.pt.trace.json")
    env = killer_env(tmp_path / "site", "stepscope.analyze.fleet", "fleet_row")
    res = subprocess.run([sys.executable, "-m", "stepscope", "fleet", str(src), "-j", "2", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1, res.stderr
    rows = {r["path"]: r for r in json.loads(res.stdout)["fleet"]}
    killer = str(src / "jobC" / "kill-me.pt.trace.json")
    assert rows.pop(killer)["error"] == (f"{killer}: its worker process was killed by SIGKILL (what the "
                                         "out-of-memory killer sends: try fewer --jobs, or more memory)")
    assert len(rows) == 3 and all(r["error"] is None and r["verdict"] for r in rows.values())


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "parquet"], "--format parquet writes a file"),
    (["--json", "--csv"], "conflicting output formats"),
    (["--address", "auto"], "--address names a Ray cluster"),
    (["--desc"], "--desc orders by --sort COLUMN"),
])
def test_cli_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    out = CliRunner().invoke(cli, ["fleet", str(_job(tmp_path / "src")), *args])
    assert out.exit_code == 2 and message in out.output


def test_a_bad_where_fails_before_any_trace_is_read(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["fleet", str(tmp_path / "missing"), "--where", "nope=1"])
    assert isinstance(out.exception, UsageError) and "no column 'nope'" in str(out.exception)


@pytest.mark.corpus
def test_corpus_rows_agree_with_each_traces_summary(corpus: Path) -> None:
    for folder in ("kineto", "param"):
        result = fleet(corpus / "traces" / folder, jobs=2)
        assert result.failed == 0 and result.traces >= 4
        for row in result.fleet.iter_rows(named=True):
            own = verdict(load(Path(row["path"])))
            assert row["verdict"] == own.verdict.value, row["path"]
            for column, value in (("gpu_busy_fraction", own.gpu_busy_fraction), ("mfu_fraction", own.mfu_fraction),
                                  ("exposed_comm_fraction", own.exposed_comm_fraction)):
                assert row[column] == pytest.approx(value, nan_ok=True), (row["path"], column)
