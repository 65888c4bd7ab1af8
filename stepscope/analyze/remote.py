"""Traces in object storage: inputs given as fsspec URLs (`s3://`, `gs://`, `hf://`, `az://`, `file://`,
`memory://`, …), streamed to a local mirror in bounded memory, then read like any local file.

    s3://bucket/nightly/jobA/rank0.pt.trace.json.gz
        -> CACHE/remote/s3/bucket/nightly/jobA/rank0.pt.trace.json.gz   (copied in MiB chunks, atomically)

The mirror keeps the remote path, so a trace keeps its name (its trace id, its rank in the name) and its run
(its directory). A mirrored file is fetched again only when the remote one's size, modification time or ETag
changed (kept beside it in a hidden `.<name>.remote`). A URL may name a file, a directory (its trace files,
recursively) or a glob. fsspec and the scheme's backend (s3fs, gcsfs, huggingface_hub, adlfs, …) are optional:
without them, one line names the URL and the package to install.

A command line path turned into a `Path` loses one slash (`s3://b/k` -> `s3:/b/k`); `as_url` reads both.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from stepscope.analyze._locations import MIRROR, default_cache_dir
from stepscope.errors import InputError

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)", re.DOTALL)
_CHUNK = 8 * 1024 * 1024
_TRACE_SUFFIXES = (".json", ".json.gz")
_GLOB = re.compile(r"[*?\[]")


def as_url(path: str | Path) -> str | None:
    """The fsspec URL a command line argument names (`s3://b/k`, or `s3:/b/k` as Path writes it), or None for a
    local path (one that exists, or has no `scheme:/` prefix; a one-letter scheme is a Windows drive)."""
    text = str(path)
    m = _URL.fullmatch(text)
    if m is None or Path(text).exists():
        return None
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme in ("file", "local"):
        return f"file:///{rest}"
    return f"{scheme}://{rest}"


def _filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path in it) for a URL; a one-line InputError naming the URL and the package to install
    when fsspec or the scheme's backend is missing, or the scheme is unknown."""
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:
        raise InputError("reading URLs needs fsspec, which is not installed: pip install 'stepscope[fsspec]'",
                         path=url) from None
    scheme = url.split("://", 1)[0]
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except ImportError:
        known = known_implementations.get(scheme, {})
        package = str(known.get("class", scheme)).split(".")[0]
        raise InputError(f"reading {scheme}:// URLs needs {package}, which is not installed: pip install {package}",
                         path=url) from None
    except ValueError as exc:
        raise InputError(f"no fsspec filesystem for {scheme}:// ({exc})", path=url) from None
    return fs, str(root)


def fetch(url: str, *, mirror: Path | None = None) -> list[Path]:
    """The local copies of the trace files a URL names (a file, a directory's trace files, or a glob's matches),
    each streamed into `mirror` (default: the cache's `remote/`) unless already there unchanged.

    A URL that names nothing, or whose files cannot be read, is a one-line InputError naming it."""
    fs, root = _filesystem(url)
    scheme = url.split("://", 1)[0]
    try:
        if _GLOB.search(root):
            names = sorted(p for p in fs.glob(root) if fs.isfile(p))
        elif fs.isdir(root):
            names = sorted(p for p in fs.find(root) if str(p).endswith(_TRACE_SUFFIXES)
                           and not PurePosixPath(str(p)).name.startswith("."))
            if not names:
                raise InputError("holds no trace (.json / .json.gz)", path=url)
        elif fs.exists(root):
            names = [root]
        else:
            raise InputError("no such file or directory", path=url)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - each backend has its own errors (permissions, network, …)
        raise InputError(f"cannot list: {type(exc).__name__}: {exc}", path=url) from None
    if not names:
        raise InputError("no such file or directory", path=url)
    base = mirror or _default_mirror()
    copies = [_copy(fs, scheme, str(name), base) for name in names]
    for name, copy in zip(names, copies, strict=True):  # each named as the URL given names it
        _MIRRORED[str(copy)] = _given(url, root, str(name))
    return copies


def _given(url: str, root: str, name: str) -> str:
    """The URL of the listed file `name` as the user's `url` (whose path the backend read as `root`) spells it:
    `memory://fleet/a.json`, not the backend's `memory:///fleet/a.json`."""
    if name == root:
        return url
    stem = root.rstrip("/")
    if not _GLOB.search(root) and name.startswith(stem + "/"):
        return url.rstrip("/") + name[len(stem):]
    return f"{url.split('://', 1)[0]}://{name}"  # (a glob's match: as the backend spells it)


def _default_mirror() -> Path:
    return default_cache_dir() / MIRROR


def _local_path(base: Path, scheme: str, name: str) -> Path:
    """Where a remote file is mirrored: base/scheme/its path (no `..`, no absolute part: it stays under base)."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", "", ".")]
    if not parts or ".." in parts:
        raise InputError("a remote path must not hold '..'", path=f"{scheme}://{name}")
    return base.joinpath(scheme, *parts)


def _stamp(info: dict[str, Any]) -> str:
    """What tells a remote file's version: its size, modification time and ETag, where the backend says them."""
    keys = ("size", "mtime", "LastModified", "last_modified", "updated", "ETag", "etag", "md5Hash", "created")
    return json.dumps({k: str(info[k]) for k in keys if k in info}, sort_keys=True)


#: each mirror this process fetched or found -> the URL it mirrors (`as_given`)
_MIRRORED: dict[str, str] = {}


def as_given(text: str) -> str:
    """`text` (an error line) with every local mirror this process used named by its URL, as the user gave it:
    "s3://b/run/rank0.json: empty file", not the path under the cache."""
    for local, url in sorted(_MIRRORED.items(), key=lambda kv: -len(kv[0])):  # (longest first: no prefix clash)
        text = text.replace(local, url)
    return text


def _copy(fs: Any, scheme: str, name: str, base: Path) -> Path:
    from stepscope._io import atomic_path, atomic_write_text

    url = f"{scheme}://{name}"
    target = _local_path(base, scheme, name)
    try:
        stamp = _stamp(fs.info(name))
        marker = target.with_name(f".{target.name}.remote")
        if target.is_file() and marker.is_file() and marker.read_text(encoding="utf-8") == stamp:
            os.utime(marker)  # used now: the cache evicts mirrors by last use (analyze/cache.py)
            return target
        with fs.open(name, "rb") as src, atomic_path(target) as tmp, open(tmp, "wb") as out:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
        atomic_write_text(marker, stamp)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=url) from None
    except Exception as exc:  # noqa: BLE001 - each backend has its own errors (permissions, network, …)
        raise InputError(f"cannot read: {type(exc).__name__}: {exc}", path=url) from None
    return target
