"""`stepscope serving` end to end with click's CliRunner: the table, JSON and CSV of an SGLang server's trace,
one-line errors, the summary line and the report's section.

GIVEN an SGLang server's trace (tests/serving_traces.py) WHEN `stepscope serving` runs THEN every format
says the same iterations and phases; a training trace gets the note and empty tables, never an error.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from builders import kernel, runtime, step, trace, write_trace
from click.testing import CliRunner
from serving_traces import sglang_server

from stepscope.cli import cli, main


def _server(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "in", sglang_server(), "sglang_server.json")


def test_table(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["serving", str(_server(tmp_path))])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["engine", "sglang"] and "iterations found  8" in out.stdout
    assert "phases:" in lines and "iterations:" in lines
    decode = next(x for x in lines if x.startswith("decode "))
    assert decode.split()[:3] == ["decode", "4", "10.5"]  # 4 iterations, p50 10.5 µs
    assert "step[EXTEND bs=2 toks=1024]" in out.stdout


def test_json(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["serving", str(_server(tmp_path)), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["engine"], data["iterations_found"], data["mixed_iterations"], data["tokens"]) == (
        "sglang", 8, 1, 1593)
    assert [p["kind"] for p in data["phases"]] == ["prefill", "decode", "mixed", "idle", "all"]
    assert len(data["iterations"]) == 8 and data["iterations"][5]["prefill_tokens"] == 256


def test_csv_one_table_and_all_tables_to_files(tmp_path: Path) -> None:
    path = _server(tmp_path)
    runner = CliRunner()
    out = runner.invoke(cli, ["serving", str(path), "--csv", "--table", "iterations"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["kind"] for r in rows][:2] == ["prefill", "decode"] and rows[0]["wall_ns"] == "60000"
    target = tmp_path / "out" / "serving.csv"
    target.parent.mkdir()
    out = runner.invoke(cli, ["serving", str(path), "--csv", "-o", str(target)])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "out" / "serving.phases.csv").read_text().startswith("kind,iterations,p50_ns")
    assert (tmp_path / "out" / "serving.iterations.csv").exists()


def test_a_training_trace_gets_the_note(tmp_path: Path) -> None:
    doc = trace(step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=5, dur=2, correlation=1),
                kernel("sgemm", ts=10, dur=20, correlation=1))
    out = CliRunner().invoke(cli, ["serving", str(write_trace(tmp_path, doc)), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["iterations_found"] == 0 and data["iterations"] == [] and data["note"].startswith("no engine")


def test_bad_input_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')  # truncated
    with pytest.raises(SystemExit) as info:
        main(["serving", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith(f"stepscope: error: {bad}")


def test_conflicting_formats_are_a_usage_error(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["serving", str(_server(tmp_path)), "--json", "--csv"])
    assert out.exit_code == 2 and "conflicting output formats" in out.output


def test_summary_and_report_show_the_serving_iterations(tmp_path: Path) -> None:
    path = _server(tmp_path)
    runner = CliRunner()
    summary = runner.invoke(cli, ["summary", str(path)])
    assert summary.exit_code == 0, summary.output
    assert any(x.startswith("serving: SGLang, 8 iterations") for x in summary.stdout.splitlines())
    report = runner.invoke(cli, ["report", str(path), "-o", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "report" / "index.html").read_text()
    assert '<section id="serving">' in page and "Engine iterations" in page
    assert "step[MIXED bs=4 c=1 g=3" in page and "stepscope serving" in page
