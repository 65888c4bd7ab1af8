"""The dependency graph of a trace's steps, and its replay: the ground the critical path and the what-if stand on.

**Nodes** are moments, each with its measured time `t_ns`: the boundaries of a thread's timeline (every start
and end of a CPU op, annotation or runtime/driver call on a thread that launches GPU work or holds the steps),
and the start and end of every kernel, memcpy and memset.

**Edges** say "v cannot happen before u + weight". One edge type per rule of DESIGN.md:

    cpu           consecutive boundaries of one thread: the slice between them, attributed to the innermost
                  event covering it (thread order and nesting in one chain)
    gpu           a GPU event's start -> its end (its duration)
    stream        a GPU event's end -> the start of the next one on its stream (stream order)
    launch        the launch call's start -> the GPU event's start (correlation / launch flow)
    cross_stream  the last work recorded on a stream (cudaEventRecord) -> the first work launched after a
                  cudaStreamWaitEvent on another stream (matched by the event record's correlation id that the
                  cuda_sync "Stream Wait Event" carries; without sync events, the previous record on the thread)
    sync          the GPU work a blocking call waits for -> the end of that call (cudaDeviceSynchronize: all
                  work launched before it; cudaStreamSynchronize: its stream's; cudaEventSynchronize: the work
                  before the event's record; a synchronous cudaMemcpy or a DtoH copy to pageable memory: the
                  copy); `.item()` / `.cpu()` block through these calls
    wake          a helper thread (autograd, …) resumes after idling: from the main thread's last boundary
    join          the main thread resumes after waiting for a helper thread (loss.backward() returns when the
                  autograd thread has run the backward): the helper's last boundary of the work it ran while the
                  main thread was inside no op of its own -> the main thread's next boundary
    arrival       (runs only, `run_graph`) each rank's arrival at a collective -> the call's arrival node of its
                  place in arrival order, and each such node -> the next: the nodes hold the latest arrival so far
    collective    (runs only, `run_graph`) a call's latest arrival before a rank's end of it -> that end
    comm_wait     (runs only, `run_graph`) a CPU-side collective's end -> the waiting main thread's resumption

**Weights.** Each edge has a *natural* weight: the work it stands for (a slice's or a GPU event's duration),
the typical launch latency (0 where too few launches found their stream idle), 0 for a pure dependency (stream order,
cross-stream, an idle helper thread), the return latency of a sync (its end after the GPU work, or after its own
start where the work was done before). A blocking call's own slice counts only its part after the GPU work ended
(the rest was waiting, explained by the sync edge). The *measured* weight is the natural one, no more than the
measured gap, and for each node the edge that explains its time best (latest `t + natural`) is raised to the gap.
So replaying the graph (each node at the latest of its in-edges, `replay`) reproduces every measured time;
changing weights (what-if) re-times it.

    kernel A on stream 7 ends at 100; kernel B launched at 90 (typical latency 5) starts at 103
    -> launch edge natural 5, stream edge natural 0; `t + natural`: 95 vs 100: the stream edge explains B
       and is raised to 3 (a 3 µs gap on the stream); the launch edge stays 5 (replay: max(95, 103) = 103)

A node without in-edges (the first boundary of the main thread, GPU work whose launch is not in the trace)
keeps its measured time in every replay.

The replay's loop over nodes in time order is the one per-event loop here (a longest path needs one); it runs
over plain integer lists, measured in benchmarks/critical_path.py. Everything else is vectorized.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze import window as _window
from stepscope.analyze._native import scan as _scan
from stepscope.analyze._text import plural
from stepscope.analyze.blame import is_sync_runtime
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.kernels import category_expr
from stepscope.analyze.loading import DATALOADER_PATTERN
from stepscope.analyze.nesting import Nested
from stepscope.analyze.schema import Kind
from stepscope.errors import UsageError

IntArray = npt.NDArray[np.int64]


class EdgeType(str, enum.Enum):
    """Why one moment waits for another (see the module docstring)."""

    CPU = "cpu"
    GPU = "gpu"
    STREAM = "stream"
    LAUNCH = "launch"
    CROSS_STREAM = "cross_stream"
    SYNC = "sync"
    WAKE = "wake"
    JOIN = "join"
    COLLECTIVE = "collective"
    ARRIVAL = "arrival"
    COMM_WAIT = "comm_wait"


class PathKind(str, enum.Enum):
    """What time on a path is spent on: the attribution of every edge."""

    CPU = "cpu"
    LAUNCH_OVERHEAD = "launch_overhead"
    KERNEL = "kernel"
    COPY = "copy"
    SYNC_WAIT = "sync_wait"
    DATA_LOADING = "data_loading"
    IDLE = "idle"


#: which in-edge explains a node when several explain it equally (lower first): a sync or a cross-stream wait
#: names the cause, then the launch, then plain order; a collective's end is its own rank's transfer before it is
#: another rank's arrival
PRIORITY: dict[EdgeType, int] = {EdgeType.SYNC: 0, EdgeType.COMM_WAIT: 0, EdgeType.CROSS_STREAM: 1,
                                 EdgeType.LAUNCH: 2, EdgeType.WAKE: 3, EdgeType.JOIN: 3, EdgeType.GPU: 4,
                                 EdgeType.COLLECTIVE: 5, EdgeType.ARRIVAL: 5, EdgeType.CPU: 6, EdgeType.STREAM: 7}
#: edges that say a blocking wait: the CPU slice ending where one lands counts only its part after the wait ended
WAIT_TYPES = (EdgeType.SYNC.value, EdgeType.COMM_WAIT.value)

#: CPU events that make a thread's timeline (Python frames are left out: the op under them names the time)
TIMELINE_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.DRIVER)

EDGE_SCHEMA: dict[str, pl.DataType] = {
    "src": pl.Int64(), "dst": pl.Int64(), "type": pl.String(), "kind": pl.String(), "category": pl.String(),
    "natural_ns": pl.Int64(), "event_id": pl.Int64(), "name": pl.String(), "lane": pl.String(), "pid": pl.String(),
    "tid": pl.String(), "point_ns": pl.Int64(), "call_dur_ns": pl.Int64(), "launch_call": pl.Boolean(),
    "sync_call": pl.Boolean(), "data_loading": pl.Boolean(), "pageable": pl.Boolean(), "copy_bytes": pl.Int64(),
    "direction": pl.String(),
}


@dataclass(frozen=True, eq=False)
class DependencyGraph:
    """Nodes (node, t_ns, lane) and edges (`EDGE_SCHEMA` plus weight_ns, the measured weight) of a trace's steps.

    `windows`: step, start_ns, end_ns, cpu_start_node, cpu_end_node (the step windows, `window.step_windows`; one
    window with a null step over the whole trace where it has no steps); `gpu_ends`: step, node (the end node of
    every GPU event a step launched; with a null step, of the GPU work launched before the trace or in the set-up
    iteration left out, which the first step waits for: `window.queued_expr`). `order` is a topological order of
    the nodes (time, then tie rules); edges
    against it (clock skew between CPU and GPU) are dropped and counted in `dropped_edges`.
    """

    nodes: pl.DataFrame
    edges: pl.DataFrame
    windows: pl.DataFrame
    gpu_ends: pl.DataFrame
    order: IntArray
    dropped_edges: int
    window_kind: str
    launch_latency_ns: int | None
    #: how many launches found their stream idle (the typical latency's samples); None where the GPU work had no
    #: launch call at all (see graph_notes)
    launch_samples: int | None = None

    def measured_weights(self) -> IntArray:
        """The measured weight of every edge (ns), in `edges` order."""
        return self.edges["weight_ns"].to_numpy().astype(np.int64)

    def edge_counts(self) -> dict[str, int]:
        """Edges per type."""
        counts = self.edges.group_by("type").len()
        return {str(t): int(n) for t, n in counts.sort("type").iter_rows()}


@dataclass(frozen=True, eq=False)
class Replay:
    """Node times after a replay and, per node, the in-edge (row of `edges`) that set it (-1: kept its time)."""

    t_ns: IntArray
    via_edge: IntArray


#: the lane of a run's arrival nodes (`run_graph`: each holds the latest arrival so far at one collective)
ARRIVAL_LANE = "arrivals"


def waited_rank(arrival: npt.NDArray[np.bool_], rank: IntArray, src: list[int], via_edge: list[int], node: int) -> int:
    """The rank whose arrival the arrival node `node` holds under a replay (`via_edge`: the edge that set each
    node): down the chain of arrival nodes along those edges, to the node its own rank's arrival set (or that
    nothing set). `arrival`: which nodes are arrival nodes; `rank`: each node's rank."""
    while (e := via_edge[node]) >= 0 and arrival[src[e]]:
        node = src[e]
    return int(rank[node])


