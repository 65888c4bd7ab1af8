"""The ranks of a run, each with its collectives: what `stepscope comm` reads before it matches anything.

Inputs are what `inputs.resolve` says they are (a capture run, a dataset, a directory of traces, one trace)
or several of those. A rank comes from the capture manifest or its `rank_<N>/` directory, else the trace's
`distributedInfo` or file name (ingest reads both). A rank's profiler windows are pooled in time order.

Problems never stop the run; each becomes a warning that names what it drops:

    a trace that fails to load                  -> named, left out
    several traces and one names no rank        -> named, left out (one trace alone is rank 0)
    traces of another world size (mixed runs)   -> named, left out (the most common world size stays)
    ranks on one host traced at different times -> an error: traces of different runs (`_one_time`)
    two traces of one rank that overlap in time -> the second named as a duplicate, left out
    ranks below the world size with no trace    -> listed as missing
    a rank with no collective                   -> named

A large run is read in parallel, one rank at a time per worker process (`usable_cores()` of them, from
PARALLEL_FROM traces or ranks): the workers ingest the traces the cache lacks, then find each rank's
collectives, and only those small tables come back, so memory holds one rank's events per worker, never the
run's (`benchmarks/comm_scale.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import polars as pl

from stepscope.analyze._comm_events import pg_config_of, rank_calls
from stepscope.analyze._text import numbered, plural
from stepscope.analyze._workers import broken_how, pool_processes, usable_cores, worker_pool
from stepscope.analyze.inputs import MemoryTimeline, RunDir, Snapshot, describe, resolve, traces_of
from stepscope.analyze.trace import Trace, load
from stepscope.errors import InputError, StepscopeError, UsageError, failure_line

#: from this many traces (or ranks), run_calls reads them in worker processes
PARALLEL_FROM = 16

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, kw_only=True)
class RankCalls:
    """One rank: its trace files (windows in time order) and their traces, clock domain, host and collectives
    (CALL_SCHEMA)."""

    rank: int
    files: tuple[Path, ...]
    traces: tuple[Trace, ...]
    clock: str
    host: str | None
    calls: pl.DataFrame


@dataclass(frozen=True, kw_only=True)
class RunCalls:
    """The ranks kept, the world size the traces state (None when none does) and the warnings."""

    ranks: tuple[RankCalls, ...]
    world_size: int | None
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class _Loaded:
    path: Path
    trace: Trace
    rank: int | None


def run_calls(paths: Sequence[str | Path], *, cache_dir: Path | None = None) -> RunCalls:
    """Every rank of the run that `paths` name, with its collectives (see the module docstring)."""
    warnings: list[str] = []
    declared = _declared(paths)
    _ingest_in_parallel([p for p, _ in declared], cache_dir)
    loaded = _load_all(declared, cache_dir, warnings)
    if not loaded:
        more = f" (and {plural(len(warnings) - 1, 'more')})" if len(warnings) > 1 else ""
        first = warnings[0].removeprefix("left out: ") if warnings else ""
        raise InputError(f"no trace could be read: {first}{more}" if warnings else "holds no trace",
                         path=paths[0] if len(paths) == 1 else ", ".join(map(str, paths)))
    loaded = _ranked(loaded, warnings)
    world, loaded = _one_world(loaded, warnings)
    by_rank = _by_rank(loaded, warnings)
    ordered = sorted(by_rank.items())
    tables = parallel_map(_calls_of, [([x.path for x in items], cache_dir) for _, items in ordered])
    ranks = tuple(_rank_calls(rank, items, calls) for (rank, items), calls in zip(ordered, tables, strict=True))
    _one_time(ranks, paths)
    if world is not None and (missing := sorted(set(range(world)) - set(by_rank))):
        have = "has" if len(missing) == 1 else "have"
        warnings.append(f"{numbered('rank', missing)} of world size {world} {have} no trace: results for the rest")
    if idle := [r.rank for r in ranks if r.calls.height == 0]:
        warnings.append(f"{numbered('rank', idle)} ran no collective (no NCCL/RCCL kernel, no gloo:* or "
                        "record_param_comms op)")
    return RunCalls(ranks=ranks, world_size=world, warnings=tuple(warnings))


def _declared(paths: Sequence[str | Path]) -> list[tuple[Path, int | None]]:
    """Each trace the paths hold, with the rank its capture run declares (None: the trace will say)."""
    out: list[tuple[Path, int | None]] = []
    for p in paths:
        inp = resolve(p, batch=True)
        if isinstance(inp, Snapshot | MemoryTimeline):
            raise UsageError(f"is {describe(inp)}, not a trace: `stepscope comm` reads the traces of a run",
                             path=inp.path)
        if isinstance(inp, RunDir):
            out += [(w, r.rank) for r in inp.ranks for w in r.windows]
        else:
            out += [(t, None) for t in traces_of(inp)]
    return out


def _load_all(declared: list[tuple[Path, int | None]], cache_dir: Path | None, warnings: list[str]) -> list[_Loaded]:
    loaded = []
    for path, rank in declared:
        try:
            trace = load(path, cache_dir=cache_dir)
        except StepscopeError as exc:
            if len(declared) == 1:  # the run is this trace: its own error, as every command gives it
                raise
            warnings.append(f"left out: {failure_line(exc, path)}")
            continue
        loaded.append(_Loaded(path, trace, rank if rank is not None else trace.rank))
    return loaded


def _ranked(loaded: list[_Loaded], warnings: list[str]) -> list[_Loaded]:
    """One trace without a rank is rank 0; among several, a trace without a rank is left out."""
    if len(loaded) == 1 and loaded[0].rank is None:
        return [_Loaded(loaded[0].path, loaded[0].trace, 0)]
    if nameless := [x.path.name for x in loaded if x.rank is None]:
        warnings.append(f"left out, no rank (no distributedInfo, manifest or rank in the file name): "
                        f"{', '.join(nameless)}")
    return [x for x in loaded if x.rank is not None]


def _one_world(loaded: list[_Loaded], warnings: list[str]) -> tuple[int | None, list[_Loaded]]:
    """The most common stated world size, and the traces that state it. Where some traces state one, a trace that
    states none (no distributedInfo: its rank from a manifest or its file name) is of another capture, not a
    window of that rank: a dataset of several jobs put worker0.pt.trace.json of a single-GPU run into rank 0."""
    sizes = Counter(x.trace.meta.world_size for x in loaded if x.trace.meta.world_size is not None)
    if not sizes:
        return None, loaded
    world = sizes.most_common(1)[0][0]
    if other := [x for x in loaded if x.trace.meta.world_size not in (None, world)]:
        warnings.append(f"mixed run: left out {plural(len(other), 'trace')} of another world size than {world}: "
                        + ", ".join(f"{x.trace.source_name} ({x.trace.meta.world_size})" for x in other))
    if unstated := [x for x in loaded if x.trace.meta.world_size is None]:
        state = "states" if len(unstated) == 1 else "state"
        warnings.append(f"mixed run: left out {plural(len(unstated), 'trace')} that {state} no world size "
                        f"(no distributedInfo) beside traces of world size {world}: "
                        + ", ".join(x.trace.source_name for x in unstated))
    return world, [x for x in loaded if x.trace.meta.world_size == world]


def _by_rank(loaded: list[_Loaded], warnings: list[str]) -> dict[int, list[_Loaded]]:
    """Traces per rank in time order; one that overlaps a window already kept is a duplicate."""
    by_rank: dict[int, list[_Loaded]] = {}
    for x in sorted(loaded, key=lambda x: (x.rank or 0, x.trace.meta.time.first_ns or 0)):
        if x.rank is None:  # _ranked dropped these already
            continue
        kept = by_rank.setdefault(x.rank, [])
        if kept and _overlap(kept[-1].trace, x.trace):
            warnings.append(f"duplicate rank {x.rank}: {x.path.name} overlaps {kept[-1].path.name} in time (or is "
                            f"on another host); {x.path.name} left out, {kept[-1].path.name} kept")
            continue
        kept.append(x)
    return by_rank


def _overlap(a: Trace, b: Trace) -> bool:
    """Two traces of one rank that cannot be two windows of one process: other hosts, or times that overlap."""
    if (ha := _host(a)) and (hb := _host(b)) and ha != hb:
        return True
    a0, a1, b0, b1 = a.meta.time.first_ns, a.meta.time.last_ns, b.meta.time.first_ns, b.meta.time.last_ns
    if a0 is None or a1 is None or b0 is None or b1 is None:
        return False
    return b0 < a1 and a0 < b1


def _host(trace: Trace) -> str | None:
    host = trace.meta.top_level.get("host_name")
    return host if isinstance(host, str) and host else None


def _rank_calls(rank: int, items: list[_Loaded], calls: pl.DataFrame) -> RankCalls:
    """One rank: its windows and collectives (`_calls_of`). Its clock: its host and base time when the trace
    names its host (ranks on one host read one clock), else its own."""
    first = items[0].trace
    host = _host(first)
    return RankCalls(rank=rank, files=tuple(x.path for x in items), traces=tuple(x.trace for x in items),
                     clock=f"{host}@{first.meta.base_time_ns or 0}" if host else f"rank{rank}", host=host,
                     calls=calls)


def _one_time(ranks: Sequence[RankCalls], paths: Sequence[str | Path]) -> None:
    """InputError where two ranks on one clock (one host) were traced at different times: traces of different
    runs (or of one rank's runs), whose collectives were never one call; matched anyway they give skews of the
    time between the runs and a straggler that is only the later run."""
    by_clock: dict[tuple[str, str], list[tuple[int, int, int, Path]]] = {}
    for r in ranks:
        times = [t.meta.time for t in r.traces]
        firsts = [t.first_ns for t in times if t.first_ns is not None]
        lasts = [t.last_ns for t in times if t.last_ns is not None]
        if r.host is not None and firsts and lasts:
            by_clock.setdefault((r.clock, r.host), []).append((min(firsts), max(lasts), r.rank, r.files[0]))
    for (_, host), spans in by_clock.items():
        late = max(spans, key=lambda s: s[0])
        early = min(spans, key=lambda s: s[1])
        if late[0] > early[1]:
            gap = (late[0] - early[1]) / 1e9
            raise InputError(
                f"ranks {early[2]} ({early[3].name}) and {late[2]} ({late[3].name}) share host {host}'s "
                f"clock but were traced at different times (rank {early[2]}'s trace ends {gap:,.1f} s before rank "
                f"{late[2]}'s begins): traces of different runs; give the traces of one run",
                path=paths[0] if len(paths) == 1 else ", ".join(map(str, paths)))


def _calls_of(job: tuple[list[Path], Path | None]) -> pl.DataFrame:
    """One rank's collectives over its windows (trace paths, in time order), by start (run in a worker)."""
    paths, cache_dir = job
    frames = []
    for path in paths:
        trace = load(path, cache_dir=cache_dir)
        frames.append(rank_calls(trace, pg_config=pg_config_of(trace.meta.distributed)))
    return pl.concat(frames, how="vertical").sort("ts_ns")


def _ingest_one(job: tuple[Path, Path | None]) -> None:
    """Ingest one trace into the cache (in a worker); a failure is left for `_load_all` to report."""
    try:
        load(job[0], cache_dir=job[1])
    except StepscopeError:
        pass


def _ingest_in_parallel(paths: list[Path], cache_dir: Path | None) -> None:
    """The traces the cache lacks, ingested by the workers (a no-op below PARALLEL_FROM traces: `_load_all`
    ingests them one by one)."""
    if len(paths) >= PARALLEL_FROM:
        parallel_map(_ingest_one, [(p, cache_dir) for p in paths])


def parallel_map(fn: Callable[[_T], _R], jobs: Iterable[_T]) -> list[_R]:
    """fn over jobs, in order: in worker processes from PARALLEL_FROM jobs on a machine with several cores (fn
    and the jobs must pickle: paths and small tables, never a Trace). `ranks` uses it for its per-rank work."""
    todo = list(jobs)
    cores = usable_cores()
    if len(todo) < PARALLEL_FROM or cores < 2:
        return [fn(j) for j in todo]
    with worker_pool(cores) as pool:  # from the fork server: this process runs polars' threads by now
        try:
            return list(pool.map(fn, todo, chunksize=max(1, len(todo) // (cores * 8))))
        except BrokenProcessPool:
            workers = pool_processes(pool)
    raise StepscopeError(f"the run's traces could not all be analysed: {broken_how(workers, 'a')}")


