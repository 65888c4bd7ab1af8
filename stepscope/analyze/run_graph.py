"""The dependency graph of a run: every rank's graph (`depgraph`) on aligned clocks, joined by its collectives.

The run, its ranks, matched calls and clock offsets are `stepscope comm`'s (`_comm_run`, `collectives`). Each
rank's graph is built as for one trace, its times moved by its clock's offset (so matched collectives end
together, DESIGN.md "Distributed runs"), then the ranks are joined through their collectives:

    comm event   per rank and call, the rank's collective: its NCCL/RCCL kernel (already a GPU event of its graph)
                 or, on a CPU backend (gloo), the `gloo:<op>` op on its worker thread, added as a start and an end
                 node joined by a `gpu` edge (kind cpu, category communication); the worker starts after the main
                 thread issued it (`wake`), and the main thread, where it was waiting (in no op of its own), resumes
                 after it ends (`comm_wait`, a blocking wait like `sync`)
    collective   r's collective cannot end before every rank q that arrived before that end (measured) did, plus
                 the call's latency (the shortest duration across ranks: the transfer). Not an edge from every q to
                 every r (n² per call): the call's ranks in arrival order each get an *arrival node*, which waits
                 for its rank's comm start and for the node before it (`arrival` edges, weight 0), so it holds the
                 latest arrival so far; each r's end waits for the last arrival node before it (`collective`, the
                 latency): the same constraint in 3n - 1 edges, and the path still names the rank it waits for

A comm event's own start -> end weighs the latency, not its measured duration: its waiting is explained by the
`collective` edge from the last rank to arrive, so a replay with no change still reproduces every rank's times
(the measured-weight rule of `depgraph`: natural weight, raised to the gap for the edge that explains a node best;
a rank's end a little before last arrival + latency, the clock alignment's residual, keeps its time too).

    rank 0 arrives at an all_reduce at 100, rank 1 at 130; latency 10; both end at 140
    -> arrival nodes: A0 = 100 (rank 0), A1 = max(A0, 130) = 130 (rank 1)
    -> rank 0's end: own start 100 + 10 = 110, A1 + 10 = 140: the collective edge explains it, and the critical
       path of rank 0 runs through A1 to rank 1's arrival ("wait for rank 1 (all_reduce)"), and rank 1's work
       before 130

Steps: step N of the run is ProfilerStep#N on every rank, from the earliest rank's start to the latest rank's end
(`depgraph.step_times`); only the steps every rank holds are kept (a note says which were left out).

`run_critical_path` and `run_what_if` are `critical_path` and `what_if` over this graph: a path may cross ranks
(each segment carries its `rank`; the jump is a `collective` segment named "wait for rank N (all_reduce)"), and
a what-if change applies to every rank or, with `rank`, to one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from stepscope.analyze._comm_events import COMM_ANNOTATION, PARAM_COMMS, comm_kernel
from stepscope.analyze._comm_run import RunCalls, parallel_map, run_calls
from stepscope.analyze._text import numbers, plural
from stepscope.analyze.collectives import alignment_warnings, clock_offsets, match
from stepscope.analyze.critical_path import held_notes, path_table
from stepscope.analyze.depgraph import (
    ARRIVAL_LANE,
    EDGE_SCHEMA,
    WAIT_TYPES,
    DependencyGraph,
    EdgeType,
    PathKind,
    build_graph,
    graph_notes,
    ordered_edges,
)
from stepscope.analyze.kernels import KernelCategory
from stepscope.analyze.trace import Trace, load
from stepscope.analyze.whatif import WhatIf, WhatIfResult, what_if_graph
from stepscope.errors import UsageError

COMM = KernelCategory.COMMUNICATION.value
_NODE_SCHEMA: dict[str, pl.DataType] = {"node": pl.Int64(), "t_ns": pl.Int64(), "lane": pl.String(),
                                        "rank": pl.Int64(), "tie": pl.Int64()}
_EDGES: dict[str, pl.DataType] = {**EDGE_SCHEMA, "weight_ns": pl.Int64(), "rank": pl.Int64()}


@dataclass(frozen=True, eq=False, kw_only=True)
class RunGraph:
    """A run's dependency graph (`graph`: nodes, edges, windows and gpu_ends each with a `rank` column, times on
    the aligned clock), the ranks' traces, their clock offsets (ns) and what the joining found."""

    graph: DependencyGraph
    ranks: tuple[int, ...]
    traces: dict[int, tuple[Trace, ...]]
    offsets_ns: dict[int, int]
    source: str | None
    collectives_joined: int
    notes: tuple[str, ...]
    noted_edges: int = 0  # of graph.dropped_edges, those `notes` already count (the collective edges run backwards)


