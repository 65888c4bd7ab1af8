"""`stepscope report --batch --engine ray`: each trace's page written by a Ray task on a real local Ray cluster (one
start for the module, as tests/analyze/test_ray_engine.py does), the index built here; the pages and the index
are the local engine's, a broken trace is one failed row and line as there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders import write_trace
from click.testing import CliRunner
from report_traces import gpu_doc

from stepscope.cli import cli
from stepscope.errors import BatchFailed, UsageError

ray = pytest.importorskip("ray")


def _inputs(directory: Path) -> Path:
    for i, scale in enumerate((1.0, 3.0, 6.0)):
        write_trace(directory, gpu_doc(scale), f"t{i}.pt.trace.json", gz=i == 1)
    (directory / "broken.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X"')
    return directory


def _timeless(page: str) -> str:
    """A page less the time it was generated at (the one thing two reports of the same traces differ in)."""
    return re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", "", page)


def _outline(page: str) -> list[str]:
    """A page's sections, figure captions, table titles and row counts, in order (a table's order among rows
    tied on its sort key is not part of the contract: the verdict's "where to look" ranks tied ops either way)."""
    return [m.group(0) if not m.group(0).startswith("<tbody>") else str(m.group(0).count("<tr>"))
            for m in re.finditer(r'<section id="[^"]+">|<figcaption>.*?</figcaption>|<h3>.*?</h3>|<tbody>.*?</tbody>',
                                 page, re.S)]


def _rows(page: str, section: str) -> list[str]:
    body = page.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]
    return re.findall(r"<tr>.*?</tr>", body, re.S)


def test_ray_writes_the_local_engines_pages_and_index(cluster: None, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a batch of three traces and a broken one, named by a relative path (the tasks run elsewhere)
    monkeypatch.chdir(tmp_path)
    src = _inputs(Path("src"))
    # WHEN it is reported by the local engine and by Ray tasks
    local = CliRunner().invoke(cli, ["report", str(src), "--batch", "-o", "local"])
    on_ray = CliRunner().invoke(cli, ["report", str(src), "--batch", "-o", "ray", "--engine", "ray"])
    # THEN both report three pages and the same failure, named as given
    for result in (local, on_ray):
        assert isinstance(result.exception, BatchFailed), result.output
        assert "(batch, 3 reports, 1 failed)" in result.stdout
        failures = [line for line in result.stderr.splitlines() if line.startswith("stepscope: error:")]
        assert len(failures) == 1 and failures[0].startswith("stepscope: error: src/broken.pt.trace.json (byte")
    # and the index has the same rows, the same fleet section, the same page
    index_local = (tmp_path / "local" / "index.html").read_text()
    index_ray = (tmp_path / "ray" / "index.html").read_text()
    assert _rows(index_ray, "traces") == _rows(index_local, "traces") and len(_rows(index_local, "traces")) == 1 + 4
    assert _rows(index_ray, "fleet") == _rows(index_local, "fleet")
    assert _timeless(index_ray) == _timeless(index_local)
    # and every member page exists, with the local engine's sections, figures and tables
    pages = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").glob("*/index.html"))
    assert len(pages) == 3 and pages == sorted(p.relative_to(tmp_path / "ray")
                                               for p in (tmp_path / "ray").glob("*/index.html"))
    for page in pages:
        assert _outline((tmp_path / "ray" / page).read_text()) == _outline((tmp_path / "local" / page).read_text())
    assert "stepscope report src/t0.pt.trace.json" in (tmp_path / "ray" / "t0.pt.trace" / "index.html").read_text()


def test_a_step_no_trace_holds_is_an_error_on_ray_too(cluster: None, tmp_path: Path) -> None:
    src = _inputs(tmp_path / "src")
    result = CliRunner().invoke(cli, ["report", str(src), "--batch", "-o", str(tmp_path / "out"), "--engine", "ray",
                                      "--step", "99"])
    assert isinstance(result.exception, UsageError) and "no step 99 in these traces (steps: 1, 2)" in str(
        result.exception)
    assert not (tmp_path / "out").exists()


def test_address_needs_the_ray_engine(tmp_path: Path) -> None:
    src = _inputs(tmp_path / "src")
    result = CliRunner().invoke(cli, ["report", str(src), "--batch", "-o", str(tmp_path / "out"), "--address", "auto"])
    assert result.exit_code == 2 and "--address names a Ray cluster" in result.output
