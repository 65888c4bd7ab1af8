"""`stepscope ops`: torch's table text by default, raw JSON/CSV, --sort/--top/--group-by-shape, bad --sort."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import cpu_op, kernel, memory, runtime, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli, main


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(
        cpu_op("aten::linear", 0, 20, external_id=1, **{"Input Dims": [[4, 8], [8, 8]]}),
        cpu_op("aten::addmm", 2, 10, external_id=2),
        runtime("cudaLaunchKernel", 3, 2, correlation=7, external_id=2),
        kernel("sgemm", 30, 10, correlation=7), memory(4, 4096, total_allocated=4096, device=-1),
    ), "t.json")


def test_table_has_torchs_columns_and_footer(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["ops", str(_trace(tmp_path))])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[1].split()[:3] == ["Name", "Self", "CPU"] and "Self CUDA %" in lines[1] and "# of Calls" in lines[1]
    assert {lines[3].split()[0], lines[4].split()[0]} == {"sgemm", "aten::addmm"}  # by self device time
    assert "Self CPU time total: 20.000us" in res.stdout and "Self CUDA time total: 10.000us" in res.stdout


def test_json_csv_sort_top_and_shapes(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    runner = CliRunner()
    data = json.loads(runner.invoke(cli, ["ops", str(path), "--json", "--sort", "cpu_total_ns", "--top", "2"]).stdout)
    assert [r["name"] for r in data["ops"]] == ["aten::linear", "aten::addmm"]
    assert data["ops"][0]["cpu_total_ns"] == 20_000 and data["ops_total"] == 4
    csv = runner.invoke(cli, ["ops", str(path), "--csv", "--group-by-shape"]).stdout
    assert csv.splitlines()[0].startswith("name,kind,input_shapes,calls,self_cpu_ns")
    assert '"[[4, 8], [8, 8]]"' in csv
    shaped = runner.invoke(cli, ["ops", str(path), "--group-by-shape"]).stdout
    assert "Input Shapes" in shaped.splitlines()[1]


def test_bad_sort_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["ops", str(_trace(tmp_path)), "--sort", "nope"])
    assert exit_info.value.code == 2 and "cannot sort by 'nope'" in capsys.readouterr().err


def test_corpus_trace(corpus: Path) -> None:
    res = CliRunner().invoke(cli, ["ops", str(corpus / "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
                                   "--top", "5"])
    assert res.exit_code == 0, res.output
    assert "CUDA Mem" in res.stdout.splitlines()[1] and "(top 5 of" in res.stdout


def test_sort_by_flops_without_flops_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a trace recorded without with_flops=True (no op carries FLOPs)
    path = _trace(tmp_path)
    # WHEN ops is asked to sort by FLOPs
    with pytest.raises(SystemExit) as exit_info:
        main(["ops", str(path), "--sort", "flops"])
    # THEN a usage error (exit 2) in one line that says the trace has none, not a table sorted by name
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "the trace has no FLOPs" in err[0] and "with_flops=True" in err[0]


def test_sort_by_flops_with_flops(tmp_path: Path) -> None:
    # GIVEN a trace whose ops carry FLOPs
    path = write_trace(tmp_path, trace(cpu_op("aten::add", 0, 20, flops=10), cpu_op("aten::mm", 30, 5, flops=1000)))
    # WHEN ops sorts by them
    res = CliRunner().invoke(cli, ["ops", str(path), "--sort", "flops", "--json"])
    # THEN the most FLOPs first
    assert res.exit_code == 0, res.output
    assert [r["name"] for r in json.loads(res.stdout)["ops"]] == ["aten::mm", "aten::add"]


def test_an_event_without_a_name_is_a_row_not_a_crash(tmp_path: Path) -> None:
    doc = trace(cpu_op("aten::mm", ts=0, dur=20, external_id=1))
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
                               "args": {"device": 0, "stream": 7, "correlation": 1}})
    path = write_trace(tmp_path, doc)
    for args in ([], ["--group-by-shape"], ["--json"], ["--csv"]):
        res = CliRunner().invoke(cli, ["ops", str(path), *args])
        assert res.exit_code == 0, (args, res.output)
    assert "(no name)" in CliRunner().invoke(cli, ["ops", str(path)]).output
