"""`stepscope comm`: every collective of a run, matched across ranks, on aligned clocks.

Definitions are DESIGN.md's "Distributed runs"; what a collective is, its group and its size come from
`_comm_events`, the ranks of a run from `_comm_run`.

Matching: the same call on every rank of its process group. By the c10d sequence number (args `Seq`)
where every call of the group has one; else by order within (group, collective, message size, dtype), the
size left out for all_to_all, send/recv, gather and scatter, whose sizes differ between ranks (their dtype does
not: two sampled ranks of hta/trace_filter once paired an int64 all_to_all of 384 elements with a 339 MB uint8
one, 600 ms apart):

    rank 0: all_reduce 1 MiB, all_reduce 4 KiB, all_reduce 1 MiB     call (all_reduce, 1 MiB, #0), (…, 4 KiB, #0),
    rank 1: all_reduce 1 MiB, all_reduce 4 KiB, all_reduce 1 MiB     (…, 1 MiB, #1): three calls of two ranks each

and within the step (ProfilerStep#N) that launched the call, where every call has one and every rank's calls
fall in the same steps: a trace that lost some calls (sampled: hta/trace_filter's two ranks of 128) then pairs
its calls with the same step's on the other ranks, not with the next step's.

Clocks: one offset per clock (ranks on one named host share one), chosen so that matched calls END
together: the reference is the lowest rank's clock (offset 0); every clock that shares calls with the
clocks aligned so far gets the median over those calls of (their median aligned end - its end); repeated
until no clock is left that shares a call. The residual of a rank in a call is its aligned end minus the
call's median aligned end.

Per call: arrival skew = latest - earliest aligned start; latency = the shortest duration; wait of a rank =
its duration - latency; algbw = message bytes / latency (bytes per ns = GB/s); busbw = algbw x the
nccl-tests factor for group size n; link share = busbw / the link's GB/s per direction (`links`: the device
table's link for a run on one host, or --link-bandwidth). n is the call's `Group size`, else the number of
ranks its group lists, else the world size where every rank of the world took part, else an all_gather's or
reduce_scatter's from its c10d op's shapes (`_comm_events`); else unknown, and so are busbw and link share
(never the count of ranks that happen to have a trace: 2 of 8 ranks' traces do not make a group of 2).
Straggler: the rank whose late arrivals cost the others the most wait, over the calls of two ranks or more in
which it arrived last (a tie in one call counts for every tied rank; a tie in the cost goes to the rank last in
more calls), with how often it was last and that wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from stepscope.analyze._comm_events import ELEMENT_BYTES, listed_ranks
from stepscope.analyze._comm_run import RankCalls, RunCalls, run_calls
from stepscope.analyze._text import plural
from stepscope.analyze.links import RunLink, device_name, run_link

#: collectives whose message size is the same on every rank (part of the matching key)
SIZE_UNIFORM = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "barrier")


@dataclass(frozen=True, kw_only=True)
class CollectivesResult:
    """Matched collectives of a run: headline figures, then the tables `groups`, `calls`, `waits`, `ranks`."""

    rank_count: int
    call_count: int
    unmatched_calls: int
    source: str | None  # "kernel" (NCCL/RCCL kernels), "cpu" (gloo and other CPU backends), "mixed"
    clocks: int
    max_clock_residual_ns: int | None
    max_skew_ns: int | None
    total_wait_ns: int | None
    straggler_rank: int | None
    straggler_last_arrivals: int | None
    straggler_wait_cost_ns: int | None
    link_bandwidth_gbps: float | None
    link: str | None  # where link_bandwidth_gbps comes from, or why it is unknown (`links.run_link`)
    note: str | None
    warnings: list[str] = field(default_factory=list)
    groups: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    calls: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    waits: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    ranks: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)


def collectives(paths: str | Path | Sequence[str | Path], *, link_bandwidth_gbps: float | None = None,
                cache_dir: Path | None = None) -> CollectivesResult:
    """Every collective of the run in `paths` (a run directory, a directory of traces, a dataset, one trace or
    several paths), matched across ranks, with aligned clocks, skew, latency, waits and bandwidth."""
    many = [paths] if isinstance(paths, str | Path) else list(paths)
    return analyze_run(run_calls(many, cache_dir=cache_dir), link_bandwidth_gbps=link_bandwidth_gbps)


def analyze_run(run: RunCalls, *, link_bandwidth_gbps: float | None = None) -> CollectivesResult:
    """The analysis of `collectives` over ranks already gathered (`_comm_run.run_calls`). The link's peak is
    `link_bandwidth_gbps` where given, else the device table's link where the run is on one host
    (`links.run_link`)."""
    link = run_link([r.host for r in run.ranks], [device_name(r.traces[0]) if r.traces else None for r in run.ranks],
                    override_gbps=link_bandwidth_gbps)
    link_bandwidth_gbps = link.gbps
    parts = match(_all_calls(run.ranks))
    if parts.height == 0:
        return _without_calls(run, link)
    # times relative to the run's first call: a median over raw ns (~1.7e18) would lose precision in float64
    parts = parts.with_columns(rel_ns=pl.col("ts_ns") - pl.col("ts_ns").min())
    offsets = clock_offsets(parts)
    parts = _aligned(parts, offsets)
    calls = _per_call(parts, [r.rank for r in run.ranks], link_bandwidth_gbps, run.world_size)
    waits = _waits(parts, calls)
    warnings = list(run.warnings)
    if unaligned := sorted({c for c in parts["clock"].unique().to_list() if c not in offsets}):
        warnings.append(f"clock{'s' if len(unaligned) > 1 else ''} {', '.join(unaligned)} "
                        f"share{'' if len(unaligned) > 1 else 's'} no collective with the others: not aligned")
    if (n := calls.filter(pl.col("missing_ranks").list.len() > 0).height):
        warnings.append(f"{plural(n, 'call')} not seen on every rank of their group (see missing_ranks in the calls "
                        "table)")
    warnings += _unknown_bandwidth(calls)
    warnings += _loose_alignment(waits, calls, one_clock=parts["clock"].n_unique() == 1,
                                 cpu=set(parts["source"].unique().to_list()) == {"cpu"})
    straggler = _straggler(calls, waits)
    sources = set(parts["source"].unique().to_list())
    return CollectivesResult(
        rank_count=len(run.ranks), call_count=calls.height,
        unmatched_calls=calls.filter(pl.col("missing_ranks").list.len() > 0).height,
        source=None if not sources else sources.pop() if len(sources) == 1 else "mixed",
        clocks=parts["clock"].n_unique(),
        max_clock_residual_ns=_max_int(waits["residual_ns"].abs()) if waits.height else None,
        max_skew_ns=_max_int(calls["skew_ns"]), total_wait_ns=int(waits["wait_ns"].sum()) if waits.height else None,
        straggler_rank=straggler[0], straggler_last_arrivals=straggler[1], straggler_wait_cost_ns=straggler[2],
        link_bandwidth_gbps=link_bandwidth_gbps, link=_link_text(link), note=_note(run, calls), warnings=warnings,
        groups=_groups(calls, link_bandwidth_gbps), calls=_calls_out(calls, link_bandwidth_gbps),
        waits=waits, ranks=_ranks(run.ranks, waits, offsets),
    )


def _all_calls(ranks: Sequence[RankCalls]) -> pl.DataFrame:
    frames = [r.calls.with_columns(rank=pl.lit(r.rank, pl.Int64), clock=pl.lit(r.clock)) for r in ranks]
    return pl.concat(frames, how="vertical")


def _link_text(link: RunLink) -> str:
    """"NVLink 4 (h100-sxm: 900 GB/s both ways, 450 each)", "--link-bandwidth", or "unknown: <why>; pass
    --link-bandwidth GB/S"."""
    return link.described or f"unknown: {link.unknown_because}; pass --link-bandwidth GB/S for the link's share"


