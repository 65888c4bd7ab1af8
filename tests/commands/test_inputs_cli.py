"""The same bad input gives the same exit code and the same one-line message in every command; a failed file
in a batch is one line on stderr, the rest go on, and the command exits 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import kernel, step, trace, write_trace

from stepscope.cli import main


def gpu_doc() -> dict[str, object]:
    return trace(step(1, ts=0, dur=100), kernel("k", ts=10, dur=20))


COMMANDS = [["info"], ["summary"], ["memory"], ["report", "-o", "{out}"], ["ingest", "-o", "{out}"]]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 1, capsys.readouterr().err.strip().splitlines()


def _bad(tmp_path: Path, kind: str) -> tuple[Path, str]:
    if kind == "missing":
        return tmp_path / "nope.pt.trace.json", "no such file or directory"
    if kind == "empty directory":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "notes.txt").write_text("no trace here")
        return tmp_path / "empty", "holds no trace (.json / .json.gz), capture run, dataset or ingested trace"
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    return path, "not a Chrome trace (.json / .json.gz), CUDA memory snapshot (.pickle) or export_memory_timeline"


@pytest.mark.parametrize("kind", ["missing", "empty directory", "unknown kind"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_the_same_bad_input_is_the_same_error_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         command: list[str], kind: str) -> None:
    # GIVEN an input that is missing, a directory with no trace, or a file of no known kind
    path, message = _bad(tmp_path, kind)
    options = [a.format(out=tmp_path / "out") for a in command[1:]]
    # WHEN any command is given it
    code, err = _run([command[0], str(path), *options], capsys)
    # THEN exit code 2 and one line naming the file, the same in every command; nothing is written
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"stepscope: error: {path}: {message}"), err
    assert not (tmp_path / "out").exists()


def test_a_run_with_a_bad_rank_reports_the_others_and_exits_1(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    write_trace(run, gpu_doc(), "rank0.1700000000000000000.pt.trace.json")
    bad = run / "rank1.1700000000000000000.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')  # truncated
    (run / "manifest.json").write_text(json.dumps({"status": "ok", "baseline": None}))
    code, lines = _run(["report", str(run), "-o", str(tmp_path / "out")], capsys)
    err = [line for line in lines if line.startswith("stepscope:")]  # (not the progress bar)
    assert code == 1
    assert len(err) == 2 and err[0].startswith(f"stepscope: error: {bad} (byte ")
    assert err[1] == "stepscope: error: 1 of 2 inputs failed (reported above)"
    assert (tmp_path / "out" / "rank0" / "index.html").is_file()


def test_ingest_and_report_batch_agree_on_a_bad_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a directory with a good trace and a malformed one
    write_trace(tmp_path / "in", gpu_doc(), "good.pt.trace.json")
    bad = tmp_path / "in" / "bad.pt.trace.json"
    bad.write_text("{not json")
    # WHEN both batch commands read it
    ingest = _run(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "ds"), "-j", "1", "-q"], capsys)
    report = _run(["report", str(tmp_path / "in"), "--batch", "-o", str(tmp_path / "out")], capsys)
    # THEN both exit 1, after one line naming the bad file (and the count)
    for code, err in (ingest, report):
        failures = [line for line in err if line.startswith(f"stepscope: error: {bad} ")]
        assert code == 1 and len(failures) == 1, err
        assert err[-1] == "stepscope: error: 1 of 2 inputs failed (reported above)"


def test_a_single_bad_trace_is_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text("{not json")
    for command in (["info"], ["report", "-o", str(tmp_path / "out")]):
        code, err = _run([command[0], str(bad), *command[1:]], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"stepscope: error: {bad}"), err


def test_ingest_of_an_empty_directory_is_the_same_error_as_elsewhere(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a directory with nothing in it at all
    empty = tmp_path / "empty"
    empty.mkdir()
    # WHEN ingest and info are given it
    ingest = _run(["ingest", str(empty), "-o", str(tmp_path / "ds"), "-q"], capsys)
    info = _run(["info", str(empty)], capsys)
    # THEN both exit 2 with the same one line (not "0 ingested"), and no dataset is created
    line = f"stepscope: error: {empty}: holds no trace (.json / .json.gz), capture run, dataset or ingested trace"
    assert ingest == info == (2, [line])
    assert not (tmp_path / "ds").exists()
