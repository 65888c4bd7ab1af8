"""`stepscope summary RUN`: one verdict for a run of several ranks, with its evidence and where to look.

The ranks, their steps, the matched collectives and the straggler are `stepscope ranks`' (`ranks.run_ranks`);
each rank's own verdict is the single-trace one (`summary.verdict`, through its bundle). Rules, in order:

    straggler     the straggler's late arrivals cost the other ranks >= STRAGGLER_MIN (10%) of their step:
                  its wait cost per step (the others' wait in the calls it arrived last in), over the other
                  ranks (rank_count - 1), over their mean step (wall)
    otherwise     the verdict most ranks share (a tie: the first in `summary.RULES`' order), with the places of
                  the slowest rank of that verdict

    8 ranks, rank 7 arrives last in 5 calls costing the others 35.5 ms in a step of ~16.5 ms:
    35.5 / 7 / 16.5 = 31% >= 10%  ->  straggler, rank 7, where to look: its cause (it began the step late:
    4.52 ms of its 4.67 ms lateness)

For the straggler, where to look is its cause in the calls it was late for (`ranks`: excess compute, excess data
loading, a late step start, or host delay with the op and the user's Python line on its step thread before its
late arrival).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stepscope.analyze._comm_run import RunCalls, run_calls
from stepscope.analyze.collectives import CollectivesResult
from stepscope.analyze.ranks import Cause, RanksResult, run_ranks
from stepscope.analyze.summary import RULES, SummaryResult, Verdict
from stepscope.errors import UsageError

STRAGGLER_MIN = 0.10

STRAGGLER_WHEN = (f"one rank's late arrivals cost the other ranks >= {STRAGGLER_MIN:.0%} of their step "
                  "(its wait cost per step, per other rank, over their mean step)")
MAJORITY_WHEN = "otherwise, the verdict most ranks share"

#: the advice for a straggler, by its cause (`ranks.Cause`; None: no cause above 0)
STRAGGLER_ADVICE: dict[Cause | None, str] = {
    Cause.HOST_DELAY: ("Rank {rank} reaches the collectives late because its host is busy elsewhere before them"
                       "{where}: work only that rank does (logging, metrics, checkpoints, "
                       "evaluation on rank 0, a host sync), or a slower host. Move it off the step, or make every "
                       "rank do it at the same point; `stepscope summary` of its own trace says what bounds it."),
    Cause.COMPUTE: ("Rank {rank} computes more before the collectives than the others: uneven work (embedding "
                    "table sharding, sequence lengths, uneven batches or a slower GPU). Balance the shards or the "
                    "batches (pack by tokens), and check its GPU clocks and thermals."),
    Cause.DATA_LOADING: ("Rank {rank} waits longer for its data than the others: more DataLoader workers on that "
                         "rank's host, faster or local storage, balanced shards."),
    Cause.LATE_START: ("Rank {rank} begins its steps later than the others, so the delay is before the step: work "
                       "between steps that only that rank does (logging, metrics, checkpoints, evaluation on rank 0, "
                       "a host sync after the optimizer), or its previous step ran longer. Move that work off the "
                       "loop or do it on every rank at the same point; profile more steps to see the one before."),
    None: ("Rank {rank} reaches the collectives late and the others wait for it; `stepscope ranks` shows each "
           "step's lateness and `stepscope summary` of its own trace what bounds it."),
}


@dataclass(frozen=True, kw_only=True)
class RunSummaryResult:
    """The run's verdict and advice, why (`reason`), the straggler's figures, the rank verdicts counted, and the
    tables `per_rank` (each rank's own verdict and evidence), `places` (where to look) and `rules` (as applied)."""

    verdict: Verdict
    reason: str
    advice: str
    rank_count: int
    step_count: int
    straggler: int | None
    straggler_wait_fraction: float | None
    straggler_wait_cost_per_step_ns: float | None
    straggler_cause: Cause | None
    straggler_host_op: str | None
    straggler_host_line: str | None
    rank_verdicts: dict[str, int]
    note: str | None
    warnings: list[str] = field(default_factory=list)
    per_rank: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    places: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    rules: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)


