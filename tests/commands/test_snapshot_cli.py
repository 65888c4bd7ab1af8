"""`stepscope snapshot` and `stepscope memory-timeline` from the command line."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import cli, main


def test_snapshot_table_json_and_activations(corpus: Path) -> None:
    path = corpus / "snapshots/decomfl/memory.pickle"
    runner = CliRunner()
    res = runner.invoke(cli, ["snapshot", str(path), "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "live at peak:" in res.stdout and "1.66 GiB" in res.stdout and "client.py:176 reset_model" in res.stdout
    data = json.loads(runner.invoke(cli, ["snapshot", str(path), "--json"]).stdout)
    assert data["peak_allocated_bytes"] == 1786608896 and data["note"] is None
    assert sum(r["live_bytes"] for r in json.loads(runner.invoke(cli, ["snapshot", str(path), "--json", "--top", "0"])
                                                   .stdout)["live_at_peak"]) == 1786608896
    act = runner.invoke(cli, ["snapshot", str(path), "--activations"])
    assert act.exit_code == 0 and "checkpoint saving estimate" in act.stdout
    csv = runner.invoke(cli, ["snapshot", str(path), "--csv"])
    assert csv.stdout.splitlines()[0].startswith("# ")  # every table, each after its name
    assert csv.stdout.splitlines()[1].startswith("device,trace_entries,trace_start_time_us")


def test_a_snapshot_without_history_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    res = CliRunner().invoke(cli, ["snapshot", str(path)])
    assert res.exit_code == 0 and "no allocation history (_record_memory_history was off)" in res.stdout


def test_memory_timeline_cli(corpus: Path) -> None:
    path = corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz"
    res = CliRunner().invoke(cli, ["memory-timeline", str(path), "--csv"])
    assert res.exit_code == 0 and res.stdout.splitlines()[1:3] == ["category,size_bytes,share_fraction",
                                                                  "activation,2592465920,0.8409364611962662"]
    table = CliRunner().invoke(cli, ["memory-timeline", str(path)])
    assert "peak total        2.87 GiB" in table.stdout


def test_memory_timeline_json_and_csv_hold_every_row_and_the_table_says_so(tmp_path: Path) -> None:
    # GIVEN an export of 1,000 rows
    path = tmp_path / "m.raw.json"
    path.write_text(json.dumps([[1000 * (i + 1), 2, 10 * (i % 7), 4] for i in range(1000)]))
    # WHEN it is shown as a table, as JSON and as CSV
    table = CliRunner().invoke(cli, ["memory-timeline", str(path)])
    data = json.loads(CliRunner().invoke(cli, ["memory-timeline", str(path), "--json"]).stdout)
    csv_out = CliRunner().invoke(cli, ["memory-timeline", str(path), "--csv", "--table", "timeline"]).stdout
    # THEN the table keeps 20 rows and says where the rest are; JSON and CSV hold all 1,000, numbered from 0
    assert table.exit_code == 0, table.output
    assert "timeline rows     20 of 1,000" in table.stdout and "(--json or --csv: every row)" in table.stdout
    assert len(table.stdout.split("\ntimeline:\n")[1].strip().splitlines()) == 2 + 20
    assert "more rows" not in table.stdout
    assert [r["row"] for r in data["timeline"]] == list(range(1000)) and data["timeline_rows"] == "every row"
    assert len(csv_out.splitlines()) == 1 + 1000 and csv_out.splitlines()[1].startswith("0,0,0,")


def test_memory_timeline_json_holds_htas_reference_row(corpus: Path) -> None:
    # GIVEN HTA's test file; WHEN shown as JSON; THEN its row 744 (the reference answer) is there, by number
    path = corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz"
    data = json.loads(CliRunner().invoke(cli, ["memory-timeline", str(path), "--json"]).stdout)
    assert len(data["timeline"]) == data["rows"] == 7717
    assert data["timeline"][744]["row"] == 744 and data["timeline"][744]["activation_bytes"] == 2618160128


@pytest.mark.parametrize(("args", "content", "needle"), [
    (["snapshot"], b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c"
                   b"\x04echo\x94\x85\x94R\x94.", "refusing to load os.system"),  # pickle of os.system("echo")
    (["snapshot"], pickle.dumps({"segments": [1]})[:-4], "truncated pickle"),
    (["snapshot"], b'{"traceEvents": []}', "is a Chrome trace, not a CUDA memory snapshot"),  # by content
    (["snapshot"], b"plain text", "not a Chrome trace (.json / .json.gz), CUDA memory snapshot"),
    (["snapshot"], pickle.dumps({"traceEvents": []}), "not a CUDA memory snapshot"),
    (["snapshot", "--device", "3"], pickle.dumps({"segments": [], "device_traces": [[]]}), "device 3 is not in"),
    (["memory-timeline"], b'{"traceEvents": []}', "is a Chrome trace, not an export_memory_timeline file"),
    (["memory-timeline"], b"[[1, 2], [3]]", "not a memory timeline export"),
    (["memory-timeline"], b"[[-1, 1, 100, 9]]", "event 0 has category 9, not one of torch's 0..7"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                         content: bytes, needle: str) -> None:
    path = tmp_path / "input.bin"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as info:
        main([args[0], str(path), *args[1:]])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and str(path) in err[0]


@pytest.mark.parametrize("command", ["snapshot", "memory-timeline"])
def test_an_empty_file_is_said_empty_not_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 command: str) -> None:
    # GIVEN a 0-byte file named like a trace THEN it is said to be empty (once: "is a Chrome trace", by its name)
    path = tmp_path / "memory.json"
    path.write_bytes(b"")
    with pytest.raises(SystemExit) as info:
        main([command, str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: is empty (0 bytes), not " in err[0]


def test_conflicting_formats_are_a_usage_error(corpus: Path) -> None:
    res = CliRunner().invoke(cli, ["snapshot", str(corpus / "snapshots/decomfl/memory.pickle"), "--json", "--csv"])
    assert res.exit_code == 2 and "conflicting output formats" in res.output


def test_a_directory_holding_one_snapshot_or_timeline_is_that_file(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A capture run's directory (or any) with one snapshot / one timeline export: the command reads it; none or
    several: one line saying so (exit 2), naming the ones found."""
    run = tmp_path / "run"
    (run / "rank0").mkdir(parents=True)
    (run / "rank0" / "snapshot.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    (run / "rank0" / "memory_timeline.raw.json").write_text("[[1, 0, 512, 2], [2, 0, 1024, 1]]")
    (run / "trace.json").write_text('{"traceEvents": []}')
    res = CliRunner().invoke(cli, ["snapshot", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["source"] == str(run / "rank0" / "snapshot.pickle")
    res = CliRunner().invoke(cli, ["memory-timeline", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["source"] == str(run / "rank0" / "memory_timeline.raw.json")

    (run / "snapshot_2.pkl").write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "trace.json").write_text('{"traceEvents": []}')
    for args, needle in (
            (["snapshot", str(run)],
             f"{run}: holds 2 CUDA memory snapshots (.pickle): pass one: rank0/snapshot.pickle, snapshot_2.pkl"),
            (["snapshot", str(empty)], f"{empty}: holds no CUDA memory snapshots"),
            (["memory-timeline", str(empty)], f"{empty}: holds no export_memory_timeline files")):
        with pytest.raises(SystemExit) as info:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and needle in err[0]
