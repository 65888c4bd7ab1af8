"""`stepscope memory`: headline, tables, JSON; a trace without [memory] says so; --by-layer; raw timeline files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import cpu_op, memory, python_fn, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli, main

MIB = 1024 * 1024


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(
        step(3, 0, 100), python_fn("nn.Module: Linear_0", 5, 40), cpu_op("aten::addmm", 10, 20),
        memory(15, 8 * MIB, total_allocated=8 * MIB, total_reserved=10 * MIB, addr=1),
        memory(60, -8 * MIB, total_allocated=0, total_reserved=10 * MIB, addr=1),
        memory(70, 1 * MIB, total_allocated=1 * MIB, total_reserved=10 * MIB, addr=2),
    ), "t.json")


def test_table_and_json(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    res = CliRunner().invoke(cli, ["memory", str(path)])
    assert res.exit_code == 0, res.output
    assert "peak allocated  8 MiB" in res.stdout and "peak op         aten::addmm" in res.stdout
    assert "mem ops:" in res.stdout and "never freed:" in res.stdout and "timeline:" in res.stdout
    data = json.loads(CliRunner().invoke(cli, ["memory", str(path), "--json"]).stdout)
    assert data["peak_step"] == 3 and data["never_freed"][0]["alloc_bytes"] == MIB
    assert data["devices"][0]["peak_allocated_bytes"] == 8 * MIB


def test_a_2021_trace_says_never_freed_is_not_recorded_and_figures_are_relative(tmp_path: Path) -> None:
    # GIVEN a 2021-format trace: [memory] events with only Bytes (no totals, no Addr)
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": nbytes}} for ts, nbytes in ((1, MIB), (2, -MIB))]}))
    # WHEN its memory is shown as a table
    res = CliRunner().invoke(cli, ["memory", str(path)])
    # THEN the never-freed table says it is not recorded, not "(none)", and the note says the figures are relative
    assert res.exit_code == 0, res.output
    assert "never freed:\n  not recorded (the trace has no addresses)\n" in res.stdout
    assert "relative to the trace's start" in res.stdout


def test_never_freed_addresses_are_shown_in_hex(tmp_path: Path) -> None:
    # GIVEN a trace whose block at 0x55c4a0000000 is never freed
    path = write_trace(tmp_path, trace(memory(1, MIB, total_allocated=MIB, addr=0x55C4_A000_0000)), "t.json")
    # WHEN its memory is shown as a table and as JSON
    res = CliRunner().invoke(cli, ["memory", str(path)])
    data = json.loads(CliRunner().invoke(cli, ["memory", str(path), "--json"]).stdout)
    # THEN the address is hex in both, as `snapshot` shows addresses, not comma-grouped decimals
    assert res.exit_code == 0 and "0x55c4a0000000" in res.stdout and f"{0x55C4_A000_0000:,}" not in res.stdout
    assert data["never_freed"][0]["addr"] == "0x55c4a0000000"


def test_by_layer(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["memory", str(_trace(tmp_path)), "--by-layer", "--json"])
    data = json.loads(res.stdout)
    assert data["largest_layer"] == "Linear_0" and data["activations_bytes"] == 8 * MIB


def test_no_memory_events_is_said_plainly(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::mm", 0, 1)), "plain.json")
    res = CliRunner().invoke(cli, ["memory", str(path)])
    assert res.exit_code == 0 and "no [memory] events in this trace" in res.stdout
    res = CliRunner().invoke(cli, ["memory", str(path), "--by-layer"])
    assert res.exit_code == 0 and "no nn.Module frames in this trace" in res.stdout


def test_memory_timeline_export_is_read_by_category(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_memory"
    export = next(sample.glob("*.memory_timeline.raw.json.gz"))
    main_result = CliRunner().invoke(cli, ["memory", str(export)])
    assert main_result.exit_code == 0 and "at peak:" in main_result.stdout and "activation" in main_result.stdout
    raw = tmp_path / "memory_timeline.raw.json.gz"
    raw.write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", str(raw)])
    assert exit_info.value.code == 2 and "not a memory timeline export" in capsys.readouterr().err