def load_run(paths: str | Path | Sequence[str | Path], *, cache_dir: Path | None = None,
             annotation: str | None = None) -> RunGraph:
    """The run graph of the run that `paths` name (as `stepscope comm` reads them)."""
    many = [paths] if isinstance(paths, str | Path) else list(paths)
    return build_run_graph(run_calls(many, cache_dir=cache_dir), annotation=annotation)


def build_run_graph(run: RunCalls, *, annotation: str | None = None) -> RunGraph:
    """The graph of `run` (see the module docstring)."""
    parts = match(pl.concat([r.calls.with_columns(rank=pl.lit(r.rank, pl.Int64), clock=pl.lit(r.clock))
                             for r in run.ranks], how="vertical"))
    relative = parts.with_columns(rel_ns=pl.col("ts_ns") - pl.col("ts_ns").min())
    offsets = clock_offsets(relative) if parts.height else {}
    by_rank = {r.rank: int(offsets.get(r.clock, 0)) for r in run.ranks}
    notes = [*run.warnings, *alignment_warnings(relative, offsets)]
    nodes: list[pl.DataFrame] = []
    edges: list[pl.DataFrame] = []
    windows: list[pl.DataFrame] = []
    gpu_ends: list[pl.DataFrame] = []
    events: list[pl.DataFrame] = []  # per (call key, rank): the comm event's start and end nodes
    base = 0
    dropped = 0
    kinds: set[str] = set()
    latency_ns: list[int] = []  # each trace's typical launch latency, where one was measured
    samples: int | None = None  # most launches onto an idle stream in one trace (None: no trace had a launch call)
    # each trace's own graph, by worker processes in a large run (they pickle back: frames and arrays)
    graphs = iter(parallel_map(_trace_graph, [(t.directory, annotation) for r in run.ranks for t in r.traces]))
    for r in run.ranks:
        calls = parts.filter(pl.col("rank") == r.rank)
        for trace in r.traces:
            g = next(graphs)
            kinds.add(g.window_kind)
            dropped += g.dropped_edges
            latency_ns += [g.launch_latency_ns] if g.launch_latency_ns is not None else []
            samples = g.launch_samples if samples is None else max(samples, g.launch_samples or 0)
            part = _shifted(g, r.rank, base, by_rank[r.rank])
            base += g.nodes.height
            comm, extra_nodes, extra_edges, extra_ends = _comm_events(trace, g, part, calls, base)
            base += extra_nodes.height
            nodes += [part.nodes, extra_nodes]
            edges += [part.edges, extra_edges]
            windows.append(part.windows)
            gpu_ends += [part.gpu_ends, extra_ends]
            events.append(comm)
    all_nodes = pl.concat(nodes, how="vertical").sort("node")
    comm = pl.concat(events, how="vertical")
    arrival_nodes, collective_edges, late = _collective_edges(comm, all_nodes["t_ns"].to_numpy(), base)
    all_nodes = pl.concat([all_nodes, arrival_nodes], how="vertical")
    all_edges = pl.concat([*edges, collective_edges], how="vertical")
    all_edges = _latency_weights(all_edges, comm)
    win = pl.concat(windows, how="vertical")
    ends = pl.concat(gpu_ends, how="vertical")
    win, ends, step_note = _common_steps(win, ends)
    notes += [step_note] if step_note else []
    graph, backwards = _ordered(all_nodes, all_edges, win, ends, kinds,
                                int(np.median(latency_ns)) if latency_ns else None, dropped + late,
                                samples=samples)
    backwards += late
    if backwards:
        notes.append(f"{plural(backwards, 'collective or comm-wait edge')} ran backwards on the aligned clocks (a "
                     "rank's end before another's arrival: the alignment's residual) and "
                     f"{'was' if backwards == 1 else 'were'} dropped")
    sources = set(parts["source"].unique().to_list()) if parts.height else set()
    return RunGraph(graph=graph, ranks=tuple(r.rank for r in run.ranks),
                    traces={r.rank: r.traces for r in run.ranks}, offsets_ns=by_rank,
                    source=None if not sources else sources.pop() if len(sources) == 1 else "mixed",
                    # (a call seen on one rank joins nothing: sampled traces have such calls)
                    collectives_joined=comm.filter(pl.col("key").is_not_null()).group_by("key").agg(
                        pl.col("rank").n_unique()).filter(pl.col("rank") > 1).height,
                    notes=tuple(notes), noted_edges=backwards)


