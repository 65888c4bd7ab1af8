"""`stepscope info`: table by default, --json / --csv for scripts, -o writes a file, conflicting flags fail."""

from __future__ import annotations

import json
from pathlib import Path

from builders import kernel, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(step(1, ts=0, dur=10), kernel("k", ts=1, dur=2)), "t.json.gz", gz=True)


def test_table_json_csv_and_output_file(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    runner = CliRunner()
    table = runner.invoke(cli, ["info", str(path)])
    assert table.exit_code == 0, table.output
    assert "steps found" in table.stdout and "counts by kind:" in table.stdout and "kernel" in table.stdout
    as_json = json.loads(runner.invoke(cli, ["info", str(path), "--json"]).stdout)
    assert as_json["steps_found"] == 1 and as_json["counts_by_kind"][0]["kind"] in ("kernel", "user_annotation")
    csv = runner.invoke(cli, ["info", str(path), "--csv"]).stdout
    assert csv.splitlines()[:2] == ["# counts_by_kind", "kind,events,total_dur_ns"]  # then the other tables
    out = tmp_path / "info.json"
    res = runner.invoke(cli, ["info", str(path), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["events"] == 2


def test_conflicting_formats_are_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["info", str(_trace(tmp_path)), "--json", "--csv"])
    assert res.exit_code == 2 and "conflicting output formats" in res.output
