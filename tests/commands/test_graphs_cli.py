"""`stepscope graphs` and `--graph-capture` on ops / flops / kernels, end to end with click's CliRunner.

GIVEN a graph-replayed run and a profile of its graph capture (given, or lying in the run directory's
capture_traces/) THEN `graphs` lists the graph, its replays and how many replayed kernels map to ops, and ops /
flops / kernels attribute the replayed kernels to those ops, saying which capture they used.
"""

from __future__ import annotations

import json
from pathlib import Path

from builders import write_trace
from click.testing import CliRunner
from graph_traces import MM_FLOPS, full_graph_capture, full_graph_run

from stepscope.cli import cli
from stepscope.errors import UsageError


def run_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    run = write_trace(tmp_path / "run", full_graph_run(), "graph_execution.json")
    capture = write_trace(tmp_path / "run" / "capture_traces", full_graph_capture(), "rank_0.pt.trace.json")
    return tmp_path / "run", run, capture


def run_alone(tmp_path: Path) -> Path:
    """The run's trace in a folder of its own: no capture profile beside it."""
    return write_trace(tmp_path / "alone", full_graph_run(), "graph_execution.json")


def test_graphs_finds_the_capture_in_the_run_directory_and_says_so(tmp_path: Path) -> None:
    directory, _, _ = run_dir(tmp_path)
    out = CliRunner().invoke(cli, ["graphs", str(directory)])
    assert out.exit_code == 0, out.output
    first = out.stdout.splitlines()[0]
    assert first.startswith("graph capture:") and "found in the run directory" in first and "6 of 6" in first
    assert "serve.py(10): decode" in out.stdout and "aten::mm" in out.stdout
    # every replayed kernel mapped: nothing to note, and no blank `note` row in the headline
    assert not any(line.split() == ["note"] for line in out.stdout.splitlines()), out.stdout


def test_flops_and_graphs_on_the_trace_file_take_the_capture_beside_it(tmp_path: Path) -> None:
    # GIVEN a run's trace file with its capture profile in its folder's capture_traces/
    _, run, _ = run_dir(tmp_path)
    runner = CliRunner()
    # WHEN flops and graphs are asked about the file THEN they map the replays as they do for the directory
    flops = runner.invoke(cli, ["flops", str(run), "--json"])
    assert flops.exit_code == 0, flops.output
    assert json.loads(flops.stdout)["model_flops"] == 3 * MM_FLOPS
    assert "found in the run directory" in flops.stderr
    graphs = runner.invoke(cli, ["graphs", str(run)])
    assert graphs.exit_code == 0 and graphs.stdout.startswith("graph capture:") and "6 of 6" in graphs.stdout


