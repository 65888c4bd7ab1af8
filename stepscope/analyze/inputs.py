"""What a path on the command line is: the one place that classifies inputs.

`resolve(path)` says which of a small closed set of inputs a path is, by these rules, in this order:

    a file:
      first bytes 0x80 (a binary pickle), or named *.pickle / *.pkl    -> Snapshot (CUDA memory snapshot)
      JSON (gzip sniffed by its magic bytes) opening with `[[`        -> MemoryTimeline (export_memory_timeline:
                                                                          raw `[[t, action, bytes, category], ...]`
                                                                          or plain `[[times], [sizes]]`)
      JSON opening with `{` or `[{` (a bare event array)              -> TraceFile (Chrome trace)
      HTML                                                            -> InputError (export_memory_timeline's
                                                                          .html page is a picture, not data)
      unreadable or empty: by name: *.json / *.json.gz -> TraceFile (its reader says what is wrong), or
      MemoryTimeline when the name says memory_timeline / .raw.json; anything else -> InputError
    a directory:
      meta.json + events.parquet + flows.parquet of this schema      -> IngestedTrace
      capture manifests (manifest*.json) here or in rank_<N>/, or
      rank_<N>/ (rank<N>/) sub-directories holding traces             -> RunDir: traces grouped per rank (rank
                                                                          from the manifest, else the directory
                                                                          or file name), each rank's profiler
                                                                          windows (one file per window when
                                                                          repeat > 1) in time order
      trace=*/rank=*/meta.json (a `stepscope ingest` dataset)         -> Dataset
      otherwise its traces, recursively (raw files by the file rule above, and ingested directories):
        none -> InputError; one, without `batch` -> that trace; else -> TraceBatch
    missing -> InputError

Every error is one line naming the path: InputError (exit code 2) for a path that is missing, empty or of
no known kind; UsageError (2) for an input of the wrong kind for the command (see `expect_trace`).

Discovery helpers (trace files under a directory, whether a directory is an ingested trace, a file's hash and
the trace id derived from it) live here too, so that ingest, the dataset, the loader and the commands share
them. This module never imports ingest.py (ingest imports it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

from stepscope.analyze._text import plural
from stepscope.analyze.remote import as_url, fetch
from stepscope.analyze.schema import INGEST_SCHEMA_VERSION
from stepscope.errors import InputError, UsageError

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_stem(path: Path) -> str:
    """What a trace's id starts with (`trace_id_for`): the file's name without .pt.trace.json.gz, tidied."""
    stem = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "trace"


def trace_id_for(path: Path, sha256: str) -> str:
    """A stable, readable id: the file's stem (without .pt.trace.json.gz) plus 8 hex digits of its hash."""
    return f"{trace_stem(path)}-{sha256[:8]}"


def file_sha256(path: Path) -> str:
    """sha256 of the file as stored (compressed bytes for .gz)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def hash_meanwhile(path: Path) -> Future[str]:
    """`file_sha256(path)` computed by a thread of its own (hashlib lets go of the GIL as it hashes), for a
    caller that has other work meanwhile: the future's result, or an InputError naming the file."""
    done: Future[str] = Future()

    def run() -> None:
        try:
            done.set_result(file_sha256(path))
        except OSError as exc:
            done.set_exception(InputError(f"cannot read: {exc.strerror or exc}", path=path))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            done.set_exception(exc)

    threading.Thread(target=run, name="stepscope-sha256", daemon=True).start()
    return done


