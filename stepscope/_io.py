"""Atomic file output: write to a temporary sibling, then rename, so no half-written file is ever seen."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path next to `target`; on success rename it over `target`, on error remove it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _publish(tmp_path, directory=False)
        os.replace(tmp_path, target)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def atomic_write_text(target: Path, text: str) -> None:
    """Write text to `target` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write bytes to `target` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary directory next to `target`; on success it replaces `target` whole."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
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
