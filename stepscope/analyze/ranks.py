"""`stepscope ranks`: the ranks of a run side by side, per step, and the straggler with its likely cause.

The run, its ranks, clocks and matched collectives are `stepscope comm`'s (`_comm_run`, `collectives`); each
rank's steps are the single-trace analysis's (`bundle.TraceAnalysis`: the one step-window rule of `window.py`,
data loading and CPU time from `steps.py`). Definitions (DESIGN.md, "Distributed runs"), per rank and step,
every interval clipped to the step window, GPU figures summed over the rank's devices:

    wall             the step window's length (steps.py)
    compute          union of the kernels that are not communication kernels, per device
    comm             union of the communication kernels (NCCL/RCCL) per device; on a CPU backend, union of the
                     collective ops (gloo:all_reduce …)
    exposed_comm     comm not covered by compute on the same device (on a CPU backend, all of comm)
    idle             window minus the union of all GPU work (kernels, memcpy, memset), per device
    data_loading     the step's DataLoader time (steps.py)
    cpu              the step's CPU span, its ProfilerStep (steps.py)
    wait             the rank's wait in the step's collectives (its duration minus the call's latency)

A call belongs to the step whose window holds its start on its lowest rank. A trace without steps (neither
ProfilerStep spans nor inferred iterations) is one window (step null): its GPU span, first GPU event to last (the
window of `summary` on the trace alone), or from its first event to its last where it has no GPU work (gloo).

    rank 0: compute [0,60) [80,90)   comm [50,100)   -> compute 70, comm 50, exposed 30 ([60,80) [90,100))

Imbalance of a metric: max / median across ranks of its mean per step. Straggler of a step: the rank whose late
arrivals cost the others most wait in the step's calls (a tie goes to the rank last in more of them); its cost:
the others' wait in those calls. Cost first, not the count: a rank last by a few µs of clock noise in three
calls costs nothing, the rank 50 ms late in one sets the step (sample_traces/late_rank, step 3). Its likely
cause, in the call where it cost most:

    lateness      its aligned start - the others' median aligned start
    late_start    its aligned step start - the others' median (>= 0, at most the lateness): it began the step
                  late, so the delay is before the step (between steps, or the previous step ran longer)
    compute       its compute from the step's start to its arrival - the others' median (>= 0)
    data_loading  its data loading in the step - the others' median (>= 0)
    host_delay    lateness - late_start - compute - data_loading (>= 0): the host reached the call late

and the cause is the largest (compute, then data loading, then the late start, on a tie). For host delay,
what the host did meanwhile: the innermost CPU op and the user's Python line (`blame.python_lines`) on the
rank's step thread at its arrival minus half the host delay. The run's straggler is `collectives'` (the costliest
late arrivals overall). param/dlrm_kineto: rank 7 is 4.67 ms late to its costliest call, 4.52 ms of it from entering
the step after the others (late_start), not from the host inside the step.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze._comm_events import comm_split, gpu_work
from stepscope.analyze._comm_events import per_window as per_window  # re-exported: the window sums of `ranks`
from stepscope.analyze._comm_run import RankCalls, RunCalls, parallel_map, run_calls
from stepscope.analyze._text import numbered
from stepscope.analyze.blame import SOURCE_LINE, innermost, python_lines
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.collectives import CollectivesResult, analyze_run
from stepscope.analyze.loading import loading_intervals, merge
from stepscope.analyze.summary import SummaryResult
from stepscope.analyze.trace import load
from stepscope.analyze.window import with_step


class Cause(enum.StrEnum):
    """Why a straggler arrived late (see the module docstring)."""

    COMPUTE = "excess_compute"
    DATA_LOADING = "excess_data_loading"
    LATE_START = "late_start"
    HOST_DELAY = "host_delay"


#: the per-step metrics compared across ranks (imbalance), in table order
METRICS: tuple[str, ...] = ("wall_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns", "data_loading_ns",
                            "cpu_ns", "wait_ns")

_WINDOW_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "start_ns": pl.Int64(), "end_ns": pl.Int64(), "wall_ns": pl.Int64(),
    "data_loading_ns": pl.Int64(), "cpu_ns": pl.Int64(),
}


@dataclass(frozen=True, kw_only=True)
class RanksResult:
    """Per rank and step: time split, imbalance across ranks, stragglers per step and their likely cause.

    Tables: `ranks` (one row per rank: its mean per step of each metric, the share of its communication that
    compute overlaps, its last arrivals), `imbalance` (one row per metric), `stragglers` (one row per step),
    `steps` (one row per rank and step).
    """

    rank_count: int
    step_count: int
    source: str | None  # "kernel" (NCCL/RCCL), "cpu" (gloo and other CPU backends), "mixed"; None: no collective
    straggler: int | None
    straggler_last_arrivals: int | None
    straggler_wait_cost_ns: int | None
    straggler_wait_cost_per_step_ns: float | None
    straggler_cause: Cause | None
    straggler_host_op: str | None
    straggler_host_line: str | None
    note: str | None
    warnings: list[str] = field(default_factory=list)
    ranks: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    imbalance: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    stragglers: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)


@dataclass(frozen=True)
class _RankSteps:
    """One rank's step table, its compute intervals (rank, start_ns, end_ns; merged over devices) and, when
    asked, its own verdict (that of its longest window): small tables, all a worker sends back."""

    steps: pl.DataFrame
    compute: pl.DataFrame
    verdict: SummaryResult | None


def ranks(paths: str | Path | Sequence[str | Path], *, cache_dir: Path | None = None) -> RanksResult:
    """Every rank of the run in `paths` (as `collectives.collectives` reads it), per step, with imbalance and
    stragglers (see the module docstring)."""
    many = [paths] if isinstance(paths, str | Path) else list(paths)
    return run_ranks(run_calls(many, cache_dir=cache_dir)).ranks


@dataclass(frozen=True)
class RunRanks:
    """`ranks` of a run with what it was computed from: the matched collectives and, when asked, each rank's own
    verdict (that of its longest window), for the run's verdict (`run_summary`) to reuse."""

    ranks: RanksResult
    collectives: CollectivesResult
    verdicts: dict[int, SummaryResult]