#: launches onto an idle stream needed for a typical launch latency: fewer say nothing typical (on a serving trace
#: the only one was a copy that started 149 ms after its launch, nothing having run on its GPU until then, and as the
#: only sample it made every launch edge weigh 149 ms)
MIN_LATENCY_SAMPLES = 3

#: a launch edge's wait beyond this many typical launch latencies is not the launch's own (`held_ns`)
HELD_FACTOR = 10
#: the same bound where the graph has no typical launch latency (MIN_LATENCY_SAMPLES): ten times the longest typical
#: latency over the corpus's GPUs (6-32 µs, V100 to B200 and MI210 to MI300X); a wait up to it stays the launch's
NO_TYPICAL_BOUND_NS = 320_000

#: why a graph with launched GPU work has no typical launch latency: none of its launches found the stream idle
QUEUED_NOTE = ("no launch found its stream idle: every kernel and copy queued behind earlier GPU work (a CPU running "
               "ahead of a GPU-bound loop), so no launch latency was measured and launch edges weigh 0")


#: the window kind of a trace without steps
NO_STEPS = "trace (no steps)"
#: a trace without steps: one window, what `steps found 1` counts, whose span is not `summary`'s window
NO_STEPS_NOTE = ("no steps: the trace is one window (the 1 step found), from its first CPU op, runtime call or GPU "
                 "event to its last, so its wall can differ from the window of `summary` and `gaps` (the GPU's first "
                 "to last event, or without GPU work the first event to the last, Python frames and annotations too)")


def graph_notes(graph: DependencyGraph) -> list[str]:
    """What to know of the graph to read its path: NO_STEPS_NOTE where the trace has no steps, then why it has no
    typical launch latency though its GPU work had launch calls: none found its stream idle (QUEUED_NOTE), or too
    few did (under MIN_LATENCY_SAMPLES); nothing about launches where it has one, or where no launch call was
    recorded at all (nothing to explain)."""
    notes = [NO_STEPS_NOTE] if graph.window_kind == NO_STEPS else []
    n = graph.launch_samples
    if graph.launch_latency_ns is not None or n is None:
        return notes
    if n == 0:
        return [*notes, QUEUED_NOTE]
    found = f"{plural(n, 'launch', 'launches')} found {'its' if n == 1 else 'their'} stream idle"
    return [*notes, f"only {found}, fewer than {MIN_LATENCY_SAMPLES}: too few to say what a typical launch latency "
            "is, so launch edges weigh 0"]


def held_ns(edges: pl.DataFrame, span: IntArray) -> IntArray:
    """Per edge, where `span` is its length (its weight, or its time on a path): the part of a launch edge's wait
    that is not the launch's own. The launch owns the typical latency (its natural weight), or its call's whole time
    where the GPU work started before the call returned (a pageable copy is staged inside its call). A wait past
    HELD_FACTOR typical latencies (NO_TYPICAL_BOUND_NS without one) and past that own part was held by something the
    trace does not record (an event wait whose record is missing, work outside the trace, a clock offset between CPU
    and GPU): the rest of it. 0 for every other edge."""
    launch = (edges["type"] == EdgeType.LAUNCH.value).to_numpy()
    natural = edges["natural_ns"].fill_null(0).to_numpy().astype(np.int64)
    own = np.maximum(natural, edges["call_dur_ns"].fill_null(0).to_numpy().astype(np.int64))
    bound = np.where(natural > 0, HELD_FACTOR * natural, NO_TYPICAL_BOUND_NS)
    return np.where(launch & (span > np.maximum(bound, own)), span - own, 0).astype(np.int64)


def replay(graph: DependencyGraph, weights: IntArray, *, enabled: npt.NDArray[np.bool_] | None = None) -> Replay:
    """Each node at the latest `t(u) + weight` over its enabled in-edges, in topological order; a node with no
    enabled in-edge keeps its measured time. Ties go to the edge of lowest `PRIORITY`.

        a(0) --5--> c ; b(2) --1--> c     ->  c = max(0 + 5, 2 + 1) = 5, via the edge from a
    """
    n = graph.nodes.height
    src = graph.edges["src"].to_numpy()
    dst = graph.edges["dst"].to_numpy()
    prio = graph.edges["type"].replace_strict({t.value: p for t, p in PRIORITY.items()}, return_dtype=pl.Int64)
    keep = np.ones(len(src), dtype=bool) if enabled is None else enabled.copy()
    rows = np.flatnonzero(keep)
    by = np.lexsort((prio.to_numpy()[rows], dst[rows]))
    rows = rows[by]
    ptr = np.searchsorted(dst[rows], np.arange(n + 1))
    order = graph.order
    if _scan is not None and graph.nodes["t_ns"].null_count() == 0:
        t_ns = graph.nodes["t_ns"].cast(pl.Int64).to_numpy().astype(np.int64)  # a copy: replayed in place
        via_edge = np.full(n, -1, dtype=np.int64)
        try:
            o, p, s, w, r = (np.ascontiguousarray(a, dtype=np.int64)
                             for a in (order, ptr, src[rows], weights[rows], rows))
            _scan.replay(o, p, s, w, r, t_ns, via_edge)
            return Replay(t_ns=t_ns, via_edge=via_edge)
        except OverflowError:  # a time beyond int64: Python's integers replay it exactly (and say so below)
            pass
    return _replay_python(graph.nodes["t_ns"].to_list(), order, ptr, src[rows].tolist(), weights[rows].tolist(),
                          rows.tolist())


def _replay_python(t: list[int], order: IntArray, ptr: IntArray, e_src: list[int], e_w: list[int],
                   e_row: list[int]) -> Replay:
    """`replay`'s walk in Python (where the compiled `_scan.replay` is not built): the same answer."""
    via = [-1] * len(t)
    for v, a, b in zip(order.tolist(), ptr[order].tolist(), ptr[order + 1].tolist(), strict=True):
        if a == b:
            continue
        if b - a == 1:  # most nodes: one in-edge
            t[v] = t[e_src[a]] + e_w[a]
            via[v] = e_row[a]
            continue
        best = t[e_src[a]] + e_w[a]
        chosen = a
        for e in range(a + 1, b):
            c = t[e_src[e]] + e_w[e]
            if c > best:
                best, chosen = c, e
        t[v] = best
        via[v] = e_row[chosen]
    return Replay(t_ns=np.asarray(t, dtype=np.int64), via_edge=np.asarray(via, dtype=np.int64))


# ---------------------------------------------------------------------------------------------------- building