def _trace_graph(job: tuple[Path, str | None]) -> DependencyGraph:
    """The dependency graph of one ingested trace directory (`depgraph.build_graph`): a worker's job."""
    directory, annotation = job
    return build_graph(load(directory), annotation=annotation)


def _shifted(g: DependencyGraph, rank: int, base: int, offset: int) -> DependencyGraph:
    """A rank's graph with node ids from `base`, times on the aligned clock, and a `rank` column everywhere."""
    tie = np.where(g.nodes["lane"].str.starts_with("gpu").to_numpy(), 1, 0)
    sync_dst = g.edges.filter(pl.col("type").is_in(WAIT_TYPES))["dst"].to_numpy()
    tie[sync_dst] = 2
    nodes = g.nodes.select(node=pl.col("node") + base, t_ns=pl.col("t_ns") + offset, lane="lane",
                           rank=pl.lit(rank, pl.Int64), tie=pl.Series(tie, dtype=pl.Int64))
    edges = g.edges.with_columns(pl.col("src") + base, pl.col("dst") + base, rank=pl.lit(rank, pl.Int64))
    windows = g.windows.select(
        rank=pl.lit(rank, pl.Int64), step="step", start_ns=pl.col("start_ns") + offset,
        end_ns=pl.col("end_ns") + offset, cpu_start_ns=pl.col("cpu_start_ns") + offset,
        cpu_end_ns=pl.col("cpu_end_ns") + offset, cpu_start_node=pl.col("cpu_start_node") + base,
        cpu_end_node=pl.col("cpu_end_node") + base)
    gpu_ends = g.gpu_ends.select(rank=pl.lit(rank, pl.Int64), step="step", node=pl.col("node") + base)
    return DependencyGraph(nodes=nodes, edges=edges.cast(_EDGES).select(list(_EDGES)), windows=windows,  # type: ignore[arg-type]
                           gpu_ends=gpu_ends, order=g.order + base, dropped_edges=g.dropped_edges,
                           window_kind=g.window_kind, launch_latency_ns=g.launch_latency_ns,
                           launch_samples=g.launch_samples)


_COMM_SCHEMA: dict[str, pl.DataType] = {"key": pl.String(), "rank": pl.Int64(), "collective": pl.String(),
                                        "dur_ns": pl.Int64(), "start_node": pl.Int64(), "end_node": pl.Int64(),
                                        "event_id": pl.Int64(), "lane": pl.String(), "cpu": pl.Boolean()}


