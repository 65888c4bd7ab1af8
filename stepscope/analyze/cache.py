"""The trace cache: raw traces ingested on the fly by `load`, keyed by the file's sha256, bounded in size.

Layout (an entry is an ingested trace directory; its lock file sits beside it so that the entry itself can be
renamed away whole):

    CACHE/<sha[:2]>/<sha>/{events.parquet, flows.parquet, meta.json}     one entry; its mtime = its last use
    CACHE/<sha[:2]>/.<sha>.lock                                         flock: who is using / writing it
    CACHE/hashes/<hash of the source's path>.json                        the source's sha256 against its stat
                                                                        (`source_sha256`)
    CACHE/remote/<scheme>/<path>  (+ .<name>.remote)                    a URL input's local mirror
                                                                        (analyze/remote.py); its marker's
                                                                        mtime = its last use

Mirrored files count toward the limit and are evicted by last use with the entries (`mirrors`); nothing locks
them: a file removed while a command reads it stays readable to that command (POSIX), and a later use fetches it
again.

Concurrency (POSIX flock; where there is none, as on Windows, entries are still written atomically but not
guarded against eviction while in use):
- `open_entry` holds the entry's lock exclusively while it checks and (if needed) ingests it, so two processes
  that load the same file at once ingest it once: the second waits, then finds it whole. It then holds the
  lock shared for as long as the returned `Lease` lives (the Trace keeps it), so no other process evicts an
  entry that is being read.
- `prune` takes each entry's lock exclusively without waiting (an entry in use is skipped, never deleted under
  a reader), renames it to a `.trash-*` name and only then deletes it: a reader sees a whole entry or none.
- The size limit: `STEPSCOPE_CACHE_MAX` (`10G`, `500M`, `0` for no limit; default DEFAULT_MAX_BYTES), checked
  after each entry a process adds, against the size it last saw plus what it added (`_prune_if_full`). The
  cache only saves time: its location and size never change a result.

    entries used at t=1, 5, 9 (1 GB each), limit 2 GB  ->  prune removes the one used at t=1
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from stepscope.analyze._locations import MIRROR
from stepscope.analyze._locations import default_cache_dir as default_cache_dir  # the cache's home
from stepscope.analyze.inputs import file_sha256 as file_sha256  # (tests count its calls here)
from stepscope.analyze.inputs import is_ingested
from stepscope.errors import UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock
    fcntl = None  # type: ignore[assignment]

DEFAULT_MAX_BYTES = 10 * 1024**3
MAX_ENV = "STEPSCOPE_CACHE_MAX"

_ENTRY = re.compile(r"[0-9a-f]{64}")
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from a size as people write it: `1073741824`, `500M`, `10G`, `1.5GiB` (binary units).

    A size that is not one is a UsageError naming it."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise UsageError(f"not a size: {text!r} (use bytes or a number with K, M, G or T, e.g. 10G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def max_cache_bytes() -> int | None:
    """The cache's size limit: $STEPSCOPE_CACHE_MAX, else DEFAULT_MAX_BYTES; None for `0` (no limit)."""
    raw = os.environ.get(MAX_ENV)
    limit = DEFAULT_MAX_BYTES if raw is None or not raw.strip() else parse_size(raw)
    return limit or None


# -------------------------------------------------------------------------------------------------- locks


class Lease:
    """An open lock file holding an entry's flock; closing it (or its garbage collection) lets it go."""

    def __init__(self, fh: IO[bytes] | None) -> None:
        self._fh = fh

    def close(self) -> None:
        """Let the lock go."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __del__(self) -> None:
        self.close()

    def __reduce__(self) -> tuple[type[Lease], tuple[None]]:
        """A lease does not travel: a Trace sent to another process arrives without this process's hold."""
        return (Lease, (None,))


