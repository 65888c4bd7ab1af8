"""Output options that every analysis command shares: --csv (every table, or --table NAME), -o FILE."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import kernel, step, trace, write_trace
from click.testing import CliRunner
from conftest import refused

from stepscope.cli import cli

COMMANDS = ["gaps", "steps", "overlap", "kernels", "transfers", "info"]


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(step(1, ts=0, dur=100), kernel("a", ts=0, dur=10),
                                       kernel("b", ts=60, dur=40)), "t.json")


@pytest.mark.parametrize("command", COMMANDS)
def test_csv_writes_every_table_and_table_picks_one(tmp_path: Path, command: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path)
    runner = CliRunner()
    full = runner.invoke(cli, [command, str(path), "--csv"])
    assert full.exit_code == 0, full.output
    names = [line[2:] for line in full.stdout.splitlines() if line.startswith("# ")]
    if not names:  # a result of one table is plain CSV
        return
    one = runner.invoke(cli, [command, str(path), "--csv", "--table", names[-1]])
    assert one.exit_code == 0 and not one.stdout.startswith("# ")
    assert one.stdout == full.stdout.split(f"# {names[-1]}\n", 1)[1]  # the same rows as in the whole
    bad = refused([command, str(path), "--csv", "--table", "nope"], capsys)
    assert "no table 'nope'" in bad and names[0] in bad


def test_table_needs_csv(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["gaps", str(_trace(tmp_path)), "--json", "--table", "gaps"])
    assert res.exit_code == 2 and "--table picks one CSV table" in res.output


def test_csv_to_a_file_is_one_file_per_table(tmp_path: Path) -> None:
    path = _trace(tmp_path)
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(cli, ["gaps", str(path), "--csv", "-o", str(out)])
    assert res.exit_code == 0, res.output
    written = sorted(p.name for p in tmp_path.glob("out.*.csv"))
    assert written == ["out.devices.csv", "out.gaps.csv", "out.histogram.csv", "out.idle_by_cause.csv"]
    assert not out.exists()
    whole = CliRunner().invoke(cli, ["gaps", str(path), "--csv"]).stdout
    assert (tmp_path / "out.gaps.csv").read_text() in whole


def test_output_into_a_missing_or_read_only_directory_isrefused(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path)
    missing = tmp_path / "no" / "such" / "x.json"
    err = refused(["steps", str(path), "--json", "-o", str(missing)], capsys)
    assert str(missing) in err and "create it first" in err
    assert not (tmp_path / "no").exists()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere: nothing to refuse
        return
    err = refused(["steps", str(path), "--json", "-o", str(locked / "x.json")], capsys)
    assert "not writable" in err and list(locked.iterdir()) == []


def test_headline_sentences_are_wrapped_whole_and_an_empty_note_is_left_out() -> None:
    from stepscope.reports.text import MAX_CELL, render_headline

    long = "the first note, " + "long enough to wrap " * 8 + "END1"
    text = render_headline({"notes": [long, "a second note that ends with END2"], "note": "", "count": 3})
    lines = text.splitlines()
    assert lines[0].startswith("notes  the first note,") and "END1" in text and "END2" in text
    # a note's own continuation lines indented two more; the next note starts at the value's column
    assert lines[1].startswith("         wrap") and lines[2] == "       a second note that ends with END2"
    assert not any(line.split() == ["note"] for line in lines) and lines[-1].startswith("count  3")
    assert len(long) > MAX_CELL


def test_a_tables_last_text_column_is_shown_whole() -> None:
    import polars as pl

    from stepscope.reports.text import MAX_CELL, render_frame

    detail = "a warning's detail " * 10 + "END"
    name = "k" * (MAX_CELL + 20)
    text = render_frame(pl.DataFrame({"name": [name], "count": [3], "detail": [detail]}))
    assert detail in text  # the last column: nothing to its right to align
    assert name not in text and "k" * (MAX_CELL - 1) + "…" in text  # any other column: cut to MAX_CELL
