"""The multi-rank section of a run's report: the stacked bars' parts add up to each rank's step, the heatmap's
matrix is the waits table, the section holds the three figures, the straggler line and a link per rank, and the
page fits a laptop screen in a real browser."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from stepscope.analyze.run_summary import RunAnalysis, run_analysis
from stepscope.cli import cli
from stepscope.reports.run_figures import STEP_PARTS, rank_parts, wait_matrix
from stepscope.reports.run_page import run_section, straggler_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))
from test_ranks import write_run  # noqa: E402 - the 3-rank run of tests/analyze/test_ranks.py


def _late(tmp_path: Path) -> tuple[Path, RunAnalysis]:
    run = write_run(tmp_path / "run", {"host_delay": 150})
    return run, run_analysis(run, cache_dir=tmp_path / "cache")


def test_stacked_parts_add_up_to_each_ranks_step(tmp_path: Path) -> None:
    _, a = _late(tmp_path)
    parts = rank_parts(a.ranks.ranks)
    total = parts.select(pl.sum_horizontal(*(c for c, _, _ in STEP_PARTS))).to_series()
    assert total.to_list() == parts["wall_ns"].to_list()  # one device per rank: compute + comm + idle = the step
    on_time = parts.filter(pl.col("rank") == 0).row(0, named=True)
    # rank 0: compute 250 µs, comm [400, 700) with 50 µs under compute, idle 500 µs (test_ranks' numbers)
    assert (on_time["compute_only_ns"], on_time["hidden_comm_ns"], on_time["exposed_comm_ns"], on_time["idle_ns"]) \
        == (200_000, 50_000, 250_000, 500_000)


def test_the_heatmap_is_the_waits_table(tmp_path: Path) -> None:
    _, a = _late(tmp_path)
    matrix, labels = wait_matrix(a.collectives.waits, a.collectives.calls)
    assert labels == ["#1 all_reduce"]
    for r in a.collectives.waits.iter_rows(named=True):  # every (call, rank) cell, one by one
        assert matrix.filter(pl.col("rank") == r["rank"])[str(r["call"])].item() == r["wait_ns"]
    assert matrix["1"].to_list() == [150_000, 150_000, 0]


def test_the_section_has_figures_straggler_and_links(tmp_path: Path) -> None:
    _, a = _late(tmp_path)
    section = run_section(a, {0: "rank0/index.html", 2: "rank2/index.html"}, "run/")
    assert len(section.figures) == 3 and section.lead[0].startswith("straggler: ")
    assert straggler_line(a.summary) == (
        "Straggler: rank 2, late at the collectives: the others wait 300 µs per step for it (15.0% of their step), "
        "more than for any other rank; cause: host delay at train.py(5): slow_host.")
    table = section.tables[0]
    assert [row[0].href for row in table.rows] == ["rank0/index.html", None, "rank2/index.html"]
    assert [row[0].text for row in table.rows] == ["rank 0", "rank 1", "rank 2  (straggler)"]


def test_a_run_report_computes_each_ranks_verdict_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a 3-rank run WHEN its traces are reported THEN each rank's verdict is computed once (for its page; the run's
    # verdict takes the pages' own) and the run section says what run_analysis alone says
    from stepscope.analyze import summary

    run, alone = _late(tmp_path)
    calls: list[int] = []
    verdict = summary.verdict

    def counted(*args: object, **kwargs: object) -> summary.SummaryResult:
        calls.append(1)
        return verdict(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(summary, "verdict", counted)
    monkeypatch.setattr("stepscope.analyze.bundle.verdict", counted)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["report", str(run), "-o", str(out), "--batch"])  # (ranks by distributedInfo)
    assert result.exit_code == 0, result.output
    assert len(calls) == 3
    page = (out / "index.html").read_text(encoding="utf-8")
    line = straggler_line(alone.summary)
    assert line is not None and line.replace("Straggler: ", "") in page.replace("&#39;", "'")


def test_run_page_fits_a_laptop_screen(tmp_path: Path) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not on PATH (apt-get install chromium) : the real-browser check cannot run")
    from test_browser import overflows

    run, _ = _late(tmp_path)
    done = CliRunner().invoke(cli, ["report", str(run), "--batch", "-o", str(tmp_path / "report")])
    assert done.exit_code == 0, done.output
    page = tmp_path / "report" / "index.html"
    assert 'id="run-verdict"' in page.read_text()
    assert overflows(exe, page, tmp_path / "profile") == []


def test_bandwidth_axis_reads_as_plain_numbers(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """busbw ticks read 0.1, 10 (not 10⁻¹); on an axis spanning under a decade the minor ticks are labelled too."""
    from matplotlib.figure import Figure

    from stepscope.analyze.collectives import collectives
    from stepscope.reports import run_figures

    drawn: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        drawn.append(fig)
        return b""

    monkeypatch.setattr(run_figures, "to_png", keep)
    coll = collectives(corpus / "traces/param/dlrm_kineto")
    narrow = coll.calls.filter(pl.col("collective") == "all_reduce", pl.col("message_bytes") > 100_000)
    for calls in (coll.calls, narrow):
        run_figures.busbw_figure(dataclasses.replace(coll, calls=calls))
    for fig in drawn:
        fig.canvas.draw()
    wide, close = (fig.axes[0].yaxis for fig in drawn)
    assert {"0.1", "1", "10"} <= {t.get_text() for t in wide.get_majorticklabels()}
    assert not any(t.get_text() for t in wide.get_minorticklabels())
    labels = [t.get_text() for t in close.get_minorticklabels() if t.get_text()]
    assert len(labels) >= 3 and all(float(x) > 0 for x in labels)  # "24", "26", …: plain numbers