def _lock_path(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.lock"


@functools.cache
def _allow_open_files() -> None:
    """Raise this process's soft limit on open files to its hard limit (at most 65,536), once: every live Trace
    holds its entry's lock file open, and a run of 1,024 ranks holds a Trace per rank, beyond the usual
    soft limit of 1,024."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # a limit we may not raise: the usual one stays
            pass


def _lock(entry: Path, *, shared: bool, wait: bool) -> Lease | None:
    """The entry's lock, shared or exclusive; None when `wait` is False and another process holds it.

    A lock file removed (by prune) between our open and our lock is a stale inode: open it again."""
    if fcntl is None:  # pragma: no cover - Windows
        return Lease(None)
    _allow_open_files()
    path = _lock_path(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
    while True:
        fh = open(path, "ab")  # noqa: SIM115 - held by the Lease
        try:
            fcntl.flock(fh.fileno(), mode)
        except BlockingIOError:
            fh.close()
            return None
        try:
            same = os.path.samestat(os.fstat(fh.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return Lease(fh)
        fh.close()


# ------------------------------------------------------------------------------------------- source hashes

#: where the cache remembers its sources' hashes (`source_sha256`): one small JSON file per source path
HASHES = "hashes"
#: a file changed less than this long ago is hashed each time, never remembered: a file system with coarse
#: timestamps could see it written again within the same tick, with the same times (git's "racy" index entries)
RACY_S = 2.0


def source_sha256(cache_dir: Path, path: Path) -> str:
    """`inputs.file_sha256(path)`, the key of the file's entry, remembered in the cache against the file's identity
    and change times (device, inode, size, mtime and ctime in ns: what git's index compares), so that each command
    on a cached multi-GB trace does not read it whole again to find its entry (sha256 runs at about 1 GB/s).

    A file whose stat differs from the remembered one (rewritten, replaced, touched) is hashed again; ctime cannot
    be set back, so a rewrite that restores the old mtime is seen too. A file changed within RACY_S before it was
    hashed, or while it was, is not remembered. The memo is written atomically; one that cannot be read or written
    (a read-only cache) only costs the hash.

        summary big.json  -> hashed (3.6 GB: 3.5 s), remembered     gaps big.json -> stat matches: no read
        (big.json rewritten) report big.json -> stat differs: hashed, re-ingested under its new hash
    """
    before = os.stat(path)
    where = hashlib.blake2b(os.fsencode(os.path.abspath(path)), digest_size=20).hexdigest()  # (a name, not a key)
    memo = cache_dir / HASHES / f"{where}.json"
    try:
        saved = json.loads(memo.read_bytes())
        if saved.get("stat") == _identity(before) and _ENTRY.fullmatch(str(saved.get("sha256"))):
            return str(saved["sha256"])
    except (OSError, ValueError, AttributeError):
        pass
    sha = file_sha256(path)
    changed_s = max(before.st_mtime_ns, before.st_ctime_ns) / 1e9
    if time.time() - changed_s >= RACY_S and _identity(os.stat(path)) == _identity(before):
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"path": os.path.abspath(path), "stat": _identity(before), "sha256": sha}))
            os.replace(tmp, memo)
        except OSError:
            tmp.unlink(missing_ok=True)
    return sha


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def open_entry(cache_dir: Path, sha256: str, fill: Callable[[Path], object]) -> tuple[Path, Lease]:
    """The cache entry of a file with this hash, filled by `fill(entry_dir)` (an atomic ingest) if missing,
    its use time updated; with a shared Lease that keeps it from eviction while the caller reads it.

    Returns (entry directory, lease). When this call filled the entry, it then evicts least recently used
    entries down to the size limit (never one in use, so never this one)."""
    entry = cache_dir / sha256[:2] / sha256
    filled = False
    while True:
        # shared first: it never waits on this process's own holds (a Trace of this file still alive here), only
        # on another process writing or evicting the entry
        reader = _lock(entry, shared=True, wait=True)
        assert reader is not None  # (a waiting lock is always granted)
        if is_ingested(entry, sha256):
            _touch(entry)
            break
        reader.close()
        writer = _lock(entry, shared=False, wait=True)
        assert writer is not None
        try:
            if not is_ingested(entry, sha256):  # (another process may have filled it while we waited)
                fill(entry)
                filled = True
        finally:
            writer.close()
    if filled:
        limit = max_cache_bytes()
        if limit is not None:
            _prune_if_full(cache_dir, limit, _dir_bytes(entry))
    return entry, reader


#: how long this process trusts its last look at a cache's size (`_prune_if_full`)
RESCAN_S = 60.0
_seen: dict[Path, tuple[int, float]] = {}  # cache directory -> (bytes it held at the last look + added since, when)


def _prune_if_full(cache_dir: Path, limit: int, added: int) -> None:
    """Evict down to `limit` after this process added `added` bytes, looking at every entry only when the cache
    may be over it: when the bytes this process last saw there plus what it added since exceed the limit, or the
    last look is older than RESCAN_S (other processes add too). A look per entry added made loading N traces
    O(N²): 1,024 small traces took minutes in `prune` alone. Between looks the cache can exceed its limit by what
    other processes added since, until the next look."""
    key = cache_dir.resolve()
    seen = _seen.get(key)
    now = time.monotonic()
    if seen is not None and now - seen[1] < RESCAN_S and seen[0] + added <= limit:
        _seen[key] = (seen[0] + added, seen[1])
        return
    _seen[key] = (prune(cache_dir, limit).kept_bytes, now)


def _touch(entry: Path) -> None:
    """Mark the entry used now (its directory's mtime: atime is unreliable on relatime/noatime mounts)."""
    try:
        os.utime(entry)
    except OSError:  # a read-only cache still serves
        pass


# ---------------------------------------------------------------------------------------------- inventory


@dataclass(frozen=True, kw_only=True)
class CacheEntry:
    """One cached trace: its key, directory, bytes on disk and last use (epoch seconds)."""

    sha256: str
    path: Path
    bytes: int
    last_used_s: float
    source: str | None


@dataclass(frozen=True, kw_only=True)
class CacheInfo:
    """What the cache holds: its location and limit, its entries by last use (oldest first), their bytes, and the
    local mirrors of URL inputs (`mirrors`: one CacheEntry per file, its `sha256` empty, its `source` the URL)."""

    location: Path
    max_bytes: int | None
    entries: tuple[CacheEntry, ...]
    mirrors: tuple[CacheEntry, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes of every entry and mirrored file together."""
        return sum(e.bytes for e in self.entries) + self.mirror_bytes

    @property
    def mirror_bytes(self) -> int:
        """Bytes of the mirrored files (markers included)."""
        return sum(m.bytes for m in self.mirrors)

    @property
    def oldest_use_s(self) -> float | None:
        """The least recent use of an entry, None for an empty cache."""
        return self.entries[0].last_used_s if self.entries else None

    @property
    def newest_use_s(self) -> float | None:
        """The most recent use of an entry, None for an empty cache."""
        return self.entries[-1].last_used_s if self.entries else None


@dataclass(frozen=True, kw_only=True)
class PruneResult:
    """What a prune or clear removed, what it kept, and the entries it left because they were in use."""

    location: Path
    removed: int
    removed_bytes: int
    kept: int
    kept_bytes: int
    in_use: int


def _dir_bytes(path: Path) -> int:
    """Bytes of the files in an entry (flat: events.parquet, flows.parquet, meta.json); 0 where it is gone."""
    total = 0
    try:
        with os.scandir(path) as children:
            for child in children:
                try:
                    if child.is_file(follow_symlinks=False):
                        total += child.stat(follow_symlinks=False).st_size
                except OSError:  # removed while we looked
                    continue
    except OSError:
        return 0
    return total


def _source_name(entry: Path) -> str | None:
    import json

    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        name = meta.get("source", {}).get("name")
        return str(name) if name else None
    except (OSError, ValueError, AttributeError):
        return None


def cache_info(cache_dir: Path | None = None, *, sources: bool = True) -> CacheInfo:
    """The entries of the cache (default: `default_cache_dir()`), least recently used first; `sources`: read
    each entry's source file name (for `stepscope cache info`; eviction needs none)."""
    location = cache_dir or default_cache_dir()
    entries = []
    if location.is_dir():
        for shard in sorted(location.iterdir()):
            if not (shard.is_dir() and len(shard.name) == 2):
                continue
            for entry in shard.iterdir():
                if not (_ENTRY.fullmatch(entry.name) and entry.is_dir()):
                    continue
                try:
                    used = entry.stat().st_mtime
                except OSError:
                    continue
                entries.append(CacheEntry(sha256=entry.name, path=entry, bytes=_dir_bytes(entry), last_used_s=used,
                                          source=_source_name(entry) if sources else None))
    entries.sort(key=lambda e: (e.last_used_s, e.sha256))
    return CacheInfo(location=location, max_bytes=max_cache_bytes(), entries=tuple(entries),
                     mirrors=tuple(mirrored_files(location / MIRROR)))


def mirrored_files(base: Path) -> list[CacheEntry]:
    """The files mirrored under `base` (CACHE/remote), least recently used first: each with its marker's bytes,
    its last use the marker's mtime (the file's where it has none), its source the URL it mirrors."""
    found = []
    if base.is_dir():
        for path in base.rglob("*"):
            if path.name.startswith(".") or not path.is_file():
                continue
            marker = path.with_name(f".{path.name}.remote")
            try:
                size = path.stat().st_size
                used = marker.stat().st_mtime if marker.is_file() else path.stat().st_mtime
                size += marker.stat().st_size if marker.is_file() else 0
            except OSError:  # removed while we looked
                continue
            scheme, *rest = path.relative_to(base).parts
            found.append(CacheEntry(sha256="", path=path, bytes=size, last_used_s=used,
                                    source=f"{scheme}://{'/'.join(rest)}"))
    found.sort(key=lambda m: (m.last_used_s, str(m.path)))
    return found


def _remove_mirrored(path: Path) -> None:
    """A mirrored file and its marker (the next use fetches it again)."""
    path.unlink(missing_ok=True)
    path.with_name(f".{path.name}.remote").unlink(missing_ok=True)


def prune(cache_dir: Path | None = None, max_bytes: int = 0) -> PruneResult:
    """Remove least recently used entries until the cache holds at most `max_bytes` (0: remove every entry,
    `stepscope cache clear`, which forgets the remembered source hashes too). An entry another process is using or
    writing is skipped, never removed; so are leftovers of an interrupted ingest younger than an hour (they may be
    another process's work)."""
    info = cache_info(cache_dir, sources=False)
    total = info.total_bytes
    removed = removed_bytes = in_use = 0
    for entry in sorted((*info.entries, *info.mirrors), key=lambda e: (e.last_used_s, str(e.path))):
        if total <= max_bytes:
            break
        if not entry.sha256:  # a mirrored URL input
            _remove_mirrored(entry.path)
            total -= entry.bytes
            removed += 1
            removed_bytes += entry.bytes
            continue
        lease = _lock(entry.path, shared=False, wait=False)
        if lease is None:
            in_use += 1
            continue
        try:
            trash = entry.path.with_name(f".trash-{entry.sha256}-{os.getpid()}")
            try:
                os.replace(entry.path, trash)
            except FileNotFoundError:  # already gone
                continue
            shutil.rmtree(trash, ignore_errors=True)
            _lock_path(entry.path).unlink(missing_ok=True)  # (while held: a waiter re-opens, see _lock)
        finally:
            lease.close()
        total -= entry.bytes
        removed += 1
        removed_bytes += entry.bytes
    _sweep(info.location)
    if max_bytes == 0:  # cleared: the remembered source hashes go too (they only save reading a source again)
        shutil.rmtree(info.location / HASHES, ignore_errors=True)
    return PruneResult(location=info.location, removed=removed, removed_bytes=removed_bytes,
                       kept=len(info.entries) + len(info.mirrors) - removed, kept_bytes=total, in_use=in_use)


def _sweep(location: Path, min_age_s: float = 3600.0) -> None:
    """Leftovers of a killed process (`.trash-*`, ingest temporaries `.<sha>.*.tmp`) older than `min_age_s`."""
    if not location.is_dir():
        return
    now = time.time()
    for shard in location.iterdir():
        if not shard.is_dir():
            continue
        for junk in shard.glob(".*"):
            if junk.name.endswith(".lock") or not junk.is_dir():
                continue
            try:
                if now - junk.stat().st_mtime > min_age_s:
                    shutil.rmtree(junk, ignore_errors=True)
            except OSError:
                continue