def run_ranks(run: RunCalls, *, verdicts: bool = False, known: Mapping[Path, SummaryResult] | None = None) -> RunRanks:
    """`ranks` over ranks already gathered (`_comm_run.run_calls`), with the collectives behind it and (with
    `verdicts`) each rank's own verdict. Each rank is analysed on its own (by worker processes in a large run,
    `_comm_run.parallel_map`), and only its small tables are kept, so memory holds one rank's analysis per
    worker, never the run's. `known`: verdicts the caller computed already, by ingested trace directory (a run
    report has each rank's from its page), used instead of computing them again."""
    coll = analyze_run(run)
    given = known or {}
    jobs = [(r.rank, tuple(t.directory for t in r.traces), r.calls,
             tuple(given.get(t.directory) for t in r.traces) if verdicts else None) for r in run.ranks]
    per_rank = dict(zip([r.rank for r in run.ranks], parallel_map(_rank_job, jobs), strict=True))
    steps = pl.concat([p.steps for p in per_rank.values()], how="vertical")
    waits = _waits_by_step(coll.waits, steps)
    steps = _with_waits(steps, waits)
    by_step = _last_arrivals(waits)
    stragglers = _stragglers(by_step, waits, steps, pl.concat([p.compute for p in per_rank.values()]))
    stragglers = _with_host_blame(stragglers, {r.rank: r for r in run.ranks})
    step_count = steps["step"].drop_nulls().n_unique()  # (a trace without steps: one window, step null)
    per_rank_table = _per_rank(steps)
    cause, host_op, host_line = _straggler_cause(stragglers, coll.straggler_rank)
    result = RanksResult(
        rank_count=len(run.ranks), step_count=step_count, source=coll.source, straggler=coll.straggler_rank,
        straggler_last_arrivals=coll.straggler_last_arrivals, straggler_wait_cost_ns=coll.straggler_wait_cost_ns,
        straggler_wait_cost_per_step_ns=_cost_per_step(by_step, coll.straggler_rank, waits),
        straggler_cause=cause, straggler_host_op=host_op, straggler_host_line=host_line,
        note=_note(coll, steps), warnings=list(coll.warnings), ranks=per_rank_table,
        imbalance=imbalance(per_rank_table),
        stragglers=stragglers.drop("ts_ns"),
        steps=steps.select("rank", "step", *METRICS, "last_arrivals").sort("step", "rank", nulls_last=True),
    )
    return RunRanks(ranks=result, collectives=coll,
                    verdicts={r: p.verdict for r, p in per_rank.items() if p.verdict is not None})


