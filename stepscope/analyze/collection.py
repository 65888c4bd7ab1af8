"""Many traces as one report's data: a capture run's ranks, a dataset, or a directory of traces.

`members(inp)` opens each trace of the collection in turn (lazily: one bundle at a time is computed by
whoever reads it) and never stops at a bad one: a trace that fails to load or analyse becomes a member with
its one-line failure and an error row, and the rest go on. `trace_row` is a trace's line in the index;
`straggler` names the member whose median step is slowest; `run_facts` reads a capture's manifest and
`side_files` analyses a run's memory snapshots and memory timelines. `fleet_stats` sums a batch's rows up: verdict
counts, the spread of step time and GPU busy across traces, the worst runs.

    run/ rank_0 (median step 101 ms), rank_1 (140 ms), rank_2 (99 ms)  ->  straggler: rank_1's row
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.graphs import with_graph_capture
from stepscope.analyze.inputs import Dataset, RunDir, TraceBatch, workload_traces
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
    #: the manifest's profiled mean / baseline mean, the ratio `stepscope capture` printed (None where unmeasured)
    overhead_ratio: float | None = None


@dataclass(frozen=True, kw_only=True)
class SideFile:
    """A run's memory snapshot or memory timeline, analysed (`result`), or why it could not be (`problem`)."""

    path: Path
    result: SnapshotResult | MemoryCategoriesResult | None
    problem: str | None = None


def page_names(inp: Collection) -> list[tuple[Path, str]]:
    """Each trace of the collection with the name of its page: rank<N> (rank<N>_w<k> for a rank's k-th
    profiler window) in a run, `<trace id>_rank=<r>` in a dataset, the file's path under a directory
    (`h100_trace` for h100/trace.json.gz)."""
    if isinstance(inp, RunDir):
        if len(inp.traces) == 1:
            return [(inp.traces[0], "trace")]
        named: list[tuple[Path, str]] = []
        for i, rank in enumerate(inp.ranks):
            label = f"rank{rank.rank if rank.rank is not None else i}"
            named += [(w, label if len(rank.windows) == 1 else f"{label}_w{k}") for k, w in enumerate(rank.windows, 1)]
        return _unique(named)
    if isinstance(inp, Dataset):
        kept = set(workload_traces(inp))
        return _unique([(t.path, _slug(f"{t.trace_id}_rank={t.rank}")) for t in inp.traces if t.path in kept])
    return _unique([(p, _slug(relative_name(p, inp.path).removesuffix(".gz").removesuffix(".json")))
                    for p in workload_traces(inp)])


