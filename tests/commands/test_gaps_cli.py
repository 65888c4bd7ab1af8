"""`stepscope gaps`, `transfers`, `overlap` from the command line, including a CPU-only trace."""

from __future__ import annotations

import json
from pathlib import Path

from builders import cpu_op, kernel, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(step(1, ts=0, dur=100), kernel("a", ts=0, dur=10),
                                       kernel("b", ts=60, dur=40)), "t.json")


def test_gaps_min_gap_json_and_csv(tmp_path: Path) -> None:
    runner = CliRunner()
    path = _trace(tmp_path)
    res = runner.invoke(cli, ["gaps", str(path), "--min-gap", "20us"])
    assert res.exit_code == 0 and "idle by cause:" in res.stdout
    data = json.loads(runner.invoke(cli, ["gaps", str(path), "--json"]).stdout)
    assert data["idle_ns"] == 50_000 and data["gaps"][0]["dur_ns"] == 50_000
    csv = runner.invoke(cli, ["gaps", str(path), "--csv", "--table", "gaps", "--min-gap", "1ms"]).stdout.splitlines()
    assert csv[0].startswith("device,step,since_start_ns,dur_ns,cause") and len(csv) == 1
    table = runner.invoke(cli, ["gaps", str(path), "--device", "0"]).stdout
    assert "start_ns" not in table and "  start  " not in table  # trace-clock times only in JSON/CSV
    assert "no GPU work on device 3" in runner.invoke(cli, ["gaps", str(path), "--device", "3"]).stdout
    bad = runner.invoke(cli, ["gaps", str(path), "--min-gap", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output


def test_cpu_only_trace_says_so(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(step(1, ts=0, dur=10), cpu_op("aten::add", ts=1, dur=2)), "cpu.json")
    runner = CliRunner()
    assert "no GPU work" in runner.invoke(cli, ["gaps", str(path)]).stdout
    assert "no memcpy events" in runner.invoke(cli, ["transfers", str(path)]).stdout
    res = runner.invoke(cli, ["overlap", str(path)])
    assert res.exit_code == 0 and "no GPU work" in res.stdout


def test_transfers_and_overlap_on_a_corpus_trace(corpus: Path) -> None:
    path = corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    runner = CliRunner()
    res = runner.invoke(cli, ["transfers", str(path), "--top", "2"])
    assert res.exit_code == 0 and "pageable copies  12" in res.stdout
    res = runner.invoke(cli, ["overlap", str(path), "--json"])
    assert res.exit_code == 0 and 0.5 < json.loads(res.stdout)["gpu_busy_fraction"] < 0.6