def is_ingested(out_dir: Path, sha256: str | None = None, *, drop_added: bool = False) -> bool:
    """Whether out_dir holds a complete ingest of the current schema (of the file with this hash, if given),
    with the tracks `stepscope export` added left out or kept as `drop_added` says."""
    meta_path = out_dir / "meta.json"
    if not (meta_path.is_file() and (out_dir / "events.parquet").is_file() and (out_dir / "flows.parquet").is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if meta.get("ingest_schema_version") != INGEST_SCHEMA_VERSION:
        return False
    if (meta.get("added_tracks") == "dropped") != drop_added:
        return False
    return sha256 is None or meta.get("source", {}).get("sha256") == sha256


def _broken_ingest(directory: Path) -> str | None:
    """Why `directory`, which holds an ingested trace's files, is no complete one (`is_ingested`): the file missing
    or unreadable, or an ingest of another schema; None where it holds none of those files."""
    names = ("meta.json", "events.parquet", "flows.parquet")
    present = [n for n in names if (directory / n).is_file()]
    if not present:
        return None
    missing = [n for n in names if n not in present]
    if missing:
        return f"an ingested trace without {' or '.join(missing)} (ingest it again)"
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"an ingested trace whose meta.json is unreadable ({exc}; ingest it again)"
    if not isinstance(meta, dict) or meta.get("ingest_schema_version") != INGEST_SCHEMA_VERSION:
        found = meta.get("ingest_schema_version") if isinstance(meta, dict) else None
        return (f"an ingested trace of schema {found}, not {INGEST_SCHEMA_VERSION} (ingest it again with this "
                "version)")
    return "an ingested trace of the other kind (its exported tracks dropped or kept): ingest it again"


def find_trace_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files, directories (recursively) and globs into trace files, sorted within each directory.

    A directory contributes the files that `sniff` calls traces (not manifests, meta.json, snapshots or memory
    timelines); a directory with none, a missing path (no glob match either) and a named file of another kind
    are an InputError, raised before any work starts.
    """
    found: list[Path] = []
    for p in paths:
        url = as_url(p)
        if url is not None:  # object storage: the trace files it names, streamed to a local mirror
            fetched = fetch(url)
            for f in fetched:
                if len(fetched) == 1:
                    _expect_trace_file(f)
                if len(fetched) == 1 or _looks_like_trace(f):
                    found.append(f)
            continue
        p = Path(p)
        if p.is_dir():
            in_dir = _traces_under(p)
            if not in_dir:
                raise InputError(EMPTY_DIRECTORY, path=p)
            found.extend(in_dir)
        elif p.exists():
            _expect_trace_file(p)
            found.append(p)
        else:
            matches = sorted(Path().glob(str(p))) if not p.is_absolute() else sorted(
                Path(p.anchor).glob(str(p.relative_to(p.anchor))))
            if not matches:
                raise InputError(NOT_FOUND, path=p)
            found.extend(m for m in matches if m.is_file())
    seen: set[Path] = set()
    unique = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _traces_under(directory: Path) -> list[Path]:
    return sorted(q for q in directory.rglob("*") if q.is_file() and _looks_like_trace(q))


def _looks_like_trace(p: Path) -> bool:
    name = p.name
    if name.startswith(("manifest", ".")) or name == "meta.json":  # capture manifests (manifest.rank<N>.json too)
        return False
    return name.endswith(TRACE_SUFFIXES) and sniff(p) == "trace"


# ------------------------------------------------------------------------------------------- what a file is

FileKind = Literal["trace", "snapshot", "memory_timeline", "html", "unknown"]

NOT_FOUND = "no such file or directory"
EMPTY_DIRECTORY = "holds no trace (.json / .json.gz), capture run, dataset or ingested trace"
UNKNOWN_FILE = ("not a Chrome trace (.json / .json.gz), CUDA memory snapshot (.pickle) or "
                "export_memory_timeline file (.raw.json.gz / .json)")
HTML_FILE = ("an HTML page (export_memory_timeline's .html is a picture): export the timeline as "
             ".raw.json.gz or .json to analyze it")
_SNIFF_BYTES = 4096


def sniff(path: Path) -> FileKind:
    """A file's kind from its first bytes (gzip decompressed), or from its name where they do not tell."""
    head = _head(path)
    if head[:1] == b"\x80":
        return "snapshot"
    text = head.lstrip()
    if text[:1] == b"[":
        second = text[1:].lstrip()[:1]
        if second == b"[":
            return "memory_timeline"
        if second in (b"{", b"]"):  # a bare event array (Chrome's array format), or an empty one
            return "memory_timeline" if second == b"]" and _named_memory_timeline(path) else "trace"
    if text[:1] == b"{":
        return "trace"
    if text[:1] == b"<":
        return "html"
    return _kind_by_name(path)


def _head(path: Path) -> bytes:
    """Up to _SNIFF_BYTES of the file's content (decompressed when it is gzip); b"" when unreadable."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_SNIFF_BYTES)
            if raw[:2] != b"\x1f\x8b":
                return raw
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflate.decompress(raw, _SNIFF_BYTES)
            while len(out) < 64 and not inflate.eof and (more := fh.read(64 * 1024)):
                out += inflate.decompress(inflate.unconsumed_tail + more, _SNIFF_BYTES)
            return out
    except (OSError, zlib.error):
        return b""


def _named_memory_timeline(path: Path) -> bool:
    return ".raw.json" in path.name or "memory_timeline" in path.name


def _kind_by_name(path: Path) -> FileKind:
    name = path.name
    if name.endswith((".pickle", ".pkl")):
        return "snapshot"
    if name.endswith(".html"):
        return "html"
    if name.endswith(TRACE_SUFFIXES):
        return "memory_timeline" if _named_memory_timeline(path) else "trace"
    return "unknown"


def _expect_trace_file(path: Path) -> None:
    kind = sniff(path)
    if kind == "trace":
        return
    if kind == "snapshot":
        raise UsageError("is a CUDA memory snapshot, not a trace: use `stepscope snapshot`", path=path)
    if kind == "memory_timeline":
        raise UsageError("is an export_memory_timeline file, not a trace: use `stepscope memory-timeline`",
                         path=path)
    raise InputError(HTML_FILE if kind == "html" else UNKNOWN_FILE, path=path)


# ------------------------------------------------------------------------------------------------ the inputs


@dataclass(frozen=True, kw_only=True)
class TraceFile:
    """One raw Chrome trace file (.json / .json.gz, or any file whose content is one)."""

    path: Path


@dataclass(frozen=True, kw_only=True)
class IngestedTrace:
    """One ingested trace: a directory with events.parquet, flows.parquet and meta.json."""

    path: Path


@dataclass(frozen=True, kw_only=True)
class RankTraces:
    """One rank of a capture run: its profiler windows (one trace file each), in time order."""

    rank: int | None
    windows: tuple[Path, ...]


@dataclass(frozen=True, kw_only=True)
class RunDir:
    """A capture run: manifests, the traces of each rank, and its memory snapshots and memory timelines."""

    path: Path
    manifests: tuple[Path, ...]
    ranks: tuple[RankTraces, ...]  # by rank (unknown last)
    snapshots: tuple[Path, ...]
    memory_timelines: tuple[Path, ...]
    graph_captures: tuple[Path, ...] = ()  # profiles of a CUDA/HIP graph capture (`is_capture_file`): no rank's

    @property
    def traces(self) -> tuple[Path, ...]:
        """Every trace file of the run: rank by rank, each rank's windows in time order."""
        return tuple(w for r in self.ranks for w in r.windows)


@dataclass(frozen=True, kw_only=True)
class DatasetTrace:
    """One partition of a dataset: trace=<id>/rank=<r>/."""

    path: Path
    trace_id: str
    rank: str


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """A `stepscope ingest` output: hive-partitioned trace=<id>/rank=<r>/ directories."""

    path: Path
    traces: tuple[DatasetTrace, ...]


@dataclass(frozen=True, kw_only=True)
class TraceBatch:
    """A directory of several traces (raw files and ingested directories), found recursively."""

    path: Path
    traces: tuple[Path, ...]


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A CUDA caching-allocator snapshot pickle (torch.cuda.memory._dump_snapshot)."""

    path: Path


@dataclass(frozen=True, kw_only=True)
class MemoryTimeline:
    """An export_memory_timeline data file (raw events .raw.json.gz, or [times, sizes] .json)."""

    path: Path


Input: TypeAlias = TraceFile | IngestedTrace | RunDir | Dataset | TraceBatch | Snapshot | MemoryTimeline
OneTrace: TypeAlias = TraceFile | IngestedTrace


def resolve(path: str | Path, *, batch: bool = False) -> Input:
    """What `path` is (see the module docstring for the rules). `batch`: a plain directory is a TraceBatch
    even when it holds one trace (a run or a dataset stays what it is; a file stays a file).

    Raises InputError (one line, naming the path) for a missing path, a directory with no trace, and a file
    of no known kind. A URL (`s3://…`, see analyze/remote.py) is its files streamed to a local mirror: one file
    is what that file is, several a TraceBatch.
    """
    url = as_url(path)
    if url is not None:
        fetched = fetch(url)
        if len(fetched) == 1 and not batch:
            return _resolve_file(fetched[0])
        remote_traces = tuple(f for f in fetched if _looks_like_trace(f))
        if not remote_traces:
            raise InputError(EMPTY_DIRECTORY, path=url)
        return TraceBatch(path=Path(path), traces=remote_traces)
    path = Path(path)
    if not path.exists():
        raise InputError(NOT_FOUND, path=path)
    if not path.is_dir():
        return _resolve_file(path)
    if is_ingested(path):
        return IngestedTrace(path=path)
    run = _run_dir(path)
    if run is not None:
        return run
    partitions = _partitions(path)
    if partitions:
        return Dataset(path=path, traces=partitions)
    traces = _traces_and_ingested(path)
    if not traces:
        raise InputError(_broken_ingest(path) or EMPTY_DIRECTORY, path=path)
    if len(traces) == 1 and not batch:
        only = traces[0]
        return IngestedTrace(path=only) if only.is_dir() else TraceFile(path=only)
    return TraceBatch(path=path, traces=tuple(traces))


def _resolve_file(path: Path) -> Input:
    kind = sniff(path)
    if kind == "trace":
        if path.name.startswith("manifest") or path.name == "meta.json":
            raise UsageError("is a capture manifest or trace metadata: pass its directory", path=path)
        return TraceFile(path=path)
    if kind == "snapshot":
        return Snapshot(path=path)
    if kind == "memory_timeline":
        return MemoryTimeline(path=path)
    raise InputError(HTML_FILE if kind == "html" else UNKNOWN_FILE, path=path)


def _traces_and_ingested(directory: Path) -> list[Path]:
    ingested = [p.parent for p in directory.rglob("meta.json") if is_ingested(p.parent)]
    return sorted(_traces_under(directory) + ingested)


def _partitions(directory: Path) -> tuple[DatasetTrace, ...]:
    return tuple(DatasetTrace(path=m.parent, trace_id=m.parent.parent.name.removeprefix("trace="),
                              rank=m.parent.name.removeprefix("rank="))
                 for m in sorted(directory.glob("trace=*/rank=*/meta.json")))


# ------------------------------------------------------------------------------------------------ capture runs

# a rank in a file or directory name: rank3, rank_3, rank-3 (as ingest's meta.json reads it), worker3
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_RANK_DIR = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
# capture's trace names: <worker>.<time_ns>.pt.trace.json.gz
_TIME_IN_NAME = re.compile(r"\.(\d{10,})\.pt\.trace\.json(?:\.gz)?$")


def is_capture_file(path: Path) -> bool:
    """A profile of a graph capture, by where it lies or its name.

        run/capture_traces/rank_0.pt.trace.json.gz   -> True
        run/graph_capture_rank_0.json.gz             -> True
        run/graph_execution.json.gz                  -> False
    """
    return "capture_traces" in path.parts or "graph_capture" in path.name.lower()


def capture_beside(trace: Path) -> Path | None:
    """The profile of the graph capture that lies beside a trace FILE: its folder taken as its run directory.
    Only where that is unambiguous: the folder holds exactly one capture profile (a `*graph_capture*` trace in
    it, or a trace under its capture_traces/) and no trace but `trace` besides; else None.

        run/graph_execution.json.gz, run/capture_traces/rank_0.pt.trace.json.gz   -> that capture
        run/a.json, run/b.json, run/capture_traces/rank_0.json                    -> None (whose capture is it?)
        run/graph_execution.json.gz, run/capture_traces/rank_{0,1}.json           -> None (which one?)
    """
    if not trace.is_file() or is_capture_file(trace.resolve()):
        return None
    folder = trace.parent
    try:
        named = [f for f in sorted(folder.iterdir()) if f.is_file() and f.name.endswith(TRACE_SUFFIXES)]
    except OSError:  # a folder that cannot be listed (execute permission only): nothing found beside the trace
        return None
    sub = folder / "capture_traces"
    if not sub.is_dir() and not any(is_capture_file(Path(f.name)) for f in named):
        return None  # the common case: nothing that could be a capture, and no file opened to say so
    others = [f for f in named if not is_capture_file(Path(f.name)) and f.resolve() != trace.resolve()]
    if any(_looks_like_trace(f) for f in others):
        return None
    captures = [f for f in named if is_capture_file(Path(f.name)) and _looks_like_trace(f)]
    captures += _traces_under(sub) if sub.is_dir() else []
    return captures[0] if len(captures) == 1 else None



def _run_dir(directory: Path) -> RunDir | None:
    rank_dirs = {int(m.group(1)): d for d in sorted(directory.iterdir())
                 if d.is_dir() and (m := _RANK_DIR.fullmatch(d.name))}
    homes = [directory, *rank_dirs.values()]
    manifests = tuple(m for d in homes for m in sorted(d.glob("manifest*.json")))
    if not manifests and not any(_traces_under(d) for d in rank_dirs.values()):
        return None
    from_manifest = _manifest_files(manifests)
    dir_rank = {d: r for r, d in rank_dirs.items()}
    groups: dict[tuple[int | None, str], list[Path]] = {}
    snapshots: list[Path] = []
    timelines: list[Path] = []
    captures: list[Path] = []
    for home in homes:
        files = sorted(home.iterdir()) if home == directory else sorted(home.rglob("*"))
        for f in files:
            if not f.is_file() or f.name.startswith(("manifest", ".")):
                continue
            kind = sniff(f) if f.name.endswith((*TRACE_SUFFIXES, ".pickle", ".pkl")) else "unknown"
            if kind == "snapshot":
                snapshots.append(f)
            elif kind == "memory_timeline":
                timelines.append(f)
            elif kind == "trace" and is_capture_file(f.relative_to(directory)):
                captures.append(f)
            elif kind == "trace" and f.name != "meta.json":
                rank = _rank_of(f, from_manifest, dir_rank.get(home))
                worker = "" if rank is not None else f.name.split(".", 1)[0]
                groups.setdefault((rank, worker), []).append(f)
    if not groups:
        raise InputError("is a capture run with no trace file (see its manifest's status and problems)",
                         path=directory)
    ranks = tuple(RankTraces(rank=rank, windows=tuple(sorted(files, key=lambda f: _time_key(f, from_manifest))))
                  for (rank, _), files in sorted(groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0,
                                                                                    kv[0][1])))
    return RunDir(path=directory, manifests=manifests, ranks=ranks, snapshots=tuple(snapshots),
                  memory_timelines=tuple(timelines), graph_captures=tuple(captures))


def _manifest_files(manifests: Sequence[Path]) -> dict[Path, tuple[int | None, int | None]]:
    """Each trace file a manifest lists -> (its rank, its schedule cycle)."""
    listed: dict[Path, tuple[int | None, int | None]] = {}
    for m in manifests:
        try:
            doc = json.loads(m.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a damaged manifest: ranks come from the names instead
        if not isinstance(doc, dict):
            continue
        distributed = doc.get("distributed") or {}
        rank = distributed.get("rank") if isinstance(distributed, dict) else None
        for entry in doc.get("files") or []:
            if isinstance(entry, dict) and entry.get("kind") == "trace" and isinstance(entry.get("name"), str):
                cycle = entry.get("cycle")
                listed[(m.parent / entry["name"]).resolve()] = (
                    rank if isinstance(rank, int) else None, cycle if isinstance(cycle, int) else None)
    return listed


def _rank_of(f: Path, from_manifest: dict[Path, tuple[int | None, int | None]], dir_rank: int | None) -> int | None:
    listed = from_manifest.get(f.resolve())
    if listed is not None and listed[0] is not None:
        return listed[0]
    if dir_rank is not None:
        return dir_rank
    m = _RANK_IN_NAME.search(f.name)
    return int(m.group(1)) if m else None


def _time_key(f: Path, from_manifest: dict[Path, tuple[int | None, int | None]]) -> tuple[int, int, str]:
    """Windows in time order: the manifest's cycle, else the export time in capture's file name, else mtime."""
    listed = from_manifest.get(f.resolve())
    cycle = listed[1] if listed is not None and listed[1] is not None else -1
    m = _TIME_IN_NAME.search(f.name)
    return cycle, int(m.group(1)) if m else os.stat(f).st_mtime_ns, f.name


# ----------------------------------------------------------------------------------------- asking for one kind


def describe(inp: Input) -> str:
    """What an input is, in words: 'a capture run (2 ranks, 3 traces)'."""
    if isinstance(inp, TraceFile):
        return "a Chrome trace"
    if isinstance(inp, IngestedTrace):
        return "an ingested trace"
    if isinstance(inp, RunDir):
        return f"a capture run ({plural(len(inp.ranks), 'rank')}, {plural(len(inp.traces), 'trace')})"
    if isinstance(inp, Dataset):
        return f"a dataset of {plural(len(inp.traces), 'trace')}"
    if isinstance(inp, TraceBatch):
        return f"a directory of {len(inp.traces):,} traces"
    if isinstance(inp, Snapshot):
        return "a CUDA memory snapshot"
    return "an export_memory_timeline file"


#: what `memory_file` looks for: the kind, its name in messages, and the file names worth sniffing
_MEMORY_FILES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "snapshot": ("a CUDA memory snapshot (.pickle)", "CUDA memory snapshots (.pickle)", (".pickle", ".pkl")),
    "memory_timeline": ("an export_memory_timeline file", "export_memory_timeline files (.raw.json.gz / .json)",
                        (".json", ".gz")),
}


def memory_file(path: str | Path, kind: Literal["snapshot", "memory_timeline"]) -> Path:
    """The one CUDA memory snapshot or export_memory_timeline file that `path` is, or that a directory (a capture
    run's, or any) holds; found by name, then by its first bytes (`sniff`).

    Raises UsageError for an input of another kind ("is a Chrome trace, not a CUDA memory snapshot (.pickle)") and
    for a directory holding several ("holds 2 CUDA memory snapshots (.pickle): pass one: a.pickle, b.pickle");
    InputError for a directory holding none, and what `resolve` raises for a file.
    """
    one, many, suffixes = _MEMORY_FILES[kind]
    local = Path(path)
    if as_url(path) is None and local.is_dir():
        found = sorted(f for f in local.rglob("*") if f.is_file() and f.name.endswith(suffixes)
                       and not f.name.startswith(".") and sniff(f) == kind)
        if len(found) == 1:
            return found[0]
        if not found:
            raise InputError(f"holds no {many}", path=local)
        names = ", ".join(str(f.relative_to(local)) for f in found[:5]) + (", …" if len(found) > 5 else "")
        raise UsageError(f"holds {len(found):,} {many}: pass one: {names}", path=local)
    source = resolve(path)
    if not isinstance(source, Snapshot if kind == "snapshot" else MemoryTimeline):
        if isinstance(source, TraceFile) and as_url(path) is None and local.stat().st_size == 0:
            raise InputError(f"is empty (0 bytes), not {one}", path=path)  # (not "a Chrome trace", by its name)
        raise UsageError(f"is {describe(source)}, not {one}", path=path)
    return source.path


def traces_of(inp: Input) -> tuple[Path, ...]:
    """Every trace an input holds (raw files or ingested directories); () for snapshots and memory timelines."""
    if isinstance(inp, TraceFile | IngestedTrace):
        return (inp.path,)
    if isinstance(inp, RunDir | TraceBatch):
        return inp.traces
    if isinstance(inp, Dataset):
        return tuple(t.path for t in inp.traces)
    return ()


def workload_traces(inp: Input) -> tuple[Path, ...]:
    """`traces_of(inp)` without the profiles of a CUDA/HIP graph capture found in a directory or a dataset
    (`is_capture_file`; a dataset partition is trace=<id>/rank=<r>, and the id keeps the source file's name):
    they profile the capture, not the workload. A capture run's own traces leave them out already; an input
    that holds nothing but capture profiles keeps them (it was named for them)."""
    if isinstance(inp, TraceBatch):
        kept = tuple(p for p in inp.traces if not is_capture_file(
            p.relative_to(inp.path) if p.is_relative_to(inp.path) else Path(p.name)))
    elif isinstance(inp, Dataset):
        kept = tuple(t.path for t in inp.traces if not is_capture_file(Path(t.trace_id)))
    else:
        return traces_of(inp)
    return kept or traces_of(inp)


def expect_trace(inp: Input) -> OneTrace:
    """The one trace an input holds (a run, dataset or directory with exactly one is accepted), else a
    UsageError that says what the input is and which command reads it."""
    if isinstance(inp, TraceFile | IngestedTrace):
        return inp
    if isinstance(inp, Snapshot):
        raise UsageError("is a CUDA memory snapshot, not a trace: use `stepscope snapshot`", path=inp.path)
    if isinstance(inp, MemoryTimeline):
        raise UsageError("is an export_memory_timeline file, not a trace: use `stepscope memory-timeline`",
                         path=inp.path)
    traces = traces_of(inp)
    if len(traces) == 1:
        return IngestedTrace(path=traces[0]) if traces[0].is_dir() else TraceFile(path=traces[0])
    raise UsageError(f"is {describe(inp)}; pass one trace file, or use `stepscope report` (one page per trace) or "
                     "`stepscope ingest` for many", path=inp.path)