def relative_name(path: Path, root: Path) -> str:
    """A trace of a directory by its path under the directory, so that two files of one name in different folders
    read apart (`h100/trace.json.gz`, `mi300/trace.json.gz`); its file name where it is not under it."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


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


def members(named: Sequence[tuple[Path, str]], *, cache_dir: Path | None = None,
            captures: dict[Path, Path] | None = None,
            start: Callable[[TraceAnalysis], None] | None = None) -> Iterator[Member]:
    """Each (path, page name) opened and its index row computed, in order; a failure is a member too.
    `captures`: a trace's graph-capture profile (`RunDir.graph_captures`), which maps its replayed kernels to
    the ops that launched them (`graphs.with_graph_capture`); `start`: given each bundle before anything of it is
    computed (a report's workers, which compute analyses ahead: `_render.FigureWorkers.analyse_ahead`)."""
    for path, name in named:
        try:
            trace = load(path, cache_dir=cache_dir)
            capture = (captures or {}).get(path)
            bundle = TraceAnalysis.of(trace if capture is None else
                                      with_graph_capture(trace, load(capture, cache_dir=cache_dir)))
            if start is not None:
                start(bundle)
            row = trace_row(bundle)
        except Exception as exc:  # noqa: BLE001 - one bad trace is reported; the rest go on
            yield Member(name=name, path=path, bundle=None, row={"trace": path.name, "error": f"{type(exc).__name__}: "
                                                                  f"{exc}"}, failure=failure_line(exc, path))
            continue
        yield Member(name=name, path=path, bundle=bundle, row=row)


def trace_row(bundle: TraceAnalysis) -> dict[str, Any]:
    """The index figures of one trace (None where the trace has none).

    Step times are the steps table's wall times (p50, p95); `idle_causes` maps each gap cause to its share
    of the analysis window, `window_busy_fraction` is the busy share of the same window (gaps);
    `summary_gpu_busy_fraction` is the verdict's GPU busy (busy time over all steps' wall time), the figure
    `stepscope summary` and `stepscope fleet` give.
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
        by = gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum()).sort(
            "idle_ns", "cause", descending=[True, False])
        shares = {str(c): float(v) / gaps.window_ns for c, v in by.iter_rows()}
    return {
        "trace": trace.source_name,
        "rank": trace.rank,
        "verdict": verdict,
        "steps": steps.height,
        "median_step_ns": wall.median() if wall is not None else None,
        "p95_step_ns": wall.quantile(0.95, "linear") if wall is not None else None,
        "gpu_busy_fraction": bundle.steps.gpu_busy_fraction,
        "gpu_idle_ns": steps["gpu_idle_ns"].mean() if steps.height else None,
        "idle_causes": shares or None,
        "window_busy_fraction": gaps.busy_fraction,
        "summary_gpu_busy_fraction": _finite(bundle.verdict.gpu_busy_fraction) if verdict is not None else None,
        "peak_memory_bytes": bundle.memory.peak_allocated_bytes,
        "peak_device": bundle.memory.peak_device,
        "warnings": bundle.info.warnings.height,
        "error": problem,
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


@dataclass(frozen=True, kw_only=True)
class Spread:
    """One figure across traces: how many have it, its min, p50, p90 and max (linear interpolation)."""

    traces: int
    min: float
    p50: float
    p90: float
    max: float


@dataclass(frozen=True, kw_only=True)
class FleetStats:
    """A batch's index rows summed up (`fleet_stats`).

    `verdicts`: traces per verdict, most first ('no verdict' for a reported trace without one; failed traces
    are counted in `failed` only). `step_p50`, `step_p95`, `gpu_busy`: the spread across traces of each trace's
    median and p95 step wall time and its GPU busy (the verdict's, as `stepscope fleet` gives it), None where
    no trace has the figure. `lowest_busy` and `longest_p95`: the worst rows (the index rows themselves), in
    the order of `stepscope fleet --sort gpu_busy` and `--sort step_p95 --desc` (ties in input order)."""

    traces: int
    failed: int
    verdicts: dict[str, int]
    step_p50: Spread | None
    step_p95: Spread | None
    gpu_busy: Spread | None
    lowest_busy: list[dict[str, Any]]
    longest_p95: list[dict[str, Any]]


#: the verdict count of a reported trace whose verdict could not be computed
NO_VERDICT = "no verdict"


def reported(row: dict[str, Any]) -> bool:
    """Whether an index row is a trace that was analysed (a failed one carries only its name and error)."""
    return "steps" in row


def fleet_stats(rows: Sequence[dict[str, Any]], *, worst: int = 10) -> FleetStats:
    """Verdict counts, the spread of step time and GPU busy across the rows (`trace_row`s), and the `worst` rows
    with the lowest GPU busy and with the longest p95 step.

        rows: a (gpu_bound, p50 10 ms, busy 0.9), b (launch_bound, 40 ms, 0.3), c (gpu_bound, 20 ms, 0.8)
        ->  verdicts {gpu_bound: 2, launch_bound: 1}; step p50 min 10 ms, p50 20 ms, max 40 ms; lowest busy b, c, a
    """
    ok = [r for r in rows if reported(r)]
    counts: dict[str, int] = {}
    for r in ok:
        key = str(r["verdict"]) if r.get("verdict") is not None else NO_VERDICT
        counts[key] = counts.get(key, 0) + 1

    def known(key: str) -> list[dict[str, Any]]:
        return [r for r in ok if _finite(r.get(key)) is not None]

    busy, p95 = known("summary_gpu_busy_fraction"), known("p95_step_ns")
    return FleetStats(
        traces=len(rows), failed=len(rows) - len(ok),
        verdicts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        step_p50=_spread([r["median_step_ns"] for r in known("median_step_ns")]),
        step_p95=_spread([r["p95_step_ns"] for r in p95]),
        gpu_busy=_spread([r["summary_gpu_busy_fraction"] for r in busy]),
        lowest_busy=sorted(busy, key=lambda r: float(r["summary_gpu_busy_fraction"]))[:worst],
        longest_p95=sorted(p95, key=lambda r: -float(r["p95_step_ns"]))[:worst],
    )


def _spread(values: list[float]) -> Spread | None:
    if not values:
        return None
    s = pl.Series(values, dtype=pl.Float64)
    q = [s.quantile(p, "linear") for p in (0.5, 0.9)]
    return Spread(traces=len(values), min=float(s.min()), p50=float(q[0] or 0.0),  # type: ignore[arg-type]
                  p90=float(q[1] or 0.0), max=float(s.max()))  # type: ignore[arg-type]


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
        overhead_ratio=(float(first["overhead_ratio"]) if isinstance(first.get("overhead_ratio"), (int, float))
                        and not isinstance(first.get("overhead_ratio"), bool) else None),
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
