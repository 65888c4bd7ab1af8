"""`stepscope summary` end to end with click's CliRunner."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from builders import annotation, cpu_op, kernel, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli
from stepscope.reports.units import human_ns


def test_summary_text_and_json(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(
        step(1, ts=0, dur=100), annotation("enumerate(DataLoader)#It.__next__", 0, 30),
        runtime("cudaLaunchKernel", ts=29, dur=1, correlation=1), kernel("sgemm", ts=30, dur=70, correlation=1),
    ))
    out = CliRunner().invoke(cli, ["summary", str(path)])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("verdict: data_loading_bound") and "where to look" in out.output
    assert f"1 step, {human_ns(100_000)} in all" in out.output and "exposed data loading        30.0%" in out.output
    assert "GPU busy                    70.0%" in out.output and "GPU idle, by cause:" in out.output
    data = json.loads(CliRunner().invoke(cli, ["summary", str(path), "--json"]).output)
    assert data["verdict"] == "data_loading_bound" and data["per_step"][0]["step"] == 1


def test_a_directory_of_one_trace_is_that_trace(tmp_path: Path) -> None:
    # GIVEN a directory holding one trace (as resnet50_num_workers_0/ does)
    doc = trace(step(1, ts=0, dur=100), annotation("enumerate(DataLoader)#It.__next__", 0, 30),
                runtime("cudaLaunchKernel", ts=29, dur=1, correlation=1), kernel("sgemm", ts=30, dur=70, correlation=1))
    path = write_trace(tmp_path / "one", doc)
    by_file = CliRunner().invoke(cli, ["summary", str(path), "--predict"])
    by_dir = CliRunner().invoke(cli, ["summary", str(path.parent), "--predict"])
    # THEN its summary is the trace's own, evidence and predictions included, not a run of one rank
    assert by_dir.exit_code == 0, by_dir.output
    assert by_dir.output == by_file.output and "--no-data-loading" in by_dir.output
    assert "one rank" not in by_dir.output


def test_summary_says_how_close_the_call_was(tmp_path: Path) -> None:
    # GIVEN a step whose GPU is busy 59 of its 100 µs
    path = write_trace(tmp_path, trace(
        step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=0, dur=1, correlation=1),
        kernel("sgemm", ts=1, dur=59, correlation=1),
    ))
    # WHEN summary reads it, as text and as JSON
    out = CliRunner().invoke(cli, ["summary", str(path)])
    data = json.loads(CliRunner().invoke(cli, ["summary", str(path), "--json"]).output)
    # THEN launch_bound, 1 point from gpu_bound, which is the runner-up; overall and for the one step
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[:3] == ["verdict: launch_bound  (GPU busy < 60% of the step)",
                         "margin:  GPU busy 59.0% < 60%: 1.0 points from gpu_bound",
                         "runner-up: gpu_bound  (otherwise, with GPU work in the trace)"]
    assert "closest step: 1 (launch_bound), GPU busy 59.0% < 60%: 1.0 points from gpu_bound" in lines
    assert data["runner_up"] == "gpu_bound" and data["runner_up_reason"] == "otherwise, with GPU work in the trace"
    assert data["margin"]["figure"] == "gpu_busy_fraction" and data["margin"]["towards"] == "gpu_bound"
    assert data["margin"]["threshold_fraction"] == 0.6 and abs(data["margin"]["margin_fraction"] - 0.01) < 1e-9
    assert data["per_step"][0]["runner_up"] == "gpu_bound"


def test_summary_cpu_only(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    out = CliRunner().invoke(cli, ["summary", str(path)])
    assert out.exit_code == 0 and "verdict: no_gpu" in out.output
    assert "GPU                         none recorded" in out.output and "GPU busy" not in out.output


def test_summary_and_overlap_count_the_same_sync_calls(tmp_path: Path) -> None:
    # GIVEN a ROCm step whose one synchronizing call is a blocking hipMemcpyWithStream (30% of the step)
    path = write_trace(tmp_path, trace(
        step(1, ts=0, dur=100), runtime("hipLaunchKernel", ts=1, dur=1, correlation=1),
        kernel("k", ts=2, dur=10, correlation=1), runtime("hipMemcpyWithStream", ts=20, dur=30),
    ))
    # WHEN summary and overlap read it
    summary = CliRunner().invoke(cli, ["summary", str(path), "--json"])
    overlap = CliRunner().invoke(cli, ["overlap", str(path), "--json"])
    # THEN both count it as the one sync call (blame.is_sync_runtime), 30 µs
    assert summary.exit_code == 0 and overlap.exit_code == 0, summary.output + overlap.output
    s, o = json.loads(summary.output), json.loads(overlap.output)
    assert s["sync_calls"] == o["sync_calls"] == 1
    assert s["sync_fraction"] == 0.3 and o["sync_ns"] == 30_000
    assert "sync calls (CPU)            30.0% (1 call)" in CliRunner().invoke(cli, ["summary", str(path)]).output


def damaged_doc() -> dict[str, object]:
    """A step whose events include one without a timestamp and two with negative durations."""
    no_ts = kernel("k2", ts=50, dur=10)
    del no_ts["ts"]
    return trace(step(1, ts=0, dur=100), kernel("k", ts=2, dur=90), no_ts, kernel("k3", ts=95, dur=-3),
                 cpu_op("aten::add", ts=3, dur=-5))


@pytest.mark.parametrize("command", ["summary", "flops", "overlap", "ops", "memory", "steps", "gaps", "kernels",
                                     "transfers", "critical-path", "whatif", "export", "report"])
def test_every_command_reads_a_damaged_trace_without_a_crash_or_a_warning(tmp_path: Path, command: str) -> None:
    # GIVEN a step whose events include ones without a timestamp (one a CPU op), negative durations and a CPU op
    # without a name (an event's "name" left out), its thread's first
    doc = damaged_doc()
    no_ts_op = cpu_op("aten::mul", ts=10, dur=5)
    no_ts_op["ts"] = "abc"
    unnamed = cpu_op("aten::relu", ts=1, dur=1)  # (the first op of its thread)
    del unnamed["name"]
    doc["traceEvents"] += [no_ts_op, unnamed]  # type: ignore[operator]
    path = write_trace(tmp_path, doc)
    # WHEN any command reads it (Python warnings raised as errors: numpy's "invalid value encountered in cast" of a
    # null start once reached the terminal) THEN it answers (`summary` and `flops` once ended in a polars traceback)
    out = ["-o", str(tmp_path / "out")] if command in ("export", "report") else []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = CliRunner().invoke(cli, [command, str(path), *out])
    assert result.exit_code == 0, (result.output, result.exception)


def test_summary_shows_the_warnings_of_a_damaged_trace(tmp_path: Path) -> None:
    # GIVEN a trace with an event without a timestamp and two negative durations
    path = write_trace(tmp_path, damaged_doc())
    # WHEN summary reads it, as a table and as JSON
    out = CliRunner().invoke(cli, ["summary", str(path)])
    data = json.loads(CliRunner().invoke(cli, ["summary", str(path), "--json"]).output)
    # THEN the verdict comes with the warnings `info` computes: code, count, detail
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("warnings:"))
    assert lines[start + 1].split() == ["code", "count", "detail"]
    assert any(line.split()[:2] == ["negative_durations", "2"] for line in lines[start + 3:start + 5])
    assert any(line.split()[:2] == ["missing_timestamps", "1"] for line in lines[start + 3:start + 5])
    assert {w["code"]: w["count"] for w in data["warnings"]} == {"negative_durations": 2, "missing_timestamps": 1}


def test_summary_of_a_clean_trace_has_no_warnings_block(tmp_path: Path) -> None:
    # GIVEN a clean trace
    path = write_trace(tmp_path, trace(step(1, ts=0, dur=100), kernel("k", ts=2, dur=90)))
    # WHEN summary reads it
    out = CliRunner().invoke(cli, ["summary", str(path)])
    # THEN no warnings block
    assert out.exit_code == 0 and "warnings:" not in out.output, out.output