def _comm_events(trace: Trace, g: DependencyGraph, part: DependencyGraph, calls: pl.DataFrame, base: int
                 ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """This trace's collectives as graph events: (key, rank, start and end node …), and the nodes, edges and step
    ends a CPU backend's collectives add (node ids from `base`)."""
    rank = int(part.nodes["rank"][0]) if part.nodes.height else 0
    empty_nodes = pl.DataFrame(schema=_NODE_SCHEMA)
    empty_edges = pl.DataFrame(schema=_EDGES)
    empty_ends = pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "node": pl.Int64})
    if g.nodes.height == 0 or calls.height == 0:
        return pl.DataFrame(schema=_COMM_SCHEMA), empty_nodes, empty_edges, empty_ends
    shift = int(part.nodes["node"][0]) - int(g.nodes["node"][0])
    kernel_calls = calls.filter(pl.col("source") == "kernel")
    found = []
    if kernel_calls.height:
        kernels = trace.kernels.filter(comm_kernel()).select(
            "event_id", "ts_ns", pl.col("device").cast(pl.Int64), pl.col("stream").cast(pl.Int64)).collect(
                engine="in-memory")
        gpu = g.edges.filter(pl.col("type") == EdgeType.GPU.value).select(
            "event_id", "lane", start_node=pl.col("src") + shift, end_node=pl.col("dst") + shift)
        found.append(
            kernel_calls.join(kernels, on=["ts_ns", "device", "stream"], how="inner")
            .join(gpu, on="event_id", how="inner")
            .select("key", "rank", "collective", "dur_ns", "start_node", "end_node", "event_id", "lane",
                    cpu=pl.lit(False)).unique(subset=["key"], keep="first"))
    cpu_calls = calls.filter(pl.col("source") == "cpu")
    nodes, edges, ends = empty_nodes, empty_edges, empty_ends
    if cpu_calls.height:
        ops = trace.cpu.filter(pl.col("name").str.contains(COMM_ANNOTATION) | (pl.col("name") == PARAM_COMMS)).select(
            "event_id", "name", "pid", "tid", "ts_ns", "dur_ns").collect(engine="in-memory")
        hit = (cpu_calls.join(ops, on=["ts_ns", "dur_ns"], how="inner").unique(subset=["key"], keep="first")
               .sort("ts_ns").with_row_index("i").with_columns(pl.col("i").cast(pl.Int64)))
        offset = int(part.nodes["t_ns"][0]) - int(g.nodes["t_ns"][0])
        hit = hit.with_columns(start_node=base + 2 * pl.col("i"), end_node=base + 2 * pl.col("i") + 1,
                               lane=pl.format("thread {}/{}", "pid", "tid"),
                               s=pl.col("ts_ns") + offset, e=pl.col("ts_ns") + pl.col("dur_ns") + offset)
        nodes = pl.concat([hit.select(node="start_node", t_ns="s", lane="lane"),
                           hit.select(node="end_node", t_ns="e", lane="lane")]).with_columns(
            rank=pl.lit(rank, pl.Int64), tie=pl.lit(1, pl.Int64)).sort("node").cast(_NODE_SCHEMA)  # type: ignore[arg-type]
        edges, ends = _cpu_comm_edges(hit, part, rank)
        found.append(hit.select("key", "rank", "collective", "dur_ns", "start_node", "end_node", "event_id", "lane",
                                cpu=pl.lit(True)))
    comm = pl.concat([f.cast(_COMM_SCHEMA) for f in found], how="vertical") if found else pl.DataFrame(  # type: ignore[arg-type]
        schema=_COMM_SCHEMA)
    return comm, nodes, edges, ends


