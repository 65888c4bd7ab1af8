"""`stepscope whatif`: re-time a trace's dependency graph under changes and predict the step times.

The graph (`depgraph`) replayed with its measured weights reproduces the measured steps (the residual is
reported: it is 0 unless clock skew made edges run backwards, which are dropped). A change rewrites some
weights, and the same replay gives each node its new time; the predicted step is the measured rule applied to
the new times (a step ends at the later of its CPU end and its last GPU work's end, `depgraph.step_times`).

Changes (any together):

    no_data_loading      CPU time inside DataLoader __next__ costs nothing (the data is ready)
    speedups             GPU events of a kernel category (`kernels.KernelCategory` value: gemm, attention, …) or
                         whose name matches a regex run FACTOR times faster
    launch_overhead_ns   every launch call (cudaLaunchKernel, cudaMemcpyAsync, …) costs this much CPU time, and its
                         GPU work can start this long after the call starts (0 is about what CUDA graphs give)
    no_sync              blocking calls (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
                         synchronous copies, the syncs under .item()) neither wait for the GPU nor cost CPU time
    pinned               pageable host copies become pinned: they run at the bandwidth the trace's pinned copies of
                         the same direction reached (twice as fast where it has none), their calls (which staged
                         the data) cost what the trace's calls of pinned copies cost (else its launch calls'
                         median), and a DtoH copy no longer blocks its cudaMemcpyAsync
    overlap_comm         communication (NCCL/RCCL kernels; in a run also a CPU backend's collectives) delays nothing
                         but the step's end: the edges out of a collective's end are dropped (stream order after it,
                         cross-stream waits and host syncs on it, a main thread waiting for a gloo collective),
                         while the collective itself still starts when it was issued and, in a run, still ends no
                         earlier than the last rank's arrival plus its latency; the step still ends after it
    rank                 (a run, `run_graph`) apply the changes above to this rank only, e.g. `rank=1,
                         no_data_loading` asks "what if rank 1 did not wait for its data" (a straggler late from
                         data loading; a host delay of its own, work only that rank does, has no change to remove it)

    rank 0: compute 0-50, all_reduce 50-70 (NCCL stream), compute 70-90 waits for it (stream wait event)
    --overlap-comm  ->  the second compute runs 50-70, the all_reduce still ends at 70: predicted 70 instead of 90

    step 10 ms: CPU 0-4 ms launches, GEMMs 4-9 ms back to back, sync until 10 ms
    --speedup gemm=2  ->  GEMMs take 2.5 ms, the sync returns at 7.5 ms: predicted 7.5 ms, saving 2.5 ms (25%)

What does not move: a node whose cause the trace does not record keeps its measured time (e.g. GPU work with
no launch in the trace), and work is never reordered. No node ever moves later for a speed-up, but one step's
saving can be negative: where the step before it now ends earlier, its window starts earlier too (a step
starts where the previous one ended, if later than its CPU start) while its own end may not move. The mean
over the steps is the run's saving.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from stepscope.analyze._text import duration, plural
from stepscope.analyze.blame import host_memory_unsaid
from stepscope.analyze.critical_path import attribution, path_segments
from stepscope.analyze.depgraph import (
    NO_STEPS,
    NO_STEPS_NOTE,
    DependencyGraph,
    EdgeType,
    build_graph,
    held_ns,
    replay,
    step_times,
)
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.kernels import KernelCategory
from stepscope.errors import UsageError

#: how much faster a pageable copy runs pinned where the trace has no pinned copy of that direction to measure
PINNED_SPEEDUP = 2.0
CATEGORIES = tuple(c.value for c in KernelCategory)


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """The changes to replay (see the module docstring). No change: the replay of the measured graph."""

    no_data_loading: bool = False
    speedups: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    launch_overhead_ns: int | None = None
    no_sync: bool = False
    pinned: bool = False
    overlap_comm: bool = False
    rank: int | None = None

    def describe(self) -> list[str]:
        """One line per change, as the command line would say it."""
        out = [f"--rank {self.rank}"] if self.rank is not None else []
        out += ["--no-data-loading"] if self.no_data_loading else []
        out += [f"--speedup {target}={factor:g}" for target, factor in self.speedups]
        if self.launch_overhead_ns is not None:
            out.append(f"--launch-overhead {self.launch_overhead_ns / 1000:g}us")
        out += ["--no-sync"] if self.no_sync else []
        out += ["--pinned"] if self.pinned else []
        out += ["--overlap-comm"] if self.overlap_comm else []
        return out

    def changes_anything(self) -> bool:
        """Whether a weight may move (a rank alone changes nothing)."""
        return bool(self.no_data_loading or self.speedups or self.launch_overhead_ns is not None or self.no_sync
                    or self.pinned or self.overlap_comm)


def parse_speedup(text: str) -> tuple[str, float]:
    """`CATEGORY=FACTOR` or `REGEX=FACTOR` -> (target, factor); a UsageError that says the form otherwise.

        "gemm=2"  -> ("gemm", 2.0)        "flash.*fwd=1.5" -> ("flash.*fwd", 1.5)
    """
    target, sep, factor_text = text.rpartition("=")
    try:
        factor = float(factor_text)
    except ValueError:
        factor = float("nan")
    if not sep or not target or not factor > 0 or factor == float("inf"):
        raise UsageError(f"--speedup {text!r}: expected CATEGORY=FACTOR or REGEX=FACTOR with FACTOR > 0 "
                         f"(e.g. gemm=2; categories: {', '.join(CATEGORIES)})")
    if target not in CATEGORIES:
        try:
            re.compile(target)
        except re.error as exc:
            raise UsageError(f"--speedup {text!r}: {target!r} is neither a kernel category ({', '.join(CATEGORIES)}) "
                             f"nor a valid regex ({exc})") from None
    return target, factor


@dataclass(frozen=True, kw_only=True)
class WhatIfResult:
    """Measured and predicted step times and the saving; the critical path's split before and after.

    `steps`: step, measured_ns (the step window's wall time), replay_ns (the graph replayed unchanged),
    predicted_ns (with the changes), saving_ns, saving_fraction. `path`: kind, category, measured_ns and
    predicted_ns (mean per step on the critical path). `replay_residual_fraction`: the largest
    |replay - measured| / measured over the steps (a replay with no change must reproduce the trace).
    """

    window_kind: str
    changes: list[str]
    steps_found: int
    measured_mean_ns: float | None
    predicted_mean_ns: float | None
    saving_ns: float | None
    saving_fraction: float | None
    replay_residual_fraction: float | None
    bound_by_measured: str | None
    bound_by_predicted: str | None
    notes: list[str]
    steps: pl.DataFrame
    path: pl.DataFrame


def _weights(graph: DependencyGraph, change: WhatIf) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The edges' weights and enabled mask under `change`, and notes on assumptions made."""
    e = graph.edges
    measured = graph.measured_weights()
    w = measured.astype(np.float64)
    enabled = np.ones(e.height, dtype=bool)
    notes: list[str] = []
    etype = e["type"]  # (tested in polars: as a numpy array it would be an object per edge)
    # the edges a change may touch: every edge, or a run's edges of one rank
    scope = np.ones(e.height, dtype=bool) if change.rank is None or "rank" not in e.columns else \
        (e["rank"] == change.rank).fill_null(False).to_numpy()
    cpu = (etype == EdgeType.CPU.value).to_numpy() & scope
    # a collective's transfer counts as its GPU work: speeding communication up shortens both
    gpu = etype.is_in((EdgeType.GPU.value, EdgeType.COLLECTIVE.value)).to_numpy() & scope
    if change.no_data_loading:
        w[cpu & e["data_loading"].fill_null(False).to_numpy()] = 0
    for target, factor in change.speedups:
        hit = (e["category"] == target) if target in CATEGORIES else e["name"].str.contains(target)
        chosen = gpu & hit.fill_null(False).to_numpy()
        if not chosen.any():
            notes.append(f"--speedup {target}: no GPU work in the steps matches it")
        w[chosen] /= factor
    if change.launch_overhead_ns is not None:
        fixed = float(change.launch_overhead_ns)
        calls = cpu & e["launch_call"].fill_null(False).to_numpy()
        call_dur = e["call_dur_ns"].fill_null(0).to_numpy().astype(np.float64)
        share = np.divide(w, call_dur, out=np.ones_like(w), where=call_dur > 0)  # a call's slices share its cost
        w[calls] = fixed * np.minimum(share[calls], 1.0)
        launches = (etype == EdgeType.LAUNCH.value).to_numpy() & scope
        w[launches] = fixed + held_ns(e, measured)[launches]  # what held a start still does
    sync = (etype == EdgeType.SYNC.value).to_numpy() & scope
    if change.no_sync:
        enabled[sync] = False
        w[cpu & e["sync_call"].fill_null(False).to_numpy()] = 0
    if change.pinned:
        w, enabled = _pinned(graph, w, enabled, notes, scope)
    if change.overlap_comm:
        enabled &= ~_after_comm(graph, scope, notes)
    return np.rint(w).astype(np.int64), enabled, notes


def _after_comm(graph: DependencyGraph, scope: np.ndarray, notes: list[str]) -> np.ndarray:
    """The edges out of the end of a communication event in `scope` (`overlap_comm`): stream order after it,
    cross-stream waits and syncs on it, a thread waiting for it. Its start -> end and the step's end stay."""
    e = graph.edges
    comm = ((e["type"] == EdgeType.GPU.value) & (e["category"] == KernelCategory.COMMUNICATION.value)
            ).fill_null(False).to_numpy() & scope
    if not comm.any():
        notes.append("--overlap-comm: no communication kernel (or, in a run, collective) in the steps")
        return np.zeros(e.height, dtype=bool)
    ends = np.zeros(graph.nodes.height, dtype=bool)
    ends[e["dst"].to_numpy()[comm]] = True
    after: np.ndarray = ends[e["src"].to_numpy()]
    return after


def _pinned(graph: DependencyGraph, w: np.ndarray, enabled: np.ndarray, notes: list[str], scope: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Pageable copies at the pinned bandwidth of their direction (measured over every rank of a run), their
    calls at a pinned copy's call time; DtoH copies no longer block an async call (in `scope`)."""
    e = graph.edges.with_row_index("_i").with_columns(_scope=pl.Series(scope))
    copies = e.filter((pl.col("type") == EdgeType.GPU.value) & pl.col("direction").is_not_null())
    pinned_bw = (copies.filter(~pl.col("pageable").fill_null(False) & (pl.col("copy_bytes") > 0)
                               & (pl.col("natural_ns") > 0))
                 .group_by("direction").agg(bw=pl.col("copy_bytes").sum() / pl.col("natural_ns").sum()))
    pageable = copies.filter(pl.col("pageable").fill_null(False) & pl.col("_scope")).join(
        pinned_bw, on="direction", how="left", maintain_order="left")
    unsaid = copies.filter(host_memory_unsaid(pl.col("name")) & pl.col("_scope")).height
    if unsaid:
        notes.append(f"--pinned: {unsaid:,} host {'copy' if unsaid == 1 else 'copies'} whose name does not say "
                     "pageable or pinned (AMD's names) left as recorded")
    if pageable.height == 0:
        if not unsaid:
            notes.append("--pinned: the steps hold no pageable copy")
        return w, enabled
    for direction in pageable.filter(pl.col("bw").is_null())["direction"].unique().sort():
        notes.append(f"--pinned: no pinned {direction} copy in the trace to measure; assumed {PINNED_SPEEDUP:g}x "
                     "faster")
    new = pageable.select("_i", dur=pl.when(pl.col("bw").is_not_null() & (pl.col("copy_bytes") > 0))
                          .then(pl.min_horizontal(pl.col("copy_bytes") / pl.col("bw"), pl.col("natural_ns")))
                          .otherwise(pl.col("natural_ns") / PINNED_SPEEDUP))
    rows = new["_i"].to_numpy()
    w[rows] = np.minimum(w[rows], new["dur"].to_numpy())
    # the call itself: from pageable memory it stages the data through a pinned buffer and returns when it is
    # copied (resnet50's 19 MB HtoD: 2 ms in cudaMemcpyAsync), from pinned memory it only queues the copy; it costs
    # what the trace's calls of pinned copies cost (their median), else its launch calls' median
    launch = e.filter(pl.col("type") == EdgeType.LAUNCH.value)
    into = launch.join(copies.select(dst="src", staged=pl.col("pageable").fill_null(False)), on="dst")
    pinned_calls = into.filter(~pl.col("staged"))["call_dur_ns"].drop_nulls()
    typical = pinned_calls.median() if pinned_calls.len() else launch["call_dur_ns"].drop_nulls().median()
    staged = into.filter(pl.col("staged")).join(pageable.select(dst="src"), on="dst", how="semi")["event_id"]
    if typical is not None and staged.len():
        calls = e.filter((pl.col("type") == EdgeType.CPU.value) & pl.col("event_id").is_in(staged.implode())
                         & pl.col("_scope"))["_i"].to_numpy()
        w[calls] = np.minimum(w[calls], int(typical))  # type: ignore[arg-type]
        # and its copy no longer waits for the staging to start: the typical launch latency, where the trace has one
        queued = e.filter((pl.col("type") == EdgeType.LAUNCH.value) & pl.col("event_id").is_in(staged.implode())
                          & pl.col("_scope") & (pl.col("natural_ns") > 0)).select("_i", "natural_ns")
        rows = queued["_i"].to_numpy()
        w[rows] = np.minimum(w[rows], queued["natural_ns"].to_numpy())
    ends = pageable.filter(pl.col("direction") == "DtoH")["dst"].implode()
    unblock = e.filter((pl.col("type") == EdgeType.SYNC.value) & pl.col("src").is_in(ends) & pl.col("_scope")
                       & pl.col("name").str.contains("(?i)async"))["_i"].to_numpy()
    enabled[unblock] = False
    return w, enabled


def what_if(source: Source, change: WhatIf, *, annotation: str | None = None,
            graph: DependencyGraph | None = None) -> WhatIfResult:
    """Measured, replayed and predicted step times under `change` (see the module docstring); `annotation`: the
    instances of this annotation are the steps (`depgraph.build_graph`)."""
    if change.rank is not None:
        raise UsageError("--rank picks one rank of a run; this is one trace (pass the run's directory)")
    frames = frames_of(source)
    graph = graph if graph is not None else build_graph(frames, annotation=annotation)
    return what_if_graph(graph, change)


def what_if_graph(graph: DependencyGraph, change: WhatIf, *, notes: Sequence[str] = (),
                  noted_edges: int = 0) -> WhatIfResult:
    """`what_if` over a graph already built (one trace's, or a run's: `run_graph`); `notes` come first, and
    already count `noted_edges` of the graph's dropped edges (a run's collective edges), which the note on
    dropped edges leaves out (trace_filter once said "5 … dropped" twice, of the same 5 edges)."""
    measured_w = graph.measured_weights()
    base = replay(graph, measured_w)
    weights, enabled, change_notes = _weights(graph, change)
    after = replay(graph, weights, enabled=enabled)
    w = graph.windows
    if "rank" in w.columns:  # a run: step N from the earliest rank's start to the latest rank's end
        w = w.group_by("step").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort("start_ns", "step")
    measured = w.select("step", measured_ns=pl.col("end_ns") - pl.col("start_ns"))
    base_times, after_times = step_times(graph, base.t_ns), step_times(graph, after.t_ns)
    table = (
        measured.join(base_times.select("step", replay_ns="wall_ns"), on="step", how="left", maintain_order="left",
                      nulls_equal=True)
        .join(after_times.select("step", predicted_ns="wall_ns"), on="step", how="left", maintain_order="left",
              nulls_equal=True)
        .with_columns(saving_ns=pl.col("measured_ns") - pl.col("predicted_ns"))
        .with_columns(saving_fraction=pl.when(pl.col("measured_ns") > 0)
                      .then(pl.col("saving_ns") / pl.col("measured_ns")))
    )
    n = table.height
    before_path = path_segments(graph, base)
    after_path = path_segments(graph, after)
    path = _path_table(attribution(before_path, n), attribution(after_path, n))
    residual = (table.select(((pl.col("replay_ns") - pl.col("measured_ns")).abs() / pl.col("measured_ns")).max())
                .item() if n else None)
    mean_m = float(table["measured_ns"].mean()) if n else None  # type: ignore[arg-type]
    mean_p = float(table["predicted_ns"].mean()) if n else None  # type: ignore[arg-type]
    return WhatIfResult(
        window_kind=graph.window_kind,
        changes=change.describe() or ["(none: the measured graph replayed)"],
        steps_found=n,
        measured_mean_ns=mean_m,
        predicted_mean_ns=mean_p,
        saving_ns=mean_m - mean_p if mean_m is not None and mean_p is not None else None,
        saving_fraction=(mean_m - mean_p) / mean_m if mean_m and mean_p is not None else None,
        replay_residual_fraction=float(residual) if residual is not None else None,
        bound_by_measured=_bound_by(before_path),
        bound_by_predicted=_bound_by(after_path),
        notes=[*([NO_STEPS_NOTE] if graph.window_kind == NO_STEPS else []), *notes, *change_notes,
               *_moved_notes(table, base_times, after_times)]
        + ([f"{plural(unnoted, 'dependency edge')} ran backwards in time (clock skew) and "
            f"{'was' if unnoted == 1 else 'were'} dropped"]
           if (unnoted := graph.dropped_edges - noted_edges) > 0 else []),
        steps=table,
        path=path,
    )


def _moved_notes(table: pl.DataFrame, base_times: pl.DataFrame, after_times: pl.DataFrame) -> list[str]:
    """Why a step is predicted longer than measured where it is because it starts earlier: a step starts where the
    previous one ended when that is after its CPU start (the step-window rule), so the previous step's GPU work
    ending sooner lengthens it, the time moving between the two steps."""
    moved = (table.filter(pl.col("saving_ns") < 0)
             .join(base_times.select("step", was="start_ns"), on="step", nulls_equal=True)
             .join(after_times.select("step", now="start_ns"), on="step", nulls_equal=True)
             .filter(pl.col("now") < pl.col("was")).sort("saving_ns"))
    if not moved.height:
        return []
    top = moved.row(0, named=True)
    return [f"{plural(moved.height, 'step')} predicted longer than measured, as each now starts earlier "
            f"(step {top['step']}: {duration(-top['saving_ns'])} longer, starting {duration(top['was'] - top['now'])} "
            "earlier): a step starts where the previous one ended when that is after its own CPU start, so the "
            "previous step's GPU work ending sooner moves time into it; the mean counts that time once"]


def _bound_by(segments: pl.DataFrame) -> str | None:
    """The kind with the most time on the critical paths."""
    if segments.height == 0:
        return None
    top = segments.group_by("kind").agg(pl.col("dur_ns").sum()).sort("dur_ns", "kind", descending=[True, False])
    return str(top["kind"][0])


def _path_table(before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
    """kind, category, measured_ns, predicted_ns: the critical path's split per step before and after."""
    return (
        before.select("kind", "category", measured_ns="mean_ns")
        .join(after.select("kind", "category", predicted_ns="mean_ns"), on=["kind", "category"], how="full",
              coalesce=True, nulls_equal=True)
        .with_columns(pl.col("measured_ns", "predicted_ns").fill_null(0.0))
        .sort("measured_ns", "predicted_ns", descending=True)
    )


__all__ = ["PINNED_SPEEDUP", "WhatIf", "WhatIfResult", "parse_speedup", "what_if", "what_if_graph"]
