"""CUDA/HIP graph replays: which kernels a graph launch replayed, what they cost, and (given a profile of the
graph capture) which ops launched them.

A replayed kernel has no CPU op of its own: one `cudaGraphLaunch` / `hipGraphLaunch` call launched it (the
correlation id links the call and every kernel of the graph). `graph_replays` lists each launch with its
kernels, their GPU time and share, and the user's Python line that launched it (`blame.python_lines`), and
groups the launches per distinct graph (the kernel-name sequence per stream):

    hipGraphLaunch (corr 51863) at model_runner.py(412)  ->  15 kernels, 6.2 ms   } graph 2: 23 replays
    hipGraphLaunch (corr 51878) at model_runner.py(412)  ->  15 kernels, 6.2 ms   }

`with_graph_capture(run, capture)` maps each replayed kernel to the op that launched it at capture time
(`graph_capture.map_replays`) and returns the run's frames with those ops filled in (`GraphMappedFrames`):
`launches` names the op of every mapped kernel and `graph_ops` holds the ops (one row per op per replay, with
the capture's input shapes), so the op table, FLOPs and the roofline see them as they see eager ops.
`locate_capture` finds the capture profile in a run directory (`capture_traces/`, or a `*graph_capture*`
file beside the run's trace); a trace file's own folder counts as its run directory where it holds one capture
profile and no other trace (`inputs.capture_beside`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import polars as pl

from stepscope.analyze.blame import python_lines, short_name
from stepscope.analyze.frames import Source, TraceFrames, frames_of, ops_by_nesting
from stepscope.analyze.graph_capture import CaptureMapping, map_replays, replay_signatures, replayed
from stepscope.analyze.inputs import capture_beside, find_trace_files, is_capture_file
from stepscope.analyze.trace import Trace, load
from stepscope.errors import InputError


@dataclass(frozen=True, eq=False)
class GraphMappedFrames(TraceFrames):
    """A run's derived frames with its graph-replayed kernels attributed to the ops of a capture profile."""

    mapping: CaptureMapping

    @cached_property
    def launches(self) -> pl.DataFrame:
        """`TraceFrames.launches`, where each mapped replayed kernel's op_event_id / op_name is its capture op's
        row in `graph_ops` (the graph launch's own enclosing op, if any, only where no capture op matched)."""
        base = ops_by_nesting(self.trace, self.trace.launches().collect(engine="in-memory"))
        mapped = self.mapping.kernels.select("gpu_event_id", _op="op_event_id", _name="op_name")
        return (base.join(mapped, on="gpu_event_id", how="left", maintain_order="left")
                .with_columns(op_event_id=pl.coalesce("_op", "op_event_id"), op_name=pl.coalesce("_name", "op_name"))
                .drop("_op", "_name"))

    @property
    def graph_ops(self) -> pl.DataFrame:
        """The capture's ops, one row per op per replay (`frames.GRAPH_OPS_SCHEMA`)."""
        return self.mapping.ops


def with_graph_capture(source: Source, capture: Trace) -> GraphMappedFrames:
    """The frames of `source` (a graph-replayed run) with its replayed kernels mapped to the ops of `capture`
    (a profile of the graph capture)."""
    frames = frames_of(source)
    last = frames.trace.events.select(pl.col("event_id").max()).collect(engine="in-memory").item()
    mapping = map_replays(frames.launches, capture, first_event_id=int(last or 0) + 1)
    return GraphMappedFrames(trace=frames.trace, mapping=mapping)


# ----------------------------------------------------------------------------------------- finding a capture
@dataclass(frozen=True, kw_only=True)
class CaptureChoice:
    """What to analyse: the run's trace, the capture profile (None: none given or found), and whether the capture
    was found in the run directory rather than given."""

    trace: Path
    capture: Path | None
    found: bool


def locate_capture(path: Path, capture: Path | None = None) -> CaptureChoice:
    """The run's trace and its capture profile. A directory holding one trace plus capture profiles is
    the run's trace with the first capture profile (by name) unless `capture` names one; a trace file is itself
    with the one capture profile its folder holds (`inputs.capture_beside`), unless `capture` names one; anything
    else is `path` as given (the loader says what is wrong with it)."""
    if not path.is_dir():
        beside = capture_beside(path) if capture is None else None
        return CaptureChoice(trace=path, capture=beside or capture, found=beside is not None)
    try:
        files = find_trace_files([path])
    except InputError:  # no raw trace in it (a dataset, an ingested trace): not a run with a capture profile
        return CaptureChoice(trace=path, capture=capture, found=False)
    captures = [f for f in files if is_capture_file(f.relative_to(path))]
    given = {capture.resolve()} if capture is not None else set()
    runs = [f for f in files if f not in captures and f.resolve() not in given]
    if len(runs) != 1:
        return CaptureChoice(trace=path, capture=capture, found=False)
    if capture is not None or not captures:
        return CaptureChoice(trace=runs[0], capture=capture, found=False)
    return CaptureChoice(trace=runs[0], capture=captures[0], found=True)