@dataclass(frozen=True)
class RunAnalysis:
    """The run's verdict with the analyses behind it, for a report: `ranks`, the matched `collectives`, and the
    ranks' calls they came from (`calls`, what the run's dependency graph is built from)."""

    summary: RunSummaryResult
    ranks: RanksResult
    collectives: CollectivesResult
    calls: RunCalls


def run_summary(paths: str | Path | Sequence[str | Path], *, cache_dir: Path | None = None) -> RunSummaryResult:
    """The verdict of the run in `paths` (as `stepscope ranks` reads it; see the module docstring)."""
    return run_analysis(paths, cache_dir=cache_dir).summary


def run_analysis(paths: str | Path | Sequence[str | Path], *, cache_dir: Path | None = None,
                 known: Mapping[Path, SummaryResult] | None = None) -> RunAnalysis:
    """`run_summary` with the ranks and collectives it was decided from; `known`: rank verdicts already computed,
    by ingested trace directory (`ranks.run_ranks`)."""
    many = [paths] if isinstance(paths, str | Path) else list(paths)
    run = run_calls(many, cache_dir=cache_dir)
    if not run.ranks:  # several traces, none naming its rank: not one run
        raise UsageError("holds several traces and none names its rank (distributedInfo, a capture manifest or "
                         "rank in the file name), so they are not one run: pass one trace file, or use "
                         "`stepscope report DIR -o OUT/` for one page per trace",
                         path=many[0] if len(many) == 1 else None)
    done = run_ranks(run, verdicts=True, known=known)
    res = done.ranks
    per_rank = _per_rank(done.verdicts, res)
    share = straggler_wait_fraction(res)
    counts = Counter(per_rank["verdict"].to_list())
    majority = _majority(counts)
    is_straggler = share is not None and share >= STRAGGLER_MIN and res.straggler is not None
    if is_straggler and res.straggler is not None:
        verdict, reason = Verdict.STRAGGLER, STRAGGLER_WHEN
        named = res.straggler_host_op is not None or res.straggler_host_line is not None
        advice = STRAGGLER_ADVICE[res.straggler_cause].format(
            rank=res.straggler, where=" (the op and Python line below)" if named else "")
        places = _straggler_places(res)
    else:
        verdict, reason = majority, MAJORITY_WHEN
        slowest = per_rank.filter(pl.col("verdict") == majority.value).sort("mean_step_ns", descending=True,
                                                                           nulls_last=True)
        lead = done.verdicts[int(slowest["rank"][0])]
        advice = lead.advice
        places = lead.places.with_columns(what=pl.format("rank {}: {}", pl.lit(int(slowest["rank"][0])), "what"))
    rules = pl.DataFrame({"order": [1, 2], "verdict": [Verdict.STRAGGLER.value, majority.value],
                          "when": [STRAGGLER_WHEN, MAJORITY_WHEN], "holds": [is_straggler, True],
                          "matched": [is_straggler, not is_straggler]})
    summary = RunSummaryResult(
        verdict=verdict, reason=reason, advice=advice, rank_count=res.rank_count, step_count=res.step_count,
        straggler=res.straggler, straggler_wait_fraction=share,
        straggler_wait_cost_per_step_ns=res.straggler_wait_cost_per_step_ns, straggler_cause=res.straggler_cause,
        straggler_host_op=res.straggler_host_op, straggler_host_line=res.straggler_host_line,
        rank_verdicts=dict(counts.most_common()), note=res.note, warnings=list(res.warnings), per_rank=per_rank,
        places=places, rules=rules)
    return RunAnalysis(summary=summary, ranks=res, collectives=done.collectives, calls=run)