def _without_calls(run: RunCalls, link: RunLink) -> CollectivesResult:
    """The result of a run where no rank ran a collective: the ranks and the warnings, no call."""
    ranks = pl.DataFrame({"rank": [r.rank for r in run.ranks], "host": [r.host for r in run.ranks],
                          "traces": [len(r.files) for r in run.ranks]},
                         schema={"rank": pl.Int64, "host": pl.String, "traces": pl.Int64})
    return CollectivesResult(
        rank_count=len(run.ranks), call_count=0, unmatched_calls=0, source=None, clocks=0,
        max_clock_residual_ns=None, max_skew_ns=None, total_wait_ns=None, straggler_rank=None,
        straggler_last_arrivals=None, straggler_wait_cost_ns=None, link_bandwidth_gbps=link.gbps,
        link=_link_text(link),
        note="no collective found: no NCCL/RCCL kernel, no gloo:* or record_param_comms op in any rank",
        warnings=list(run.warnings), ranks=ranks)


def match(calls: pl.DataFrame) -> pl.DataFrame:
    """`calls` (all ranks) with `key`, the same on every rank for one call (see the module docstring)."""
    group = pl.coalesce("process_group", "group_ranks", pl.lit("")).alias("group")
    calls = calls.with_columns(group)
    by_seq = calls.group_by("group").agg(all_seq=pl.col("seq").is_not_null().all())
    # a call of unknown message size (an all_gather whose group size is unknown) by its input, the same on every rank
    size = pl.when(pl.col("collective").is_in(SIZE_UNIFORM)).then(
        pl.coalesce(pl.col("message_bytes").cast(pl.String), pl.format("in {} {}", "in_nelems", "dtype"),
                    pl.lit("?"))).otherwise(pl.lit("*"))
    within = ["step_key"] if _by_step(calls) else []
    ordinal = pl.col("ts_ns").rank("ordinal").over("rank", "group", "collective", "size", "dtype_key", *within) - 1
    return (
        calls.join(by_seq, on="group").with_columns(size=size, dtype_key=pl.col("dtype").fill_null("?"),
                                                    step_key=pl.col("step").cast(pl.String) if within else pl.lit(""))
        .with_columns(key=pl.when(pl.col("all_seq"))
                      .then(pl.concat_str(pl.lit("seq"), "group", "collective", "seq", separator="|"))
                      .otherwise(pl.concat_str(pl.lit("ord"), "group", "collective", "size", "dtype_key", "step_key",
                                               ordinal.cast(pl.String), separator="|")))
        .drop("all_seq", "size", "dtype_key", "step_key")
    )


