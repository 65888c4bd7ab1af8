"""Batch ingest: many traces -> one hive-partitioned Parquet dataset, in parallel processes.

Layout (one partition per trace, with its rank; `__HIVE_DEFAULT_PARTITION__` when the rank is unknown):

    DATASET/
      trace=<stem>-<sha8>/rank=<r>/events.parquet
      trace=<stem>-<sha8>/rank=<r>/flows.parquet
      trace=<stem>-<sha8>/rank=<r>/meta.json

    pl.scan_parquet("DATASET/**/events.parquet", hive_partitioning=True)
    duckdb: SELECT … FROM read_parquet('DATASET/*/*/events.parquet', hive_partitioning = true)

Ingest is a per-file map (`ingest_one`), so it runs unchanged under any executor.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from stepscope.analyze._read import json_size
from stepscope.analyze._workers import mark_import_threads, surviving_map, usable_cores
from stepscope.analyze.cache import default_cache_dir, source_sha256
from stepscope.analyze.engines import Engine, import_ray, ray_map
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.inputs import (
    find_trace_files,
    hash_meanwhile,
    is_ingested,
    trace_id_for,
    trace_stem,
)
from stepscope.analyze.meta import read_meta
from stepscope.errors import StepscopeError, failure_line

mark_import_threads()  # polars, pyarrow and stepscope are loaded: see worker_context

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True, kw_only=True)
class FileOutcome:
    """What happened to one input file."""

    source: str
    trace_id: str | None
    out_dir: str | None
    status: str  # "ingested" | "skipped" | "failed"
    n_events: int | None
    seconds: float | None
    error: str | None


@dataclass(frozen=True, kw_only=True)
class BatchResult:
    """The outcome of a batch ingest; `failed` says whether the exit code should be non-zero."""

    dataset: str
    outcomes: tuple[FileOutcome, ...]

    @property
    def failed(self) -> int:
        """How many files could not be ingested."""
        return sum(o.status == "failed" for o in self.outcomes)


def _partition_dir(dataset: Path, trace_id: str, rank: int | None) -> Path:
    return dataset / f"trace={trace_id}" / f"rank={rank if rank is not None else NULL_PARTITION}"


def existing_partition(dataset: Path, trace_id: str) -> Path | None:
    """The partition directory already holding this trace id, if any."""
    parent = dataset / f"trace={trace_id}"
    if not parent.is_dir():
        return None
    for child in sorted(parent.glob("rank=*")):
        if is_ingested(child):
            return child
    return None


def ingest_one(source: str, dataset: str, force: bool = False, jobs: int = 1, spare_core: bool = True,
               drop_added: bool = False) -> FileOutcome:
    """Ingest one file into its partition of the dataset (on `jobs` cores when it is large; `spare_core`,
    `drop_added`: see ingest_trace). Never raises for a bad trace: reports it.

    The file's sha256 names its partition and tells an unchanged file, to skip. Where no partition of a file of
    its name is there yet (or with `force`), nothing can be skipped: with `spare_core`, a thread then hashes the
    file while it is ingested, instead of before (a 607 MB trace's hash takes about half a second)."""
    src, root = Path(source), Path(dataset)
    sha: str | Future[str] | None = None
    try:
        stem = trace_stem(src)
        if spare_core and (force or not any(root.glob(f"trace={glob.escape(stem)}-*"))):
            sha = hash_meanwhile(src)  # no partition of a file of this name: nothing to skip, no need to wait
        else:  # (the hash remembered in the trace cache against the file's stat: an unchanged file is not read)
            sha = source_sha256(default_cache_dir(), src)
            done = existing_partition(root, trace_id_for(src, sha))
            if not force and done is not None and is_ingested(done, sha, drop_added=drop_added):
                meta = read_meta(done)
                return FileOutcome(source=source, trace_id=trace_id_for(src, sha), out_dir=str(done),
                                   status="skipped", n_events=meta.counts.events, seconds=0.0, error=None)
        staging = root / f".staging-{stem}-{socket.gethostname()}-{os.getpid()}"  # (Ray: many hosts, one dataset)
        result = ingest_trace(src, staging, force=True, jobs=jobs, sha256=sha, spare_core=spare_core,
                              drop_added=drop_added)
        meta = read_meta(staging)
        trace_id = meta.trace_id
        target = _partition_dir(root, trace_id, meta.rank)
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, target)
        _drop_earlier_versions(root, stem, src, keep=target.parent)
        return FileOutcome(source=source, trace_id=trace_id, out_dir=str(target), status="ingested",
                           n_events=result.n_events, seconds=result.seconds, error=None)
    except StepscopeError as exc:
        return FileOutcome(source=source, trace_id=None, out_dir=None, status="failed", n_events=None,
                           seconds=None, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - one bad file must not stop a batch; say what it was
        return FileOutcome(source=source, trace_id=None, out_dir=None, status="failed", n_events=None,
                           seconds=None, error=f"{source}: unexpected {type(exc).__name__}: {exc}")
    finally:
        if isinstance(sha, Future):
            sha.exception()  # (a file that failed: its hashing thread ends before this returns, never outlives it)


def _drop_earlier_versions(root: Path, stem: str, src: Path, *, keep: Path) -> None:
    """Remove the partitions of an earlier version of the file `src` (its path, another sha256: it changed since it
    was ingested), so that the dataset holds each file once; `keep` is the one just written. A file of the same name
    elsewhere (another run's rank0.json) is another file and stays."""
    here = str(src.resolve())
    for parent in root.glob(f"trace={glob.escape(stem)}-*"):
        if parent == keep or not parent.is_dir():
            continue
        for child in parent.glob("rank=*"):
            try:
                same = read_meta(child).source.path == here
            except (OSError, StepscopeError, ValueError):
                continue
            if same:
                shutil.rmtree(parent, ignore_errors=True)
                break


def ingest_many(paths: Sequence[Path], dataset: Path, *, jobs: int | None = None, force: bool = False,
                on_done: Callable[[FileOutcome], None] | None = None, fork_workers: bool = False,
                engine: Engine = "local", address: str | None = None, drop_added: bool = False) -> BatchResult:
    """Ingest files/directories/globs into `dataset`, `jobs` processes at a time (default: the cores this
    process may use).

    `engine="ray"`: each file is a Ray task instead (engines.ray_map) on the cluster at `address` (None or
    "local": one started here, with `jobs` CPUs), writing the same partitions; the dataset must then be on
    storage every node sees.

    `fork_workers`: fork the worker processes from this one where that is safe (see
    _workers.worker_context): a quarter of a second sooner at work. For a process of its own that ran
    nothing before importing stepscope, as the CLI; leave it False in a process that may have run polars.

    `drop_added`: leave out the tracks `stepscope export` added (see ingest_trace).
    """
    files = find_trace_files(paths)
    if engine == "ray":
        import_ray()  # (not installed: one line saying how, before anything is written)
    created = not dataset.exists()
    dataset.mkdir(parents=True, exist_ok=True)
    if engine == "ray":
        runner = _run_ray(files, dataset, force, address, jobs, drop_added)
    else:
        runner = _run(files, dataset, max(1, jobs or usable_cores()), force, fork_workers, drop_added)
    outcomes: list[FileOutcome] = []
    try:
        for outcome in runner:
            outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)
    finally:  # (also when the engine could not start)
        for stale in dataset.glob(".staging-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if created and not any(dataset.iterdir()):  # every file failed: leave no empty dataset behind
            dataset.rmdir()
    order = {str(f): i for i, f in enumerate(files)}
    outcomes.sort(key=lambda o: order.get(o.source, 0))
    return BatchResult(dataset=str(dataset), outcomes=tuple(outcomes))


def _run_ray(files: list[Path], dataset: Path, force: bool, address: str | None,
             jobs: int | None, drop_added: bool) -> Iterator[FileOutcome]:
    """Each file an `ingest_one` Ray task, largest first; a task Ray lost is that file's failure.

    A task gets absolute paths (a worker's working directory is not this process's), and its outcome is told in
    the paths as given here, as the local engine tells it."""
    def lost(args: tuple[str, str, bool, int, bool, bool], exc: BaseException) -> FileOutcome:
        return FileOutcome(source=args[0], trace_id=None, out_dir=None, status="failed", n_events=None,
                           seconds=None, error=failure_line(exc, args[0]))

    given = {str(f.absolute()): str(f) for f in files}
    root = str(dataset.absolute())
    tasks = [(str(f.absolute()), root, force, 1, False, drop_added) for f in sorted(files, key=json_size, reverse=True)]
    for outcome in ray_map(ingest_one, tasks, on_error=lost, address=address, num_cpus=jobs):
        source = given.get(outcome.source, outcome.source)
        out_dir = outcome.out_dir
        if out_dir is not None and out_dir.startswith(root):
            out_dir = str(dataset) + out_dir[len(root):]
        error = outcome.error.replace(outcome.source, source, 1) if outcome.error is not None else None
        yield replace(outcome, source=source, out_dir=out_dir, error=error)


def _run(files: list[Path], dataset: Path, jobs: int, force: bool, fork: bool,
         drop_added: bool) -> Iterator[FileOutcome]:
    """Ingest the files on `jobs` cores: jobs - 1 worker processes plus this process itself.

    Largest files first keeps the cores evenly loaded, by the size of their JSON (for gzip, the size its
    trailer states: a gzip trace of 1 MB may hold thirty times the JSON of a plain one). This process
    ingests a file while the workers start (a worker needs a moment to come up), so a short batch never
    waits for them, and the workers are kept two files ahead so that none idles while this process is busy.
    A worker that dies (the out-of-memory killer) fails the file that killed it, and the rest go on
    (_workers.surviving_map).
    """
    processes = 1 if jobs == 1 or len(files) <= 1 else min(jobs, len(files))
    # Helper threads per ingest (the Parquet writer, faulting memory in ahead, hashing while reading) pay
    # only where a core is left for them: with a process on every core they would take their time from
    # another process's file, so each process then does that work in turn on its own thread.
    spare = processes < usable_cores()
    if processes == 1:  # every file here in turn (a lone file has its spans decoded on `jobs` cores instead)
        for f in files:
            yield ingest_one(str(f), str(dataset), force, jobs, spare, drop_added)
        return

    def lost(args: tuple[str, str, bool, int, bool, bool], how: str) -> FileOutcome:
        return FileOutcome(source=args[0], trace_id=None, out_dir=None, status="failed", n_events=None,
                           seconds=None, error=f"{args[0]}: {how}")

    jobs_list = [(str(f), str(dataset), force, 1, spare, drop_added)
                 for f in sorted(files, key=json_size, reverse=True)]
    # (with fork, the first submit forks every worker before this process starts a thread)
    yield from surviving_map(ingest_one, jobs_list, processes=processes - 1, lost=lost,
                             here=lambda args: ingest_one(*args), fork_if_fresh=fork)
