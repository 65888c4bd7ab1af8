"""`stepscope export` end to end: a trace and a run with CliRunner, the size options, bad input as one line and
exit code 2 with nothing written, the report's sentence that names the export command and the file `report
--perfetto` writes and links, and `ingest --drop-added` reading an export as its trace."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, runtime, step, trace, write_trace
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from stepscope.cli import cli, main
from stepscope.reports.html import render_page

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ARGS: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                        "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}


def _trace(directory: Path) -> Path:
    events: list[dict[str, Any]] = []
    for n in (1, 2, 3):
        base = n * 1000
        events += [step(n, base, 500), cpu_op("aten::mm", base + 10, 50, external_id=n),
                   runtime("cudaLaunchKernel", base + 20, 10, correlation=n, external_id=n),
                   kernel("sgemm", base + 100, 200, correlation=n)]
    path: Path = write_trace(directory, trace(*events), "train.pt.trace.json")
    return path


def _run(directory: Path) -> Path:
    for r in (0, 1):
        events = [step(1, 0, 200), kernel("sgemm", 10, 50), kernel(AR, 100 + 40 * r, 60 - 40 * r, stream=20, **ARGS)]
        write_trace(directory, trace(*events, distributedInfo={"rank": r, "world_size": 2}), f"rank{r}.pt.trace.json")
    return directory


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Exit code and stderr lines of the real entry point (which maps errors to exit codes)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0), capsys.readouterr().err.strip().splitlines()


def _events(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    events: list[dict[str, Any]] = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)["traceEvents"]
    return events


def test_a_trace_and_the_size_options(tmp_path: Path) -> None:
    # GIVEN a three-step trace
    src = _trace(tmp_path / "t")
    # WHEN it is exported whole, THEN every original event is there, and the added ones after them
    out = CliRunner().invoke(cli, ["export", str(src), "-o", str(tmp_path / "all.json.gz")])
    assert out.exit_code == 0, out.output
    assert "wrote " in out.output and "12 original events" in out.output and "chrome://tracing" in out.output
    whole = _events(tmp_path / "all.json.gz")
    assert whole[:12] == json.loads(src.read_text())["traceEvents"]
    # --only annotations: none of the originals; --steps 2..2: the originals of step 2 only
    assert CliRunner().invoke(cli, ["export", str(src), "-o", str(tmp_path / "a.json"), "--only",
                                    "annotations"]).exit_code == 0
    assert all(e.get("cat") == "stepscope" for e in _events(tmp_path / "a.json"))
    out = CliRunner().invoke(cli, ["export", str(src), "-o", str(tmp_path / "s.json"), "--steps", "2..2"])
    assert out.exit_code == 0, out.output
    originals = [e for e in _events(tmp_path / "s.json") if e.get("cat") != "stepscope"]
    assert {e["name"] for e in originals} == {"ProfilerStep#2", "aten::mm", "cudaLaunchKernel", "sgemm"}
    assert len(originals) == 4


def test_a_run(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    out = CliRunner().invoke(cli, ["export", str(run), "-o", str(tmp_path / "run.json")])
    assert out.exit_code == 0, out.output
    assert "2 ranks" in out.output
    names = {e["args"]["name"] for e in _events(tmp_path / "run.json")
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1", "rank 0 · stepscope", "rank 1 · stepscope"}


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "5..3"], "the first step is after the last"),
    (["--steps", "two"], "is not N..M"),
    (["--only", "everything"], "Invalid value for '--only'"),
])
def test_bad_options_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    src = _trace(tmp_path / "t")
    out = CliRunner().invoke(cli, ["export", str(src), "-o", str(tmp_path / "o.json"), *args])
    assert out.exit_code == 2 and message in out.output
    assert not (tmp_path / "o.json").exists()


def test_bad_input_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(["export", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o.json")], capsys)
    assert code == 2 and err == [f"stepscope: error: {tmp_path / 'nope.json'}: no such file or directory"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"')
    code, err = _main(["export", str(broken), "-o", str(tmp_path / "o.json")], capsys)
    assert code == 2 and len(err) == 1 and str(broken) in err[0]
    src = _trace(tmp_path / "t")
    code, err = _main(["export", str(src), "-o", str(tmp_path / "o.json"), "--steps", "7..8"], capsys)
    assert code == 2 and err == [f"stepscope: error: {src}: no step in 7..8 in this trace (steps 1..3)"]
    code, err = _main(["export", str(src), "-o", str(tmp_path / "missing" / "o.json")], capsys)
    assert code == 2 and len(err) == 1 and "create it first" in err[0]
    assert not list(tmp_path.glob("o.json*")) and not list(tmp_path.glob(".o.json*"))


def test_the_report_names_the_export_command() -> None:
    page = render_page(title="t", subtitle="s", sections=[], reproduce=["stepscope report 'my run/' -o OUT/"])
    assert "stepscope export &#39;my run/&#39; -o trace.perfetto.json.gz" in page
    assert "chrome://tracing" in page and "nothing is uploaded" in page
    assert "stepscope export" not in render_page(title="t", subtitle="s", sections=[],
                                                 reproduce=["stepscope diff a b"])


def test_ingest_drop_added_reads_an_export_as_its_trace(tmp_path: Path) -> None:
    # GIVEN a trace and its export
    src = _trace(tmp_path / "t")
    assert CliRunner().invoke(cli, ["export", str(src), "-o", str(tmp_path / "e.json.gz")]).exit_code == 0
    # WHEN the export is ingested with --drop-added, and the trace itself plainly
    for args, name in (([str(tmp_path / "e.json.gz"), "--drop-added"], "dropped"), ([str(src)], "plain")):
        out = CliRunner().invoke(cli, ["ingest", *args, "-o", str(tmp_path / name), "-q", "-j", "1"])
        assert out.exit_code == 0, out.output
    # THEN both datasets hold the same events, and the export's added tracks are nowhere
    dropped, plain = (pl.read_parquet(next((tmp_path / d).glob("**/events.parquet"))) for d in ("dropped", "plain"))
    assert_frame_equal(dropped, plain)
    assert "12 events" in CliRunner().invoke(cli, ["ingest", str(tmp_path / "e.json.gz"), "--drop-added", "-o",
                                                   str(tmp_path / "dropped"), "-q"]).output


def _perfetto_link(page: Path) -> Path:
    """The file the page's Perfetto note links, as a path (it must be there)."""
    found = re.search(r'<p class="note" id="perfetto">[^<]*<a href="([^"]+)" download>', page.read_text())
    assert found is not None, "no link to the exported trace"
    target = (page.parent / found.group(1)).resolve()
    assert target.is_file(), target
    return target


