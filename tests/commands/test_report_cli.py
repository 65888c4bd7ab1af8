"""stepscope report: one trace, a capture run, a batch with one bad trace; written atomically."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from builders import kernel, step, trace, write_trace
from click.testing import CliRunner
from conftest import refused
from report_traces import gpu_doc

from stepscope.cli import cli, main

TESTS = Path(__file__).resolve().parents[1]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_single_trace(tmp_path: Path) -> None:
    src = write_trace(tmp_path / "in", gpu_doc())
    code, out = run("report", str(src), "-o", str(tmp_path / "out"))
    assert code == 0, out
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="ops"' in page and "wrote" in out and "(trace, 1 report, 0 failed)" in out
    assert not list(tmp_path.glob(".out.*"))  # no temporary directory left behind


def test_batch_with_a_bad_trace(tmp_path: Path) -> None:
    write_trace(tmp_path / "in", gpu_doc(), "a.pt.trace.json")
    write_trace(tmp_path / "in", gpu_doc(scale=2), "b.pt.trace.json")
    (tmp_path / "in" / "bad.pt.trace.json").write_text("{not json")
    code, out = run("report", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--batch")
    # the other traces are reported, the bad one named in one line, and the exit code says a file failed
    assert code == 1, out
    index = (tmp_path / "out" / "index.html").read_text()
    assert 'href="a.pt.trace/index.html"' in index and 'href="b.pt.trace/index.html"' in index
    bad = str(tmp_path / "in" / "bad.pt.trace.json")
    errors = [line for line in out.splitlines() if line.startswith("stepscope: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"stepscope: error: {bad} ") and "2 reports, 1 failed" in out
    assert "bad.pt.trace.json" in index
    assert (tmp_path / "out" / "a.pt.trace" / "index.html").is_file()


def test_a_batch_names_its_traces_by_their_path_under_the_directory(tmp_path: Path) -> None:
    # GIVEN two traces of one file name in two folders (an H100 and an MI300X capture of one model, say)
    write_trace(tmp_path / "in" / "h100", gpu_doc(), "trace.json")
    write_trace(tmp_path / "in" / "mi300", gpu_doc(scale=2), "trace.json")
    code, out = run("report", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--batch")
    assert code == 0, out
    # THEN the index reads them apart, each linking to its own page
    index = (tmp_path / "out" / "index.html").read_text()
    for folder in ("h100", "mi300"):
        assert f'<a href="{folder}_trace/index.html">{folder}/trace.json</a>' in index
        assert (tmp_path / "out" / f"{folder}_trace" / "index.html").is_file()


def test_directory_of_traces_without_batch_is_a_batch(tmp_path: Path) -> None:
    # GIVEN a directory of two traces WHEN it is reported without --batch (as summary and critical-path take a
    # directory without a flag) THEN it is a batch: one page each and an index linking them (once refused)
    write_trace(tmp_path / "in", gpu_doc(), "a.pt.trace.json")
    write_trace(tmp_path / "in", gpu_doc(), "b.pt.trace.json")
    code, out = run("report", str(tmp_path / "in"), "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert "(batch, 2 reports, 0 failed)" in out
    index = (tmp_path / "out" / "index.html").read_text()
    for name in ("a", "b"):
        assert f'href="{name}.pt.trace/index.html"' in index
        assert (tmp_path / "out" / f"{name}.pt.trace" / "index.html").is_file()
    # AND a directory of one trace is that trace's page, and a batch of one with --batch
    write_trace(tmp_path / "one", gpu_doc(), "a.pt.trace.json")
    assert "(trace, 1 report" in run("report", str(tmp_path / "one"), "-o", str(tmp_path / "o1"))[1]
    assert "(batch, 1 report" in run("report", str(tmp_path / "one"), "-o", str(tmp_path / "o2"), "--batch")[1]


def test_capture_run_with_two_ranks_marks_the_straggler(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for rank, scale in ((0, 1.0), (1, 3.0)):
        doc = gpu_doc(scale)
        doc["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
        if rank == 1:  # rank 1's steps take longer
            for e in doc["traceEvents"]:
                if e["name"].startswith("ProfilerStep#"):
                    e["dur"] = 150
        write_trace(run_dir, doc, f"host_{rank}.pt.trace.json")
        (run_dir / f"manifest.rank{rank}.json").write_text(json.dumps({
            "status": "ok", "command": {"argv": ["train.py"]}, "device": {"type": "cuda", "name": "H100"},
            "baseline": {"mean_ns": 80_000.0}, "notes": []}))
    code, out = run("report", str(run_dir), "-o", str(tmp_path / "out"))
    assert code == 0, out
    index = (tmp_path / "out" / "index.html").read_text()
    assert "(run, 2 reports" in out
    assert "rank 1: host_1.pt.trace.json  (straggler)" in index
    assert "baseline step (mean, unprofiled)" in index and "80 µs" in index
    assert (tmp_path / "out" / "rank0" / "index.html").is_file()
    assert "Median step time per rank" not in index  # (figure text is in the PNG, not the page)
    assert '<figcaption>Ranks side by side</figcaption>' in index


def test_sample_run(tmp_path: Path) -> None:
    sample = TESTS.parent / "sample_traces" / "convnet_train"
    if not sample.is_dir():
        pytest.skip("sample_traces/convnet_train is not present")
    shutil.copytree(sample, tmp_path / "run")
    code, out = run("report", str(tmp_path / "run"), "-o", str(tmp_path / "out"))
    assert code == 0, out
    index = (tmp_path / "out" / "index.html").read_text()
    # the capture's own ratio of means, as `stepscope capture` printed it (once the median step over the mean
    # baseline: 0.65x on a run whose capture said 0.55x)
    ratio = json.loads((sample / "manifest.json").read_text())["overhead_ratio"]
    assert f"profiled / baseline (means)</dt><dd>{ratio:.2f}x" in index.replace("\n", "")
    assert 'id="memory-categories"' in index and "activation" in index  # the run's export_memory_timeline file
    # AND a run of one rank is that rank's report in the index: no second copy of it that nothing links
    assert 'id="steps"' in index
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".stepscope-output.json", "index.html"]


def test_run_with_a_snapshot_and_a_bad_side_file(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_trace(run_dir, gpu_doc(), "host_0.pt.trace.json")
    (run_dir / "manifest.json").write_text(json.dumps({"status": "ok", "baseline": None}))
    shutil.copy(corpus / "snapshots" / "cs336_magma27" / "memory_snapshot.pickle", run_dir / "rank0.pickle")
    (run_dir / "broken.memory_timeline.raw.json.gz").write_bytes(b"not gzip")
    code, out = run("report", str(run_dir), "-o", str(tmp_path / "out"))
    assert code == 0, out
    index = (tmp_path / "out" / "index.html").read_text()
    assert 'id="snapshot"' in index and "Live at the peak, by user frame" in index
    assert "broken.memory_timeline.raw.json.gz:" in index  # reported, the rest still rendered


def test_corpus_dataset_batch(corpus: Path, tmp_path: Path) -> None:
    k = corpus / "traces" / "kineto"
    code, out = run("ingest", str(k / "resnet50_num_workers_0"), str(k / "resnet50_num_workers_4"), "-o",
                    str(tmp_path / "ds"))
    assert code == 0, out
    code, out = run("report", str(tmp_path / "ds"), "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert "(batch, 2 reports, 0 failed)" in out
    index = (tmp_path / "out" / "index.html").read_text()
    assert "177.4 ms" in index and "126.7 ms" in index  # median step wall: num_workers 0 vs 4
    assert "data loading bound" in index  # the verdict column
    assert "<th class=\"num\">step p95</th>" in index and "177.6 ms" in index  # p95 (linear) of num_workers=4
    assert "<figcaption>Traces side by side</figcaption>" in index
    page = next((tmp_path / "out").glob("worker0.1623143089861*/index.html")).read_text()  # num_workers=0
    if 'id="gaps"' in page:  # gaps.py installed
        assert "data loading 3" in index  # num_workers=0: about a third of its window idle waiting for data


def test_every_sample_trace_reports_cleanly(tmp_path: Path) -> None:
    samples = TESTS.parent / "sample_traces"
    if not any(samples.glob("*/manifest.json")):
        pytest.skip("sample_traces/ holds no capture runs")
    code, out = run("report", str(samples), "--batch", "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert ", 0 failed)" in out
    pages = list((tmp_path / "out").glob("*/index.html"))
    # every trace but a graph capture's profile, which profiles the capture, not the workload
    assert len(pages) == len([t for t in samples.glob("*/*.pt.trace.json*") if "graph_capture" not in t.name])
    for page in pages:
        text = page.read_text()
        assert "could not be built" not in text, page  # every section of every sample renders
        assert 'id="verdict"' in text and 'id="ops"' in text


def test_the_verdict_section_shows_a_damaged_traces_warnings(tmp_path: Path) -> None:
    # GIVEN a trace with an event without a timestamp and negative durations
    no_ts = kernel("k2", ts=50, dur=10)
    del no_ts["ts"]
    src = write_trace(tmp_path / "in", trace(step(1, ts=0, dur=100), kernel("k", ts=2, dur=90), no_ts,
                                             kernel("k3", ts=95, dur=-3)))
    # WHEN it is reported
    code, out = run("report", str(src), "-o", str(tmp_path / "out"))
    # THEN the verdict section holds the warnings table, before the verdict's evidence tables
    assert code == 0, out
    page = (tmp_path / "out" / "index.html").read_text()
    verdict = page[page.index('id="verdict"'):page.index('id="verdict"') + 20_000]
    assert "Warnings: the trace is odd here" in verdict and "negative_durations" in verdict
    assert verdict.index("Warnings:") < verdict.index("Where to look first")


def test_a_step_the_trace_does_not_hold_is_an_error_as_in_plot(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a trace of steps 1 and 2
    src = write_trace(tmp_path / "in", gpu_doc())
    # WHEN report and plot are asked for step 99
    errors = []
    for args in (["report", str(src), "-o", str(tmp_path / "out"), "--step", "99"],
                 ["plot", "timeline", str(src), "-o", str(tmp_path / "t.png"), "--step", "99"]):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        errors.append((exit_info.value.code, capsys.readouterr().err.strip().splitlines()))
    # THEN both exit 2 with the same one line, and nothing is written
    assert errors[0] == errors[1] == (2, ["stepscope: error: no step 99 in this trace (steps: 1, 2)"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.png").exists()


def test_a_step_no_trace_of_a_batch_holds_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a batch of two traces of steps 1 and 2
    for name in ("a", "b"):
        write_trace(tmp_path / "in", gpu_doc(), f"{name}.pt.trace.json")
    # WHEN the report is asked for step 99, which neither holds
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "in"), "--batch", "-o", str(tmp_path / "out"), "--step", "99"])
    # THEN the same error as for one trace, naming the input, and nothing is written
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (  # (after the progress bar)
        f"stepscope: error: {tmp_path / 'in'}: no step 99 in these traces (steps: 1, 2)")
    assert not (tmp_path / "out").exists()
    # AND a step one of them holds is fine
    code, out = run("report", str(tmp_path / "in"), "--batch", "-o", str(tmp_path / "out"), "--step", "2")
    assert code == 0, out


def test_a_directory_of_the_users_files_is_refused_not_emptied(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an output directory that holds the user's own files
    src = write_trace(tmp_path / "in", gpu_doc())
    keep = tmp_path / "keep"
    (keep / "sub").mkdir(parents=True)
    (keep / "notes.txt").write_text("mine")
    (keep / "sub" / "y").write_text("y")
    # WHEN a report is written there
    err = refused(["report", str(src), "-o", str(keep)], capsys)
    # THEN one line naming it, and every file kept, nothing added
    assert err == (f"stepscope: error: {keep}: holds files stepscope did not write (notes.txt; no "
                   ".stepscope-output.json: your files, or an output of an earlier stepscope, which wrote none): give "
                   "a new or empty directory")
    assert sorted(p.relative_to(keep).as_posix() for p in keep.rglob("*")) == ["notes.txt", "sub", "sub/y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "keep"]


def test_an_earlier_report_is_replaced_and_an_empty_directory_written_into(tmp_path: Path) -> None:
    # GIVEN an empty directory
    write_trace(tmp_path / "in", gpu_doc(), "a.pt.trace.json")
    write_trace(tmp_path / "in", gpu_doc(scale=2), "b.pt.trace.json")
    (tmp_path / "out").mkdir()
    # WHEN a batch report is written there, then a report of one trace
    code, out = run("report", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--batch")
    assert code == 0, out
    assert (tmp_path / "out" / "a.pt.trace" / "index.html").is_file()
    code, out = run("report", str(tmp_path / "in" / "a.pt.trace.json"), "-o", str(tmp_path / "out"))
    # THEN the second replaces the first whole
    assert code == 0, out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".stepscope-output.json", "index.html"]


@pytest.mark.parametrize("given", [".", "./"])
def test_the_current_directory_as_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    # GIVEN a trace, and an empty current directory
    src = write_trace(tmp_path / "in", gpu_doc())
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    # WHEN the report is written to `.` twice
    for _ in range(2):
        code, out = run("report", str(src), "-o", given)
        assert code == 0, out
    # THEN the page is in it
    assert "wrote index.html" in out and 'id="ops"' in (tmp_path / "here" / "index.html").read_text()


def test_a_mount_point_as_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an output directory holding an earlier report that cannot be renamed (a mount point: EBUSY)
    src = write_trace(tmp_path / "in", gpu_doc())
    mnt = tmp_path / "mnt"
    code, out = run("report", str(src), "-o", str(mnt))
    assert code == 0, out
    real_replace = os.replace

    def replace(source: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
        if Path(source) == mnt:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(source))
        real_replace(source, dest)

    monkeypatch.setattr(os, "replace", replace)
    # WHEN the report is written there again THEN it is, into the directory
    code, out = run("report", str(src), "-o", str(mnt))
    assert code == 0, out
    assert sorted(p.name for p in mnt.iterdir()) == [".stepscope-output.json", "index.html"]
