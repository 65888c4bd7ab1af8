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


def _slow_shown_apart(texts: list[str], shown: list[str]) -> bool:
    """The oracle: texts that differ are shown differently, and each shown text fits a cell."""
    from stepscope.reports.text import MAX_CELL

    pairs = {(a, b) for a, b in zip(texts, shown, strict=True)}
    return all(len(b) <= MAX_CELL for _, b in pairs) and len({b for _, b in pairs}) == len({a for a, _ in pairs})


def test_texts_cut_to_one_cell_stay_apart() -> None:
    import polars as pl

    from stepscope.reports.text import MAX_CELL, cut_texts, render_frame

    # GIVEN two kernels whose names differ only in a template argument past the cut (HTA's trace_diff pair)
    head = "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<float, float, float, "
    args = ">(at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, int>, float, float, long)"
    five, two = head + "5ul" + args, head + "2ul" + args
    short = "volta_sgemm_128x32_nt"
    texts = [five, short, two, five]
    shown = cut_texts(texts)
    # THEN each shows its start and the part where it differs; a text cut alone, or short, is as before
    assert _slow_shown_apart(texts, shown) and shown[0] == shown[3] and shown[1] == short
    assert shown[0].startswith(five[:40] + "…") and "float, 5ul>(at::" in shown[0] and "float, 2ul>(at::" in shown[2]
    alone = "x" * (MAX_CELL + 5)
    assert cut_texts([alone, short]) == ["x" * (MAX_CELL - 1) + "…", short]
    # three that differ at different places past the cut, one of them near its end
    base = "k" * 150
    trio = [base, base[:120] + "A" + base[121:], base[:149] + "B"]
    assert _slow_shown_apart(trio, cut_texts(trio))
    assert cut_texts(trio)[2].endswith("kB")  # the difference at the very end: shown, no "…" after it
    # AND a table shows them apart, with nulls as "-"
    table = render_frame(pl.DataFrame({"name": [five, two, None], "count": [1, 2, 3]}))
    assert "5ul>(at::" in table and "2ul>(at::" in table and table.splitlines()[-1].startswith("-")


def test_every_top_option_takes_0_for_all_and_means_it(tmp_path: Path) -> None:
    # GIVEN every command's --top THEN each accepts 0 and says it means all (kernels, transfers, critical-path and
    # counters once refused it while gaps, ops, comm and ranks took it)
    import click

    ctx = click.Context(cli)
    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    tops = {name: p for name, c in commands.items() if c is not None for p in c.params if p.name == "top"}
    assert {"kernels", "gaps", "ops", "transfers", "critical-path", "counters", "comm", "ranks"} <= tops.keys()
    for name, param in tops.items():
        assert isinstance(param.type, click.IntRange) and param.type.min == 0, name
        assert "0" in (getattr(param, "help", None) or ""), name
    # WHEN kernels lists its names with --top 0 THEN every one is there (a --top 1 keeps one)
    path = _trace(tmp_path)
    every = CliRunner().invoke(cli, ["kernels", str(path), "--top", "0", "--csv", "--table", "by_name"])
    one = CliRunner().invoke(cli, ["kernels", str(path), "--top", "1", "--csv", "--table", "by_name"])
    assert every.exit_code == one.exit_code == 0, every.output
    assert len(every.stdout.splitlines()) == 3 and len(one.stdout.splitlines()) == 2


def test_every_option_of_every_command_says_what_it_does() -> None:
    # GIVEN every command (and subcommand) THEN each of its options has help text (capture's schedule options
    # --wait/--warmup/--active/--repeat once had none)
    import click

    ctx = click.Context(cli)
    missing: list[str] = []

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, [*prefix, name])
            elif command is not None:
                missing.extend(f"{' '.join([*prefix, name])} {p.opts[0]}" for p in command.params
                               if isinstance(p, click.Option) and not p.hidden and not p.help)

    walk(cli, [])
    assert missing == []
