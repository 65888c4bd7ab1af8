"""Atomic file output: write to a temporary sibling, then rename, so no half-written file is ever seen.

A command's output (`-o PATH`) goes through `check_output_path` (the writers' `create_parents=False`): a
parent directory that is missing or not writable is one UsageError naming the path, before anything is
written; stepscope's own files (the trace cache, capture manifests) keep creating their parents.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
def atomic_dir(target: Path, *, create_parents: bool = True) -> Iterator[Path]:
    """Yield a temporary directory next to `target`; on success it replaces `target` whole.

    `create_parents=False` (a command's -o): a missing or unwritable parent is a UsageError instead."""
    target = Path(target)
    _prepare(target, create_parents)
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
