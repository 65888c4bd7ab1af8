"""`stepscope kernels` end to end with click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from builders import cpu_op, kernel, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def test_kernels_table_json_and_category(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(kernel("volta_sgemm_64x64_nt", ts=0, dur=10),
                                       kernel("ncclKernel_AllReduce", ts=20, dur=5)))
    out = CliRunner().invoke(cli, ["kernels", str(path)])
    assert out.exit_code == 0, out.output
    assert "by category" in out.output and "volta_sgemm_64x64_nt" in out.output
    data = json.loads(CliRunner().invoke(cli, ["kernels", str(path), "--json", "--by", "category"]).output)
    assert {r["category"] for r in data["by_category"]} == {"gemm", "communication"}
    assert data["by_name"] == []


def test_kernels_cpu_only(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    out = CliRunner().invoke(cli, ["kernels", str(path)])
    assert out.exit_code == 0 and "no GPU kernels" in out.output
    # --json is JSON there too (it printed the table's sentence), with nothing in it
    data = json.loads(CliRunner().invoke(cli, ["kernels", str(path), "--json"]).output)
    assert (data["gpu_events"], data["by_name"], data["by_category"]) == (0, [], [])


def test_kernels_measured_by_the_range_profiler_are_not_a_cpu_only_trace(tmp_path: Path) -> None:
    # GIVEN a trace recorded with profiler_metrics: its kernels are cuda_profiler_range events, not kernel events
    ranges = [{"ph": "X", "cat": "cuda_profiler_range", "name": "sgemm", "pid": 0, "tid": 0, "ts": ts, "dur": 121,
               "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 8}} for ts in (10, 200, 400)]
    path = write_trace(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=5), *ranges))
    # WHEN `kernels` runs on it
    out = CliRunner().invoke(cli, ["kernels", str(path)])
    # THEN it says the 3 kernels were measured, not timed, and where their counters are; not "CPU-only"
    assert out.exit_code == 0, out.output
    assert "CPU-only" not in out.output and "measured 3 kernels" in out.output
    assert "stepscope counters" in out.output


def test_kernels_csv_follows_by(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(kernel("volta_sgemm_64x64_nt", ts=0, dur=10)))
    by_name = CliRunner().invoke(cli, ["kernels", str(path), "--csv"]).output
    assert "# by_name" in by_name and "# by_category" in by_name  # both tables, as the text shows
    assert by_name.splitlines()[by_name.splitlines().index("# by_name") + 1].startswith("name,category,count")
    by_cat = CliRunner().invoke(cli, ["kernels", str(path), "--csv", "--by", "category"]).output
    assert by_cat.splitlines()[0].startswith("category,count") and "by name" not in by_cat
    text = CliRunner().invoke(cli, ["kernels", str(path), "--by", "category"]).output
    assert "by category" in text and "by name" not in text