def _by_step(calls: pl.DataFrame) -> bool:
    """Whether calls are matched within their step: every call has one, and every rank's calls fall in the same
    steps (ranks that profiled other steps, or lost a step's every call, are matched by order alone)."""
    if "step" not in calls.columns or calls.height == 0 or calls["step"].null_count():
        return False
    per_rank = calls.group_by("rank").agg(pl.col("step").unique().sort())["step"].to_list()
    return all(steps == per_rank[0] for steps in per_rank) and len(per_rank[0]) > 1


def clock_offsets(parts: pl.DataFrame) -> dict[str, int]:
    """Offset (ns) per clock that makes matched calls end together (see the module docstring)."""
    if parts.height == 0:
        return {}
    ends = parts.select("key", "clock", "rank", end_ns=pl.col("rel_ns") + pl.col("dur_ns"))
    offsets = {str(ends.sort("rank")["clock"][0]): 0}
    while True:
        known = pl.DataFrame({"clock": list(offsets), "off": list(offsets.values())})
        center = (ends.join(known, on="clock").group_by("key")
                  .agg(center=(pl.col("end_ns") + pl.col("off")).median()))
        new = (ends.filter(~pl.col("clock").is_in(list(offsets))).join(center, on="key")
               .group_by("clock").agg(off=(pl.col("center") - pl.col("end_ns")).median()))
        if new.height == 0:
            return offsets
        offsets.update({str(c): round(o) for c, o in new.iter_rows()})


