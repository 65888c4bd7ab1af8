"""`stepscope steps` end to end with click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from builders import cpu_op, kernel, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def test_steps_table_and_json(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(
        step(1, ts=0, dur=100), cpu_op("aten::mm", ts=10, dur=10, external_id=1),
        runtime("cudaLaunchKernel", ts=12, dur=2, correlation=1, external_id=1),
        kernel("sgemm", ts=20, dur=50, correlation=1),
    ))
    out = CliRunner().invoke(cli, ["steps", str(path)])
    assert out.exit_code == 0, out.output
    assert "data_loading" in out.output and "start_ns" not in out.output
    assert "idle by cause:" in out.output and "idle_launch_overhead" in out.output
    data = json.loads(CliRunner().invoke(cli, ["steps", str(path), "--json"]).output)
    assert data["steps"][0]["gpu_busy_ns"] == 50_000 and data["steps"][0]["start_ns"] == 0
    idle = data["idle_by_cause"][0]  # idle 0-20 and 70-100 µs of the 100 µs step, every µs to some cause
    assert idle["step"] == 1 and sum(v for k, v in idle.items() if k != "step") == 50_000


def test_steps_without_profiler_steps(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    out = CliRunner().invoke(cli, ["steps", str(path)])
    assert out.exit_code == 0 and "no ProfilerStep" in out.output
    # AND --json is JSON still (once the same sentence as text, which no script could read): no steps, the reason
    data = json.loads(CliRunner().invoke(cli, ["steps", str(path), "--json"]).output)
    assert data["steps_found"] == 0 and data["steps"] == [] and data["note"].startswith("no ProfilerStep#N spans")
