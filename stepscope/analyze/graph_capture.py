"""Which op launched each graph-replayed kernel: the replay's kernel sequence matched against a profile of the
graph capture.

A kernel replayed from a CUDA/HIP graph has no CPU op: one `cudaGraphLaunch` / `hipGraphLaunch` launched it and
every other kernel of the graph. A profile of the capture itself records the ops: between
`cudaStreamBeginCapture` and `cudaStreamEndCapture` each op issues its launch calls (on ROCm the call names its
kernel, `args.kernel`), and warm-up runs before the capture execute the same ops eagerly (their kernels name
themselves). So each distinct replayed graph (its kernel-name sequence per stream) is matched against:

1. each capture segment (the launches between a Begin/EndCapture pair on one thread, in order), and failing a
   full match,
2. the eager launches of the capture profile (per thread, in order), at each place the graph's first kernel
   occurs.

Each stream's sequence is matched in order as a subsequence of the candidate's launches (a launch is used
once), so a multi-stream graph, whose streams interleave at capture, matches too. The candidate that matches
the most kernels wins (a capture segment before an eager run when they tie); where several tie (piecewise
graphs: every layer's piece holds the same kernels), the k-th replay of that graph takes the k-th of them.

    replay (hipGraphLaunch, stream 0):  Cijk_..MT160  rmsnorm  Cijk_..MT32
    capture segment 2 (thread 851):     hipExtModuleLaunchKernel(Cijk_..MT160) <- aten::addmm
                                        hipLaunchKernel(rmsnorm)               <- aiter::rmsnorm2d_fwd_with_add_ck
                                        hipExtModuleLaunchKernel(Cijk_..MT32)  <- aten::addmm
    -> the three replayed kernels belong to aten::addmm, aiter::rmsnorm2d_fwd_with_add_ck, aten::addmm

The ops (with their ancestors inside the capture segment: `vllm::rocm_unquantized_gemm > aten::addmm`) become
one row each per replay (`GRAPH_OPS_SCHEMA`), so an op table counts an op once per replay, as FLOPs do.
Matching is a loop over the handful of distinct graphs and capture segments, not over events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from stepscope.analyze.blame import innermost
from stepscope.analyze.frames import GRAPH_OPS_SCHEMA
from stepscope.analyze.nesting import parent_index, sort_for_nesting
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace

#: the runtime call that replays a graph
GRAPH_LAUNCH = r"(?i)^(cuda|hip|cu)GraphLaunch"
#: runtime calls that launch one kernel / copy / set (cudaLaunchKernel, cuLaunchKernelEx, hipModuleLaunchKernel,
#: hipExtModuleLaunchKernel, cudaLaunchCooperativeKernel, cudaMemcpyAsync, hipMemsetAsync, …)
KERNEL_LAUNCH = r"(?i)launch\w*kernel"
_COPY_LAUNCH = r"(?i)^(cuda|hip|cu)mem(cpy|set)\w*async"
_BEGIN_CAPTURE = r"(?i)StreamBeginCapture"
_END_CAPTURE = r"(?i)StreamEndCapture"
#: the slack an eager window allows past the graph's own length (ops that run eagerly between graph pieces)
_WINDOW_SLACK = 16


def token(name: pl.Expr, kind: pl.Expr) -> pl.Expr:
    """What a replayed GPU event and its capture-time launch agree on: the kernel's name; a copy or set only
    by its kind (the GPU event says 'Memcpy DtoD', the launch call 'cudaMemcpyAsync').

        kernel 'void at::native::fill_kernel<…>(…)'  -> 'void at::native::fill_kernel<…>(…)'
        memcpy 'Memcpy DtoD (Device -> Device)'      -> '[memcpy]'
    """
    return (pl.when(kind == Kind.MEMCPY.value).then(pl.lit("[memcpy]"))
            .when(kind == Kind.MEMSET.value).then(pl.lit("[memset]")).otherwise(name))


def replayed(launches: pl.DataFrame) -> pl.DataFrame:
    """The rows of `launches` (`TraceFrames.launches`) that a graph launch replayed."""
    return launches.filter(pl.col("runtime_name").fill_null("").str.contains(GRAPH_LAUNCH))


def replay_signatures(launches: pl.DataFrame) -> pl.DataFrame:
    """One row per graph launch: correlation, launch_ts_ns, signature (its GPU events' tokens per stream, in
    order: what makes two replays the same graph), graph (1, 2, … by first replay)."""
    rep = replayed(launches).filter(pl.col("ts_ns").is_not_null())
    if rep.height == 0:
        return pl.DataFrame(schema={"correlation": pl.Int64, "launch_ts_ns": pl.Int64, "signature": pl.String,
                                    "graph": pl.Int64})
    per_stream = (
        rep.with_columns(tok=token(pl.col("name"), pl.col("kind")))
        .sort("correlation", "stream", "ts_ns")
        .group_by("correlation", "stream", maintain_order=True)
        .agg(seq=pl.col("tok").str.join("\x1f"), launch_ts_ns=pl.col("launch_ts_ns").first())
    )
    sig = (per_stream.group_by("correlation", maintain_order=True)
           .agg(signature=pl.col("seq").str.join("\x1e"), launch_ts_ns=pl.col("launch_ts_ns").first())
           .sort("launch_ts_ns", "correlation"))
    first = sig.group_by("signature").agg(t=pl.col("launch_ts_ns").min(), c=pl.col("correlation").min())
    order = first.sort("t", "c").with_row_index("graph", offset=1).select("signature", pl.col("graph").cast(pl.Int64))
    return sig.join(order, on="signature").select("correlation", "launch_ts_ns", "signature", "graph")


# ------------------------------------------------------------------------------------------- capture side
def capture_launches(capture: Trace) -> pl.DataFrame:
    """Every launch call of the capture profile, in thread order: event_id, pid, tid, ts_ns, token (the kernel's
    name from its executed GPU event, else the call's `kernel` arg; null where neither says it), op_event_id
    (the CPU op with the call's External id, else the innermost op around it), segment (the capture segment
    it lies in, `capture_segments`; null for an eager launch)."""
    calls = capture.runtime.filter(
        pl.col("name").str.contains(KERNEL_LAUNCH) | pl.col("name").str.contains(_COPY_LAUNCH)
    ).select("event_id", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "external_id",
             arg_kernel=pl.col("args").str.json_path_match("$.kernel")).collect(engine="in-memory")
    gpu = capture.gpu.filter(pl.col("correlation").is_not_null()).select(
        "correlation", gpu_tok=token(pl.col("name"), pl.col("kind"))).unique("correlation").collect(engine="in-memory")
    copy_tok = pl.when(pl.col("name").str.contains("(?i)memset")).then(pl.lit("[memset]")).otherwise(pl.lit("[memcpy]"))
    calls = calls.join(gpu, on="correlation", how="left", maintain_order="left").with_columns(
        token=pl.coalesce("gpu_tok", "arg_kernel",
                          pl.when(pl.col("name").str.contains(_COPY_LAUNCH)).then(copy_tok)))
    ops = (capture.cpu_ops.filter(pl.col("external_id").is_not_null()).sort("dur_ns")
           .unique(subset="external_id", keep="first").select("external_id", op_event_id="event_id").collect(
               engine="in-memory"))
    calls = calls.join(ops, on="external_id", how="left", maintain_order="left")
    missing = calls["op_event_id"].is_null()
    if missing.any():
        found = innermost(capture.cpu_ops, calls.filter(missing).select("pid", "tid", "ts_ns"))["event_id"]
        calls = calls.with_columns(op_event_id=calls["op_event_id"].scatter(np.flatnonzero(missing.to_numpy()), found))
    segments = capture_segments(capture)
    calls = calls.sort("ts_ns").join_asof(
        segments.sort("begin_ns").select("pid", "tid", "segment", "begin_ns", "end_ns"),
        left_on="ts_ns", right_on="begin_ns", by=["pid", "tid"], strategy="backward", check_sortedness=False)
    inside = pl.col("end_ns").is_not_null() & (pl.col("ts_ns") <= pl.col("end_ns"))
    return calls.with_columns(segment=pl.when(inside).then("segment"), seg_begin_ns=pl.when(inside).then("begin_ns"),
                              seg_end_ns=pl.when(inside).then("end_ns")).select(
        "event_id", "pid", "tid", "ts_ns", "token", "op_event_id", "segment", "seg_begin_ns", "seg_end_ns",
    ).sort("pid", "tid", "ts_ns")


def capture_segments(capture: Trace) -> pl.DataFrame:
    """One row per graph capture: segment (1, 2, … in time order), pid, tid, begin_ns (the BeginCapture call's
    start), end_ns (the next EndCapture call's end on the same thread)."""
    rt = capture.runtime.filter(pl.col("name").str.contains(f"{_BEGIN_CAPTURE}|{_END_CAPTURE}")).select(
        "pid", "tid", "ts_ns", end=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0),
        begin=pl.col("name").str.contains(_BEGIN_CAPTURE)).collect(engine="in-memory").sort("ts_ns")
    begins = rt.filter("begin").select("pid", "tid", begin_ns="ts_ns")
    ends = rt.filter(~pl.col("begin")).select("pid", "tid", e_ts="ts_ns", end_ns="end")
    paired = begins.join_asof(ends, left_on="begin_ns", right_on="e_ts", by=["pid", "tid"], strategy="forward",
                              check_sortedness=False)
    return (paired.filter(pl.col("end_ns").is_not_null()).sort("begin_ns")
            .with_row_index("segment", offset=1).select(pl.col("segment").cast(pl.Int64), "pid", "tid", "begin_ns",
                                                        "end_ns"))


# ------------------------------------------------------------------------------------------------ matching
@dataclass(frozen=True)
class _Candidate:
    """A run of capture launches one graph may have come from: a capture segment or an eager window."""

    key: str  # "segment 3" / "eager 851:120"
    is_segment: bool
    rows: tuple[int, ...]  # rows of capture_launches, in launch order
    tokens: tuple[str | None, ...]


def _align(streams: Sequence[Sequence[str]], tokens: Sequence[str | None]) -> list[list[int | None]]:
    """Each stream's tokens matched in order as a subsequence of `tokens`, each position used once: the matched
    position per token (None where the rest of `tokens` has no such token left).

        streams [[a, b, c]], tokens [a, x, b, c]  ->  [[0, 2, 3]]
        streams [[a, c], [b]], tokens [a, b, c]   ->  [[0, 2], [1]]     (two streams interleaved at capture)
    """
    used: set[int] = set()
    out: list[list[int | None]] = []
    for seq in streams:
        pos = 0
        got: list[int | None] = []
        for tok in seq:
            j = pos
            while j < len(tokens) and (tokens[j] != tok or j in used):
                j += 1
            if j < len(tokens):
                got.append(j)
                used.add(j)
                pos = j + 1
            else:
                got.append(None)
        out.append(got)
    return out


def _candidates(launches: pl.DataFrame) -> tuple[list[_Candidate], dict[tuple[str, str], list[int]]]:
    """The capture segments as candidates, and each thread's eager launch rows (for windows)."""
    rows = launches.with_row_index("_row")
    segs = [
        _Candidate(f"segment {seg}", True, tuple(g["_row"].to_list()), tuple(g["token"].to_list()))
        for (seg,), g in rows.filter(pl.col("segment").is_not_null()).group_by("segment", maintain_order=True)
    ]
    segs.sort(key=lambda c: c.rows[0])
    eager: dict[tuple[str, str], list[int]] = {}
    for (pid, tid), g in rows.filter(pl.col("segment").is_null() & pl.col("token").is_not_null()).group_by(
            "pid", "tid", maintain_order=True):
        eager[(str(pid), str(tid))] = g["_row"].to_list()
    return segs, eager


def _eager_windows(streams: Sequence[Sequence[str]], eager: dict[tuple[str, str], list[int]],
                   tokens: Sequence[str | None]) -> list[_Candidate]:
    """Windows of the eager launches starting where the graph's first kernel was launched."""
    first = streams[0][0] if streams and streams[0] else None
    size = sum(len(s) for s in streams) * 2 + _WINDOW_SLACK
    out = []
    for (pid, tid), rows in eager.items():
        for i, r in enumerate(rows):
            if tokens[r] == first:
                window = tuple(rows[i:i + size])
                out.append(_Candidate(f"eager {pid}:{tid}:{r}", False, window, tuple(tokens[w] for w in window)))
    return out


def _best(streams: Sequence[Sequence[str]], candidates: Sequence[_Candidate]) -> tuple[int, list[_Candidate],
                                                                                         list[list[list[int | None]]]]:
    """The most kernels any candidate matches, the candidates that match that many and their alignments.

    Among those, capture segments win over eager windows, and segments with the fewest launches left over win
    (a 12-kernel graph matches inside every 15-kernel segment too, but it is the 12-kernel one)."""
    scored = []
    for c in candidates:
        a = _align(streams, c.tokens)
        n = sum(p is not None for s in a for p in s)
        if n:
            scored.append(((n, c.is_segment, -(len(c.tokens) - n) if c.is_segment else 0), c, a))
    if not scored:
        return 0, [], []
    top = max(score for score, _, _ in scored)
    tied = [(c, a) for score, c, a in scored if score == top]
    return top[0], [c for c, _ in tied], [a for _, a in tied]


def _in_launch_order(streams: Sequence[Sequence[str]], segments: Sequence[_Candidate]) -> list[_Candidate]:
    """The capture segments a one-stream graph replays launch for launch, where their kernel launches carry no
    kernel name (CUDA: a launch call made during capture runs nothing, so the profile never learns what it
    launched): as many launches as the graph has GPU events, and copies and sets at the same places.

    Captured on one stream, a graph is a chain in launch order, and its replay runs the chain in that order, so
    the i-th replayed GPU event is the i-th launch: exact, not a guess. Graphs of several streams interleave
    at capture in an order the replay does not keep: those are left to the eager runs.

        replay:  [memset] gemm gelu [memset] gemm   segment:  [memset] ? ? [memset] ?   ->  position by position
    """
    if len(streams) != 1:
        return []
    events = streams[0]
    kernel = [tok not in ("[memcpy]", "[memset]") for tok in events]

    def fits(c: _Candidate) -> bool:
        return len(c.tokens) == len(events) and all(
            (tok is None and k) or tok == ev for tok, ev, k in zip(c.tokens, events, kernel, strict=True))

    return [c for c in segments if fits(c)]


# ------------------------------------------------------------------------------------------------- mapping
@dataclass(frozen=True, kw_only=True)
class CaptureMapping:
    """Replayed GPU events mapped to the ops that launched them at capture time.

    `kernels`: gpu_event_id, correlation (the graph launch), graph, capture_launch_event_id, capture_op_event_id,
    op_event_id (the op's row in `ops`), op_name: one row per replayed GPU event that was mapped.
    `ops`: `GRAPH_OPS_SCHEMA` rows, one per captured op (launching op or its ancestor) per replay.
    `graphs`: graph, kernels_per_replay, mapped_per_replay, source (where its ops came from: "capture segment",
    "eager run", or null where nothing matched), candidates (how many equally good places matched it).
    """

    capture_name: str
    kernels: pl.DataFrame
    ops: pl.DataFrame
    graphs: pl.DataFrame


_KERNELS_SCHEMA = {"gpu_event_id": pl.Int64, "correlation": pl.Int64, "graph": pl.Int64,
                   "capture_launch_event_id": pl.Int64, "capture_op_event_id": pl.Int64}


def map_replays(launches: pl.DataFrame, capture: Trace, *, first_event_id: int) -> CaptureMapping:
    """Map every graph-replayed GPU event of `launches` (`TraceFrames.launches` of the profiled run) to the op of
    `capture` (a profile of the graph capture) that launched it (module docstring). Virtual op rows get event
    ids from `first_event_id` on (past the run's own)."""
    sigs = replay_signatures(launches)
    cap = capture_launches(capture)
    segs, eager = _candidates(cap)
    tokens = cap["token"].to_list()
    picks, graphs = [], []
    for graph, signature in sigs.unique("graph").sort("graph").select("graph", "signature").iter_rows():
        streams = [seq.split("\x1f") for seq in signature.split("\x1e")]
        n = sum(len(s) for s in streams)
        best, tied, aligned = _best(streams, segs)
        if best < n:
            in_order = _in_launch_order(streams, segs)
            if in_order:
                best, tied, aligned = n, in_order, [[list(range(n))]] * len(in_order)
            else:
                best, tied, aligned = _best(streams, [*segs, *_eager_windows(streams, eager, tokens)])
        graphs.append({"graph": graph, "kernels_per_replay": n, "mapped_per_replay": best,
                       "source": None if not tied else "capture segment" if tied[0].is_segment else "eager run",
                       "candidates": len(tied)})
        for choice, (cand, a) in enumerate(zip(tied, aligned, strict=True)):
            flat = [cand.rows[p] if p is not None else None for s in a for p in s]
            picks.append(pl.DataFrame({"graph": graph, "choice": choice, "choices": len(tied),
                                       "pos": list(range(n)), "cap_row": flat},
                                      schema={"graph": pl.Int64, "choice": pl.Int64, "choices": pl.Int64,
                                              "pos": pl.Int64, "cap_row": pl.Int64}))
    kernels = _mapped_kernels(launches, sigs, cap, picks)
    ops = _virtual_ops(capture, cap, kernels, launches, first_event_id)
    kernels = kernels.join(ops.select("replay_correlation", "capture_event_id", "event_id", "name"),
                           left_on=["correlation", "capture_op_event_id"],
                           right_on=["replay_correlation", "capture_event_id"], how="left",
                           maintain_order="left").rename({"event_id": "op_event_id", "name": "op_name"})
    graph_frame = pl.DataFrame(graphs, schema={"graph": pl.Int64, "kernels_per_replay": pl.Int64,
                                               "mapped_per_replay": pl.Int64, "source": pl.String,
                                               "candidates": pl.Int64})
    return CaptureMapping(capture_name=capture.source_name, kernels=kernels, ops=ops, graphs=graph_frame)


def _mapped_kernels(launches: pl.DataFrame, sigs: pl.DataFrame, cap: pl.DataFrame,
                    picks: list[pl.DataFrame]) -> pl.DataFrame:
    """Replayed GPU events joined to the capture launch their position matched (`_KERNELS_SCHEMA`).

    The k-th replay of a graph (in time order) takes the k-th of its equally good candidates."""
    if not picks:
        return pl.DataFrame(schema=_KERNELS_SCHEMA)
    rep = (replayed(launches).filter(pl.col("ts_ns").is_not_null()).sort("correlation", "stream", "ts_ns")
           .with_columns(pos=pl.int_range(pl.len(), dtype=pl.Int64).over("correlation"))
           .select("gpu_event_id", "correlation", "pos"))
    order = sigs.with_columns(k=pl.int_range(pl.len(), dtype=pl.Int64).over("graph", order_by="launch_ts_ns"))
    chosen = pl.concat(picks).filter(pl.col("cap_row").is_not_null())
    launch_rows = cap.with_row_index("cap_row").select(pl.col("cap_row").cast(pl.Int64),
                                                       capture_launch_event_id="event_id",
                                                       capture_op_event_id="op_event_id")
    return (
        rep.join(order.select("correlation", "graph", "k"), on="correlation")
        .join(chosen, on=["graph", "pos"])
        .filter(pl.col("k") % pl.col("choices") == pl.col("choice"))
        .join(launch_rows, on="cap_row")
        .select(list(_KERNELS_SCHEMA))
    )


def _virtual_ops(capture: Trace, cap: pl.DataFrame, kernels: pl.DataFrame, launches: pl.DataFrame,
                 first_event_id: int) -> pl.DataFrame:
    """`GRAPH_OPS_SCHEMA` rows: per replay, the capture ops its kernels map to and their ancestors that enclose
    no launch outside the replay's matched launches (`_keep_ancestors`), placed at the replay's launch (same
    offsets as at capture) on a thread of their own."""
    if kernels.height == 0:
        return pl.DataFrame(schema=GRAPH_OPS_SCHEMA)
    cpu = sort_for_nesting(capture.cpu_ops.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
                           .select("event_id", "name", "pid", "tid", "ts_ns", "dur_ns", "input_dims", "input_types",
                                   "concrete_inputs", "input_strides", "flops").collect(engine="in-memory"))
    parent, _ = parent_index(cpu)
    per_replay = kernels.group_by("correlation").agg(
        ops=pl.col("capture_op_event_id").drop_nulls().unique(), calls=pl.col("capture_launch_event_id"))
    row_of = {e: i for i, e in enumerate(cpu["event_id"].to_list())}
    wanted: dict[int, list[int]] = {}
    memo: dict[tuple[int, ...], list[int]] = {}  # replays of one graph from one candidate share their ops
    for corr, ops, calls in per_replay.iter_rows():
        key = tuple(sorted(calls))
        if key not in memo:
            memo[key] = _keep_ancestors(cpu, parent, row_of, ops, calls, cap)
        wanted[corr] = memo[key]
    pairs = pl.DataFrame({"replay_correlation": list(wanted), "capture_event_id": list(wanted.values())},
                         schema={"replay_correlation": pl.Int64, "capture_event_id": pl.List(pl.Int64)}
                         ).explode("capture_event_id").drop_nulls()
    launch = replayed(launches).group_by("correlation").agg(launch_ts=pl.col("launch_ts_ns").min(),
                                                           launch_pid=pl.col("launch_pid").first())
    rows = (pairs.join(cpu.rename({"event_id": "capture_event_id"}), on="capture_event_id")
            .join(launch, left_on="replay_correlation", right_on="correlation", how="left", maintain_order="left")
            .with_columns(anchor=pl.col("ts_ns").min().over("replay_correlation"))
            .sort("replay_correlation", "ts_ns", "capture_event_id"))
    return rows.with_row_index("_i").select(
        event_id=pl.col("_i").cast(pl.Int64) + first_event_id, name="name", kind=pl.lit(Kind.CPU_OP.value),
        pid=pl.col("launch_pid").cast(pl.String),
        tid=pl.format("graph replay {}", pl.col("replay_correlation")),
        ts_ns=pl.col("launch_ts").fill_null(0) + pl.col("ts_ns") - pl.col("anchor"), dur_ns="dur_ns",
        input_dims="input_dims", input_types="input_types", concrete_inputs="concrete_inputs",
        input_strides="input_strides", flops="flops",
        capture_event_id="capture_event_id", replay_correlation="replay_correlation",
    ).cast(GRAPH_OPS_SCHEMA)  # type: ignore[arg-type]


def _keep_ancestors(cpu: pl.DataFrame, parent: np.ndarray[Any, Any], row_of: dict[int, int], ops: list[int],
                    calls: list[int], cap: pl.DataFrame) -> list[int]:
    """The launching ops plus each ancestor that encloses no launch call outside [first, last] matched call of
    its thread (and stays inside the capture segment): `vllm::rocm_unquantized_gemm` around `aten::addmm` is
    kept, the model's forward around the whole capture is not."""
    matched = cap.filter(pl.col("event_id").is_in(calls))
    lo_ts, hi_ts = int(matched["ts_ns"].min()), int(matched["ts_ns"].max())  # type: ignore[arg-type]
    thread = cap.filter((pl.col("pid") == matched["pid"][0]) & (pl.col("tid") == matched["tid"][0]))["ts_ns"]
    before, after = thread.filter(thread < lo_ts), thread.filter(thread > hi_ts)
    lo = int(before.max()) if before.len() else -(2**62)  # type: ignore[arg-type]
    hi = int(after.min()) if after.len() else 2**62  # type: ignore[arg-type]
    if matched["seg_begin_ns"][0] is not None:
        lo, hi = max(lo, int(matched["seg_begin_ns"][0])), min(hi, int(matched["seg_end_ns"][0]))
    ts, end = cpu["ts_ns"].to_numpy(), (cpu["ts_ns"] + cpu["dur_ns"]).to_numpy()
    keep: set[int] = set()
    for op in ops:
        r = row_of.get(op)
        while r is not None and r >= 0 and r not in keep:
            if op != cpu["event_id"][r] and not (ts[r] > lo and end[r] < hi):
                break
            keep.add(r)
            r = int(parent[r])
    return [int(cpu["event_id"][r]) for r in sorted(keep)]
