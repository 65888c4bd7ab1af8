"""`stepscope info`: table by default, --json / --csv for scripts, -o writes a file, conflicting flags fail."""

from __future__ import annotations

import json
from pathlib import Path

from builders import annotation, kernel, step, trace, write_trace
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


def test_a_corrupt_duration_is_warned_of_as_a_clock_span(tmp_path: Path) -> None:
    # GIVEN a 100 µs step whose DataLoader call says it lasted 1e12 µs (11.6 days) THEN info warns, as it does of a
    # corrupt timestamp (the span of starts alone was 100 µs: no warning, and the figures moved silently)
    path = write_trace(tmp_path, trace(step(1, ts=0, dur=100), annotation(
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts=10, dur=1e12)))
    res = CliRunner().invoke(cli, ["info", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert "clock_span" in [w["code"] for w in json.loads(res.output)["warnings"]]
