"""A command's output directory (`atomic_output_dir`): written whole or not at all, and never over files stepscope
did not write."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import pytest

from stepscope import _io
from stepscope._io import OUTPUT_MARKER, atomic_output_dir
from stepscope.errors import UsageError

NOT_OURS = r"holds files stepscope did not write \(notes.txt\): give a new or empty directory"
#: the same where no marker says what stepscope wrote there
NO_MARKER = (f"holds files stepscope did not write (notes.txt; no {OUTPUT_MARKER}: your files, or an output of an "
             "earlier stepscope, which wrote none): give a new or empty directory")


def _tree(root: Path) -> dict[str, str]:
    """Every file under root with its text, by relative path."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _write(target: Path, files: dict[str, str], kind: _io.OutputKind = "report") -> None:
    with atomic_output_dir(target, kind=kind) as tmp:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)


def test_a_new_directory_is_written_whole_with_a_marker_listing_its_paths(tmp_path: Path) -> None:
    # WHEN an output directory that does not exist yet is written
    _write(tmp_path / "out", {"index.html": "page", "a/index.html": "a"})
    # THEN it holds the files and the marker naming the command and every path, and no working directory is left
    marker = json.loads((tmp_path / "out" / OUTPUT_MARKER).read_text())
    assert marker == {"written_by": "stepscope", "command": "report", "paths": ["a", "a/index.html", "index.html"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_directory_of_the_users_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    # GIVEN a directory holding the user's own files
    keep = tmp_path / "keep"
    (keep / "sub").mkdir(parents=True)
    (keep / "notes.txt").write_text("mine")
    (keep / "sub" / "y").write_text("y")
    # WHEN an output is written there
    with pytest.raises(UsageError) as info:
        _write(keep, {"index.html": "page"})
    # THEN one error naming it, and the directory holds exactly what it held
    assert str(info.value) == f"{keep}: {NO_MARKER}"
    assert _tree(keep) == {"notes.txt": "mine", "sub/y": "y"} and sorted(p.name for p in keep.iterdir()) == [
        "notes.txt", "sub"]


def test_an_empty_directory_is_written_into(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    _write(tmp_path / "out", {"index.html": "page"})
    assert _tree(tmp_path / "out") == {"index.html": "page", OUTPUT_MARKER: (tmp_path / "out" / OUTPUT_MARKER)
                                       .read_text()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_earlier_output_is_replaced_whole(tmp_path: Path) -> None:
    # GIVEN an earlier report of a batch (a page per trace)
    out = tmp_path / "out"
    _write(out, {"index.html": "batch", "a/index.html": "a", "b/index.html": "b"})
    # WHEN a report of one trace is written there
    _write(out, {"index.html": "one"})
    # THEN only the new output is left
    assert set(_tree(out)) == {"index.html", OUTPUT_MARKER} and (out / "index.html").read_text() == "one"
    assert json.loads((out / OUTPUT_MARKER).read_text())["paths"] == ["index.html"]


def test_an_earlier_output_the_user_added_a_file_to_is_refused(tmp_path: Path) -> None:
    # GIVEN an earlier report the user put a notes file into
    out = tmp_path / "out"
    _write(out, {"index.html": "page"})
    (out / "notes.txt").write_text("mine")
    # WHEN it is written again THEN it is refused, the notes kept
    with pytest.raises(UsageError, match=NOT_OURS):
        _write(out, {"index.html": "new"})
    assert (out / "notes.txt").read_text() == "mine" and (out / "index.html").read_text() == "page"


def test_an_output_of_another_command_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, {"index.html": "diff"}, kind="diff")
    with pytest.raises(UsageError, match="holds the output of `stepscope diff`, not of `stepscope report`"):
        _write(out, {"index.html": "report"})
    assert (out / "index.html").read_text() == "diff"


def test_a_failure_while_writing_leaves_the_earlier_output_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, {"index.html": "old"})
    before = _tree(out)
    with pytest.raises(RuntimeError), atomic_output_dir(out, kind="report") as tmp:
        (tmp / "index.html").write_text("half")
        raise RuntimeError("the analysis failed")
    assert _tree(out) == before and sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "index.html"]


@pytest.mark.parametrize("given", [".", "./"])
def test_the_current_directory_is_written_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    # GIVEN the current directory, empty, then holding an earlier output
    monkeypatch.chdir(tmp_path)
    # WHEN it is given as the output, twice
    _write(Path(given), {"index.html": "first", "a/index.html": "a"})
    _write(Path(given), {"index.html": "second"})
    # THEN it is written into (never renamed: a shell sitting in it keeps its directory)
    assert set(_tree(tmp_path)) == {"index.html", OUTPUT_MARKER} and (tmp_path / "index.html").read_text() == "second"


def test_a_directory_that_cannot_be_renamed_is_written_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an output directory that is a mount point (renaming it fails: EBUSY), holding an earlier output
    out = tmp_path / "mnt"
    _write(out, {"index.html": "old", "a/index.html": "a"})
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(src) == out:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    # WHEN the output is written there again THEN its entries are swapped, the directory itself stays
    _write(out, {"index.html": "new"})
    assert set(_tree(out)) == {"index.html", OUTPUT_MARKER} and (out / "index.html").read_text() == "new"


def test_an_os_refusal_is_one_usage_error_naming_the_directory(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an existing output directory on a file system that refuses writes (read-only)
    out = tmp_path / "ro"
    out.mkdir()

    def refuse(*args: object, **kwargs: object) -> str:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    # WHEN an output is written there THEN one UsageError naming it, nothing written
    with pytest.raises(UsageError) as info:
        _write(out, {"index.html": "page"})
    assert str(info.value) == f"{out}: cannot write here: {os.strerror(errno.EROFS)}"
    assert list(out.iterdir()) == []


def test_a_run_cut_short_leaves_a_directory_the_next_run_replaces(tmp_path: Path) -> None:
    # GIVEN an earlier output and the working directory a run killed while writing left inside it
    out = tmp_path / "out"
    _write(out, {"index.html": "old"})
    (out / ".stepscope-new.abc123.tmp").mkdir()
    (out / ".stepscope-new.abc123.tmp" / "index.html").write_text("half")
    # WHEN the output is written again THEN it is replaced, the leftover too
    _write(out, {"index.html": "new"})
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "index.html"]


def test_a_file_where_the_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("mine")
    with pytest.raises(UsageError, match="is not a directory"):
        _write(tmp_path / "out", {"index.html": "page"})
    assert (tmp_path / "out").read_text() == "mine"


def test_a_folder_inside_that_cannot_be_listed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an earlier output with a folder whose contents cannot be listed (what it holds is unknown)
    out = tmp_path / "out"
    _write(out, {"index.html": "old", "a/index.html": "a"})
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if Path(path) == out / "a":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    # WHEN it is written again THEN one UsageError naming it, and nothing moved
    with pytest.raises(UsageError, match=f"^{out}: cannot read what it holds: Permission denied$"):
        _write(out, {"index.html": "new"})
    monkeypatch.undo()
    assert _tree(out)["index.html"] == "old" and (out / "a" / "index.html").is_file()
