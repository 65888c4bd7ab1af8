"""stepscope diff BEFORE AFTER [-o OUT]."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import write_trace
from click.testing import CliRunner
from conftest import refused
from report_traces import gpu_doc

from stepscope.cli import cli
from stepscope.reports.html import _delta_cell
from stepscope.reports.units import human_bytes


def test_diff_text_and_html(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a", gpu_doc(1.0))
    b = write_trace(tmp_path / "b", gpu_doc(2.0))
    result = CliRunner().invoke(cli, ["diff", str(a), str(b), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "sgemm_128x64" in result.output and "10 µs" in result.output  # 2 x 5 µs more kernel time
    page = (tmp_path / "out" / "index.html").read_text()
    assert "What changed" in page and "&lt;script&gt;" in page
    assert "data:image/png;base64," in page  # the before/after figure
    assert "Median step 100 µs → 100 µs (+0.0%): about the same." in page  # the answer leads the page
    assert "Before and after" in page and "+20 µs (+66.7%)" in page  # self device 30 -> 50 µs (kernels 2x)


def test_the_same_trace_twice_says_so_and_a_tiny_change_is_not_zero(tmp_path: Path) -> None:
    # GIVEN one trace as BEFORE and as AFTER THEN the answer says they are the same, in the text and on the page
    a = write_trace(tmp_path / "a", gpu_doc(1.0))
    result = CliRunner().invoke(cli, ["diff", str(a), str(a), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "BEFORE and AFTER are the same trace (the same bytes), so every change is 0" in " ".join(
        result.output.split())  # (the headline wraps it)
    assert "BEFORE and AFTER are the same trace" in (tmp_path / "out" / "index.html").read_text()
    other = write_trace(tmp_path / "b", gpu_doc(2.0))
    assert "same trace" not in CliRunner().invoke(cli, ["diff", str(a), str(other)]).output
    # and a change that rounds to 0.0% keeps two digits (-128 KiB of 2.6 GiB), a real 0 stays 0.0%
    assert _delta_cell(2_791_636_480, 2_791_636_480 - 131_072, human_bytes, True).text == "-128 KiB (-0.0047%)"
    assert _delta_cell(100, 100, human_bytes, True).text == "0 B (+0.0%)"


def test_corpus_resnet_workers_html(corpus: Path, tmp_path: Path) -> None:
    k = corpus / "traces" / "kineto"
    result = CliRunner().invoke(cli, ["diff", str(k / "resnet50_num_workers_0"), str(k / "resnet50_num_workers_4"),
                                      "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "out" / "index.html").read_text()
    assert "Median step 177.4 ms → 126.7 ms (-28.6%): faster." in page
    assert "data loading bound → gpu bound" in page
    assert "+15.9 points" in page  # GPU busy per step 56.6% -> 72.6%


def test_corpus_resnet_workers(corpus: Path) -> None:
    k = corpus / "traces" / "kineto"
    result = CliRunner().invoke(cli, ["diff", str(k / "resnet50_num_workers_0"), str(k / "resnet50_num_workers_4")])
    assert result.exit_code == 0, result.output
    assert "177.4 ms" in result.output and "126.7 ms" in result.output and "-28.6%" in result.output
    assert "data_loading_bound" in result.output  # num_workers=0 is data-loading bound
    # each side named as given (both files are worker0.*.pt.trace.json.gz: the directory tells them apart)
    # (from --json: the text headline wraps a long path onto a second line)
    names = json.loads(CliRunner().invoke(cli, ["diff", str(k / "resnet50_num_workers_0"),
                                                str(k / "resnet50_num_workers_4"), "--json"]).output)
    assert names["before"].startswith(f"{k / 'resnet50_num_workers_0'} (worker0.")
    assert names["after"].startswith(f"{k / 'resnet50_num_workers_4'} (worker0.")
    if "idle by cause:" in result.output:  # with gaps.py: data-loading idle all but disappears
        line = next(x for x in result.output.splitlines() if x.startswith("data_loading "))
        assert "357 ms" in line and "-357 ms" in line


def test_html_only_into_a_new_or_empty_directory_or_an_earlier_diff(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    a = write_trace(tmp_path / "a", gpu_doc(1.0))
    b = write_trace(tmp_path / "b", gpu_doc(2.0))
    # GIVEN a directory of the user's files, one holding a report, and an empty one
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    assert CliRunner().invoke(cli, ["report", str(a), "-o", str(tmp_path / "rep")]).exit_code == 0
    (tmp_path / "empty").mkdir()
    # WHEN the diff's page is written to each
    # THEN the first two are refused in one line, as they were, and the empty one written, then replaced
    err = refused(["diff", str(a), str(b), "-o", str(keep)], capsys)
    assert err.startswith(f"stepscope: error: {keep}: holds files stepscope did not write (notes.txt; no .stepscope-")
    assert [p.name for p in keep.iterdir()] == ["notes.txt"]
    err = refused(["diff", str(a), str(b), "-o", str(tmp_path / "rep")], capsys)
    assert "holds the output of `stepscope report`, not of `stepscope diff`" in err
    for _ in range(2):
        result = CliRunner().invoke(cli, ["diff", str(a), str(b), "-o", str(tmp_path / "empty")])
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == [".stepscope-output.json", "index.html"]