def _aligned(parts: pl.DataFrame, offsets: dict[str, int]) -> pl.DataFrame:
    """Aligned start and end, each rank's residual, and its wait, per (call, rank)."""
    off = pl.col("clock").replace_strict(offsets, default=0, return_dtype=pl.Int64)
    return (
        parts.with_columns(offset_ns=off)
        .with_columns(start=pl.col("rel_ns") + pl.col("offset_ns"))
        .with_columns(end=pl.col("start") + pl.col("dur_ns"))
        .with_columns(residual_ns=(pl.col("end") - pl.col("end").median().over("key")).round().cast(pl.Int64),
                      latency_ns=pl.col("dur_ns").min().over("key"))
        .with_columns(wait_ns=pl.col("dur_ns") - pl.col("latency_ns"))
    )


def _expected(group_ranks: str | None, present: list[int]) -> list[int]:
    """The ranks a call should have: its group's (where the trace lists them), of those with a trace."""
    listed = listed_ranks(group_ranks)
    return sorted(set(listed) & set(present)) if listed else present


def _per_call(parts: pl.DataFrame, present: list[int], link_gbps: float | None, world: int | None) -> pl.DataFrame:
    """One row per call: participants, skew, latency, bytes, bandwidths, the last arrivals, and the ranks of
    the run (`present`) that its group holds but that did not take part.

    The group size n, exact or null (then busbw and link share are null too), first answer wins: the call's
    `Group size`; the number of ranks its group lists (all of them, with a trace or not); the world size where
    every rank of the world (`world`) took part; an all_gather's / reduce_scatter's from its c10d op's shapes
    (`_comm_events.shape_group_size`). An all_gather whose size no rank knows (only its input recorded) gets
    input x n where n is known."""
    first = pl.col("rank").arg_min()
    calls = parts.sort("rank").group_by("key").agg(
        collective=pl.col("collective").first(), process_group=pl.col("process_group").first(),
        group_ranks=pl.col("group_ranks").drop_nulls().first(), seq=pl.col("seq").first(),
        dtype=pl.col("dtype").get(first), message_bytes=pl.col("message_bytes").get(first),
        in_nelems=pl.col("in_nelems").get(first),
        group_size_arg=pl.col("group_size").drop_nulls().first(),
        shape_group_size=pl.col("shape_group_size").drop_nulls().first(), participants=pl.col("rank"),
        first_start=pl.col("start").min(), skew_ns=pl.col("start").max() - pl.col("start").min(),
        latency_ns=pl.col("dur_ns").min(), max_wait_ns=pl.col("wait_ns").max(),
        last_ranks=pl.col("rank").filter(pl.col("start") == pl.col("start").max()),
    )
    groups = calls["group_ranks"].to_list()
    calls = calls.with_columns(
        expected=pl.Series([_expected(g, present) for g in groups], dtype=pl.List(pl.Int64)),
        listed_size=pl.Series([len(r) if (r := listed_ranks(g)) else None for g in groups], dtype=pl.Int64))
    took = pl.col("participants")  # distinct ranks: all of 0..world-1 where there are world of them in that range
    whole_world = pl.lit(False) if world is None else (
        (took.list.len() == world) & (took.list.min() == 0) & (took.list.max() == world - 1))
    n = pl.coalesce("group_size_arg", "listed_size", pl.when(whole_world).then(pl.lit(world, pl.Int64)),
                    "shape_group_size")
    gathered = pl.when(pl.col("collective") == "all_gather").then(
        pl.col("in_nelems") * n * pl.col("dtype").replace_strict(ELEMENT_BYTES, default=None, return_dtype=pl.Int64))
    calls = calls.with_columns(group_size=n, message_bytes=pl.coalesce("message_bytes", gathered))
    algbw = pl.when(pl.col("message_bytes") > 0).then(pl.col("message_bytes") / pl.col("latency_ns"))
    calls = calls.with_columns(
        ranks=pl.col("participants").list.len(),
        missing_ranks=pl.col("expected").list.set_difference("participants").list.sort(),
        skew_ns=pl.when(pl.col("participants").list.len() > 1).then("skew_ns"),
        last_ranks=pl.when(pl.col("participants").list.len() > 1).then("last_ranks"),
        algbw_gbps=algbw.fill_nan(None),
    ).with_columns(busbw_gbps=pl.col("algbw_gbps") * bus_factor(pl.col("collective"), pl.col("group_size")))
    calls = calls.with_columns(link_share=pl.col("busbw_gbps") / link_gbps if link_gbps else pl.lit(None))
    origin = calls["first_start"].min()
    return (calls.sort("first_start", "key").with_row_index("call", offset=1)
            .with_columns(call=pl.col("call").cast(pl.Int64), start_ns=pl.col("first_start") - origin))