def _windows(frames: TraceFrames) -> tuple[pl.DataFrame, str, pl.DataFrame | None]:
    """The step windows and the GPU events by step (`window.gpu_by_step`), or one window over the trace (first to
    last CPU/GPU event) where it has no steps."""
    steps = frames.step_windows
    if steps.height:
        kind = f"steps ({frames.iterations.source})" if frames.iterations.inferred else "steps"
        return (steps.select("step", "start_ns", "end_ns", "cpu_start_ns", "cpu_end_ns", "pid", "tid"), kind,
                frames.gpu_by_step)
    trace = frames.trace
    span = pl.concat([trace.gpu.select("ts_ns", "dur_ns"), trace.cpu.select("ts_ns", "dur_ns")]).filter(
        pl.col("dur_ns").is_not_null()).select(
        start_ns=pl.col("ts_ns").min(), end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).max()).collect(engine="in-memory")
    main = _main_thread(frames)
    if span["start_ns"][0] is None or main is None:
        return pl.DataFrame(schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                    "cpu_start_ns": pl.Int64, "cpu_end_ns": pl.Int64, "pid": pl.String,
                                    "tid": pl.String}), "trace", None
    lo, hi = int(span["start_ns"][0]), int(span["end_ns"][0])
    return pl.DataFrame({"step": [None], "start_ns": [lo], "end_ns": [hi], "cpu_start_ns": [lo], "cpu_end_ns": [hi],
                         "pid": [main[0]], "tid": [main[1]]},
                        schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "cpu_start_ns": pl.Int64,
                                "cpu_end_ns": pl.Int64, "pid": pl.String, "tid": pl.String}), NO_STEPS, None