def _rank_job(job: tuple[int, tuple[Path, ...], pl.DataFrame, tuple[SummaryResult | None, ...] | None]
              ) -> _RankSteps:
    """One rank's steps over its windows (ingested trace directories, in time order): wall, compute, comm,
    exposed comm, idle, data loading, CPU (`_comm_events.comm_split`, the definition `summary` uses too), and
    its own verdict when asked (`known`: each directory's verdict where the caller has it, else None). Runs in a
    worker process for a large run."""
    rank, directories, calls, known = job
    bundles = tuple(TraceAnalysis.of(load(d)) for d in directories)
    windows = pl.concat([_windows(b) for b in bundles], how="vertical")
    gpu = pl.concat([gpu_work(b.trace.gpu) for b in bundles], how="vertical")
    split = comm_split(gpu, calls.lazy())
    devices = gpu.select(pl.col("device").n_unique()).collect(engine="in-memory").item()
    out = windows
    for name, pieces in (("compute_ns", split.compute), ("comm_ns", split.comm), ("exposed_comm_ns", split.exposed),
                         ("busy", split.busy)):
        out = out.join(per_window(pieces, windows, name), on="step", how="left",
                       maintain_order="left", nulls_equal=True)
    gpu_known = pl.lit(devices > 0)
    out = out.with_columns(
        rank=pl.lit(rank, pl.Int64),
        compute_ns=pl.when(gpu_known).then(pl.col("compute_ns").fill_null(0)),
        comm_ns=pl.col("comm_ns").fill_null(0), exposed_comm_ns=pl.col("exposed_comm_ns").fill_null(0),
        idle_ns=pl.when(gpu_known).then(devices * pl.col("wall_ns") - pl.col("busy").fill_null(0)),
    ).drop("busy")
    merged = intervals.union(split.compute, start="start_ns", end="end_ns").collect(engine="in-memory")
    verdict = max((k if k is not None else b.verdict for b, k in zip(bundles, known, strict=True)),
                  key=lambda v: v.wall_ns) if known is not None else None
    return _RankSteps(steps=out, compute=merged.with_columns(rank=pl.lit(rank, pl.Int64)), verdict=verdict)


def _windows(bundle: TraceAnalysis) -> pl.DataFrame:
    """step, start_ns, end_ns, wall_ns, data_loading_ns, cpu_ns of a trace's steps (the step windows, and the
    DataLoader time in each step's CPU span: `steps`' data_loading_ns, the first phase, so its union), without
    the rest of `steps`' analysis (idle causes, blame), which ranks does not show; without steps one window,
    step null: the trace's GPU span (first GPU event to last, as `summary` of the trace alone takes it), or on a
    CPU backend, where there is no GPU work, its first event to its last."""
    spans = bundle.frames.step_windows
    if spans.height:
        loading = merge(loading_intervals(bundle.trace, spans).lazy(), ["step"]).collect(engine="in-memory")
        per_step = loading.group_by("step").agg(data_loading_ns=(pl.col("e") - pl.col("s")).sum())
        return (spans.join(per_step, on="step", how="left", maintain_order="left")
                .with_columns(pl.col("data_loading_ns").fill_null(0))
                .select(list(_WINDOW_SCHEMA)).cast(_WINDOW_SCHEMA))  # type: ignore[arg-type]
    gpu = bundle.frames.analysis_window()  # (without steps: each device's first to last GPU event)
    first, last = (gpu.select(pl.col("start_ns").min(), pl.col("end_ns").max()).row(0) if gpu.height
                   else (bundle.trace.meta.time.first_ns, bundle.trace.meta.time.last_ns))
    if first is None or last is None:
        return pl.DataFrame(schema=_WINDOW_SCHEMA)
    return pl.DataFrame({"step": [None], "start_ns": [first], "end_ns": [last], "wall_ns": [last - first],
                         "data_loading_ns": [None], "cpu_ns": [None]}, schema=_WINDOW_SCHEMA)