#: matched calls end together once clocks are aligned (a collective's end is a global event; a CPU backend's calls
#: return within a millisecond or so of each other, sample_traces/late_rank: 1.04 ms): a residual above this and
#: above the calls' median latency says the pairing or the clocks are off, not the ranks
LOOSE_RESIDUAL_NS = 5_000_000


def alignment_warnings(parts: pl.DataFrame, offsets: dict[str, int]) -> list[str]:
    """`_loose_alignment`'s warning for matched call parts (`match`'s, with `rel_ns`) on `offsets`' clocks, where
    the caller (the run graph) has no calls or waits table of its own: the same warning `comm` gives."""
    if parts.height == 0:
        return []
    aligned = _aligned(parts, offsets)
    calls = aligned.group_by("key").agg(ranks=pl.col("rank").n_unique(), latency_ns=pl.col("latency_ns").first())
    return _loose_alignment(aligned.select("residual_ns"), calls, one_clock=parts["clock"].n_unique() == 1,
                            cpu=set(parts["source"].unique().to_list()) == {"cpu"})


def _loose_alignment(waits: pl.DataFrame, calls: pl.DataFrame, *, one_clock: bool, cpu: bool) -> list[str]:
    """A warning where matched calls do not end together after alignment (hta/trace_filter, two sampled ranks of
    128: residuals of 308 ms against calls of ~30 ms): skews, waits and the straggler then say little. Its likely
    causes as the run allows: no drifting clocks where the ranks share one; CPU collectives (gloo) whose ranks
    leave the call at different times where they are all such (a ring's ranks return one after another)."""
    worst = _max_int(waits["residual_ns"].abs()) if waits.height else None
    latency = calls.filter(pl.col("ranks") > 1).select(pl.col("latency_ns").median()).item()
    if worst is None or latency is None or worst <= max(LOOSE_RESIDUAL_NS, latency):
        return []
    causes = ["calls paired wrongly (traces missing calls, sampled or cut)"]
    if cpu:
        causes.append("CPU collectives whose ranks return at different times (gloo's ring on a busy host)")
    if not one_clock:
        causes.append("drifting clocks")
    return [f"matched calls do not end together after clock alignment (residual up to {worst / 1e6:,.1f} ms, above "
            f"their median latency {latency / 1e6:,.1f} ms): {' or '.join(causes)}; read skews, waits and the "
            "straggler with care"]