def test_flops_without_a_capture_says_the_replays_are_not_counted(tmp_path: Path) -> None:
    # GIVEN a run whose kernels are all graph-replayed, alone in its folder (no capture profile to find)
    run = run_alone(tmp_path)
    # WHEN its FLOPs are asked for THEN the note says the replays hold the kernel time and how to pass a capture
    out = CliRunner().invoke(cli, ["flops", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["model_flops"] == 0
    assert "graph-replayed kernels hold 100.0% of kernel time" in data["note"]
    assert "--graph-capture FILE" in data["note"]
    # AND with the capture given, no such note
    _, _, capture = run_dir(tmp_path)
    given = CliRunner().invoke(cli, ["flops", str(run), "--graph-capture", str(capture), "--json"])
    assert "graph-replayed" not in json.loads(given.stdout)["note"]


def test_graphs_json_without_a_capture(tmp_path: Path) -> None:
    run = run_alone(tmp_path)
    out = CliRunner().invoke(cli, ["graphs", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert (data["graph_launches"], data["graph_count"], data["replayed_kernels"]) == (3, 1, 6)
    assert data["mapped_kernels"] is None and len(data["replays"]) == 3


def test_ops_flops_kernels_take_the_graph_capture(tmp_path: Path) -> None:
    _, run, capture = run_dir(tmp_path)
    runner = CliRunner()
    ops = runner.invoke(cli, ["ops", str(run), "--graph-capture", str(capture), "--kind", "cpu_op"])
    assert ops.exit_code == 0, ops.output
    assert ops.stdout.startswith("graph capture:") and "aten::mm" in ops.stdout
    flops = runner.invoke(cli, ["flops", str(run), "--graph-capture", str(capture), "--json"])
    assert flops.exit_code == 0, flops.output
    assert json.loads(flops.stdout)["model_flops"] == 3 * MM_FLOPS
    assert "graph capture:" in flops.stderr  # JSON stays clean; the line goes to stderr
    kernels = runner.invoke(cli, ["kernels", str(run), "--graph-capture", str(capture), "--json"])
    by_op = {r["op"]: r["count"] for r in json.loads(kernels.stdout)["by_op"]}
    assert by_op == {"aten::mm": 3, "aten::relu": 3}
    plain = runner.invoke(cli, ["kernels", str(run_alone(tmp_path)), "--json"])
    assert {r["op"] for r in json.loads(plain.stdout)["by_op"]} == {"(graph replay)"}


def test_a_missing_capture_file_is_a_usage_error(tmp_path: Path) -> None:
    _, run, _ = run_dir(tmp_path)
    out = CliRunner().invoke(cli, ["graphs", str(run), "--graph-capture", str(tmp_path / "nope.json")])
    assert out.exit_code == 2 and "nope.json" in out.output


def test_summary_takes_the_graph_capture_given_or_found(tmp_path: Path) -> None:
    directory, run, capture = run_dir(tmp_path)
    runner = CliRunner()
    # GIVEN the run directory (its trace and capture_traces/): one trace's verdict, not a run of ranks
    found = runner.invoke(cli, ["summary", str(directory)])
    assert found.exit_code == 0, found.output
    assert found.stdout.startswith("graph capture:") and "6 of 6" in found.stdout.splitlines()[0]
    assert "replayed from graphs" in found.stdout
    # AND the capture given for the trace file: the same verdict, the line on stderr beside JSON
    given = runner.invoke(cli, ["summary", str(run), "--graph-capture", str(capture), "--json"])
    assert given.exit_code == 0, given.output
    assert "graph capture:" in given.stderr and json.loads(given.stdout)["verdict"] in found.stdout
    # AND the trace file alone (its capture found beside it) is the same verdict
    beside = runner.invoke(cli, ["summary", str(run)])
    assert beside.exit_code == 0 and beside.stdout.startswith("graph capture:"), beside.output
    # AND without a capture the trace is summarised as it is
    plain = runner.invoke(cli, ["summary", str(run_alone(tmp_path))])
    assert plain.exit_code == 0 and not plain.stdout.startswith("graph capture:")


def test_report_takes_the_graph_capture_given_or_found(tmp_path: Path) -> None:
    directory, run, capture = run_dir(tmp_path)
    runner = CliRunner()
    # GIVEN the run directory: one trace's report whose replayed kernels are the capture's ops
    found = runner.invoke(cli, ["report", str(directory), "-o", str(tmp_path / "found")])
    assert found.exit_code == 0, found.output
    page = (tmp_path / "found" / "index.html").read_text()
    assert "graph capture:" in page and "found in the run directory" in page and "6 of 6" in page
    assert "aten::mm" in page
    # AND the capture given for the trace file: the same mapping, and the command that reproduces it
    given = runner.invoke(cli, ["report", str(run), "-o", str(tmp_path / "given"), "--graph-capture", str(capture)])
    assert given.exit_code == 0, given.output
    page = (tmp_path / "given" / "index.html").read_text()
    assert "6 of 6" in page and "aten::mm" in page and f"--graph-capture {capture}" in page
    # AND without one, the replayed kernels have no op
    plain = runner.invoke(cli, ["report", str(run_alone(tmp_path)), "-o", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    page = (tmp_path / "plain" / "index.html").read_text()
    assert "graph capture:" not in page and "aten::mm" not in page
    # AND a capture for a batch of traces is a usage error
    batch = runner.invoke(cli, ["report", str(directory), "--batch", "-o", str(tmp_path / "b"),
                                "--graph-capture", str(capture)])
    assert isinstance(batch.exception, UsageError) and "leave out --batch" in str(batch.exception)


def test_a_dataset_is_not_taken_for_a_run_with_a_capture(tmp_path: Path) -> None:
    # GIVEN a dataset (Parquet, no raw trace in it) THEN looking for a capture profile in it finds none, quietly,
    # and summary and report read it as the dataset it is
    _, run, _ = run_dir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(run), "-o", str(tmp_path / "ds"), "-q"]).exit_code == 0
    summary = runner.invoke(cli, ["summary", str(tmp_path / "ds")])
    assert summary.exit_code == 0, summary.output
    report = runner.invoke(cli, ["report", str(tmp_path / "ds"), "-o", str(tmp_path / "out")])
    assert report.exit_code == 0, report.output
