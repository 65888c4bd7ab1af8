"""Many traces as one report's data: a capture run's ranks, a dataset, or a directory of traces.

`members(inp)` opens each trace of the collection in turn (lazily: one bundle at a time is computed by
whoever reads it) and never stops at a bad one: a trace that fails to load or analyse becomes a member with
its one-line failure and an error row, and the rest go on. `trace_row` is a trace's line in the index;
`straggler` names the member whose median step is slowest; `run_facts` reads a capture's manifest and
`side_files` analyses a run's memory snapshots and memory timelines.

    run/ rank_0 (median step 101 ms), rank_1 (140 ms), rank_2 (99 ms)  ->  straggler: rank_1's row
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.inputs import Dataset, RunDir, TraceBatch, traces_of
from stepscope.analyze.memory_categories import MemoryCategoriesResult, memory_categories
from stepscope.analyze.snapshot import SnapshotResult, analyze_snapshot
from stepscope.analyze.snapshot_read import read_snapshot
from stepscope.analyze.trace import load
from stepscope.errors import failure_line

Collection = RunDir | Dataset | TraceBatch


@dataclass(frozen=True, kw_only=True)
class Member:
    """One trace of a collection: the name of its page, its bundle (None when it failed) and its index row.

    `failure` is the one line naming the file that a batch prints for it (errors.failure_line)."""

    name: str
    path: Path
    bundle: TraceAnalysis | None
    row: dict[str, Any]
    failure: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What a capture's manifest says about the run (the first rank's manifest; `ranks` counts them)."""

    command: str | None
    device: str | None
    status: str | None
    ranks: int
    baseline_step_ns: float | None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class SideFile:
    """A run's memory snapshot or memory timeline, analysed (`result`), or why it could not be (`problem`)."""

    path: Path
    result: SnapshotResult | MemoryCategoriesResult | None
    problem: str | None = None


def page_names(inp: Collection) -> list[tuple[Path, str]]:
    """Each trace of the collection with the name of its page: rank<N> (rank<N>_w<k> for a rank's k-th
    profiler window) in a run, `<trace id>_rank=<r>` in a dataset, the file's own name in a directory."""
    if isinstance(inp, RunDir):
        if len(inp.traces) == 1:
            return [(inp.traces[0], "trace")]
        named: list[tuple[Path, str]] = []
        for i, rank in enumerate(inp.ranks):
            label = f"rank{rank.rank if rank.rank is not None else i}"
            named += [(w, label if len(rank.windows) == 1 else f"{label}_w{k}") for k, w in enumerate(rank.windows, 1)]
        return _unique(named)
    if isinstance(inp, Dataset):
        return _unique([(t.path, _slug(f"{t.trace_id}_rank={t.rank}")) for t in inp.traces])
    return _unique([(p, _slug(p.name.removesuffix(".gz").removesuffix(".json"))) for p in traces_of(inp)])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "trace"


def _unique(named: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """Names made unique by appending '_' (two files of one name in different folders get two pages)."""
    seen: set[str] = set()
    out = []
    for path, name in named:
        while name in seen:
            name += "_"
        seen.add(name)
        out.append((path, name))
    return out


def members(named: Sequence[tuple[Path, str]], *, cache_dir: Path | None = None) -> Iterator[Member]:
    """Each (path, page name) opened and its index row computed, in order; a failure is a member too."""
    for path, name in named:
        try:
            bundle = TraceAnalysis.of(load(path, cache_dir=cache_dir))
            row = trace_row(bundle)
        except Exception as exc:  # noqa: BLE001 - one bad trace is reported; the rest go on
            yield Member(name=name, path=path, bundle=None, row={"trace": path.name, "error": f"{type(exc).__name__}: "
                                                                  f"{exc}"}, failure=failure_line(exc, path))
            continue
        yield Member(name=name, path=path, bundle=bundle, row=row)


def trace_row(bundle: TraceAnalysis) -> dict[str, Any]:
    """The index figures of one trace (None where the trace has none).

    Step times are the steps table's wall times (p50, p95); `idle_causes` maps each gap cause to its share
    of the analysis window, `window_busy_fraction` is the busy share of the same window (gaps).
    """
    trace = bundle.trace
    try:
        verdict: str | None = str(bundle.verdict.verdict.value)
        problem = None
    except Exception as exc:  # noqa: BLE001 - a failing verdict must not drop the trace's other figures
        verdict, problem = None, f"verdict could not be computed: {type(exc).__name__}: {exc}"
    steps = bundle.steps.steps
    wall = steps["wall_ns"] if steps.height else None
    gaps = bundle.gaps
    shares: dict[str, float] = {}
    if gaps.window_ns > 0 and gaps.idle_by_cause.height:
        by = gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum()).sort("idle_ns", descending=True)
        shares = {str(c): float(v) / gaps.window_ns for c, v in by.iter_rows()}
    return {
        "trace": trace.source_name,
        "rank": trace.rank,
        "verdict": verdict,
        "steps": steps.height,
        "median_step_ns": wall.median() if wall is not None else None,
        "p95_step_ns": wall.quantile(0.95, "linear") if wall is not None else None,
        "gpu_busy_fraction": bundle.steps.mean_gpu_busy_fraction,
        "gpu_idle_ns": steps["gpu_idle_ns"].mean() if steps.height else None,
        "idle_causes": shares or None,
        "window_busy_fraction": gaps.busy_fraction,
        "peak_memory_bytes": bundle.memory.peak_allocated_bytes,
        "peak_device": bundle.memory.peak_device,
        "warnings": bundle.info.warnings.height,
        "error": problem,
    }


def straggler(found: Sequence[Member]) -> str | None:
    """Page name of the member whose median step is slowest, when at least two have one (else None)."""
    timed = [(m.row["median_step_ns"], m.name) for m in found if m.row.get("median_step_ns") is not None]
    if len(timed) < 2:
        return None
    slowest = max(t for t, _ in timed)
    return next(name for t, name in timed if t == slowest)


def run_facts(manifests: Sequence[Path]) -> RunFacts | None:
    """The capture's command, device, status and unprofiled baseline step time, from its first manifest
    (None without manifests, or when it cannot be read as a JSON object)."""
    if not manifests:
        return None
    try:
        first = json.loads(manifests[0].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(first, dict):
        return None
    argv = (first.get("command") or {}).get("argv")
    device = first.get("device") or {}
    baseline = (first.get("baseline") or {}).get("mean_ns")
    return RunFacts(
        command=" ".join(map(str, argv)) if argv else None,
        device=f"{device.get('type', '?')} {device.get('name', '')}".strip() if device else None,
        status=str(first.get("status")), ranks=len(manifests),
        baseline_step_ns=float(baseline) if isinstance(baseline, (int, float)) and baseline else None,
        notes=[str(n) for n in first.get("notes") or []],
        error=str(first["error"]) if first.get("error") else None,
    )


def side_files(run: RunDir) -> list[SideFile]:
    """A run's memory timelines (by category) and CUDA memory snapshots, analysed; a bad one says why."""
    out: list[SideFile] = []
    for path in (*run.memory_timelines, *run.snapshots):
        try:
            result: SnapshotResult | MemoryCategoriesResult = (
                memory_categories(path) if path in run.memory_timelines else analyze_snapshot(read_snapshot(path)))
        except Exception as exc:  # noqa: BLE001 - a bad side file must not lose the run's report
            out.append(SideFile(path=path, result=None, problem=f"{path.name}: {type(exc).__name__}: {exc}"))
            continue
        out.append(SideFile(path=path, result=result))
    return out