def _waits_by_step(waits: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """`collectives`' waits (call, rank, ts_ns, aligned_start_ns, wait_ns, last) with the call's step: the step
    whose window holds the call's start on its lowest rank that has one."""
    cols = ["call", "rank", "ts_ns", "aligned_start_ns", "wait_ns", "last"]
    if waits.height == 0:
        return pl.DataFrame(schema={**{c: pl.Int64 for c in cols}, "last": pl.Boolean, "step": pl.Int64})
    parts = [with_step(waits.filter(pl.col("rank") == r).select(cols),
                       steps.filter(pl.col("rank") == r).filter(pl.col("step").is_not_null()), at="ts_ns")
             for r in waits["rank"].unique().to_list()]
    tagged = pl.concat(parts, how="vertical")
    of_call = tagged.sort("rank").group_by("call").agg(step=pl.col("step").drop_nulls().first())
    return tagged.drop("step").join(of_call, on="call").sort("call", "rank")


def _with_waits(steps: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """The step table with each rank's wait and last arrivals in the step's calls."""
    per = waits.group_by("rank", "step").agg(wait_ns=pl.col("wait_ns").sum(),
                                             last_arrivals=pl.col("last").sum().cast(pl.Int64))
    return (steps.join(per, on=["rank", "step"], how="left", maintain_order="left", nulls_equal=True)
            .with_columns(pl.col("wait_ns", "last_arrivals").fill_null(0)))


def _last_arrivals(waits: pl.DataFrame) -> pl.DataFrame:
    """step, rank, last_arrivals, wait_cost_ns (the others' wait in the calls it arrived last in) and call (the
    one of those that cost most): one row per rank that arrived last in some call of the step."""
    # the others' wait in a call: its total wait less the late rank's own (not a join of every late rank with
    # every other: ranks x ranks rows in a call where all arrive together)
    last = waits.filter(pl.col("last")).select("call", "step", "rank", own="wait_ns")
    total = waits.group_by("call").agg(total=pl.col("wait_ns").sum())
    return (last.join(total, on="call", how="left", maintain_order="left")
            .with_columns(cost=(pl.col("total") - pl.col("own").fill_null(0)).fill_null(0))
            .group_by("step", "rank").agg(last_arrivals=pl.len().cast(pl.Int64), wait_cost_ns=pl.col("cost").sum(),
                                          call=pl.col("call").sort_by("cost", "call", descending=[True, False])
                                          .first()))


def _stragglers(by_step: pl.DataFrame, waits: pl.DataFrame, steps: pl.DataFrame,
                compute: pl.DataFrame) -> pl.DataFrame:
    """One row per step: its straggler, last arrivals and cost, and in its costliest call the lateness and the
    excess compute and data loading that explain it, the host delay left, and the cause."""
    top = (by_step.sort(["step", "wait_cost_ns", "last_arrivals", "rank"], descending=[False, True, True, False],
                        nulls_last=True)
           .group_by("step", maintain_order=True).first().rename({"rank": "straggler"}))
    rows = (waits.join(top.select("call", "straggler"), on="call")
            .join(steps.select("rank", "step", step_start="start_ns", dl="data_loading_ns", known="compute_ns"),
                  on=["rank", "step"], how="left", maintain_order="left", nulls_equal=True))
    rows = rows.with_columns(before=pl.when(pl.col("known").is_not_null())
                             .then(_covered(compute, rows.select("rank", s="step_start", e="ts_ns"))),
                             # the step's start on the aligned clock (the call's own offset; a stepless window has none)
                             start=pl.when(pl.col("step").is_not_null())
                             .then(pl.col("step_start") + pl.col("aligned_start_ns") - pl.col("ts_ns")))
    me = pl.col("rank") == pl.col("straggler")

    def excess(col: str) -> pl.Expr:
        return (pl.col(col).filter(me).first() - pl.col(col).filter(~me).median()).clip(lower_bound=0)

    per_call = rows.group_by("call").agg(
        ts_ns=pl.col("ts_ns").filter(me).first(),
        lateness_ns=pl.col("aligned_start_ns").filter(me).first() - pl.col("aligned_start_ns").filter(~me).median(),
        excess_compute_ns=excess("before"), excess_data_loading_ns=excess("dl"), late_start_ns=excess("start"))
    out = top.join(per_call, on="call", how="left", maintain_order="left").with_columns(
        pl.col("lateness_ns", "excess_compute_ns", "excess_data_loading_ns", "late_start_ns").round()
        .cast(pl.Int64)).with_columns(
        late_start_ns=pl.min_horizontal("late_start_ns", pl.col("lateness_ns").clip(lower_bound=0)))
    host = (pl.col("lateness_ns") - pl.col("late_start_ns").fill_null(0) - pl.col("excess_compute_ns").fill_null(0)
            - pl.col("excess_data_loading_ns").fill_null(0)).clip(lower_bound=0)
    return out.with_columns(host_delay_ns=host).with_columns(cause=_cause()).select(
        "step", "straggler", "last_arrivals", "wait_cost_ns", "lateness_ns", "late_start_ns", "excess_compute_ns",
        "excess_data_loading_ns", "host_delay_ns", "cause", "call", "ts_ns").sort("step", nulls_last=True)


def _cause() -> pl.Expr:
    """The largest of excess compute, excess data loading, the late start and host delay (in that order on a
    tie); null when none is above 0."""
    c, d, s, h = (pl.col(x).fill_null(0) for x in ("excess_compute_ns", "excess_data_loading_ns", "late_start_ns",
                                                    "host_delay_ns"))
    top = pl.max_horizontal(c, d, s, h)
    return (pl.when(top <= 0).then(None)
            .when(c >= top).then(pl.lit(Cause.COMPUTE.value))
            .when(d >= top).then(pl.lit(Cause.DATA_LOADING.value))
            .when(s >= top).then(pl.lit(Cause.LATE_START.value))
            .otherwise(pl.lit(Cause.HOST_DELAY.value)))


def _covered(pieces: pl.DataFrame, spans: pl.DataFrame) -> pl.Series:
    """For each span (rank, s, e), the length of that rank's disjoint `pieces` (rank, start_ns, end_ns) inside
    it; 0 where none, in the spans' order."""
    idx = spans.with_row_index("_i")
    inside = pl.min_horizontal("end_ns", "e") - pl.max_horizontal("start_ns", "s")
    hit = (idx.join(pieces, on="rank").filter((pl.col("start_ns") < pl.col("e")) & (pl.col("end_ns") > pl.col("s")))
           .group_by("_i").agg(inside.sum().alias("n")))
    return idx.join(hit, on="_i", how="left", maintain_order="left").sort("_i")["n"].fill_null(0)


def _with_host_blame(stragglers: pl.DataFrame, ranks: dict[int, RankCalls]) -> pl.DataFrame:
    """host_op, host_line: for a host-delay straggler, the innermost CPU op and the user's Python line on its
    step thread half its host delay before its arrival (one lookup per step: a handful of rows; the straggler's
    traces are analysed again here, the only ranks whose events are read twice)."""
    ops: list[str | None] = []
    lines: list[str | None] = []
    for rank, ts, late, cause in stragglers.select("straggler", "ts_ns", "host_delay_ns", "cause").iter_rows():
        found: tuple[str | None, str | None] = (None, None)
        if cause == Cause.HOST_DELAY.value and ts is not None and late is not None:
            found = _host_at([TraceAnalysis.of(t) for t in ranks[rank].traces], ts - late // 2)
        ops.append(found[0])
        lines.append(found[1])
    return stragglers.with_columns(host_op=pl.Series(ops, dtype=pl.String), host_line=pl.Series(lines, dtype=pl.String))


def _host_at(bundles: Sequence[TraceAnalysis], at_ns: int) -> tuple[str | None, str | None]:
    """(innermost CPU op, else innermost built-in Python call; user's Python line) at `at_ns` on the step thread
    of the trace that holds it."""
    for b in bundles:
        t = b.trace.meta.time
        main = b.frames.main_thread
        if main is None or t.first_ns is None or t.last_ns is None or not t.first_ns <= at_ns <= t.last_ns:
            continue
        point = pl.DataFrame({"pid": [main[0]], "tid": [main[1]], "ts_ns": [at_ns]},
                             schema={"pid": pl.String, "tid": pl.String, "ts_ns": pl.Int64})
        op = innermost(b.trace.cpu_ops, point)["name"][0]
        if op is None:  # no op: a builtin the host sat in (`<built-in function sleep>`), which names no line
            op = innermost(b.trace.python.filter(~pl.col("name").str.contains(SOURCE_LINE)), point)["name"][0]
        line = python_lines(b.trace, point)[0][0]
        return op, line
    return None, None


def _cost_per_step(by_step: pl.DataFrame, straggler: int | None, waits: pl.DataFrame) -> float | None:
    """The others' wait the straggler's late arrivals cost, per step of the run's calls (0 in steps where it
    was never last)."""
    if straggler is None or waits.height == 0:
        return None
    steps = waits.select(pl.col("step").n_unique()).item()
    total = by_step.filter(pl.col("rank") == straggler)["wait_cost_ns"].sum()
    return float(total) / steps if steps else None


def _straggler_cause(stragglers: pl.DataFrame, straggler: int | None) -> tuple[Cause | None, str | None, str | None]:
    """The straggler's cause (the one that cost most over the steps it was the straggler of) and, for host
    delay, the op and line of its costliest such step."""
    if straggler is None:
        return None, None, None
    mine = stragglers.filter((pl.col("straggler") == straggler) & pl.col("cause").is_not_null())
    if mine.height == 0:
        return None, None, None
    cause = (mine.group_by("cause").agg(pl.col("wait_cost_ns").sum())
             .sort("wait_cost_ns", "cause", descending=[True, False])["cause"][0])
    host = mine.filter(pl.col("cause") == Cause.HOST_DELAY.value).sort("wait_cost_ns", descending=True,
                                                                       maintain_order=True)
    op, line = (host["host_op"][0], host["host_line"][0]) if cause == Cause.HOST_DELAY.value else (None, None)
    return Cause(cause), op, line


def _per_rank(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per rank: steps (0 for a trace without: one window), the mean per window of each metric, the share
    of comm that compute overlaps (1 - exposed / comm, HTA's comm/comp overlap; null without GPU compute) and its
    last arrivals."""
    means = [pl.col(m).mean().round().cast(pl.Int64) for m in METRICS]
    overlap = 1 - pl.col("exposed_comm_ns").sum() / pl.col("comm_ns").sum()
    return steps.group_by("rank").agg(
        pl.col("step").is_not_null().sum().cast(pl.Int64).alias("steps"), *means,
        comm_overlap_fraction=pl.when((pl.col("comm_ns").sum() > 0) & pl.col("compute_ns").is_not_null().any())
        .then(overlap),
        last_arrivals=pl.col("last_arrivals").sum()).sort("rank")


def imbalance(per_rank: pl.DataFrame) -> pl.DataFrame:
    """metric, median_ns, max_ns, max_rank, imbalance (max / median; null where the median is 0 or unknown).

        compute_ns per rank 10, 10, 12, 30  ->  median 11, max 30 (rank 3), imbalance 2.727
    """
    rows: list[dict[str, object]] = []
    for m in METRICS:
        values = per_rank.select("rank", m).drop_nulls()
        if values.height == 0:
            rows.append({"metric": m.removesuffix("_ns"), "median_ns": None, "max_ns": None, "max_rank": None,
                         "imbalance": None})
            continue
        median = float(values[m].median())  # type: ignore[arg-type]
        top = values.sort([m, "rank"], descending=[True, False]).row(0)
        rows.append({"metric": m.removesuffix("_ns"), "median_ns": median, "max_ns": float(top[1]),
                     "max_rank": int(top[0]), "imbalance": top[1] / median if median > 0 else None})
    return pl.DataFrame(rows, schema={"metric": pl.String, "median_ns": pl.Float64, "max_ns": pl.Float64,
                                      "max_rank": pl.Int64, "imbalance": pl.Float64})


def _note(coll: CollectivesResult, steps: pl.DataFrame) -> str | None:
    """The collectives' note (one rank: what that leaves out), the ranks whose traces have no steps (each one
    window, step null: `_windows`), and those with a step whose CPU time exceeds its wall (`steps` says why)."""
    notes = ["one rank: no imbalance or straggler across ranks; its row and steps below" if coll.rank_count == 1
             else coll.note]
    stepless = sorted(steps.filter(pl.col("step").is_null())["rank"].unique().to_list())
    if stepless:
        notes.append(f"{numbered('rank', stepless)}: no steps (no ProfilerStep#N, no iterations inferred), so each "
                     "trace is one window: its GPU span, or first event to last without GPU work")
    if over := sorted(steps.filter(pl.col("cpu_ns") > pl.col("wall_ns"))["rank"].unique().to_list()):
        notes.append(f"{numbered('rank', over)}: more CPU time than wall time in some step, as `stepscope steps` "
                     "explains: a step's window opens only once the GPU work before it is done, while its CPU span "
                     "starts with its ProfilerStep")
    return "; ".join(n for n in notes if n) or None