def straggler_wait_fraction(res: RanksResult) -> float | None:
    """The straggler's wait cost per step, per other rank, over the other ranks' mean step (None without a
    straggler or step times).

        cost 35.5 ms per step, 8 ranks, the 7 others' mean step 16.5 ms  ->  35.5 / 7 / 16.5 = 0.31
    """
    if res.straggler is None or res.straggler_wait_cost_per_step_ns is None or res.rank_count < 2:
        return None
    others = res.ranks.filter(pl.col("rank") != res.straggler)["wall_ns"].mean()
    if not isinstance(others, int | float) or others <= 0:
        return None
    return res.straggler_wait_cost_per_step_ns / (res.rank_count - 1) / float(others)


def _per_rank(verdicts: dict[int, SummaryResult], res: RanksResult) -> pl.DataFrame:
    """One row per rank: its own verdict (that of its longest window, `ranks.run_ranks`), runner-up and
    evidence, its mean step, wait and last arrivals."""
    rows = []
    for rank, v in sorted(verdicts.items()):
        rows.append({"rank": rank, "verdict": v.verdict.value,
                     "runner_up": v.runner_up.value if v.runner_up else None,
                     "gpu_busy_fraction": v.gpu_busy_fraction, "exposed_comm_fraction": v.exposed_comm_fraction,
                     "data_loading_fraction": v.data_loading_fraction, "sync_fraction": v.sync_fraction})
    table = pl.DataFrame(rows, schema={"rank": pl.Int64, "verdict": pl.String, "runner_up": pl.String,
                                       "gpu_busy_fraction": pl.Float64, "exposed_comm_fraction": pl.Float64,
                                       "data_loading_fraction": pl.Float64, "sync_fraction": pl.Float64})
    timing = res.ranks.select("rank", mean_step_ns="wall_ns", wait_ns="wait_ns", last_arrivals="last_arrivals")
    return table.join(timing, on="rank", how="left", maintain_order="left").sort("rank")


def _majority(counts: Counter[str]) -> Verdict:
    """The verdict most ranks share; a tie goes to the first in RULES' order."""
    order = {r.verdict.value: i for i, r in reversed(list(enumerate(RULES)))}
    top = max(counts.values())
    return Verdict(min((v for v, n in counts.items() if n == top), key=lambda v: order.get(v, len(order))))


def _straggler_places(res: RanksResult) -> pl.DataFrame:
    """Where the straggler's lateness comes from (its cause over the steps it was the straggler of: the op and
    Python line of a host delay, excess compute or data loading), then the wait it cost the others."""
    mine = res.stragglers.filter(pl.col("straggler") == res.straggler)
    rank = f"rank {res.straggler}"
    host = mine.filter(pl.col("cause") == Cause.HOST_DELAY.value)
    rows: list[dict[str, object]] = []
    for col, what in (("host_line", "late: host busy at (Python)"), ("host_op", "late: host busy at (op)")):
        named = host.filter(pl.col(col).is_not_null())
        if named.height:
            top = named.group_by(col).agg(total_ns=pl.col("host_delay_ns").sum(), count=pl.len()).sort(
                "total_ns", descending=True).row(0)
            rows.append({"what": what, "name": top[0], "total_ns": top[1], "count": top[2]})
    for col, what in (("excess_compute_ns", "late: more compute before the call"),
                      ("excess_data_loading_ns", "late: more data loading in the step"),
                      ("late_start_ns", "late: began the step late")):
        total = int(mine[col].fill_null(0).sum() or 0)
        if total > 0:
            rows.append({"what": what, "name": rank, "total_ns": total,
                         "count": mine.filter(pl.col(col) > 0).height})
    rows.sort(key=lambda r: -int(r["total_ns"]))  # type: ignore[call-overload]  # the largest part of the lateness first
    rows.append({"what": "its late arrivals cost the others", "name": rank,
                 "total_ns": res.straggler_wait_cost_ns or 0, "count": res.straggler_last_arrivals or 0})
    return pl.DataFrame(rows, schema={"what": pl.String, "name": pl.String, "total_ns": pl.Int64,
                                      "count": pl.Int64})