def _cpu_comm_edges(hit: pl.DataFrame, part: DependencyGraph, rank: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A CPU backend's collectives (hit: start/end nodes at aligned s, e): start -> end; the main thread's last
    boundary at its start -> its start (`wake`); its end -> the main thread's first boundary after it where the
    main thread was waiting there in no op of its own (`comm_wait`); and its end as GPU-like work of its step."""
    w = part.windows
    main_lane = part.nodes["lane"].gather(w["cpu_start_node"].drop_nulls().head(1) - int(part.nodes["node"][0])) \
        if w["cpu_start_node"].drop_nulls().len() else part.nodes["lane"].head(1)
    main = part.nodes.filter(pl.col("lane") == main_lane[0]).select(m_node="node", m_t="t_ns").sort("m_t", "m_node")
    cpu_in = part.edges.filter(pl.col("type") == EdgeType.CPU.value).select(
        m_node="dst", slice_event="event_id", slice_name="name", slice_kind="kind")
    hs = hit.sort("s")
    issued = hs.join_asof(main, left_on="s", right_on="m_t", strategy="backward", check_sortedness=False).filter(
        pl.col("m_node").is_not_null())
    he = hit.sort("e")
    resumed = (he.join_asof(main.sort("m_t", "m_node"), left_on="e", right_on="m_t", strategy="forward",
                            check_sortedness=False)
               .filter(pl.col("m_node").is_not_null()).join(cpu_in, on="m_node", how="left", maintain_order="left"))
    # waiting: untraced time under the step annotation, the collective's own op, or an op that says it waits
    waiting = (pl.col("slice_event").is_null() | (pl.col("slice_event") == pl.col("event_id"))
               | pl.col("slice_name").str.contains("(?i)(ProfilerStep|wait)").fill_null(False)) \
        & (pl.col("slice_kind") != PathKind.DATA_LOADING.value).fill_null(True)
    resumed = resumed.filter(waiting).unique(subset=["key"], keep="first")
    lit_rank = pl.lit(rank, pl.Int64)
    edges = pl.concat([
        hit.select(src="start_node", dst="end_node", type=pl.lit(EdgeType.GPU.value), kind=pl.lit(PathKind.CPU.value),
                   category=pl.lit(COMM), natural_ns=pl.col("e") - pl.col("s"), event_id="event_id", name="name",
                   lane="lane", pid="pid", tid="tid", point_ns="ts_ns"),
        issued.select(src="m_node", dst="start_node", type=pl.lit(EdgeType.WAKE.value),
                      kind=pl.lit(PathKind.IDLE.value), natural_ns=pl.col("s") - pl.col("m_t"), event_id="event_id",
                      name=pl.lit("(collective issued)"),
                      lane="lane", pid="pid", tid="tid", point_ns="ts_ns"),
        resumed.select(src="end_node", dst="m_node", type=pl.lit(EdgeType.COMM_WAIT.value),
                       kind=pl.lit(PathKind.SYNC_WAIT.value), natural_ns=pl.col("m_t") - pl.col("e"),
                       event_id="event_id", name=pl.format("(wait for {})", "name"), lane="lane", pid="pid", tid="tid",
                       point_ns="ts_ns"),
    ], how="diagonal_relaxed").with_columns(rank=lit_rank, weight_ns=pl.lit(None, pl.Int64))
    edges = edges.select([pl.col(c).cast(t) if c in edges.columns else pl.lit(None, t).alias(c)
                          for c, t in _EDGES.items()])
    # the step whose window holds the collective's start waits for its end
    steps = w.filter(pl.col("step").is_not_null()).select("step", w_s="start_ns").sort("w_s")
    ends = (hs.join_asof(steps, left_on="s", right_on="w_s", strategy="backward", check_sortedness=False)
            .filter(pl.col("step").is_not_null()).select(rank=lit_rank, step="step", node="end_node")) \
        if steps.height else hs.select(rank=lit_rank, step=pl.lit(None, pl.Int64), node="end_node")
    return edges, ends


#: an arrival node's tie (`depgraph.topological_order`): after every rank node at its time (their ties are 0 to 2),
#: then the call's arrival nodes in arrival order
_ARRIVAL_TIE = 3


def _collective_edges(comm: pl.DataFrame, t_ns: np.ndarray, base: int) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """The arrival nodes (ids from `base`) and the arrival and collective edges of every matched call (see the
    module docstring), the collective edges weighing the call's latency (the shortest duration across its ranks);
    and how many (rank q, rank r) pairs of a call had q arrive at or after r's end.

    A call's ranks by measured arrival (comm start), then rank: arrival node k holds the k-th arrival (rank
    column: that rank) and waits for it and for node k - 1. Rank r's end waits for the last node whose arrival
    came before that end: a rank that arrived after it (the clock alignment's residual) does not hold it up (as
    an edge from it would run backwards, those pairs are counted with the edges dropped so)."""
    calls = comm.filter(pl.col("key").is_not_null())
    if calls.height == 0:
        return pl.DataFrame(schema=_NODE_SCHEMA), pl.DataFrame(schema=_EDGES), 0
    calls = (calls.with_columns(latency_ns=pl.col("dur_ns").min().over("key"),
                                a=pl.Series(t_ns[calls["start_node"].to_numpy()]),
                                e=pl.Series(t_ns[calls["end_node"].to_numpy()]))
             .sort("key", "a", "rank")
             .with_columns(node=pl.int_range(pl.len(), dtype=pl.Int64) + base,
                           k=pl.int_range(pl.len(), dtype=pl.Int64).over("key"))
             .with_columns(kind=pl.when(pl.col("cpu")).then(pl.lit(PathKind.CPU.value))
                           .otherwise(pl.lit(PathKind.KERNEL.value))))
    nodes = calls.select("node", t_ns="a", lane=pl.lit(ARRIVAL_LANE), rank="rank", tie=pl.col("k") + _ARRIVAL_TIE)
    arrival: dict[str, pl.Expr | str] = dict(
        type=pl.lit(EdgeType.ARRIVAL.value), kind="kind", category=pl.lit(COMM), natural_ns=pl.lit(0),
        event_id="event_id", name=pl.lit("(arrival)"), lane="lane", rank="rank")
    entries = calls.select(src="start_node", dst="node", **arrival)
    chain = calls.filter(pl.col("k") > 0).select(src=pl.col("node") - 1, dst="node", **arrival)
    joined = (calls.select("key", "rank", "collective", "latency_ns", "end_node", "event_id", "lane", "kind", "e",
                           own_a="a", n=pl.len().over("key"))
              .sort("e")
              .join_asof(calls.select("key", "a", "k", last="node").sort("a"), left_on="e", right_on="a", by="key",
                         strategy="backward", allow_exact_matches=False, check_sortedness=False))
    # arrivals at or after r's end, r's own left out
    late = int(joined.select((pl.col("n") - (pl.col("k") + 1).fill_null(0) - (pl.col("own_a") >= pl.col("e"))
                              .cast(pl.Int64)).sum()).item())
    latest = joined.filter(pl.col("last").is_not_null()).sort("end_node")
    waits = latest.select(src="last", dst="end_node", type=pl.lit(EdgeType.COLLECTIVE.value), kind="kind",
                          category=pl.lit(COMM), natural_ns="latency_ns", event_id="event_id", name="collective",
                          lane="lane", rank="rank")
    edges = pl.concat([entries, chain, waits], how="vertical_relaxed")
    return (nodes.cast(_NODE_SCHEMA),  # type: ignore[arg-type]
            edges.select([pl.col(c).cast(t) if c in edges.columns else pl.lit(None, t).alias(c)
                          for c, t in _EDGES.items()]), late)


def _latency_weights(edges: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """A matched comm event's own start -> end weighs its call's latency (its wait is the collective edges')."""
    lat = (comm.filter(pl.col("key").is_not_null()).with_columns(latency_ns=pl.col("dur_ns").min().over("key"))
           .select(src="start_node", dst="end_node", latency_ns="latency_ns", is_gpu=pl.lit(EdgeType.GPU.value)))
    return (edges.join(lat, left_on=["src", "dst", "type"], right_on=["src", "dst", "is_gpu"], how="left",
                       maintain_order="left")
            .with_columns(natural_ns=pl.coalesce("latency_ns", "natural_ns")).drop("latency_ns"))


def _common_steps(windows: pl.DataFrame, ends: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, str | None]:
    """The windows and step ends of the steps every rank holds, and a note naming those left out."""
    if windows["step"].null_count() == windows.height:
        return windows.sort("rank", "start_ns"), ends, None
    ranks = windows["rank"].n_unique()
    counts = windows.filter(pl.col("step").is_not_null()).group_by("step").agg(n=pl.col("rank").n_unique())
    common = counts.filter(pl.col("n") == ranks)["step"]
    left = counts.filter(pl.col("n") < ranks)["step"].sort()
    if common.len() == 0:
        raise UsageError("the ranks of this run share no ProfilerStep number: no step can be compared across them "
                         "(pass one rank's trace, or --annotation REGEX for a region every rank ran)")
    note = (f"steps {numbers(left.to_list())} are not on every rank: left out (the run's steps are "
            "those every rank holds)") if left.len() else None
    keep = common.implode()
    return (windows.filter(pl.col("step").is_in(keep)).sort("rank", "start_ns"),
            ends.filter(pl.col("step").is_in(keep) | pl.col("step").is_null()), note)


def _ordered(nodes: pl.DataFrame, edges: pl.DataFrame, windows: pl.DataFrame, ends: pl.DataFrame, kinds: set[str],
             latency: int | None, dropped: int, *, samples: int | None) -> tuple[DependencyGraph, int]:
    """Order the run's nodes, drop edges against the order (counting the collective ones), set measured weights."""
    t = nodes["t_ns"].to_numpy()
    tie = nodes["tie"].to_numpy().copy()
    wait_dst = edges.filter(pl.col("type") == EdgeType.COMM_WAIT.value)["dst"].to_numpy()
    tie[wait_dst] = 2
    order, edges, backwards = ordered_edges(t, tie, edges)
    kind = kinds.pop() if len(kinds) == 1 else " / ".join(sorted(kinds))
    graph = DependencyGraph(nodes=nodes.drop("tie"), edges=edges, windows=windows, gpu_ends=ends, order=order,
                            dropped_edges=dropped + backwards, window_kind=kind, launch_latency_ns=latency,
                            launch_samples=samples)
    return graph, backwards


# ------------------------------------------------------------------------------------- the run's analyses


@dataclass(frozen=True, kw_only=True)
class RunCriticalPathResult:
    """`critical_path.CriticalPathResult` of a run: each step from the earliest rank's start to the latest rank's
    end; `rank_path_share`: the share of the paths' time on each rank; segments and top contributors carry `rank`
    (a `collective` segment "wait for rank N (…)" is where the path crosses to the rank that arrived last)."""

    rank_count: int
    source: str | None
    collectives_joined: int
    window_kind: str
    steps_found: int
    mean_wall_ns: float | None
    bound_by: str | None
    path_share: dict[str, float]
    rank_path_share: dict[str, float]
    graph_nodes: int
    graph_edges: dict[str, int]
    dropped_edges: int
    typical_launch_latency_ns: int | None  # None: no launch found its stream idle (see depgraph)
    notes: list[str] = field(default_factory=list)
    steps: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    attribution: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    top: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)
    segments: pl.DataFrame = field(repr=False, default_factory=pl.DataFrame)