def _unknown_bandwidth(calls: pl.DataFrame) -> list[str]:
    """Why busbw is missing where it is: an unknown group size, an all_gather's unknown message size (one line
    each, where some call has it)."""
    out = []
    factored = bus_factor(pl.col("collective"), pl.lit(2)).is_not_null()  # a collective that has a busbw
    if n := calls.filter(factored & pl.col("busbw_gbps").is_null() & pl.col("algbw_gbps").is_not_null()).height:
        out.append(f"busbw unknown for {plural(n, 'call')}: group size unknown (no `Group size` or group ranks in the "
                   "trace, and not every rank of the world took part)")
    if n := calls.filter((pl.col("collective") == "all_gather") & pl.col("message_bytes").is_null()).height:
        out.append(f"size and bandwidth unknown for {plural(n, 'all_gather call')}: the trace records only each "
                   "rank's input, and the group size is unknown")
    return out


def bus_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' busbw / algbw: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
    broadcast, reduce, send/recv 1; null for other collectives or an unknown n."""
    n = n.cast(pl.Float64)
    return (pl.when(collective == "all_reduce").then(2 * (n - 1) / n)
            .when(collective.is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
            .when(collective.is_in(["broadcast", "reduce", "send_recv"])).then(pl.lit(1.0)))


def _waits(parts: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """One row per (call, rank): raw and aligned start, duration, wait, arrival order and end residual."""
    origin = calls["first_start"].min()
    return (
        parts.join(calls.select("key", "call"), on="key")
        .with_columns(arrival=pl.col("start").rank("min").over("key").cast(pl.Int64))
        .with_columns(last=(pl.col("arrival") == pl.col("arrival").max().over("key")) & (pl.len().over("key") > 1))
        .select("call", "rank", "collective", "ts_ns", aligned_start_ns=pl.col("start") - origin,
                dur_ns="dur_ns", wait_ns="wait_ns", arrival="arrival", last="last", residual_ns="residual_ns")
        .sort("call", "rank")
    )


def _straggler(calls: pl.DataFrame, waits: pl.DataFrame) -> tuple[int | None, int | None, int | None]:
    """(rank, calls it arrived last in, the others' wait in those calls), or Nones without such calls: the rank
    whose late arrivals cost the others the most wait, a tie going to the one last more often. (Not the one last
    most often: a rank last by microseconds in every call of a ring costs nothing beside one that holds every
    rank 30 ms in a few calls; DESIGN's "most often sets the others' wait" read by the wait it sets.)"""
    last = calls.select("call", "last_ranks").explode("last_ranks").drop_nulls().rename({"last_ranks": "rank"})
    if last.height == 0:
        return None, None, None
    # the others' wait in a call = the call's total wait - the late rank's own (a join of last arrivals with every
    # other rank's wait would be ranks x ranks rows in a call where all arrive together: 12M rows at 1,024 ranks)
    total = waits.group_by("call").agg(total_ns=pl.col("wait_ns").sum())
    own = waits.select("call", "rank", own_ns="wait_ns")
    cost = (last.join(total, on="call").join(own, on=["call", "rank"], how="left", maintain_order="left")
            .group_by("rank").agg(cost=(pl.col("total_ns") - pl.col("own_ns").fill_null(0)).sum()))
    ranked = (last.group_by("rank").agg(n=pl.len()).join(cost, on="rank", how="left", maintain_order="left")
              .with_columns(pl.col("cost").fill_null(0))
              .sort(["cost", "n", "rank"], descending=[True, True, False]))
    rank, n, wait = ranked.row(0)
    return int(rank), int(n), int(wait)


def _groups(calls: pl.DataFrame, link_gbps: float | None) -> pl.DataFrame:
    """Calls grouped by collective x message size (powers of 2) x dtype x group."""
    bucket = pl.when(pl.col("message_bytes") > 0).then(
        pl.lit(2, pl.Int64).pow(pl.col("message_bytes").log(2).floor().cast(pl.Int64))).otherwise("message_bytes")
    timed = pl.col("algbw_gbps").is_not_null()
    # exact or null: a call of unknown size leaves its group's total unknown, never a partial sum; so does a timed
    # call of unknown busbw (its group size unknown) for the group's busbw
    total = pl.when(pl.col("message_bytes").null_count() == 0).then(pl.col("message_bytes").sum())
    busbw = pl.when(pl.col("busbw_gbps").filter(timed).null_count() == 0).then(
        (pl.col("busbw_gbps") * pl.col("latency_ns")).filter(timed).sum() / pl.col("latency_ns").filter(timed).sum())
    out = (calls.with_columns(size_bucket_bytes=bucket)
           .group_by("collective", "size_bucket_bytes", "dtype", "process_group")
           .agg(calls=pl.len(), ranks=pl.col("ranks").max(), mean_skew_ns=pl.col("skew_ns").mean(),
                max_skew_ns=pl.col("skew_ns").max(), mean_latency_ns=pl.col("latency_ns").mean(),
                max_wait_ns=pl.col("max_wait_ns").max(), total_message_bytes=total,
                algbw_gbps=pl.col("message_bytes").filter(timed).sum() / pl.col("latency_ns").filter(timed).sum(),
                busbw_gbps=busbw)
           .with_columns(pl.col("mean_skew_ns", "mean_latency_ns").round().cast(pl.Int64),
                         pl.col("algbw_gbps", "busbw_gbps").fill_nan(None))
           .sort("collective", "process_group", "size_bucket_bytes", "dtype", nulls_last=True))
    if link_gbps:
        out = out.with_columns(link_share=pl.col("busbw_gbps") / link_gbps)
    return out


def _calls_out(calls: pl.DataFrame, link_gbps: float | None) -> pl.DataFrame:
    cols = ["call", "collective", "process_group", "seq", "ranks", "missing_ranks", "start_ns", "skew_ns",
            "latency_ns", "max_wait_ns", "last_ranks", "message_bytes", "dtype", "group_size", "algbw_gbps",
            "busbw_gbps"]
    as_text = {c: pl.when(pl.col(c).list.len() > 0).then(pl.col(c).list.eval(pl.element().cast(pl.String))
                                                        .list.join(", ")) for c in ("missing_ranks", "last_ranks")}
    return calls.with_columns(**as_text).select(*cols, *(["link_share"] if link_gbps else []))


def _ranks(ranks: Sequence[RankCalls], waits: pl.DataFrame, offsets: dict[str, int]) -> pl.DataFrame:
    """One row per rank: its files, host and clock offset, collectives, time in them, wait, last arrivals."""
    base = pl.DataFrame({
        "rank": [r.rank for r in ranks], "host": [r.host for r in ranks], "traces": [len(r.files) for r in ranks],
        "clock_offset_ns": [offsets.get(r.clock) for r in ranks],
    }, schema={"rank": pl.Int64, "host": pl.String, "traces": pl.Int64, "clock_offset_ns": pl.Int64})
    per = waits.group_by("rank").agg(
        collectives=pl.len(), comm_ns=pl.col("dur_ns").sum(), wait_ns=pl.col("wait_ns").sum(),
        last_arrivals=pl.col("last").sum().cast(pl.Int64),
        max_residual_ns=pl.col("residual_ns").abs().max())
    return (base.join(per, on="rank", how="left", maintain_order="left")
            .with_columns(pl.col("collectives").fill_null(0)).sort("rank"))


def _note(run: RunCalls, calls: pl.DataFrame) -> str | None:
    if len(run.ranks) == 1:
        return (f"one rank (rank {run.ranks[0].rank}): no matching across ranks is possible; its "
                f"{plural(calls.height, 'collective')} {'is' if calls.height == 1 else 'are'} listed with "
                "their duration as latency")
    return None


def _max_int(values: pl.Series) -> int | None:
    top = values.max()
    return int(top) if isinstance(top, int | float) else None
