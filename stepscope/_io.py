"""Atomic file output: write to a temporary sibling, then rename, so no half-written file is ever seen.

A command's output (`-o PATH`) goes through `check_output_path` (the writers' `create_parents=False`): a
parent directory that is missing or not writable is one UsageError naming the path, before anything is
written; stepscope's own files (the trace cache, capture manifests) keep creating their parents.

A command's output directory (`report -o OUT/`, `diff -o OUT/`) goes through `check_output_dir` and
`atomic_output_dir`, which never delete a file stepscope did not write. Every such directory holds a marker,
`.stepscope-output.json`, naming the command and every path it wrote. An existing OUT is written into only where
it is empty or holds nothing but a previous output of the same command; otherwise one UsageError, nothing written:

    OUT missing                         -> built beside it, renamed into place whole
    OUT empty, or an earlier `report`   -> built inside it, then its old entries swapped for the new ones
    OUT holding notes.txt               -> "OUT: holds files stepscope did not write: give a new or empty directory"

An existing OUT is never renamed itself (it may be the current directory or a mount point): its entries are
swapped, each by one rename, so no page is ever half-written and a run that fails leaves the old output as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from stepscope.errors import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(path: Path, *, directory: bool) -> None:
    """Give a finished temporary file/dir the permissions a plain open()/mkdir() would have had
    (mkstemp and mkdtemp make them private: 0600 / 0700)."""
    base = 0o777 if directory else 0o666
    path.chmod(base & ~_umask())
    if directory:
        for child in path.rglob("*"):
            child.chmod((0o777 if child.is_dir() else 0o666) & ~_umask())


def check_output_path(target: Path) -> None:
    """UsageError (one line naming `target`) unless its parent directory exists and is writable.

        -o /nonexistent/dir/x.txt  -> "/nonexistent/dir/x.txt: cannot write here: no directory /nonexistent/dir
                                       (create it first)"
        -o /proc/x                 -> "/proc/x: cannot write here: /proc is not writable"
    """
    parent = Path(target).absolute().parent
    if not parent.is_dir():
        raise UsageError(f"cannot write here: no directory {parent} (create it first)", path=target)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write here: {parent} is not writable", path=target)


def output_dir(target: Path) -> Path:
    """A command's output directory (`ingest -o DATASET`): created if missing, in a parent that must exist;
    a UsageError naming it when that or the creation fails."""
    check_output_path(target)
    try:
        Path(target).mkdir(exist_ok=True)
    except OSError as exc:
        raise _unwritable(target, exc) from exc
    return Path(target)


def _prepare(target: Path, create_parents: bool) -> None:
    if create_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    else:
        check_output_path(target)


def _unwritable(target: Path, exc: OSError) -> UsageError:
    """An OS refusal that the permission bits did not predict (a read-only or virtual file system)."""
    return UsageError(f"cannot write in {Path(target).absolute().parent}: {exc.strerror or exc}", path=target)


@contextmanager
def atomic_path(target: Path, *, create_parents: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to `target`; on success rename it over `target`, on error remove it.

    `create_parents=False` (a command's -o): a missing or unwritable parent is a UsageError instead."""
    target = Path(target)
    _prepare(target, create_parents)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _unwritable(target, exc) from exc
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _publish(tmp_path, directory=False)
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def atomic_write_text(target: Path, text: str, *, create_parents: bool = True) -> None:
    """Write text to `target` atomically."""
    with atomic_path(target, create_parents=create_parents) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(target: Path, data: bytes, *, create_parents: bool = True) -> None:
    """Write bytes to `target` atomically."""
    with atomic_path(target, create_parents=create_parents) as tmp:
        tmp.write_bytes(data)


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary directory next to `target`; on success it replaces `target` whole. For stepscope's own
    directories (an ingested trace in the cache or a dataset): a command's -o goes through `atomic_output_dir`."""
    target = Path(target)
    _prepare(target, create_parents=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise _unwritable(target, exc) from exc
    try:
        yield tmp
        _publish(tmp, directory=True)
        if target.exists():
            old = target.with_name(f".{target.name}.old.{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: the file in every output directory a command writes: {"written_by": "stepscope", "command": ..., "paths": [...]}
OUTPUT_MARKER = ".stepscope-output.json"
#: the working directories `atomic_output_dir` makes inside an existing OUT (left only by a run cut short)
_WORK_PREFIXES = (".stepscope-new.", ".stepscope-old.")
OutputKind = Literal["report", "diff"]


def check_output_dir(target: Path, kind: OutputKind) -> None:
    """UsageError (one line naming `target`) unless `stepscope <kind> -o target` may write there: a directory to be
    made in a writable parent, or an existing writable one that is empty or holds only an earlier output of `kind`.

        -o keep/    (keep/notes.txt)         -> "keep: holds files stepscope did not write: give a new or empty
                                                directory"
        -o report/  (from `stepscope diff`)  -> "report: holds the output of `stepscope diff`, not of
                                                `stepscope report`: give a new or empty directory"
    """
    target = Path(target)
    if not os.path.lexists(target):
        check_output_path(target)
        return
    if not target.is_dir():
        raise UsageError("is not a directory: give a new or empty directory", path=target)
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError("cannot write here: the directory is not writable", path=target)
    try:
        refusal = _refusal(target, kind)
    except OSError as exc:  # (a folder inside it that cannot be listed)
        raise UsageError(f"cannot read what it holds: {exc.strerror or exc}", path=target) from exc
    if refusal is not None:
        raise UsageError(refusal, path=target)


def _refusal(target: Path, kind: OutputKind) -> str | None:
    """Why the existing directory `target` may not be replaced by an output of `kind`; None where it may be."""
    present = _paths(target)
    if not present:
        return None
    try:
        marker = json.loads((target / OUTPUT_MARKER).read_text(encoding="utf-8"))
        command, written = str(marker["command"]), set(marker["paths"])
    except (OSError, ValueError, KeyError, TypeError):  # no marker, or not one stepscope wrote
        return (f"holds files stepscope did not write ({min(present)}; no {OUTPUT_MARKER}: your files, or an "
                "output of an earlier stepscope, which wrote none): give a new or empty directory")
    if stray := sorted(present - written - {OUTPUT_MARKER}):
        return f"holds files stepscope did not write ({stray[0]}): give a new or empty directory"
    if command != kind:
        return f"holds the output of `stepscope {command}`, not of `stepscope {kind}`: give a new or empty directory"
    return None


def _paths(root: Path) -> set[str]:
    """Every file and directory under `root` (symbolic links not followed), as relative POSIX paths; the working
    directories of an output run cut short are left out (they are stepscope's). OSError where a folder cannot be
    listed (what it holds is unknown, so not to be replaced)."""
    found: set[str] = set()
    for parent, dirs, files in os.walk(root, onerror=_raise):
        base = Path(parent).relative_to(root)
        if parent == str(root):
            dirs[:] = [d for d in dirs if not (d.startswith(_WORK_PREFIXES) and d.endswith(".tmp"))]
        found.update((base / name).as_posix() for name in [*dirs, *files])
    return found


def _raise(exc: OSError) -> None:
    raise exc


@contextmanager
def atomic_output_dir(target: Path, *, kind: OutputKind) -> Iterator[Path]:
    """A command's output directory (`stepscope <kind> -o target`): yield an empty temporary directory to fill;
    on success its contents become `target`'s, with a marker listing them; on error nothing changes.

    A missing `target` is built beside it and renamed into place; an existing one (empty, or an earlier output of
    `kind`: `check_output_dir`) is built inside it and its entries swapped, one rename each, as it cannot always
    be renamed itself (the current directory, a mount point). Anything else is a UsageError, nothing written."""
    target = Path(target)
    check_output_dir(target, kind)
    exists = os.path.lexists(target)
    try:
        if exists:
            tmp = Path(tempfile.mkdtemp(prefix=_WORK_PREFIXES[0], suffix=".tmp", dir=target))
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise _refused(target, exc) from exc
    try:
        yield tmp
        paths = sorted(_paths(tmp))
        marker = {"written_by": "stepscope", "command": kind, "paths": paths}
        (tmp / OUTPUT_MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        _publish(tmp, directory=True)
        try:
            if exists:
                _swap_into(target, tmp, kind)
            else:
                os.replace(tmp, target)
        except OSError as exc:
            raise _refused(target, exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_into(target: Path, tmp: Path, kind: OutputKind) -> None:
    """Replace the entries of `target` (checked again: it may have changed while the output was built) with those
    of `tmp`, inside it. The marker moves in first, so a run cut short leaves a directory the next one may replace."""
    refusal = _refusal(target, kind)
    if refusal is not None:
        raise UsageError(refusal, path=target)
    old = Path(tempfile.mkdtemp(prefix=_WORK_PREFIXES[1], suffix=".tmp", dir=target))
    for entry in os.scandir(target):
        if entry.name not in (tmp.name, old.name):
            os.replace(entry.path, old / entry.name)
    new = sorted(os.scandir(tmp), key=lambda e: e.name != OUTPUT_MARKER)
    for entry in new:
        os.replace(entry.path, target / entry.name)
    tmp.rmdir()
    shutil.rmtree(old, ignore_errors=True)


def _refused(target: Path, exc: OSError) -> UsageError:
    """An OS refusal to write the output directory `target` (a read-only file system, a full disk)."""
    return UsageError(f"cannot write here: {exc.strerror or exc}", path=target)
