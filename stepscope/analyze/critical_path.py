"""`stepscope critical-path`: per step, the chain of dependent work that sets the step's time, and what it is.

The dependency graph (`depgraph`: thread order and nesting, launch -> GPU work, stream order, cross-stream
event waits, host syncs) is replayed with its measured weights, which reproduces every measured time; each node
remembers the in-edge that set it. The **critical path** of a step is then walked back from the step's end (the
later of its CPU end and the end of the last GPU work it launched, `window.step_windows`) along those edges to
the step's start. Its segments tile the step window exactly, so their durations add up to the step's wall time.

Each segment is attributed to one kind (`depgraph.PathKind`):

    cpu              a slice of a thread's timeline, named by the innermost op / annotation / runtime call
    launch_overhead  a launch call's own CPU time (cudaLaunchKernel, …) and the launch latency to the GPU start
    kernel           a kernel's execution (by category: `kernels.category_expr`)
    copy             a memcpy / memset
    sync_wait        a blocking call's time after the GPU work it waited for ended (its return latency), or the
                     whole call where the GPU had finished before it began
    data_loading     CPU time inside a DataLoader __next__
    idle             a gap with only an order to explain it: between work on a stream, a stream waiting on
                     another, a helper thread waiting for the main thread, no recorded dependency at all;
                     in a run, a rank that began the step after the earliest rank ("(began the step late)");
                     GPU work that started more than HELD_FACTOR typical launch latencies after its launch onto an
                     idle stream: past the launch's own part (its typical latency, or its call's time), "(start held
                     after launch)", by something the trace does not record (an event wait without its record, work
                     outside the trace, a clock offset between CPU and GPU; `depgraph.held_ns`)

Before/after, a step of one launch-bound loop (every time in µs):

    CPU  [aten::add 0-10 [cudaLaunchKernel 4-9]] [aten::add 10-20 [cudaLaunchKernel 14-19]]
    GPU                      [k1 12-13]                             [k2 22-23]
    -> path: aten::add 0-4 (cpu), cudaLaunchKernel 4-9 (launch), aten::add 9-10, aten::add 10-14,
       cudaLaunchKernel 14 -> k2 start 22 (launch latency 8), k2 22-23 (kernel): the CPU is the path; k1 is not
       on it.

Differences from HolisticTraceAnalysis's `critical_path_analysis` (same graph ingredients): its nodes are every
event's start and end with nesting edges, ours the boundaries of a thread's timeline (one edge per slice: the
same chain, fewer nodes); it analyses one annotation instance, we every step; a GPU event's launch edge counts
there only when the stream was empty, here every launch edge carries the typical latency and the edge that
explains the start wins; we add helper-thread wake edges and attribute every segment to a kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from stepscope.analyze._comm_events import comm_kernel
from stepscope.analyze._native import scan as _scan
from stepscope.analyze._text import duration, plural
from stepscope.analyze.blame import python_lines, short_name, step_row_name
from stepscope.analyze.depgraph import (
    ARRIVAL_LANE,
    HELD_FACTOR,
    NO_TYPICAL_BOUND_NS,
    DependencyGraph,
    EdgeType,
    PathKind,
    Replay,
    build_graph,
    graph_notes,
    held_ns,
    replay,
    waited_rank,
)
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.trace import Trace

SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "seq": pl.Int64(), "name": pl.String(), "kind": pl.String(), "category": pl.String(),
    "lane": pl.String(), "start_ns": pl.Int64(), "dur_ns": pl.Int64(), "event_id": pl.Int64(), "edge_type": pl.String(),
}
_KINDS = [k.value for k in PathKind]
#: the names of a path's unexplained head (an `idle` segment from the step's start to the path's first node): in
#: a run, where that node is the rank's own step start, the rank began the step after the earliest rank did
NO_DEPENDENCY = "(no recorded dependency)"
LATE_START = "(began the step late)"
#: the name of the part of a launch's wait past its bound (see `_split_held`): the GPU work started far later than a
#: launch takes, on a stream with nothing before it, so something the trace does not record held its start (an event
#: wait whose record is missing, work outside the trace, a clock offset between CPU and GPU)
HELD_START = "(start held after launch)"


@dataclass(frozen=True, kw_only=True)
class CriticalPathResult:
    """Per step, the critical path as ordered segments and its split by kind; the top contributors overall.

    `steps`: step, wall_ns, segments, then `<kind>_ns` per `PathKind` (adding up to wall_ns). `attribution`: kind,
    category (kernel/copy categories; null for the others), mean_ns per step, step_share (of the mean step). `top`:
    kind, category, name, total_ns (over all steps), path_share (of all steps' time), segments, python (the user's
    line at the longest segment: its CPU slice, or the launch of the GPU work). `segments`: step, seq, name, kind,
    category, lane (thread or GPU stream), start_ns (since the step window's start), dur_ns, event_id, edge_type.
    """

    window_kind: str
    steps_found: int
    mean_wall_ns: float | None
    bound_by: str | None
    path_share: dict[str, float]
    graph_nodes: int
    graph_edges: dict[str, int]
    dropped_edges: int
    typical_launch_latency_ns: int | None  # None: no launch found its stream idle (see depgraph)
    steps: pl.DataFrame
    attribution: pl.DataFrame
    top: pl.DataFrame
    segments: pl.DataFrame
    notes: list[str] = field(default_factory=list)


def walk_paths(via_edge: np.ndarray, src: np.ndarray, t: np.ndarray, starts: np.ndarray,
               end_nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each window's path, walked back from its end node along the edge that set each node's time (`via_edge`, a
    row of the edges, -1 for none; `src` each edge row's source node) while the node is after the window's start.

    Returns (rows, counts, heads): the paths' edge rows in time order, window after window, a path whose first node
    nothing recorded explains (still after the start) headed by -1; the rows of each window; and that first node
    per window (-1 where the walk reached the start). The compiled scanner's `walk` does it in C (counting, then
    filling); where it is not built, the same walk runs here over plain lists (tests hold the two to one answer).

        nodes 1, 2, 3 at t 5, 8, 9; edge 0: 1 -> 2 sets node 2, edge 1: 2 -> 3 sets node 3; node 1 has none
        start 6, end node 3  ->  rows [0, 1], counts [2], heads [-1]       (node 1, at 5, is not after the start)
        start 4, end node 3  ->  rows [-1, 0, 1], counts [3], heads [1]   (node 1 is: nothing explains it)
    """
    via_edge, src, t, starts, end_nodes = (np.ascontiguousarray(a, dtype=np.int64)
                                           for a in (via_edge, src, t, starts, end_nodes))
    if len(via_edge) != len(t) or len(starts) != len(end_nodes):
        raise ValueError("walk: via and t one length per node; starts and ends one per window")
    if (((via_edge < -1) | (via_edge >= len(src))).any() or ((src < 0) | (src >= len(t))).any()
            or ((end_nodes < 0) | (end_nodes >= len(t))).any()):
        raise IndexError("walk: a node or edge index out of range")
    if _scan is None:
        return _walk_python(via_edge, src, t, starts, end_nodes)
    counts = np.empty(len(starts), dtype=np.int64)
    heads = np.empty(len(starts), dtype=np.int64)
    _scan.walk(via_edge, src, t, starts, end_nodes, counts, heads)
    rows = np.empty(int(counts.sum()), dtype=np.int64)
    _scan.walk(via_edge, src, t, starts, end_nodes, counts, heads, rows)
    return rows, counts, heads


def _walk_python(via_edge: np.ndarray, src: np.ndarray, t: np.ndarray, starts: np.ndarray,
                 end_nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`walk_paths` in Python (where the compiled `_scan.walk` is not built): the same answer."""
    via, src_l, t_l = via_edge.tolist(), src.tolist(), t.tolist()
    rows: list[int] = []
    counts: list[int] = []
    heads: list[int] = []
    for start, v in zip(starts.tolist(), end_nodes.tolist(), strict=True):
        path: list[int] = []
        while t_l[v] > start and (e := via[v]) >= 0:
            path.append(e)
            v = src_l[e]
            if len(path) > len(t_l):
                raise ValueError("walk: the edges that set the nodes' times form a cycle")
        heads.append(v if t_l[v] > start else -1)
        if t_l[v] > start:
            path.append(-1)
        path.reverse()
        rows.extend(path)
        counts.append(len(path))
    return (np.asarray(rows, dtype=np.int64), np.asarray(counts, dtype=np.int64), np.asarray(heads, dtype=np.int64))


def path_segments(graph: DependencyGraph, timed: Replay) -> pl.DataFrame:
    """`SEGMENT_SCHEMA` rows: the critical path of every step of `graph` under the node times of `timed`.

    Walked back from the step's end along the edge that set each node, to the step's start; the segment that
    crosses the start is clipped to it, and where the walk stops at a node with no in-edge after the start, the
    time before it is an `idle` segment "(no recorded dependency)", or in a run, where that node is its rank's step
    start, "(began the step late)": the rank was still in its previous step when the earliest rank began this one.
    Consecutive edges of one event (an op's slices around a zero-length child) merge, and so do consecutive edges
    of data loading (each named by its DataLoader fetch, the ops under it included).
    """
    t = timed.t_ns
    ends = _end_nodes(graph, t)
    starts = ends["start_ns"].to_numpy().astype(np.int64)
    edge, counts, heads = walk_paths(timed.via_edge, graph.edges["src"].to_numpy(), t, starts,
                                     ends["end_node"].to_numpy().astype(np.int64))
    if not len(edge):
        return pl.DataFrame(schema={**SEGMENT_SCHEMA, "rank": pl.Int64()} if "rank" in graph.edges.columns
                            else SEGMENT_SCHEMA)
    # the unexplained heads (nothing recorded explains a path's first node): their spans and nodes, in row order
    head_node = heads[heads >= 0]
    head_s, head_e = starts[heads >= 0], t[head_node]
    on_edge = edge >= 0
    at = np.where(on_edge, edge, 0)
    window = np.repeat(np.arange(len(counts)), counts)
    w_start = starts[window]
    s_ns = np.full(len(edge), 0, dtype=np.int64)
    e_ns = np.full(len(edge), 0, dtype=np.int64)
    s_ns[on_edge] = t[graph.edges["src"].to_numpy()[edge[on_edge]]]
    e_ns[on_edge] = t[graph.edges["dst"].to_numpy()[edge[on_edge]]]
    s_ns[~on_edge], e_ns[~on_edge] = head_s, head_e
    edge, on_edge, at, window, w_start, s_ns, e_ns, held = _split_held(graph, edge, on_edge, at, window, w_start,
                                                                       s_ns, e_ns)
    s_ns = np.maximum(s_ns, w_start)
    e_ns = np.minimum(e_ns, ends["end_ns"].to_numpy()[window])
    ranked = "rank" in graph.edges.columns  # a run's graph: segments say their rank
    late = np.zeros(len(edge), dtype=bool)
    if ranked:  # an unexplained head belongs to the rank whose node the walk stopped at
        rank_of = np.full(len(edge), -1, dtype=np.int64)
        rank_of[on_edge] = graph.edges["rank"].fill_null(-1).to_numpy()[edge[on_edge]]
        rank_of[~on_edge] = graph.nodes["rank"].to_numpy()[head_node]
        # a head that ends where that rank's own step begins: the run's step began earlier on another rank, and
        # this rank was still in its previous step (outside the window), not idle
        late[~on_edge] = np.isin(head_node, graph.windows["cpu_start_node"].drop_nulls().to_numpy())
    keep = e_ns > s_ns
    edge, on_edge, at, window, s_ns, e_ns, w_start, late, held = (
        x[keep] for x in (edge, on_edge, at, window, s_ns, e_ns, w_start, late, held))
    # consecutive rows of one event, kind and lane (an op's slices around a zero-length child) make one segment,
    # and so does a stretch of data loading (the DataLoader's own time and the ops under it)
    loading = pl.col("kind") == PathKind.DATA_LOADING.value
    codes = graph.edges.select(pl.when(loading).then(-5).otherwise(pl.col("event_id").fill_null(-1)).alias("ev"),
                               *(pl.col(c).cast(pl.Categorical).to_physical() for c in ("type", "kind", "lane")),
                               *([pl.col("rank").fill_null(-1)] if ranked else []))
    key = np.column_stack([window, on_edge.astype(np.int64), held.astype(np.int64)] + [
        np.where(on_edge, codes[c].to_numpy().astype(np.int64)[at], -1) for c in codes.columns])
    new = np.ones(len(edge), dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(axis=1)
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(edge) - 1)
    picked = graph.edges[at[first]].select("name", "kind", "category", "lane", "event_id", edge_type="type")
    if ranked:
        picked = picked.with_columns(rank=pl.Series(rank_of[keep][first]))
        picked = _name_waits(graph, picked, at[first], on_edge[first], timed.via_edge)
    head = pl.Series(~on_edge[first])
    head_name = pl.when(pl.Series(late[first])).then(pl.lit(LATE_START)).otherwise(pl.lit(NO_DEPENDENCY))
    picked = picked.with_columns(pl.when(pl.Series(held[first])).then(pl.lit(v)).otherwise(c).alias(c) for c, v in (
        ("name", HELD_START), ("kind", PathKind.IDLE.value), ("category", None)))
    schema = {**SEGMENT_SCHEMA, "rank": pl.Int64()} if ranked else SEGMENT_SCHEMA
    columns = [*list(SEGMENT_SCHEMA)[:2], "rank", *list(SEGMENT_SCHEMA)[2:]] if ranked else list(SEGMENT_SCHEMA)
    segments: pl.DataFrame = (
        picked.with_columns(
            step=ends["step"].gather(window[first]),
            name=pl.when(head).then(head_name).otherwise("name"),
            kind=pl.when(head).then(pl.lit(PathKind.IDLE.value)).otherwise("kind"),
            **{c: pl.when(head).then(None).otherwise(c) for c in ("category", "lane", "event_id", "edge_type")},
            start_ns=pl.Series(s_ns[first] - w_start[first]), dur_ns=pl.Series(e_ns[last] - s_ns[first]),
        )
        .with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("step"))
        .select(columns)
        .cast(schema)
    )
    return segments


def _split_held(graph: DependencyGraph, edge: np.ndarray, on_edge: np.ndarray, at: np.ndarray, window: np.ndarray,
                w_start: np.ndarray, s_ns: np.ndarray, e_ns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The path's rows (edge rows, their windows and spans) with each launch edge whose wait was partly held
    (`depgraph.held_ns`) split in two: the launch's own part, then the held rest, flagged in the last array
    returned (`held`)."""
    held = np.zeros(len(edge), dtype=bool)
    part = np.zeros(len(edge), dtype=np.int64)
    if on_edge.any():
        launch_cols = graph.edges.select("type", "natural_ns", "call_dur_ns")  # (what held_ns reads)
        part[on_edge] = held_ns(launch_cols[at[on_edge]], (e_ns - s_ns)[on_edge])
    long = part > 0
    if not long.any():
        return edge, on_edge, at, window, w_start, s_ns, e_ns, held
    rows = np.repeat(np.arange(len(edge)), np.where(long, 2, 1))
    second = np.zeros(len(rows), dtype=bool)
    second[1:] = rows[1:] == rows[:-1]
    cut = e_ns[rows] - part[rows]  # the launch's own part ends here; the rest held the start
    s_out = np.where(second, cut, s_ns[rows])
    e_out = np.where(long[rows] & ~second, cut, e_ns[rows])
    return (edge[rows], on_edge[rows], at[rows], window[rows], w_start[rows], s_out, e_out, second)


def held_notes(segments: pl.DataFrame, traces: Mapping[int | None, Sequence[Trace]] | None = None) -> list[str]:
    """What the path's HELD_START segments say, where it has any: how long and why they are not launch overhead;
    and, where one of them ends as a collective on another stream of its GPU ends (`_held_by_collective`, in
    `traces`, by rank), that it most likely waited for that collective."""
    held = segments.filter(pl.col("name") == HELD_START)
    if not held.height:
        return []
    total, longest = int(held["dur_ns"].sum()), int(held["dur_ns"].max())  # type: ignore[arg-type]
    bound = duration(NO_TYPICAL_BOUND_NS)
    their = "its" if held.height == 1 else "their"
    notes = [f"{plural(held.height, 'GPU start')} on the path came more than {HELD_FACTOR}x the typical launch "
             f"latency ({bound} without one) after {their} launch onto an idle stream ({duration(total)} in all, the "
             f"longest {duration(longest)}): the launch's own part (the typical latency, or its call's time) counts as "
             f"launch overhead, the rest as idle {HELD_START}, held by something the trace does not record (an event "
             "wait whose record is missing, work outside the trace, or a clock offset between CPU and GPU)"]
    return notes + ([n] if traces and (n := _held_by_collective(held, traces)) else [])


#: a held GPU start this soon after a collective on another stream of its GPU ended most likely waited for it
AFTER_COLLECTIVE_NS = 20_000


def _held_by_collective(held: pl.DataFrame, traces: Mapping[int | None, Sequence[Trace]]) -> str | None:
    """A note on the held GPU starts that begin within AFTER_COLLECTIVE_NS after a communication kernel on another
    stream of the same GPU ended: a cross-stream wait for the collective whose event the trace does not link (dlrm's
    cudaStreamWaitEvent calls carry no event ids), so the path runs through that collective (and, in a run, the
    rank it waited for), not through idle time. None where no held start does."""
    found: list[tuple[int, str, str, int]] = []  # (held ns, what was held, the collective, ns after its end)
    for rank, dur, event_id in held.select("rank" if "rank" in held.columns else pl.lit(None).alias("rank"),
                                           "dur_ns", "event_id").iter_rows():
        for trace in traces.get(rank, ()):  # (a held start's event is its launch call: its GPU work by correlation,
            # two small scans, not the whole trace's launch links)
            corr = trace.runtime.filter(pl.col("event_id") == event_id).select("correlation").collect(
                engine="in-memory")["correlation"]
            ids = pl.col("event_id") == event_id
            if corr.len() and corr[0] is not None:
                ids = ids | (pl.col("correlation") == corr[0])
            gpu = trace.gpu.filter(ids).select("name", "device", "stream", "ts_ns").collect(engine="in-memory")
            if gpu.height != 1:
                continue
            name, device, stream, ts = gpu.row(0)
            comm = (trace.kernels.filter(comm_kernel() & (pl.col("device") == device) & (pl.col("stream") != stream))
                    .select("name", "stream", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
                    .filter(pl.col("end_ns").is_between(ts - AFTER_COLLECTIVE_NS, ts))
                    .sort("end_ns").collect(engine="in-memory"))
            if comm.height:
                short = pl.select(held=short_name(pl.lit(name)),
                                  comm=short_name(pl.lit(comm["name"][-1].split("(")[0]))).row(0)
                found.append((int(dur), f"{short[0]} (stream {stream})", f"{short[1]} (stream "
                              f"{comm['stream'][-1]})", int(ts - comm["end_ns"][-1])))
            break
    if not found:
        return None
    dur, name, collective, after = max(found)
    return (f"{plural(len(found), 'held GPU start')} on the path began just after a collective on another stream of "
            f"its GPU ended (the longest, {duration(dur)} before {name}, {duration(after)} after {collective} ended): "
            "most likely a wait for that collective whose event the trace does not link (a cudaStreamWaitEvent "
            "without event ids), so the collective, and in a run the rank it waited for, hold the step there, not "
            "idle time")

def _name_waits(graph: DependencyGraph, picked: pl.DataFrame, rows: np.ndarray, on_edge: np.ndarray,
                via_edge: np.ndarray) -> pl.DataFrame:
    """A run's `collective` segments named for the rank they wait for: "wait for rank N (all_reduce)", N the rank
    whose arrival the edge's arrival node holds under this replay (`depgraph.waited_rank`)."""
    arrival = (graph.nodes["lane"] == ARRIVAL_LANE).to_numpy()
    edge_src = graph.edges["src"].to_numpy()
    waits = on_edge & (picked["edge_type"] == EdgeType.COLLECTIVE.value).to_numpy() & arrival[edge_src[rows]]
    if not waits.any():
        return picked
    rank = graph.nodes["rank"].to_numpy()
    src, via = edge_src.tolist(), via_edge.tolist()  # (walked edge by edge: plain lists index fastest)
    waited = np.full(len(rows), -1, dtype=np.int64)
    waited[waits] = [waited_rank(arrival, rank, src, via, int(edge_src[r])) for r in rows[waits]]
    return picked.with_columns(name=pl.when(pl.Series(waits)).then(
        pl.format("wait for rank {} ({})", pl.Series(waited), "name")).otherwise("name"))


def _end_nodes(graph: DependencyGraph, t: np.ndarray) -> pl.DataFrame:
    """step, start_ns, end_ns, end_node of each window under node times `t` (the step-window rule of
    `depgraph.step_times`): the end node is the step's last GPU work's end where that is later than its CPU end.
    In a run's graph: per step, the end node of the rank that ends last, from the earliest rank's start."""
    from stepscope.analyze.depgraph import window_times

    times = window_times(graph, t)
    times_s = pl.Series(t)
    w = graph.windows
    by = ["rank"] if "rank" in w.columns else []
    if w.height and w["step"].null_count() == w.height:
        if not by:
            last = int(np.argmax(t))
            return times.with_columns(end_node=pl.lit(last, pl.Int64))
        last_nodes = (graph.nodes.select("rank", "node", t=times_s).sort("t", "node")
                      .group_by("rank").agg(end_node=pl.col("node").last()))
        per_window = times.join(last_nodes, on="rank", how="left", maintain_order="left")
    else:
        gpu_last = (graph.gpu_ends.with_columns(t=times_s.gather(graph.gpu_ends["node"]))
                    .sort("t", "node", descending=[True, True]).group_by(*by, "step", maintain_order=True).first()
                    .select(*by, "step", gpu_node="node", gpu_t="t"))
        joined = (times.join(w.select(*by, "step", "cpu_end_node"), on=[*by, "step"], how="left", maintain_order="left")
                  .join(gpu_last, on=[*by, "step"], how="left", maintain_order="left"))
        per_window = (
            joined.with_columns(cpu_t=pl.Series(t[joined["cpu_end_node"].fill_null(0).to_numpy()]))
            .with_columns(end_node=pl.when(pl.col("gpu_t").is_not_null() & (pl.col("gpu_t") > pl.col("cpu_t"))
                                           | pl.col("cpu_end_node").is_null())
                          .then(pl.col("gpu_node")).otherwise(pl.col("cpu_end_node")))
            .filter(pl.col("end_node").is_not_null())
        )
    if not by:
        return per_window.select("step", "start_ns", "end_ns", "end_node")
    return (per_window.sort("end_ns", "rank", descending=[True, False])
            .group_by("step", maintain_order=True)
            .agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").first(),
                 end_node=pl.col("end_node").first())
            .sort("start_ns", "step"))


def attribution(segments: pl.DataFrame, steps: int) -> pl.DataFrame:
    """kind, category, mean_ns (per step), step_share (of the mean step): the critical path split, most first."""
    schema = {"kind": pl.String, "category": pl.String, "mean_ns": pl.Float64, "step_share": pl.Float64}
    if segments.height == 0 or steps == 0:
        return pl.DataFrame(schema=schema)
    total = float(segments["dur_ns"].sum())
    gpu = pl.col("kind").is_in([PathKind.KERNEL.value, PathKind.COPY.value])
    return (
        segments.group_by("kind", category=pl.when(gpu).then(pl.col("category")))
        .agg(ns=pl.col("dur_ns").sum())
        .select("kind", "category", mean_ns=pl.col("ns") / steps, step_share=pl.col("ns") / total)
        .sort("mean_ns", "kind", "category", descending=[True, False, False], nulls_last=True)
        .cast(schema)  # type: ignore[arg-type]
    )


def per_step(segments: pl.DataFrame) -> pl.DataFrame:
    """step, wall_ns, segments, then `<kind>_ns` for every PathKind (0 where none)."""
    sums = segments.group_by("step", "kind").agg(ns=pl.col("dur_ns").sum())
    walls = segments.group_by("step", maintain_order=True).agg(wall_ns=pl.col("dur_ns").sum(),
                                                               segments=pl.len().cast(pl.Int64))
    out = walls
    for kind in _KINDS:
        out = out.join(sums.filter(pl.col("kind") == kind).select("step", pl.col("ns").alias(f"{kind}_ns")),
                       on="step", how="left", maintain_order="left", nulls_equal=True)
    return out.with_columns(pl.col(f"{k}_ns" for k in _KINDS).fill_null(0).cast(pl.Int64)).sort("step")


def _top(graph: DependencyGraph, segments: pl.DataFrame, traces: Mapping[int | None, Sequence[Trace]],
         top: int | None) -> pl.DataFrame:
    """The contributors (kind, category, name; a kernel by its short name, every step's own time as one
    `ProfilerStep*`; in a run also by rank) with the most time on the paths, with the user's Python line at the
    longest segment of each (`blame.python_lines` at its CPU slice, or at the launch of its GPU work, in the trace
    of its rank)."""
    ranked = "rank" in segments.columns
    by_rank = ["rank"] if ranked else []
    schema = {**{c: pl.Int64 for c in by_rank}, "kind": pl.String, "category": pl.String, "name": pl.String,
              "total_ns": pl.Int64, "path_share": pl.Float64, "segments": pl.Int64, "python": pl.String}
    if segments.height == 0:
        return pl.DataFrame(schema=schema)
    total = float(segments["dur_ns"].sum())
    gpu = pl.col("kind").is_in([PathKind.KERNEL.value, PathKind.COPY.value])
    keys = [*(pl.col(c) for c in by_rank), pl.col("kind"), pl.when(gpu).then(pl.col("category")).alias("category"),
            pl.when(gpu).then(short_name(pl.col("name"))).otherwise(step_row_name(pl.col("name"))).alias("name")]
    names = [*by_rank, "kind", "category", "name"]
    grouped = (
        segments.group_by(*keys).agg(total_ns=pl.col("dur_ns").sum(), segments=pl.len().cast(pl.Int64))
        .sort("total_ns", "kind", "name", descending=[True, False, False])
    )
    grouped = grouped.head(top) if top is not None else grouped
    # where each contributor's longest segment ran: its edge's point (a CPU slice's start, a GPU event's launch)
    longest = (
        segments.select(*keys, "event_id", "edge_type", "dur_ns")
        .join(grouped.select(names), on=names, nulls_equal=True)
        .sort("dur_ns", descending=True, maintain_order=True).group_by(names, maintain_order=True).first()
    )
    on = [*by_rank, "event_id", "edge_type"]
    located = longest.join(
        graph.edges.select(*by_rank, "event_id", edge_type="type", pid="pid", tid="tid", point_ns="point_ns")
        .join(longest.select(on), on=on, how="semi")
        .unique(subset=on, keep="first"), on=on, how="left", nulls_equal=True)
    grouped = grouped.join(located.select(*names, "pid", "tid", "point_ns"), on=names, how="left",
                           nulls_equal=True, maintain_order="left")
    points = grouped.select(*by_rank, pl.col("pid", "tid").fill_null(""), ts_ns=pl.col("point_ns").fill_null(0))
    user = pl.Series("python", [None] * grouped.height, dtype=pl.String)
    for rank, rank_traces in traces.items():
        rows = (pl.Series(np.ones(grouped.height, dtype=bool)) if not ranked
                else (grouped["rank"] == rank).fill_null(False))
        if not rows.any():
            continue
        for trace in rank_traces:  # a rank's windows: the trace holding the point names its line
            lines, _ = python_lines(trace, points.filter(rows).select("pid", "tid", "ts_ns"))
            found = pl.Series(np.full(grouped.height, None, dtype=object), dtype=pl.String).scatter(
                np.flatnonzero(rows.to_numpy()), lines)
            user = user.fill_null(found)
    return grouped.with_columns(user.alias("_user")).select(
        *by_rank, "kind", "category", "name", total_ns="total_ns", path_share=pl.col("total_ns") / total,
        segments="segments", python=pl.when(pl.col("point_ns").is_not_null()).then(pl.col("_user")),
    ).cast(schema)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PathTable:
    """The tables and figures a critical-path result is made of (`path_table`)."""

    mean_wall_ns: float | None
    bound_by: str | None
    path_share: dict[str, float]
    steps: pl.DataFrame
    attribution: pl.DataFrame
    top: pl.DataFrame
    segments: pl.DataFrame


def path_table(graph: DependencyGraph, traces: Mapping[int | None, Sequence[Trace]], *,
               top: int | None) -> PathTable:
    """Segments, per-step split, attribution and top contributors of the critical paths of `graph` replayed with
    its measured weights; `traces` (by rank; one key None for one trace) give the Python lines."""
    measured = replay(graph, graph.measured_weights())
    segments = path_segments(graph, measured)
    table = per_step(segments) if segments.height else pl.DataFrame(
        schema={"step": pl.Int64, "wall_ns": pl.Int64, "segments": pl.Int64, **{f"{k}_ns": pl.Int64 for k in _KINDS}})
    n = table.height
    by_kind = {k: float(table[f"{k}_ns"].sum()) / float(table["wall_ns"].sum()) for k in _KINDS} \
        if n and table["wall_ns"].sum() else {}
    return PathTable(
        mean_wall_ns=float(table["wall_ns"].mean()) if n else None,  # type: ignore[arg-type]
        bound_by=max(by_kind, key=lambda k: by_kind[k]) if by_kind else None,
        path_share={k: v for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]) if v > 0},
        steps=table, attribution=attribution(segments, n), top=_top(graph, segments, traces, top), segments=segments)


def critical_path(source: Source, *, top: int | None = 15, annotation: str | None = None,
                  graph: DependencyGraph | None = None) -> CriticalPathResult:
    """The critical path of every step of `source` and its attribution (see the module docstring). `annotation`:
    the instances of this annotation are the steps (`depgraph.build_graph`); `graph` is the trace's graph when
    already built."""
    frames = frames_of(source)
    graph = graph if graph is not None else build_graph(frames, annotation=annotation)
    table = path_table(graph, {None: (frames.trace,)}, top=top)
    return CriticalPathResult(
        window_kind=graph.window_kind,
        steps_found=table.steps.height,
        mean_wall_ns=table.mean_wall_ns,
        bound_by=table.bound_by,
        path_share=table.path_share,
        graph_nodes=graph.nodes.height,
        graph_edges=graph.edge_counts(),
        dropped_edges=graph.dropped_edges,
        typical_launch_latency_ns=graph.launch_latency_ns,
        steps=table.steps,
        attribution=table.attribution,
        top=table.top,
        segments=table.segments,
        notes=[*graph_notes(graph), *held_notes(table.segments, {None: (frames.trace,)})],
    )


__all__ = ["HELD_START", "CriticalPathResult", "PathTable", "attribution", "critical_path", "held_notes",
           "path_segments", "path_table", "per_step"]