def test_report_perfetto_writes_and_links_the_export(tmp_path: Path) -> None:
    # GIVEN a trace and a capture run (the bundled two-rank sample)
    src, run = _trace(tmp_path / "t"), Path(__file__).parents[2] / "sample_traces" / "late_rank"
    # WHEN each is reported with --perfetto
    for given, out in ((src, tmp_path / "r1"), (run, tmp_path / "r2")):
        result = CliRunner().invoke(cli, ["report", str(given), "-o", str(out), "--perfetto"])
        assert result.exit_code == 0, result.output
    # THEN the trace's page links OUT/trace.perfetto.json.gz: the export of that trace, its originals first
    linked = _perfetto_link(tmp_path / "r1" / "index.html")
    assert linked.name == "trace.perfetto.json.gz"
    assert _events(linked)[:12] == json.loads(src.read_text())["traceEvents"]
    assert "--perfetto" in (tmp_path / "r1" / "index.html").read_text()
    # AND the run's index and each rank's page link one merged file of both ranks
    pages = [tmp_path / "r2" / "index.html", *sorted((tmp_path / "r2").glob("*/index.html"))]
    assert len(pages) == 3
    assert {_perfetto_link(p) for p in pages} == {(tmp_path / "r2" / "run.perfetto.json.gz").resolve()}
    names = {e["args"]["name"] for e in _events(tmp_path / "r2" / "run.perfetto.json.gz")
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0", "rank 1"} <= names
    # AND without --perfetto, nothing is written and the page says how to make it
    assert CliRunner().invoke(cli, ["report", str(src), "-o", str(tmp_path / "r3")]).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "r3").iterdir()) == [".stepscope-output.json", "index.html"]
    assert "--perfetto</code> writes it beside this page" in (tmp_path / "r3" / "index.html").read_text()


def test_report_perfetto_that_cannot_be_written_is_said_on_the_page(tmp_path: Path) -> None:
    # GIVEN a dataset whose trace's source file is gone (the events are there, the original bytes are not)
    src = _trace(tmp_path / "t")
    assert CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds"), "-q"]).exit_code == 0
    src.unlink()
    # WHEN it is reported with --perfetto, THEN the report is written and its page says why there is no file
    out = CliRunner().invoke(cli, ["report", str(tmp_path / "ds"), "-o", str(tmp_path / "r"), "--perfetto"])
    assert out.exit_code == 0, out.output
    page = next((tmp_path / "r").glob("*/index.html")).read_text()
    assert "The report could not write it:" in page and "is not there" in page
    assert not list((tmp_path / "r").glob("**/*.perfetto.json.gz"))


def test_a_capture_run_of_one_trace_is_exported_as_that_trace(tmp_path: Path) -> None:
    # GIVEN a capture run directory of one rank (manifest, trace, memory timeline)
    run = Path(__file__).resolve().parents[2] / "sample_traces" / "convnet_train"
    res = CliRunner().invoke(cli, ["export", str(run), "-o", str(tmp_path / "one.json.gz")])
    # THEN it is that trace's export: no warning that no collective matched across ranks (there is one rank)
    assert res.exit_code == 0 and "warning" not in res.stderr and " rank" not in res.stderr, res.stderr
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in _events(tmp_path / "one.json.gz"))
