"""`stepscope summary` end to end with click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_summary_cpu_only(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    out = CliRunner().invoke(cli, ["summary", str(path)])
    assert out.exit_code == 0 and "verdict: no_gpu" in out.output
    assert "GPU                         none recorded" in out.output and "GPU busy" not in out.output
