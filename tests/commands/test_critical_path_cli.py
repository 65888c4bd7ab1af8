"""`stepscope critical-path` and `stepscope whatif` end to end with CliRunner on traces with known paths: the
table, --json (every segment), --csv, and one-line errors for bad options."""

from __future__ import annotations

import json
from pathlib import Path

import critical_path_traces as cp
import pytest
from builders import write_trace
from click.testing import CliRunner
from conftest import refused

from stepscope.cli import cli


def test_critical_path_table_json_and_csv(tmp_path: Path) -> None:
    path = write_trace(tmp_path, cp.sync_serializes(), "t.json")
    out = CliRunner().invoke(cli, ["critical-path", str(path)])
    assert out.exit_code == 0, out.output
    assert "bound by" in out.output and "top contributors:" in out.output and "path of step 1 (in order):" in out.output
    assert "sgemm_128x64_nn" in out.output and "cudaDeviceSynchronize" in out.output
    data = json.loads(CliRunner().invoke(cli, ["critical-path", str(path), "--json"]).output)
    assert data["bound_by"] == "kernel" and data["steps_found"] == 1
    assert [s["name"] for s in data["segments"]][2:5] == ["(launch latency)", "sgemm_128x64_nn",
                                                          "cudaDeviceSynchronize"]
    assert sum(s["dur_ns"] for s in data["segments"]) == data["steps"][0]["wall_ns"] == 200_000
    csv = CliRunner().invoke(cli, ["critical-path", str(path), "--csv", "--table", "segments"]).output
    assert csv.splitlines()[0] == "step,seq,name,kind,category,lane,start_ns,dur_ns,event_id,edge_type"
    assert len(csv.splitlines()) == 1 + len(data["segments"])


def test_critical_path_bad_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path, cp.gpu_bound(), "t.json")
    assert "no step 7 in this trace" in refused(["critical-path", str(path), "--step", "7"], capsys)


def test_whatif_reports_measured_predicted_and_the_residual(tmp_path: Path) -> None:
    path = write_trace(tmp_path, cp.gpu_bound(), "t.json")
    out = CliRunner().invoke(cli, ["whatif", str(path), "--speedup", "gemm=2"])
    assert out.exit_code == 0, out.output
    assert "--speedup gemm=2" in out.output and "replay residual" in out.output
    data = json.loads(CliRunner().invoke(cli, ["whatif", str(path), "--speedup", "gemm=2", "--json"]).output)
    assert data["measured_mean_ns"] == 180_000 and data["predicted_mean_ns"] == 100_000
    assert data["saving_ns"] == 80_000 and data["replay_residual_fraction"] == 0.0
    assert data["steps"] == [{"step": 1, "measured_ns": 180_000, "replay_ns": 180_000, "predicted_ns": 100_000,
                              "saving_ns": 80_000, "saving_fraction": pytest.approx(80 / 180)}]
    both = json.loads(CliRunner().invoke(cli, ["whatif", str(path), "--launch-overhead", "0", "--no-sync",
                                               "--pinned", "--no-data-loading", "--json"]).output)
    assert both["changes"] == ["--no-data-loading", "--launch-overhead 0us", "--no-sync", "--pinned"]


def test_whatif_bad_speedup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path, cp.gpu_bound(), "t.json")
    assert "expected CATEGORY=FACTOR" in refused(["whatif", str(path), "--speedup", "gemm"], capsys)
    assert "FACTOR > 0" in refused(["whatif", str(path), "--speedup", "gemm=0"], capsys)


def test_annotation_windows_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builders import annotation

    doc = cp.gpu_bound()
    doc["traceEvents"].append(annotation("[param|model|forward]", ts=2, dur=20))
    path = write_trace(tmp_path, doc, "t.json")
    args = ["whatif", str(path), "--annotation", r"\[param\|model", "--json"]
    data = json.loads(CliRunner().invoke(cli, args).output)
    assert data["window_kind"] == r"annotation \[param\|model" and data["replay_residual_fraction"] == 0.0
    assert data["steps"][0]["measured_ns"] == 168_000  # 2 µs to the end of the last GEMM it launched, 170 µs
    assert "is not a valid regex" in refused(["critical-path", str(path), "--annotation", "("], capsys)


def test_json_is_the_document_every_command_writes(tmp_path: Path) -> None:
    # --json writes its tables with polars (a long step has ~0.5M segments); the document is the shared renderer's
    from stepscope.analyze import load
    from stepscope.analyze.critical_path import critical_path
    from stepscope.reports.text import render_json

    path = write_trace(tmp_path, cp.two_streams(), "t.json")
    ours = json.loads(CliRunner().invoke(cli, ["critical-path", str(path), "--json"]).output)
    assert ours == json.loads(render_json(critical_path(load(path))))


def _run_dir(tmp_path: Path) -> Path:
    for rank in (0, 1):
        write_trace(tmp_path / "run", cp.late_rank_run(rank, late_by="data_loading"), f"rank{rank}.pt.trace.json")
    return tmp_path / "run"


def test_critical_path_of_a_run_table_json_and_csv(tmp_path: Path) -> None:
    # GIVEN a 2-rank run whose rank 1 loads data before the all_reduce WHEN its critical path is asked for
    run = str(_run_dir(tmp_path))
    out = CliRunner().invoke(cli, ["critical-path", run])
    assert out.exit_code == 0, out.output
    # THEN the table says the run's ranks and shows the path crossing to rank 1
    assert "rank count" in out.output and "rank path" in out.output and "wait for rank 1 (all_reduce)" in out.output
    data = json.loads(CliRunner().invoke(cli, ["critical-path", run, "--json"]).output)
    assert data["rank_count"] == 2 and data["steps_found"] == 1 and data["collectives_joined"] == 1
    assert {s["rank"] for s in data["segments"]} == {0, 1}
    assert sum(s["dur_ns"] for s in data["segments"]) == data["steps"][0]["wall_ns"] == 300_000
    assert any(t["rank"] == 1 and t["kind"] == "data_loading" for t in data["top"])
    csv = CliRunner().invoke(cli, ["critical-path", run, "--csv", "--table", "segments"]).output
    assert csv.splitlines()[0] == "step,seq,rank,name,kind,category,lane,start_ns,dur_ns,event_id,edge_type"
    assert len(csv.splitlines()) == 1 + len(data["segments"])


def test_whatif_of_a_run_with_one_rank_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(_run_dir(tmp_path))
    data = json.loads(CliRunner().invoke(cli, ["whatif", run, "--rank", "1", "--no-data-loading", "--json"]).output)
    assert data["changes"] == ["--rank 1", "--no-data-loading"] and data["replay_residual_fraction"] == 0.0
    assert (data["measured_mean_ns"], data["predicted_mean_ns"]) == (300_000, 200_000)
    out = CliRunner().invoke(cli, ["whatif", run, "--overlap-comm"])
    assert out.exit_code == 0 and "--overlap-comm" in out.output
    csv = CliRunner().invoke(cli, ["whatif", run, "--overlap-comm", "--csv", "--table", "steps"]).output
    assert csv.splitlines()[1] == "1,300000,300000,275000,25000,0.08333333333333333"
    one = write_trace(tmp_path, cp.gpu_bound(), "t.json")
    assert "--rank picks one rank of a run" in refused(["whatif", str(one), "--rank", "1", "--no-sync"], capsys)
    assert "the run's ranks are 0, 1" in refused(["whatif", run, "--rank", "4", "--no-sync"], capsys)
