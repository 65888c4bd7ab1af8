"""`stepscope transfers`: table, JSON, CSV and --top on a synthetic trace with one synchronous pageable copy."""

from __future__ import annotations

import json
from pathlib import Path

from builders import cpu_op, kernel, memcpy, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(
        step(1, ts=0, dur=100),
        cpu_op("aten::copy_", ts=5, dur=40),
        runtime("cudaMemcpy", ts=10, dur=30, correlation=1),
        memcpy("HtoD", ts=20, dur=10, nbytes=1_000_000, correlation=1),
        runtime("cudaMemcpyAsync", ts=50, dur=2, correlation=2),
        memcpy("DtoH", ts=60, dur=20, nbytes=500_000, correlation=2, src="Device", dst="Pinned"),
        runtime("cudaLaunchKernel", ts=53, dur=2, correlation=3),
        kernel("k", ts=70, dur=30, correlation=3),
    ), "t.json")


def test_transfers_json_exact(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["transfers", str(_trace(tmp_path)), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["copies_total"] == 2 and data["pageable_copies"] == 1 and data["sync_copies"] == 1
    assert data["copied_bytes"] == 1_500_000 and data["copy_time_ns"] == 30_000
    assert data["cpu_blocked_ns"] == 30_000                       # only the synchronous cudaMemcpy blocks
    assert data["exposed_ns"] == 10_000 + 10_000                  # DtoH [60,80) half hidden by kernel [70,100)
    by_dir = {r["direction"]: r for r in data["by_direction"]}
    assert by_dir["HtoD"]["gbps"] == 100.0 and by_dir["DtoH"]["gbps"] == 25.0


def test_transfers_table_top_and_csv(tmp_path: Path) -> None:
    runner = CliRunner()
    path = _trace(tmp_path)
    res = runner.invoke(cli, ["transfers", str(path), "--top", "1"])
    assert res.exit_code == 0 and "by direction:" in res.stdout and "pageable copies  1" in res.stdout
    worst = res.stdout.split("worst:")[1].split("copies:")[0]
    assert "HtoD" in worst and "DtoH" not in worst
    csv = runner.invoke(cli, ["transfers", str(path), "--csv", "--table", "copies"]).stdout.splitlines()
    assert len(csv) == 3 and "direction" in csv[0]
    every = runner.invoke(cli, ["transfers", str(path), "--top", "0"])  # 0: every copy, as in gaps and ops
    assert every.exit_code == 0
    worst = every.stdout.split("worst:")[1].split("copies:")[0]
    assert "HtoD" in worst and "DtoH" in worst