def _annotation_windows(frames: TraceFrames, annotation: str) -> tuple[pl.DataFrame, str, pl.DataFrame]:
    """Windows from the instances of an annotation (or op) matching `annotation`, by the step-window rule; a
    UsageError naming the pattern where none matches (or the pattern is no regex)."""
    try:
        re.compile(annotation)
    except re.error as exc:
        raise UsageError(f"--annotation {annotation!r} is not a valid regex ({exc})") from None
    spans = (
        frames.trace.events.filter(pl.col("kind").is_in([Kind.USER_ANNOTATION.value, Kind.CPU_OP.value])
                                   & pl.col("dur_ns").is_not_null() & pl.col("name").str.contains(annotation))
        .select("ts_ns", "dur_ns", "pid", "tid", "event_id", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
        .collect(engine="in-memory").sort("ts_ns", "event_id")
    )
    if spans.height == 0:
        raise UsageError(f"no annotation or op in this trace matches --annotation {annotation!r}")
    outermost = spans.filter(pl.col("ts_ns") >= pl.col("end_ns").cum_max().shift(1).fill_null(-(2**62)))
    spans = outermost.with_columns(step=pl.int_range(pl.len(), dtype=pl.Int64))
    by_step = _window.gpu_by_step(frames.launches, spans)
    windows = _window.step_windows(spans, by_step, queued_until_ns=_window.queued_until(frames.launches))
    return (windows.select("step", "start_ns", "end_ns", "cpu_start_ns", "cpu_end_ns", "pid", "tid"),
            f"annotation {annotation}", by_step)


def _main_thread(frames: TraceFrames) -> tuple[str, str] | None:
    """The thread holding the steps; without steps, the one that launched the most GPU work, else the busiest."""
    if frames.main_thread is not None:
        return frames.main_thread
    launched = frames.launches.filter(pl.col("launch_tid").is_not_null()).group_by("launch_pid", "launch_tid").len()
    if launched.height:
        top = launched.sort("len", "launch_pid", "launch_tid", descending=[True, False, False]).row(0)
        return str(top[0]), str(top[1])
    busy = frames.trace.cpu.group_by("pid", "tid").len().collect(engine="in-memory")
    if busy.height == 0:
        return None
    top = busy.sort("len", "pid", "tid", descending=[True, False, False]).row(0)
    return str(top[0]), str(top[1])


def _gpu_events(frames: TraceFrames, lo: int, hi: int) -> pl.DataFrame:
    """GPU events overlapping [lo, hi) with their launch, category, copy facts and when everything before each on
    its stream had ended (`prev_end_ns`: the latest end among the earlier events, which is the previous event's
    where they do not overlap, as graph branches do; found over the whole trace: the first event in the window has
    one too, null only for a stream's first event in the trace); ordered by device, stream, start."""
    trace = frames.trace
    copies = trace.gpu.select(gpu_event_id="event_id", copy_bytes="bytes")
    return (
        frames.launches.lazy()
        .filter(pl.col("dur_ns").is_not_null() & pl.col("ts_ns").is_not_null())
        .with_columns(device=pl.col("device").fill_null(-1), stream=pl.col("stream").fill_null(-1))
        .sort("device", "stream", "ts_ns", "gpu_event_id")
        .with_columns(prev_end_ns=(pl.col("ts_ns") + pl.col("dur_ns")).cum_max().shift(1).over("device", "stream"))
        .filter((pl.col("ts_ns") < hi) & (pl.col("ts_ns") + pl.col("dur_ns") > lo))
        .join(copies, on="gpu_event_id", how="left", maintain_order="left")
        .with_columns(category=category_expr(), key_ns=pl.coalesce("launch_ts_ns", "ts_ns"))
        .collect(engine="in-memory")
    )


def _timeline_events(frames: TraceFrames, threads: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """CPU events of the graph's threads overlapping [lo, hi], clipped to it."""
    return (
        frames.trace.events
        .filter(pl.col("kind").is_in([k.value for k in TIMELINE_KINDS]) & pl.col("dur_ns").is_not_null()
                & (pl.col("dur_ns") >= 0) & (pl.col("ts_ns") <= hi) & (pl.col("ts_ns") + pl.col("dur_ns") >= lo))
        .join(threads.lazy(), on=["pid", "tid"], how="semi")
        .select("event_id", "name", "kind", "pid", "tid",
                s=pl.max_horizontal("ts_ns", pl.lit(lo)), e=pl.min_horizontal(pl.col("ts_ns") + pl.col("dur_ns"),
                                                                              pl.lit(hi)),
                full_dur_ns="dur_ns")
        .collect(engine="in-memory")
    )


def _innermost(events: pl.DataFrame, slices: pl.DataFrame) -> pl.Series:
    """Row of `events` (s, e) innermost over each slice [a, b) of `slices` (pid, tid, a, b); null where none.

    On doubled coordinates a slice's point 2a+1 lies strictly inside it, so an event ending where the slice
    starts never encloses it."""
    found = Nested.of(events.select("pid", "tid", ts_ns=pl.col("s") * 2, dur_ns=(pl.col("e") - pl.col("s")) * 2,
                                    row=pl.int_range(pl.len(), dtype=pl.Int64)), keep=("row",))
    rows = found.enclosing(slices.select("pid", "tid", ts_ns=pl.col("a") * 2 + 1))
    return found.rows.select(ev_row=pl.col("row").gather(rows))["ev_row"]


def _launch_latency(gpu: pl.DataFrame) -> tuple[int | None, int | None]:
    """Typical launch latency: the median of launch -> start over the launches that found their stream idle
    (`_gpu_events`' prev_end_ns at or before the launch: everything before on the stream had ended), and how many
    did (None: no GPU event had a launch call). The latency is None where fewer than MIN_LATENCY_SAMPLES did: where
    every launch queued behind earlier work, as in a GPU-bound loop whose CPU runs ahead (there launch -> start is
    the queue's wait, not the launch's cost), or where one or two samples cannot say what is typical."""
    if not gpu["launch_ts_ns"].is_not_null().any():
        return None, None
    idle = gpu.filter(pl.col("launch_ts_ns").is_not_null()
                      & (pl.col("prev_end_ns").is_null() | (pl.col("prev_end_ns") <= pl.col("launch_ts_ns"))))
    lat = (idle["ts_ns"] - idle["launch_ts_ns"]).clip(lower_bound=0)
    return (int(lat.median()) if lat.len() >= MIN_LATENCY_SAMPLES else None), lat.len()  # type: ignore[arg-type]


def _last_launched(gpu: pl.DataFrame, queries: pl.DataFrame, *, at: str, by_stream: bool) -> pl.DataFrame:
    """For each query (q, at, [device, stream]): the GPU event (row g) launched last at or before `at` on that
    stream (by_stream) — or, device-wide, the one ending latest among all launched by then."""
    g = gpu.select("g", "device", "stream", "key_ns", end=pl.col("ts_ns") + pl.col("dur_ns"))
    if by_stream:
        return (queries.select("q", "device", "stream", t=at).drop_nulls().sort("t")
                .join_asof(g.sort("key_ns"), left_on="t", right_on="key_ns", by=["device", "stream"],
                           strategy="backward", check_sortedness=False)
                .filter(pl.col("g").is_not_null()).select("q", "g"))
    ranked = (g.sort("key_ns", "g").with_columns(best=pl.col("end").cum_max())
              .with_columns(g=pl.when(pl.col("end") == pl.col("best")).then(pl.col("g")).forward_fill())
              .select("key_ns", "g"))
    return (queries.select("q", t=at).drop_nulls().sort("t")
            .join_asof(ranked, left_on="t", right_on="key_ns", strategy="backward", check_sortedness=False)
            .filter(pl.col("g").is_not_null()).select("q", "g"))


def _stream_predecessors(gpu: pl.DataFrame) -> pl.DataFrame:
    """`gpu` (ordered by device, stream, start; row g) with `prev`: the end node of the event its stream makes it
    wait for. That is the event before it on its stream, or, where that one's recorded end falls after this one's
    start, the earlier event on the stream that ended last at or before this start (null where none did).

    A stream runs its work in order, yet recorded events on one stream can overlap: kernels replayed from a CUDA/HIP
    graph run its branches side by side under the stream that launched it, and a kernel's recorded start can lead
    its predecessor's end by a few ns. An edge from an end after the start would run backwards and be dropped,
    leaving the event explained by its launch alone: a graph kernel launched 169 ms before the stream reached it
    read as 169 ms of launch latency. The stream was free once what ran before had ended, which this edge says."""
    end = pl.col("ts_ns") + pl.col("dur_ns")
    gpu = gpu.with_columns(prev=pl.col("end_node").shift(1).over("device", "stream"),
                           prev_end=end.shift(1).over("device", "stream"))
    overlapped = gpu.filter(pl.col("prev_end") > pl.col("ts_ns"))
    if not overlapped.height:
        return gpu.drop("prev_end")
    ended = (gpu.select("device", "stream", before="end_node", before_end=end, before_g="g")
             .sort("before_end", "before_g"))
    found = (overlapped.select("g", "device", "stream", "ts_ns").sort("ts_ns")
             .join_asof(ended, left_on="ts_ns", right_on="before_end", by=["device", "stream"], strategy="backward",
                        check_sortedness=False)
             .select("g", before=pl.when(pl.col("before_g") < pl.col("g")).then(pl.col("before"))))
    return (gpu.join(found, on="g", how="left", maintain_order="left")
            .with_columns(prev=pl.when(pl.col("prev_end") > pl.col("ts_ns")).then(pl.col("before"))
                          .otherwise(pl.col("prev")))
            .drop("prev_end", "before"))


def _edges(frame: pl.DataFrame, **cols: pl.Expr | str | int | enum.Enum) -> pl.DataFrame:
    """Edges in `EDGE_SCHEMA` from `frame`: each column an expression, a column name, an int or an enum (both
    constants); columns not given are null."""
    # rechunked first: polars panics ("i < self.len()") evaluating pl.format over some frames that a filter
    # after a window expression left in several chunks (found by the hypothesis test in test_critical_path)
    out = frame.rechunk().select(**{k: (pl.lit(v.value) if isinstance(v, enum.Enum) else pl.lit(v) if isinstance(v, int)
                              else v) for k, v in cols.items()})
    return out.select([pl.col(c).cast(t) if c in out.columns else pl.lit(None, t).alias(c)
                       for c, t in EDGE_SCHEMA.items()])


def _json_int(path: str) -> pl.Expr:
    return pl.col("args").str.json_path_match(path).cast(pl.Int64, strict=False)


def build_graph(source: Source, *, annotation: str | None = None) -> DependencyGraph:
    """The dependency graph of the steps of `source` (see the module docstring), measured weights set.

    `annotation` (a regex) takes the instances of the matching CPU annotation or op as the steps instead, numbered
    0, 1, … by start (HolisticTraceAnalysis analyses one such instance: `annotation="ProfilerStep"`, or a region
    such as `"\\[param\\|.*forward\\]"`); the step-window rule applies to them the same way.
    """
    frames = frames_of(source)
    if annotation is None:
        windows, window_kind, by_step = _windows(frames)
    else:
        windows, window_kind, by_step = _annotation_windows(frames, annotation)
    main = (str(windows["pid"][0]), str(windows["tid"][0])) if windows.height else _main_thread(frames)
    if windows.height == 0 or main is None:
        return _empty(window_kind)
    lo, hi = _graph_span(windows)

    gpu = _gpu_events(frames, lo, hi).with_row_index("g")
    threads = pl.concat([
        pl.DataFrame({"pid": [main[0]], "tid": [main[1]]}),
        gpu.filter(pl.col("launch_tid").is_not_null() & pl.col("launch_ts_ns").is_between(lo, hi))
        .select(pid="launch_pid", tid="launch_tid"),
    ]).unique().with_columns(main=(pl.col("pid") == main[0]) & (pl.col("tid") == main[1]))
    cpu = _timeline_events(frames, threads.select("pid", "tid"), lo, hi).with_row_index("row").with_columns(
        pl.col("row").cast(pl.Int64))

    # ---- CPU nodes: every boundary of each thread, plus the step spans on the main thread
    stepped = windows.filter(pl.col("step").is_not_null())  # without steps the window adds no boundary
    extra = stepped.select(pl.lit(main[0]).alias("pid"), pl.lit(main[1]).alias("tid"),
                           pl.col("cpu_start_ns").clip(lo, hi).alias("t"), pl.col("cpu_end_ns").clip(lo, hi).alias("x"))
    # threads as integers numbered in (pid, tid) order: sorting and deduplicating on them, not on the strings,
    # gives the same boundaries in the same order at a third of the cost
    coded = (pl.concat([cpu.select("pid", "tid"), extra.select("pid", "tid")]).unique().sort("pid", "tid")
             .with_row_index("th"))
    bounds = (
        pl.concat([part.join(coded, on=["pid", "tid"], how="left",
                             maintain_order="left").select("th", "t") for part in (
            cpu.select("pid", "tid", t="s"), cpu.select("pid", "tid", t="e"), extra.select("pid", "tid", "t"),
            extra.select("pid", "tid", t="x"))])
        .unique().sort("th", "t").join(coded, on="th", how="left", maintain_order="left")
        .select("pid", "tid", "t").with_row_index("node").with_columns(pl.col("node").cast(pl.Int64))
    )
    n_cpu = bounds.height
    slices = (
        bounds.with_columns(b=pl.col("t").shift(-1).over("pid", "tid"), dst=pl.col("node").shift(-1).over("pid", "tid"))
        .filter(pl.col("b").is_not_null())
        .select("pid", "tid", src="node", dst="dst", a="t", b="b")
    )
    ev_row = _innermost(cpu, slices) if cpu.height else pl.Series("ev_row", [None] * slices.height, dtype=pl.Int64)
    launch_calls = gpu["runtime_event_id"].drop_nulls().unique().implode()
    loading = intervals.union(
        cpu.lazy().filter(pl.col("name").str.contains(DATALOADER_PATTERN)), by=["pid", "tid"], start="s", end="e"
    ).collect(engine="in-memory").rename({"start_ns": "dl_s", "end_ns": "dl_e"}).sort("dl_s")
    loaders = cpu.filter(pl.col("name").str.contains(DATALOADER_PATTERN)).select(
        "pid", "tid", loader_s="s", loader="name").sort("loader_s")
    slices = (
        slices.with_columns(ev_row)
        .join(cpu.select(ev_row="row", event_id="event_id", name="name", ev_kind="kind", call_dur_ns="full_dur_ns"),
              on="ev_row", how="left", maintain_order="left")
        .join(threads, on=["pid", "tid"], how="left", maintain_order="left")
        .sort("a")
        .join_asof(loading, left_on="a", right_on="dl_s", by=["pid", "tid"], strategy="backward",
                   check_sortedness=False)
        .join_asof(loaders, left_on="a", right_on="loader_s", by=["pid", "tid"], strategy="backward",
                   check_sortedness=False)
        .with_columns(
            data_loading=(pl.col("dl_e").is_not_null() & (pl.col("a") < pl.col("dl_e"))),
            launch_call=pl.col("event_id").is_in(launch_calls).fill_null(False),
            sync_call=(pl.col("ev_kind").is_in([Kind.RUNTIME.value, Kind.DRIVER.value])
                       & is_sync_runtime(pl.col("name"))).fill_null(False),
        )
    )

    # ---- GPU nodes: start n_cpu + 2g, end n_cpu + 2g + 1
    gpu = gpu.with_columns(start_node=pl.col("g").cast(pl.Int64) * 2 + n_cpu, end_node=pl.col("g").cast(pl.Int64) * 2
                           + n_cpu + 1, g=pl.col("g").cast(pl.Int64))
    gpu_lane = pl.format("gpu {} stream {}", "device", "stream")
    nodes = pl.concat([
        bounds.select("node", t_ns="t", lane=pl.format("thread {}/{}", "pid", "tid")),
        gpu.select(node="start_node", t_ns="ts_ns", lane=gpu_lane),
        gpu.select(node="end_node", t_ns=pl.col("ts_ns") + pl.col("dur_ns"), lane=gpu_lane),
    ]).sort("node")
    latency, samples = _launch_latency(gpu)

    copy_dir = pl.col("name").str.extract(r"(HtoD|DtoH|DtoD|HtoH|PtoP)")
    cpu_kind = (
        pl.when(pl.col("data_loading")).then(pl.lit(PathKind.DATA_LOADING.value))
        .when(pl.col("sync_call")).then(pl.lit(PathKind.SYNC_WAIT.value))
        .when(pl.col("launch_call")).then(pl.lit(PathKind.LAUNCH_OVERHEAD.value))
        .when(pl.col("event_id").is_null() & ~pl.col("main")).then(pl.lit(PathKind.IDLE.value))
        .otherwise(pl.lit(PathKind.CPU.value))
    )
    helper_idle = pl.col("event_id").is_null() & ~pl.col("main")
    slices, joins = _joins(slices)
    parts = [
        _edges(slices, src="src", dst="dst", type=EdgeType.CPU, kind=cpu_kind,
              natural_ns=pl.when(helper_idle).then(0).otherwise(pl.col("b") - pl.col("a") - pl.col("helped")),
              event_id="event_id",
              name=pl.when(pl.col("data_loading")).then(pl.coalesce("loader", "name"))  # data loading: the fetch
              .otherwise(pl.coalesce("name", pl.when(pl.col("main")).then(pl.lit("(untraced CPU time)"))
                                     .otherwise(pl.lit("(thread idle)")))),
              lane=pl.format("thread {}/{}", "pid", "tid"), pid="pid", tid="tid", point_ns="a",
              call_dur_ns="call_dur_ns", launch_call="launch_call", sync_call="sync_call",
              data_loading="data_loading"),
        _edges(gpu, src="start_node", dst="end_node", type=EdgeType.GPU,
              kind=pl.when(pl.col("kind") == Kind.KERNEL.value).then(pl.lit(PathKind.KERNEL.value))
              .otherwise(pl.lit(PathKind.COPY.value)),
              category="category", natural_ns="dur_ns", event_id="gpu_event_id", name="name", lane=gpu_lane,
              pid="launch_pid", tid="launch_tid", point_ns="launch_ts_ns",
              pageable=pl.col("name").str.contains("Pageable"), copy_bytes="copy_bytes", direction=copy_dir),
        _edges(_stream_predecessors(gpu).filter(pl.col("prev").is_not_null()), src="prev", dst="start_node",
               type=EdgeType.STREAM,
              kind=PathKind.IDLE, natural_ns=0, event_id="gpu_event_id", name=pl.lit("(stream gap)"),
              lane=gpu_lane, pid="launch_pid", tid="launch_tid", point_ns="launch_ts_ns"),
    ]
    launch_src = gpu.filter(pl.col("launch_ts_ns").is_not_null()).join(
        bounds.select(launch_pid="pid", launch_tid="tid", launch_ts_ns="t", launch_node="node"),
        on=["launch_pid", "launch_tid", "launch_ts_ns"], how="inner")
    parts.append(_edges(launch_src, src="launch_node", dst="start_node", type=EdgeType.LAUNCH,
                       kind=PathKind.LAUNCH_OVERHEAD, natural_ns=latency or 0, event_id="runtime_event_id",
                       name=pl.lit("(launch latency)"), lane=gpu_lane, pid="launch_pid", tid="launch_tid",
                       point_ns="launch_ts_ns", call_dur_ns="launch_dur_ns"))
    parts.append(_sync_edges(frames, cpu, bounds, gpu))
    parts.append(_cross_stream_edges(frames, gpu, lo, hi))
    parts.append(_wake_edges(slices, bounds, threads, main))
    # (the main thread's own time from the helper's end to its next boundary: resuming, then its Python)
    parts.append(_edges(joins, src="h_node", dst="dst", type=EdgeType.JOIN, kind=PathKind.CPU,
                        natural_ns=pl.col("b") - pl.col("h_end"), name=pl.lit("(thread join)"),
                        lane=pl.format("thread {}/{}", "pid", "tid"), pid="pid", tid="tid", point_ns="h_end"))
    del cpu, slices, launch_src  # (what the graph keeps is in the parts: the rest is freed before it is ordered)
    setup = frames.setup_span if annotation is None else None  # (an annotation's instances have no set-up)
    queued = gpu.filter(_window.queued_expr(frames.launches, setup)) if by_step is not None else gpu.clear()
    return _finish(nodes, parts, windows, gpu, by_step, queued, main, n_cpu, bounds, window_kind, latency, samples)


def _sync_edges(frames: TraceFrames, cpu: pl.DataFrame, bounds: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU work -> the end of the blocking call that waits for it."""
    calls = cpu.filter(pl.col("kind").is_in([Kind.RUNTIME.value, Kind.DRIVER.value])).join(
        frames.trace.runtime.select("event_id", "correlation").collect(engine="in-memory"), on="event_id", how="left",
        maintain_order="left")
    syncs = frames.trace.syncs.select(
        "correlation", sync_name="name", sync_device="device", sync_stream="stream",
        wait_stream=_json_int("$.wait_on_stream"), record_corr=_json_int("$.wait_on_cuda_event_record_corr_id"),
    ).collect(engine="in-memory").unique(subset="correlation", keep="first")
    records = frames.trace.runtime.filter(pl.col("correlation").is_not_null()).select(
        record_corr="correlation", record_ts="ts_ns").collect(
            engine="in-memory").unique(subset="record_corr", keep="first")
    # a synchronous copy, or a DtoH copy into pageable memory that ended inside its call: the call waited for it
    own = gpu.filter(pl.col("runtime_event_id").is_not_null()).select("g", event_id="runtime_event_id",
                                                                          g_end=pl.col("ts_ns") + pl.col("dur_ns"),
                                                                          g_name="name")
    copy_waits = cpu.join(own, on="event_id", how="inner").filter(
        (is_sync_runtime(pl.col("name")) & pl.col("name").str.contains("(?i)memcpy"))
        | (pl.col("g_name").str.contains("DtoH") & pl.col("g_name").str.contains("Pageable")
           & (pl.col("g_end") <= pl.col("e"))))
    blocking = (
        calls.filter(is_sync_runtime(pl.col("name")) | pl.col("event_id").is_in(copy_waits["event_id"].implode()))
        .join(syncs, on="correlation", how="left", maintain_order="left")
        .join(records, on="record_corr", how="left", maintain_order="left")
        .with_row_index("q").with_columns(pl.col("q").cast(pl.Int64))
    )
    copy_q = blocking.join(copy_waits.select("event_id"), on="event_id", how="semi")["q"].implode()
    waits = blocking.filter(~pl.col("q").is_in(copy_q))
    stream_wait = waits.filter(pl.col("name").str.contains("(?i)StreamSynchronize") & (pl.col("sync_stream") >= 0)
                               ).select("q", "s", device="sync_device", stream="sync_stream")
    event_wait = waits.filter(pl.col("name").str.contains("(?i)EventSynchronize") & (pl.col("wait_stream") >= 0)
                              ).select("q", pl.coalesce("record_ts", "s").alias("record_ts"), device="sync_device",
                                       stream="wait_stream")
    known = pl.concat([stream_wait["q"], event_wait["q"]]).implode()
    device_wait = waits.filter(~pl.col("q").is_in(known)).select("q", "s")
    found = pl.concat([
        _last_launched(gpu, stream_wait, at="s", by_stream=True),
        _last_launched(gpu, event_wait, at="record_ts", by_stream=True),
        _last_launched(gpu, device_wait, at="s", by_stream=False),
        copy_waits.join(blocking.select("q", "event_id"), on="event_id").select("q", "g"),
    ])
    targets = (
        found.join(blocking.select("q", "pid", "tid", "name", "event_id", "s", "e"), on="q")
        .join(gpu.select("g", "end_node", "device", "stream", g_end=pl.col("ts_ns") + pl.col("dur_ns")), on="g")
        .join(bounds.select("pid", "tid", e="t", call_end="node"), on=["pid", "tid", "e"], how="inner")
        .filter(pl.col("g_end") <= pl.col("e"))
    )
    return _edges(targets, src="end_node", dst="call_end", type=EdgeType.SYNC,
                kind=PathKind.SYNC_WAIT, natural_ns=pl.col("e") - pl.max_horizontal("s", "g_end"), event_id="event_id",
                name="name", lane=pl.format("thread {}/{}", "pid", "tid"), pid="pid", tid="tid", point_ns="s")


def _cross_stream_edges(frames: TraceFrames, gpu: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """The last work before a cudaEventRecord -> the first work on the waiting stream after cudaStreamWaitEvent."""
    trace = frames.trace
    runtime = trace.runtime.filter(pl.col("correlation").is_not_null()).select(
        "correlation", "pid", "tid", "event_id", "name", "ts_ns").collect(
            engine="in-memory").unique(subset="correlation", keep="first")
    waits = trace.syncs.filter(pl.col("name").str.contains("(?i)wait event")).select(
        "correlation", "device", stream="stream", wait_stream=_json_int("$.wait_on_stream"),
        record_corr=_json_int("$.wait_on_cuda_event_record_corr_id")).collect(engine="in-memory")
    exact = (
        waits.filter(pl.col("wait_stream") >= 0)
        .join(runtime.select("correlation", "pid", "tid", "event_id", "name", wait_ts="ts_ns"), on="correlation")
        .join(runtime.select(record_corr="correlation", record_ts="ts_ns"), on="record_corr", how="left",
              maintain_order="left")
        # older sync events name the recorded stream but not the record: its work launched before the wait
        .with_columns(record_ts=pl.coalesce("record_ts", "wait_ts"))
        .filter(pl.col("wait_ts").is_between(lo, hi))
    )
    # without a sync event: the wait pairs with the thread's previous cudaEventRecord; the recorded stream is the
    # one the thread launched on last before the record, the waiting one gets the thread's next launch elsewhere
    rt_calls = trace.runtime.filter(pl.col("name").str.contains("(?i)(EventRecord|StreamWaitEvent)")
                                    & pl.col("ts_ns").is_between(lo, hi)).select(
        "pid", "tid", "event_id", "name", "correlation", "ts_ns").collect(engine="in-memory").sort("ts_ns")
    rec = rt_calls.filter(pl.col("name").str.contains("(?i)EventRecord")).select("pid", "tid", record_ts="ts_ns")
    loose = (
        rt_calls.filter(pl.col("name").str.contains("(?i)StreamWaitEvent")
                        & ~pl.col("correlation").is_in(exact["correlation"].implode()).fill_null(False))
        .rename({"ts_ns": "wait_ts"})
        .join_asof(rec, left_on="wait_ts", right_on="record_ts", by=["pid", "tid"], strategy="backward",
                   check_sortedness=False)
        .filter(pl.col("record_ts").is_not_null())
    )
    launched = gpu.filter(pl.col("launch_ts_ns").is_not_null()).select(
        "g", "device", "stream", pid="launch_pid", tid="launch_tid", key="launch_ts_ns").sort("key")
    if loose.height:
        src_of_loose = loose.sort("record_ts").join_asof(
            launched.rename({"g": "src_g", "device": "src_device", "stream": "src_stream"}), left_on="record_ts",
            right_on="key", by=["pid", "tid"], strategy="backward", check_sortedness=False).drop("key")
        nxt = (src_of_loose.filter(pl.col("src_g").is_not_null()).sort("wait_ts")
               .join(launched.rename({"g": "dst_g"}), on=["pid", "tid"], how="inner")
               .filter((pl.col("key") >= pl.col("wait_ts")) & ((pl.col("stream") != pl.col("src_stream"))
                                                                | (pl.col("device") != pl.col("src_device"))))
               .sort("key").group_by("event_id", maintain_order=True).first())
        loose_pairs = nxt.select("pid", "tid", "event_id", "name", "wait_ts", "src_g", "dst_g")
    else:
        loose_pairs = pl.DataFrame(schema={"pid": pl.String, "tid": pl.String, "event_id": pl.Int64,
                                           "name": pl.String, "wait_ts": pl.Int64, "src_g": pl.Int64,
                                           "dst_g": pl.Int64})
    exact = exact.with_row_index("q").with_columns(pl.col("q").cast(pl.Int64))
    src = _last_launched(gpu, exact.select("q", "record_ts", "device", stream="wait_stream"), at="record_ts",
                         by_stream=True).rename({"g": "src_g"})
    dst = (exact.select("q", "device", "stream", "wait_ts").sort("wait_ts")
           .join_asof(gpu.select("g", "device", "stream", "key_ns").sort("key_ns"), left_on="wait_ts",
                      right_on="key_ns", by=["device", "stream"], strategy="forward", check_sortedness=False)
           .filter(pl.col("g").is_not_null()).select("q", dst_g="g"))
    exact_pairs = exact.join(src, on="q").join(dst, on="q").select("pid", "tid", "event_id", "name", "wait_ts",
                                                                    "src_g", "dst_g")
    pairs = (pl.concat([exact_pairs, loose_pairs.cast(exact_pairs.schema)])
             .join(gpu.select(src_g="g", src_node="end_node"), on="src_g")
             .join(gpu.select(dst_g="g", dst_node="start_node", dlane=pl.format("gpu {} stream {}", "device",
                                                                                  "stream")), on="dst_g"))
    return _edges(pairs, src="src_node", dst="dst_node", type=EdgeType.CROSS_STREAM,
                kind=PathKind.IDLE, natural_ns=0, event_id="event_id", name=pl.lit("(stream wait)"),
                lane="dlane", pid="pid", tid="tid", point_ns="wait_ts")


#: what the autograd engine's thread runs: `autograd::engine::evaluate_function: MmBackward0`, `MmBackward0`
AUTOGRAD_ENGINE = r"^autograd::engine::evaluate_function|Backward\d*$"


def _joins(slices: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`slices` with `helped`: the part of a main-thread slice inside no op of its own (no event, or only an
    annotation: the step, a `## backward ##` region) that a helper thread running the autograd engine
    (`AUTOGRAD_ENGINE`) spent busy in work that ended inside it, which the main thread waited through
    (loss.backward() blocks while the autograd thread runs it; 0 elsewhere); and the join edges' rows: the
    helper's last busy boundary in such a slice (`h_node`, `h_end`) -> the slice's end (`dst`, `b`).

        main   ProfilerStep 0-100 (no op 20-80)        autograd  evaluate_function 25-70
        -> main slice 20-80: helped 45 (its CPU weight 15), join autograd@70 -> main@80 (weight 10)
    """
    # helpers the main thread waits for: those running the autograd engine (its backward: `evaluate_function`,
    # `…Backward0`); a pin-memory or logging thread busy while the main thread runs untraced Python is not waited for
    engine = slices.filter(~pl.col("main") & pl.col("name").str.contains(AUTOGRAD_ENGINE).fill_null(False)).select(
        "pid", "tid").unique()
    busy = slices.filter(~pl.col("main") & pl.col("event_id").is_not_null()).join(engine, on=["pid", "tid"],
                                                                                  how="semi")
    waiting = (pl.col("main") & (pl.col("event_id").is_null() | (pl.col("ev_kind") == Kind.USER_ANNOTATION.value)
                                 | pl.col("name").str.starts_with("ProfilerStep#").fill_null(False)))
    if busy.height == 0:
        return slices.with_columns(helped=pl.lit(0, pl.Int64)), pl.DataFrame(
            schema={"pid": pl.String, "tid": pl.String, "dst": pl.Int64, "b": pl.Int64, "h_node": pl.Int64,
                    "h_end": pl.Int64})
    merged = intervals.union(busy.lazy().select(start_ns="a", end_ns="b"), start="start_ns", end="end_ns")
    cand = slices.filter(waiting).select("src", "dst", "pid", "tid", "a", "b")
    inside = pl.min_horizontal("end_ns", "b") - pl.max_horizontal("start_ns", "a")
    # (helper work still running when the main thread resumes was not waited for: only work that ends inside)
    helped = (cand.lazy().join_where(merged, pl.col("end_ns") <= pl.col("b"), pl.col("end_ns") > pl.col("a"))
              .group_by("src").agg(helped=inside.sum(), h_end=pl.col("end_ns").max())
              .collect(engine="in-memory"))
    ends = busy.select(h_end="b", h_node="dst").sort("h_end", "h_node").unique("h_end", keep="first")
    joins = (cand.join(helped, on="src").filter(pl.col("h_end") > pl.col("a"))
             .join(ends, on="h_end", how="inner").select("pid", "tid", "dst", "b", "h_node", "h_end"))
    out = slices.join(helped.select("src", "helped"), on="src", how="left", maintain_order="left").with_columns(
        pl.col("helped").fill_null(0).cast(pl.Int64))
    return out, joins


def _wake_edges(slices: pl.DataFrame, bounds: pl.DataFrame, threads: pl.DataFrame, main: tuple[str, str]
                ) -> pl.DataFrame:
    """A helper thread resuming (after an idle slice, or at its first boundary) <- the main thread's last boundary,
    the first such resume after each main boundary."""
    helper = bounds.join(threads.filter(~pl.col("main")), on=["pid", "tid"], how="semi")
    first = helper.group_by("pid", "tid").agg(pl.col("node").min())["node"]
    after_idle = slices.filter(pl.col("event_id").is_null() & ~pl.col("main"))["dst"]
    resumes = helper.filter(pl.col("node").is_in(pl.concat([first, after_idle]).implode())).sort("t")
    main_nodes = bounds.filter((pl.col("pid") == main[0]) & (pl.col("tid") == main[1])).select(
        main_node="node", main_t="t").sort("main_t")
    # the first resume after each main-thread boundary only: later ones, with no main boundary between, are the
    # helper's own (the autograd thread idling between its tasks while the main thread waits in backward)
    found = (resumes.join_asof(main_nodes, left_on="t", right_on="main_t", strategy="backward",
                               check_sortedness=False).filter(pl.col("main_node").is_not_null())
             .sort("t").unique(["pid", "tid", "main_node"], keep="first", maintain_order=True))
    return _edges(found, src="main_node", dst="node", type=EdgeType.WAKE,
                kind=PathKind.IDLE, natural_ns=pl.col("t") - pl.col("main_t"), name=pl.lit("(thread wait)"),
                lane=pl.format("thread {}/{}", "pid", "tid"), pid="pid", tid="tid", point_ns="t")


def _graph_span(windows: pl.DataFrame) -> tuple[int, int]:
    """The times the graph covers: from the first step's window or CPU start, whichever is earlier, to the last
    window's end. From the CPU start: in a GPU-bound loop the CPU runs ahead, and a step's window begins where the
    GPU reached its work, after its launches; without them in the graph its GPU work would be bound by nothing but
    stream order, and a faster GPU (what-if) could run it before the CPU had issued it."""
    lo = min(windows["start_ns"].min(), windows["cpu_start_ns"].min())  # type: ignore[type-var]
    return int(lo), int(windows["end_ns"].max())  # type: ignore[arg-type]


def _finish(nodes: pl.DataFrame, parts: list[pl.DataFrame], windows: pl.DataFrame, gpu: pl.DataFrame,
            by_step: pl.DataFrame | None, queued: pl.DataFrame, main: tuple[str, str], n_cpu: int,
            bounds: pl.DataFrame, window_kind: str, latency: int | None, samples: int | None) -> DependencyGraph:
    """Join the edge frames `parts` (emptied here, so that they are freed once joined), order the nodes, drop
    edges against the order, set the measured weights, index the step windows (`queued`: the GPU work the first
    step waits for, `window.queued_expr`: `gpu_ends` rows of a null step)."""
    edges = pl.concat(parts).filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null())
    parts.clear()
    t = nodes["t_ns"].to_numpy()
    sync_dst = edges.filter(pl.col("type") == EdgeType.SYNC.value)["dst"].unique().to_numpy()
    rank = np.zeros(len(t), dtype=np.int64)
    rank[n_cpu:] = 1
    rank[sync_dst] = 2  # a blocking call's end comes after the GPU work it waited for, even at the same time
    order, edges, dropped = ordered_edges(t, rank, edges)
    main_nodes = bounds.filter((pl.col("pid") == main[0]) & (pl.col("tid") == main[1])).select("node", "t")
    if windows["step"].null_count() == windows.height:  # no steps: the window is what the graph covers
        windows = windows.with_columns(start_ns=pl.lit(int(t.min())), end_ns=pl.lit(int(t.max())))
    lo, hi = _graph_span(windows)
    win = (windows.with_columns(cs=pl.col("cpu_start_ns").clip(lo, hi), ce=pl.col("cpu_end_ns").clip(lo, hi))
           .join(main_nodes.rename({"node": "cpu_start_node", "t": "cs"}), on="cs", how="left", maintain_order="left")
           .join(main_nodes.rename({"node": "cpu_end_node", "t": "ce"}), on="ce", how="left", maintain_order="left")
           .select("step", "start_ns", "end_ns", "cpu_start_ns", "cpu_end_ns", "cpu_start_node", "cpu_end_node")
           .sort("start_ns"))
    if by_step is None:  # no steps: the one window owns all GPU work
        gpu_ends = gpu.select(step=pl.lit(None, pl.Int64), node="end_node")
    else:
        gpu_ends = pl.concat([
            by_step.select("gpu_event_id", "step").join(
                gpu.select("gpu_event_id", node="end_node"), on="gpu_event_id").select("step", "node"),
            queued.select(step=pl.lit(None, pl.Int64), node="end_node")])
    return DependencyGraph(nodes=nodes, edges=edges, windows=win, gpu_ends=gpu_ends, order=order,
                           dropped_edges=dropped, window_kind=window_kind, launch_latency_ns=latency,
                           launch_samples=samples)


def measured_weights(edges: pl.DataFrame, t: IntArray) -> pl.Series:
    """Each edge's measured weight: its natural weight, at most the measured gap t(dst) - t(src); where no in-edge
    of a node then reaches the node's time, the one that comes closest (latest t(src) + natural, then PRIORITY)
    is raised to its gap. A blocking call's last slice first drops the part before its GPU work ended.

        in-edges of v (t = 103): launch from 90 natural 5 -> 95; stream from 100 natural 0 -> 100
        -> weights 5 and 3 (the stream edge is raised: it explains v)
    """
    src, dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    tu, tv = t[src], t[dst]
    natural = edges["natural_ns"].to_numpy().astype(np.int64)
    etype = edges["type"]  # (tested in polars: as a numpy array it would be an object per edge)
    sync = etype.is_in(WAIT_TYPES).to_numpy()
    waited = np.full(len(t), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(waited, dst[sync], tu[sync])
    reduced = (etype == EdgeType.CPU.value).to_numpy() & (waited[dst] > np.iinfo(np.int64).min)
    natural = np.where(reduced, tv - np.maximum(tu, waited[dst]), natural)
    gap = tv - tu
    weight = np.minimum(natural, gap)
    best = np.full(len(t), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(best, dst, tu + weight)
    short = np.flatnonzero(best[dst] < tv)  # edges into nodes nothing explains yet
    if len(short):
        prio = etype.gather(short).replace_strict({k.value: p for k, p in PRIORITY.items()},
                                                  return_dtype=pl.Int64).to_numpy()
        ranked = short[np.lexsort((prio, -(tu[short] + natural[short]), dst[short]))]
        first = np.ones(len(ranked), dtype=bool)
        first[1:] = dst[ranked][1:] != dst[ranked][:-1]
        weight[ranked[first]] = gap[ranked[first]]
    return pl.Series("weight_ns", weight, dtype=pl.Int64)


def _empty(window_kind: str) -> DependencyGraph:
    """The graph of a trace with nothing to analyse."""
    return DependencyGraph(
        nodes=pl.DataFrame(schema={"node": pl.Int64, "t_ns": pl.Int64, "lane": pl.String}),
        edges=pl.DataFrame(schema={**EDGE_SCHEMA, "weight_ns": pl.Int64}),
        windows=pl.DataFrame(schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                     "cpu_start_ns": pl.Int64, "cpu_end_ns": pl.Int64, "cpu_start_node": pl.Int64,
                                     "cpu_end_node": pl.Int64}),
        gpu_ends=pl.DataFrame(schema={"step": pl.Int64, "node": pl.Int64}),
        order=np.zeros(0, dtype=np.int64), dropped_edges=0, window_kind=window_kind, launch_latency_ns=None)


def step_times(graph: DependencyGraph, t_ns: IntArray) -> pl.DataFrame:
    """step, start_ns, end_ns, wall_ns of each window with node times `t_ns`, by the step-window rule
    (`window.step_windows`): a step ends at the later of its CPU end and its last GPU work's end, and starts at
    its CPU start or where the previous step ended, if later (the first step: where the GPU work launched before
    the trace ended, if later). Without steps: the window's start to the latest
    node. In a run's graph (`run_graph`: windows per rank) step N runs from the earliest rank's start to the
    latest rank's end."""
    times = window_times(graph, t_ns)
    if "rank" not in times.columns:
        return times
    return (times.group_by("step").agg(start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max())
            .select("step", "start_ns", "end_ns", wall_ns=pl.col("end_ns") - pl.col("start_ns"))
            .sort("start_ns", "step"))


def window_times(graph: DependencyGraph, t_ns: IntArray) -> pl.DataFrame:
    """`step_times` of each window: in a run's graph one row per rank and step (a `rank` column first)."""
    w = graph.windows
    by = ["rank"] if "rank" in w.columns else []
    schema = {**{c: pl.Int64() for c in by}, "step": pl.Int64(), "start_ns": pl.Int64(), "end_ns": pl.Int64(),
              "wall_ns": pl.Int64()}
    if w.height == 0:
        return pl.DataFrame(schema=schema)
    times = pl.Series("t", t_ns)
    if w["step"].null_count() == w.height:
        if not by:
            start = int(w["start_ns"][0])
            end = int(t_ns.max()) if len(t_ns) else int(w["end_ns"][0])
            return pl.DataFrame({"step": [None], "start_ns": [start], "end_ns": [end], "wall_ns": [end - start]},
                                schema=schema)
        last = graph.nodes.select("rank", t=times).group_by("rank").agg(last=pl.col("t").max())
        return (w.join(last, on="rank", how="left", maintain_order="left")
                .select("rank", "step", "start_ns", end_ns=pl.max_horizontal("start_ns", pl.coalesce("last", "end_ns")))
                .with_columns(wall_ns=pl.col("end_ns") - pl.col("start_ns")).cast(schema))  # type: ignore[arg-type]
    ends = graph.gpu_ends.with_columns(t=times.gather(graph.gpu_ends["node"]))
    gpu_end = ends.filter(pl.col("step").is_not_null()).group_by(*by, "step").agg(gpu_end=pl.col("t").max())
    queued = ends.filter(pl.col("step").is_null())
    if by:
        w = w.join(queued.group_by(*by).agg(queued=pl.col("t").max()), on=by, how="left", maintain_order="left")
    else:
        w = w.with_columns(queued=pl.lit(queued["t"].max(), pl.Int64))
    # (the previous step's end; the first step's is where the GPU work queued before the trace ended)
    previous = (pl.col("end_ns").shift(1).over(by) if by else pl.col("end_ns").shift(1)).fill_null(pl.col("queued"))
    return (
        w.with_columns(cs=times.gather(w["cpu_start_node"].fill_null(0)),
                       ce=times.gather(w["cpu_end_node"].fill_null(0)))
        .with_columns(cs=pl.when(pl.col("cpu_start_node").is_null()).then(pl.col("cpu_start_ns")).otherwise("cs"),
                      ce=pl.when(pl.col("cpu_end_node").is_null()).then(pl.col("cpu_end_ns")).otherwise("ce"))
        .join(gpu_end, on=[*by, "step"], how="left", maintain_order="left")
        .with_columns(end_ns=pl.max_horizontal("ce", "gpu_end"))
        .with_columns(start_ns=pl.max_horizontal("cs", previous))
        .with_columns(end_ns=pl.max_horizontal("end_ns", "start_ns"))
        .select(*by, "step", "start_ns", "end_ns", wall_ns=pl.col("end_ns") - pl.col("start_ns"))
    )


def ordered_edges(t_ns: IntArray, tie: IntArray, edges: pl.DataFrame) -> tuple[IntArray, pl.DataFrame, int]:
    """The replay order (`topological_order`), the edges that run along it with their measured weights, and how
    many ran against it (clock skew) and were dropped."""
    order = topological_order(t_ns, tie, edges["src"].to_numpy(), edges["dst"].to_numpy())
    position = np.empty(len(t_ns), dtype=np.int64)
    position[order] = np.arange(len(t_ns))
    forward = position[edges["src"].to_numpy()] < position[edges["dst"].to_numpy()]
    kept = edges.filter(pl.Series(forward))
    return order, kept.with_columns(weight_ns=measured_weights(kept, t_ns)), int((~forward).sum())


#: rounds of re-ranking nodes that share a time (`topological_order`): the longest chain of edges between
#: nodes at one instant that is put in order; what is left against the order after them is dropped
TIE_ROUNDS = 16


def topological_order(t_ns: IntArray, tie: IntArray, src: IntArray, dst: IntArray) -> IntArray:
    """Nodes by time, then `tie` (a CPU boundary before GPU work at the same time, a blocking call's end after
    the work it waited for), then index: the order every replay follows. Where an edge joins two nodes at the
    same time against that order (a kernel on one stream ends at the very ns another, waiting on it, starts),
    its head is ranked after its tail, round by round, so the edge is kept instead of dropped as backwards.

        t: a=5 (tie 1), b=5 (tie 1), edge b -> a  ->  a is ranked 2: order b, a
    """
    tie = tie.astype(np.int64, copy=True)
    same = t_ns[src] == t_ns[dst]
    s, d = src[same], dst[same]
    for _ in range(TIE_ROUNDS):
        order = np.lexsort((np.arange(len(t_ns)), tie, t_ns)).astype(np.int64)
        if not len(s):
            return order
        position = np.empty(len(t_ns), dtype=np.int64)
        position[order] = np.arange(len(t_ns))
        against = position[s] > position[d]
        if not against.any():
            return order
        np.maximum.at(tie, d[against], tie[s[against]] + 1)
    return np.lexsort((np.arange(len(t_ns)), tie, t_ns)).astype(np.int64)


__all__ = ["DependencyGraph", "EdgeType", "PathKind", "Replay", "build_graph", "held_ns", "measured_weights",
           "ordered_edges", "replay", "step_times", "topological_order", "window_times"]