def load_replayed(path: Path, capture: Path | None = None, *,
                  cache_dir: Path | None = None) -> tuple[TraceFrames, CaptureChoice]:
    """Open a run (a trace, or a run directory) with its capture profile where given or found
    (`locate_capture`): mapped frames with a capture, plain frames without."""
    choice = locate_capture(path, capture)
    trace = load(choice.trace, cache_dir=cache_dir)
    if choice.capture is None:
        return TraceFrames(trace), choice
    return with_graph_capture(trace, load(choice.capture, cache_dir=cache_dir)), choice


def capture_line(choice: CaptureChoice, frames: TraceFrames) -> str | None:
    """One line saying which capture profile maps the replayed kernels, and how many it mapped."""
    if choice.capture is None:
        return None
    how = " (found in the run directory)" if choice.found else ""
    total = replayed(frames.launches).height
    mapped = (frames.mapping.kernels["op_event_id"].is_not_null().sum()
              if isinstance(frames, GraphMappedFrames) else 0)
    return (f"graph capture: {choice.capture}{how}: {mapped:,} of {total:,} replayed kernels mapped to the ops "
            "that launched them")


# ------------------------------------------------------------------------------------------------- replays
@dataclass(frozen=True, kw_only=True)
class GraphsResult:
    """The graph launches of a trace and, with a capture profile, how many replayed kernels map to ops.

    `graphs`: graph, replays, kernels_per_replay, gpu_ns, gpu_share, mean_replay_ns, mapped_share (null without
    a capture), python (the user's line that launched its first replay), first_kernel, ops (the mapped ops,
    most GPU time first). `replays`: graph, correlation, offset_ns (the launch call's start since the trace's
    first event), kernels, gpu_ns, gpu_share, mapped (null without a capture), python, library (the library
    frame it went through, if any). `ops`: op_name, calls (per replay),
    kernels, gpu_ns, gpu_share (of all GPU time): the ops the capture maps replayed kernels to.
    Shares are of the summed duration of every GPU event of the trace.
    """

    graph_launches: int
    graph_count: int
    replayed_kernels: int
    replayed_gpu_ns: int
    replayed_gpu_share: float | None
    capture: str | None
    mapped_kernels: int | None
    mapped_share: float | None
    note: str
    graphs: pl.DataFrame
    replays: pl.DataFrame
    ops: pl.DataFrame


def graph_replays(source: Source) -> GraphsResult:
    """The graph launches of `source`, per launch and per distinct graph (module docstring); with mapped frames
    (`with_graph_capture`) also how many replayed kernels map to ops, and which ops."""
    frames = frames_of(source)
    launches = frames.launches
    mapping = frames.mapping if isinstance(frames, GraphMappedFrames) else None
    total = int(launches["dur_ns"].sum() or 0)
    rep = replayed(launches)
    mapped_ids = mapping.kernels.filter(pl.col("op_event_id").is_not_null())["gpu_event_id"] if mapping else None
    origin = frames.trace.meta.time.first_ns or 0  # offsets from the trace's first event (a launch call's start
    # comes before its kernels', so from the first GPU event they would read negative)
    replays = _replays(frames.trace, rep, replay_signatures(launches), mapped_ids, total, origin)
    n_mapped = int(replays["mapped"].sum()) if mapping is not None else None
    kernels = int(rep.height)
    gpu_ns = int(rep["dur_ns"].sum() or 0)
    return GraphsResult(
        graph_launches=replays.height, graph_count=int(replays["graph"].n_unique()), replayed_kernels=kernels,
        replayed_gpu_ns=gpu_ns, replayed_gpu_share=gpu_ns / total if total else None,
        capture=mapping.capture_name if mapping is not None else None, mapped_kernels=n_mapped,
        mapped_share=n_mapped / kernels if n_mapped is not None and kernels else None,
        note=_note(replays.height, kernels, mapping, n_mapped),
        graphs=_graphs(replays, rep, launches, mapping is not None, total),
        replays=replays, ops=_ops(rep, mapping, total),
    )