def run_critical_path(run: RunGraph, *, top: int | None = 15) -> RunCriticalPathResult:
    """The critical path of every step of the run (see the module docstring)."""
    graph = run.graph
    traces: dict[int | None, Sequence[Trace]] = {r: t for r, t in run.traces.items()}  # noqa: C416
    table = path_table(graph, traces, top=top)
    seg = table.segments
    total = float(seg["dur_ns"].sum()) if seg.height else 0.0
    by_rank = ({str(r): float(ns) / total for r, ns in seg.group_by("rank").agg(pl.col("dur_ns").sum())
                .sort("dur_ns", "rank", descending=[True, False], nulls_last=True).iter_rows() if ns}
               if total else {})
    return RunCriticalPathResult(
        rank_count=len(run.ranks), source=run.source, collectives_joined=run.collectives_joined,
        window_kind=graph.window_kind, steps_found=table.steps.height, mean_wall_ns=table.mean_wall_ns,
        bound_by=table.bound_by, path_share=table.path_share, rank_path_share=by_rank, graph_nodes=graph.nodes.height,
        graph_edges=graph.edge_counts(), dropped_edges=graph.dropped_edges,
        typical_launch_latency_ns=graph.launch_latency_ns,
        notes=[*run.notes, *graph_notes(graph), *held_notes(seg, traces)],
        steps=table.steps,
        attribution=table.attribution, top=table.top, segments=seg)


def run_what_if(run: RunGraph, change: WhatIf) -> WhatIfResult:
    """`whatif.what_if` over the run's graph: the changes on every rank, or on `change.rank` only."""
    if change.rank is not None and change.rank not in run.ranks:
        raise UsageError(f"--rank {change.rank}: the run's ranks are {numbers(run.ranks)}")
    joined = plural(run.collectives_joined, "collective")
    notes = [f"run of {plural(len(run.ranks), 'rank')} on aligned clocks, {joined} joined across ranks; step N runs "
             "from the earliest rank's start to the latest rank's end", *run.notes]
    return what_if_graph(run.graph, change, notes=notes, noted_edges=run.noted_edges)


__all__ = ["RunCriticalPathResult", "RunGraph", "build_run_graph", "load_run", "run_critical_path", "run_what_if"]