def _replays(trace: Trace, rep: pl.DataFrame, sigs: pl.DataFrame, mapped_ids: pl.Series | None,
             total: int, origin: int) -> pl.DataFrame:
    """One row per graph launch: its graph, kernels, GPU time and share, mapped kernels, Python line."""
    mapped = pl.col("gpu_event_id").is_in(mapped_ids.implode()) if mapped_ids is not None else pl.lit(None, pl.Boolean)
    per = (
        rep.with_columns(_mapped=mapped)
        .group_by("correlation")
        .agg(launch_ts_ns=pl.col("launch_ts_ns").min(), launch_pid=pl.col("launch_pid").first(),
             launch_tid=pl.col("launch_tid").first(), kernels=pl.len().cast(pl.Int64),
             gpu_ns=pl.col("dur_ns").sum(), mapped=pl.col("_mapped").sum().cast(pl.Int64) if mapped_ids is not None
             else pl.lit(None, pl.Int64))
        .join(sigs.select("correlation", "graph"), on="correlation", how="left", maintain_order="left")
        .sort("launch_ts_ns", "correlation")
    )
    points = per.select(pid=pl.col("launch_pid").fill_null(""), tid=pl.col("launch_tid").fill_null(""),
                        ts_ns="launch_ts_ns")
    user, library = python_lines(trace, points) if per.height else (pl.Series([], dtype=pl.String),) * 2
    return per.with_columns(python=user, library=library, offset_ns=pl.col("launch_ts_ns") - origin,
                            gpu_share=pl.col("gpu_ns") / total if total else pl.lit(None, pl.Float64)).select(
        "graph", "correlation", "offset_ns", "kernels", "gpu_ns", "gpu_share", "mapped", "python", "library")


def _graphs(replays: pl.DataFrame, rep: pl.DataFrame, launches: pl.DataFrame, mapped: bool,
            total: int) -> pl.DataFrame:
    """One row per distinct graph (replays summed), first replay's Python line and kernels, its mapped ops."""
    ends = rep.sort("ts_ns").group_by("correlation").agg(first_kernel=pl.col("name").first()).with_columns(
        first_kernel=short_name(pl.col("first_kernel")))
    ops = (rep.filter(pl.col("op_name").is_not_null())
           .join(replays.select("correlation", "graph"), on="correlation")
           .group_by("graph", "op_name").agg(ns=pl.col("dur_ns").sum())
           .sort("ns", "op_name", descending=[True, False])
           .group_by("graph", maintain_order=True).agg(ops=pl.col("op_name").str.join(", ")))
    return (
        replays.join(ends, on="correlation", how="left", maintain_order="left")
        .group_by("graph")
        .agg(replays=pl.len().cast(pl.Int64), kernels_per_replay=pl.col("kernels").first(),
             gpu_ns=pl.col("gpu_ns").sum(), mean_replay_ns=pl.col("gpu_ns").mean(),
             _kernels=pl.col("kernels").sum(), _mapped=pl.col("mapped").sum(),
             python=pl.col("python").first(), first_kernel=pl.col("first_kernel").first())
        .join(ops, on="graph", how="left", maintain_order="left")
        .with_columns(gpu_share=pl.col("gpu_ns") / total if total else pl.lit(None, pl.Float64),
                      mapped_share=(pl.col("_mapped") / pl.col("_kernels")) if mapped else pl.lit(None, pl.Float64))
        .sort("gpu_ns", "graph", descending=[True, False])
        .select("graph", "replays", "kernels_per_replay", "gpu_ns", "gpu_share", "mean_replay_ns", "mapped_share",
                "python", "first_kernel", "ops")
    )


def _ops(rep: pl.DataFrame, mapping: CaptureMapping | None, total: int) -> pl.DataFrame:
    """GPU time of the replayed kernels per op the capture maps them to (calls: one per op per replay)."""
    schema = {"op_name": pl.String, "calls": pl.Int64, "kernels": pl.Int64, "gpu_ns": pl.Int64,
              "gpu_share": pl.Float64}
    if mapping is None:
        return pl.DataFrame(schema=schema)
    return (
        rep.filter(pl.col("op_name").is_not_null())
        .group_by("op_name")
        .agg(calls=pl.col("op_event_id").n_unique().cast(pl.Int64), kernels=pl.len().cast(pl.Int64),
             gpu_ns=pl.col("dur_ns").sum())
        .with_columns(gpu_share=pl.col("gpu_ns") / total if total else pl.lit(None, pl.Float64))
        .sort("gpu_ns", "op_name", descending=[True, False])
        .select(list(schema))
    )


def _note(launches: int, kernels: int, mapping: CaptureMapping | None, mapped: int | None) -> str:
    """What the reader should know: no graphs, no capture to map them, or kernels the capture did not map."""
    if launches == 0:
        return "no CUDA/HIP graph launches in this trace"
    if mapping is None:
        return ("replayed kernels have no CPU op: pass a profile of the graph capture (--graph-capture FILE) to "
                "attribute them to the ops that launched them at capture time")
    if mapped is not None and mapped < kernels:
        missing = mapping.graphs.filter(pl.col("mapped_per_replay") < pl.col("kernels_per_replay")).height
        return (f"{kernels - mapped:,} replayed kernels (in {missing:,} of {mapping.graphs.height:,} graphs) match "
                f"no launch of the capture profile: is it the capture of this run?")
    return ""
