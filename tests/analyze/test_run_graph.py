"""The run's dependency graph (stepscope.analyze.run_graph): two synthetic ranks with known answers worked out by
hand in `critical_path_traces.late_rank_run`, the bundled gloo sample, and the real 8-rank dlrm set."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import critical_path_traces as cp
import numpy as np
import polars as pl
import pytest
from builders import load_events, slow_before_trace, write_trace

from stepscope.analyze.collectives import collectives
from stepscope.analyze.depgraph import ARRIVAL_LANE, DependencyGraph, EdgeType, build_graph, measured_weights
from stepscope.analyze.run_graph import RunGraph, load_run, run_critical_path, run_what_if
from stepscope.analyze.whatif import WhatIf, what_if
from stepscope.errors import UsageError

US = 1_000
SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "late_rank"


def write_run(directory: Path, late_by: str) -> Path:
    for rank in (0, 1):
        write_trace(directory, cp.late_rank_run(rank, late_by=late_by), f"rank{rank}.pt.trace.json")
    return directory


def graph_of(tmp_path: Path, late_by: str) -> RunGraph:
    return load_run(write_run(tmp_path / "run", late_by), cache_dir=tmp_path / "cache")


def predicted_us(run: RunGraph, change: WhatIf) -> int:
    result = run_what_if(run, change)
    assert result.replay_residual_fraction == 0.0
    return int(result.steps["predicted_ns"][0]) // US


@pytest.mark.parametrize("late_by", ["data_loading", "gemm"])
def test_no_change_replays_every_rank_and_the_run(tmp_path: Path, late_by: str) -> None:
    # GIVEN two ranks whose all_reduce rank 1 reaches late WHEN replayed unchanged THEN the step is measured exactly
    run = graph_of(tmp_path, late_by)
    assert run.ranks == (0, 1) and run.collectives_joined == 1 and run.graph.dropped_edges == 0
    # one all_reduce of two ranks: each end waits for the last arrival before it (2 edges); two arrival nodes, each
    # waiting for its rank's arrival, the second for the first too (3 edges)
    assert (run.graph.edge_counts()["collective"], run.graph.edge_counts()["arrival"]) == (2, 3)
    result = run_what_if(run, WhatIf())
    assert result.replay_residual_fraction == 0.0
    assert result.steps.select("measured_ns", "replay_ns", "predicted_ns").row(0) == (300 * US,) * 3


def test_the_path_crosses_to_the_late_rank_s_data_loading(tmp_path: Path) -> None:
    result = run_critical_path(graph_of(tmp_path, "data_loading"))
    seg = result.segments
    assert result.steps_found == 1 and result.rank_count == 2 and int(seg["dur_ns"].sum()) == 300 * US
    # the path ends on rank 0 (both end at 300; the lower rank first) and reaches rank 1 through the all_reduce
    assert seg["rank"][-1] == 0
    jump = seg.filter(pl.col("edge_type") == "collective").row(0, named=True)
    assert (jump["rank"], jump["name"], jump["kind"], jump["dur_ns"]) == (0, "wait for rank 1 (all_reduce)",
                                                                          "kernel", 20 * US)
    loading = seg.filter(pl.col("kind") == "data_loading").row(0, named=True)
    assert (loading["rank"], loading["start_ns"], loading["dur_ns"]) == (1, 1 * US, 100 * US)
    assert result.rank_path_share["1"] > 0.5


def test_what_if_rank_1_were_not_late(tmp_path: Path) -> None:
    run = graph_of(tmp_path, "data_loading")
    # rank 1 without its 100 µs of data loading arrives at 80: the all_reduce ends at 100 on both ranks, the syncs
    # at 105 and the steps 95 µs later, at 200
    assert predicted_us(run, WhatIf(rank=1, no_data_loading=True)) == 200
    assert predicted_us(run, WhatIf(no_data_loading=True)) == 200
    # the same change on rank 0 (which loads no data) saves nothing
    assert predicted_us(run, WhatIf(rank=0, no_data_loading=True)) == 300


def test_a_faster_gemm_on_the_late_rank(tmp_path: Path) -> None:
    run = graph_of(tmp_path, "gemm")
    # rank 1's GEMM 20-170 becomes 20-70: its all_reduce starts at 70 and ends 30 µs later, at 100, on both
    # ranks; the syncs return at 105 and the steps end 95 µs later
    assert predicted_us(run, WhatIf(rank=1, speedups=(("gemm", 3.0),))) == 200
    assert predicted_us(run, WhatIf(rank=0, speedups=(("gemm", 3.0),))) == 300
    path = run_critical_path(run).segments
    assert path.filter((pl.col("rank") == 1) & (pl.col("name") == "sgemm_128x64_nn"))["dur_ns"].to_list() == [150 * US]


def test_rank_must_be_one_of_the_run_s(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="the run's ranks are 0, 1"):
        run_what_if(graph_of(tmp_path, "gemm"), WhatIf(rank=5, no_sync=True))


def test_overlap_comm_on_one_trace(tmp_path: Path) -> None:
    # GIVEN a GEMM that waits for an all_reduce through an event WHEN communication overlaps THEN the GEMM runs
    # 20-50 and the step ends with the all_reduce, at 60 instead of 91
    result = what_if(load_events(tmp_path, cp.compute_waits_for_comm()), WhatIf(overlap_comm=True))
    assert result.replay_residual_fraction == 0.0
    assert result.steps.select("measured_ns", "predicted_ns").row(0) == (91 * US, 60 * US)
    assert result.changes == ["--overlap-comm"]
    none = what_if(load_events(tmp_path / "b", cp.gpu_bound()), WhatIf(overlap_comm=True))
    assert none.saving_ns == 0 and any("no communication kernel" in n for n in none.notes)


def test_work_that_starts_the_ns_its_wait_ends_keeps_the_edge(tmp_path: Path) -> None:
    # GIVEN the GEMM starting at the very ns the all_reduce it waits for ends (both GPU events, one time)
    trace = load_events(tmp_path, cp.compute_waits_for_comm(gap=0))
    graph = build_graph(trace)
    # THEN the cross-stream edge between them is kept (not dropped as running backwards), and the replay holds
    assert graph.dropped_edges == 0
    assert EdgeType.CROSS_STREAM.value in graph.edges["type"].to_list()
    result = what_if(trace, WhatIf(overlap_comm=True))
    assert result.replay_residual_fraction == 0.0
    assert result.steps.select("measured_ns", "predicted_ns").row(0) == (90 * US, 60 * US)


def test_overlap_comm_in_a_run_still_waits_for_the_last_rank(tmp_path: Path) -> None:
    # the syncs on the all_reduce were its only out-edges: dropped, each sync returns 5 µs after its start
    # (rank 0: 80, rank 1: 180) and its CPU ends 95 µs later (175, 275); the all_reduce still ends at 200 (rank 1
    # arrives at 180), so the step ends with rank 1's CPU at 275 (not 300)
    run = graph_of(tmp_path, "data_loading")
    assert predicted_us(run, WhatIf(overlap_comm=True)) == 275
    # with rank 1's loading gone too: the CPUs end at 175 and 175, the all_reduce (rank 1 arriving at 80) at 100
    assert predicted_us(run, WhatIf(overlap_comm=True, no_data_loading=True)) == 175


def test_one_trace_refuses_rank(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--rank"):
        what_if(load_events(tmp_path, cp.gpu_bound()), WhatIf(rank=1))


# ---------------------------------------------------------------------------------------------- real runs


def test_the_gloo_sample_s_path_runs_through_rank_1_s_sleep() -> None:
    if not SAMPLE.is_dir():
        pytest.skip("sample_traces/late_rank is not present")
    run = load_run(SAMPLE)
    assert run.source == "cpu" and run.collectives_joined == 12
    result = run_critical_path(run)
    assert result.steps_found == 3 and result.rank_path_share["1"] > 0.7
    # every step's path holds rank 1's untraced sleep (30 ms under its ProfilerStep) before the all-reduces
    sleeps = (result.segments.filter((pl.col("rank") == 1) & pl.col("name").str.starts_with("ProfilerStep")
                                     & (pl.col("dur_ns") > 25_000_000)).group_by("step").len())
    assert sleeps.height == 3
    assert run_what_if(run, WhatIf()).replay_residual_fraction == 0.0


def test_dlrm_8_ranks(corpus: Path) -> None:
    run = load_run(corpus / "traces" / "param" / "dlrm_kineto")
    assert len(run.ranks) == 8 and run.source == "kernel" and run.collectives_joined == 8
    assert not any("end together" in n for n in run.notes)  # its calls end together to 4 µs
    result = run_what_if(run, WhatIf())
    assert result.replay_residual_fraction is not None and result.replay_residual_fraction <= 0.01
    path = run_critical_path(run)
    assert path.steps_found == 1 and int(path.segments["dur_ns"].sum()) == int(result.steps["measured_ns"][0])
    # rank 4's 4.24 ms held start on stream 7 begins 2 µs after its all-to-all (SendRecv on stream 84) ends: its
    # cudaStreamWaitEvent carries no event id, so the path cannot link them, and a note says so
    assert any(n.startswith("1 held GPU start on the path began just after a collective") and "4.24 ms before "
               "at::native::CatArrayBatchedCopy (stream 7), 2 µs after ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t "
               "(stream 84) ended" in n for n in path.notes)
    overlapped = run_what_if(run, WhatIf(overlap_comm=True))
    assert overlapped.predicted_mean_ns is not None and overlapped.measured_mean_ns is not None
    assert overlapped.predicted_mean_ns <= overlapped.measured_mean_ns


def test_dropped_edges_are_noted_once(corpus: Path) -> None:
    # GIVEN two sampled ranks whose alignment leaves collective edges running backwards (hta/trace_filter)
    run = load_run(corpus / "traces" / "hta" / "trace_filter")
    # (the collectives joined are the calls both ranks ran, as comm matches them: not those one sampled rank lost)
    both = collectives(corpus / "traces" / "hta" / "trace_filter").calls.filter(pl.col("ranks") == 2).height
    assert run.collectives_joined == both == 6
    # and the run's graph carries comm's warning that the matched calls do not end together (160 ms residuals)
    comm_warning = next(w for w in collectives(corpus / "traces" / "hta" / "trace_filter").warnings
                        if "do not end together" in w)
    assert comm_warning in run.notes
    result = run_what_if(run, WhatIf())
    dropped = [n for n in result.notes if "ran backwards" in n]
    # THEN one note counts them, not a second one for the same edges as dependency edges
    assert run.noted_edges > 0 and run.graph.dropped_edges >= run.noted_edges
    assert len(dropped) == 1 + (run.graph.dropped_edges > run.noted_edges)
    assert dropped[0].startswith(f"{run.noted_edges} collective or comm-wait edge")


def test_a_path_that_starts_on_a_rank_that_began_the_step_late_says_so(corpus: Path) -> None:
    # GIVEN the dlrm run, whose ranks begin ProfilerStep#10 up to 7.5 ms apart, and whose path runs through rank 4
    # THEN the path's head is rank 4's lateness: from the earliest rank's step start to rank 4's (read from the JSON
    # here, on the run's aligned clocks), named as such rather than as a missing dependency
    import json

    directory = corpus / "traces" / "param" / "dlrm_kineto"
    run = load_run(directory)
    starts = {}
    for path in directory.glob("*.json"):
        doc = json.loads(path.read_text())
        step = next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == "ProfilerStep#10")
        # a step starts where its ProfilerStep does, or where the previous step's GPU work (launched before the
        # trace began: ranks 1 and 3 still run its optimizer kernels) ends, if later
        earlier = max((e["ts"] + e["dur"] for e in slow_before_trace(doc["traceEvents"])), default=step["ts"])
        rank = doc["distributedInfo"]["rank"]
        starts[rank] = round(max(step["ts"], earlier) * 1000) + run.offsets_ns[rank]
    head = run_critical_path(run).segments.row(0, named=True)
    assert (head["rank"], head["name"], head["kind"], head["start_ns"]) == (4, "(began the step late)", "idle", 0)
    assert head["dur_ns"] == starts[4] - min(starts.values()) > 0
    # a rank's unexplained head that is not its step's start keeps the plain name (one trace: no rank is late)
    one = run_critical_path(load_run(directory / "worker4_step_12.1694128201547.pt.trace.json"))
    assert "(began the step late)" not in one.segments["name"].to_list()


def test_a_large_run_s_graphs_built_by_workers_are_the_serial_ones(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a run of 16 ranks (worker processes build the ranks' graphs from PARALLEL_FROM traces on) THEN the run
    # graph and its critical path are those built one rank after another in this process
    import sys

    from stepscope.analyze import _comm_run

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from make_run import write_run as write_synthetic_run

    write_synthetic_run(tmp_path / "run", ranks=16, steps=2, ops=6, late=3)
    parallel = load_run(tmp_path / "run", cache_dir=tmp_path / "cache")
    monkeypatch.setattr(_comm_run, "usable_cores", lambda: 1)  # parallel_map runs the jobs here
    serial = load_run(tmp_path / "run", cache_dir=tmp_path / "cache")
    assert parallel.graph.nodes.equals(serial.graph.nodes) and parallel.graph.edges.equals(serial.graph.edges)
    assert parallel.graph.order.tolist() == serial.graph.order.tolist()
    assert run_critical_path(parallel).segments.equals(run_critical_path(serial).segments)


# ------------------------------------------------------------------- the arrival chain against every pair of ranks


def quadratic(run: RunGraph) -> RunGraph:
    """The run's graph as the obvious definition joins ranks: an edge from every rank q's arrival at a call to every
    other rank r's end of it, weighing the call's latency, named "wait for rank q (…)"; arrival nodes gone, the
    other edges, node order and measured-weight rule (depgraph.measured_weights) as they are."""
    g = run.graph
    edges = g.edges.drop("weight_ns")
    arrival = g.nodes.filter(pl.col("lane") == ARRIVAL_LANE)["node"]
    from_arrival = pl.col("src").is_in(arrival.implode())
    chain = edges.filter((pl.col("type") == EdgeType.ARRIVAL.value) & from_arrival)
    # a call's arrival nodes have consecutive ids, its chain starting at the one no chain edge leads to
    heads = arrival.filter(~arrival.is_in(chain["dst"].implode()))
    call = (pl.DataFrame({"node": arrival}).sort("node")
            .join_asof(pl.DataFrame({"node": heads, "call": heads}).sort("node"), on="node", strategy="backward"))
    entries = (edges.filter((pl.col("type") == EdgeType.ARRIVAL.value) & ~from_arrival)
               .join(call, left_on="dst", right_on="node").select("call", q="rank", q_src="src"))
    exits = edges.filter(pl.col("type") == EdgeType.COLLECTIVE.value).join(call, left_on="src", right_on="node")
    pairs = (exits.join(entries, on="call").filter(pl.col("q") != pl.col("rank"))
             .with_columns(src="q_src", name=pl.format("wait for rank {} ({})", "q", "name"))
             .select(edges.columns))
    others = edges.filter(~pl.col("type").is_in([EdgeType.ARRIVAL.value, EdgeType.COLLECTIVE.value]))
    all_edges = pl.concat([others, pairs])
    nodes = g.nodes.filter(pl.col("lane") != ARRIVAL_LANE)
    order = g.order[~np.isin(g.order, arrival.to_numpy())]
    position = np.empty(nodes.height, dtype=np.int64)
    position[order] = np.arange(nodes.height)
    forward = all_edges.filter(pl.Series(position[all_edges["src"].to_numpy()] < position[all_edges["dst"].to_numpy()]))
    t = nodes["t_ns"].to_numpy()
    graph = DependencyGraph(nodes=nodes, edges=forward.with_columns(weight_ns=measured_weights(forward, t)),
                            windows=g.windows, gpu_ends=g.gpu_ends, order=order, dropped_edges=g.dropped_edges,
                            window_kind=g.window_kind, launch_latency_ns=g.launch_latency_ns,
                            launch_samples=g.launch_samples)
    return dataclasses.replace(run, graph=graph)


CHANGES = [WhatIf(), WhatIf(no_data_loading=True), WhatIf(rank=1, speedups=(("communication", 2.0),)),
           WhatIf(overlap_comm=True), WhatIf(rank=0, speedups=(("gemm", 3.0),))]


def _same_answers(run: RunGraph) -> None:
    slow = quadratic(run)
    assert slow.graph.edge_counts()["collective"] > run.graph.edge_counts()["collective"] or len(run.ranks) <= 2
    assert run_critical_path(run).segments.equals(run_critical_path(slow).segments)
    for change in CHANGES:
        fast, reference = run_what_if(run, change), run_what_if(slow, change)
        assert fast.steps.equals(reference.steps), change
        assert fast.replay_residual_fraction == reference.replay_residual_fraction


@pytest.mark.parametrize("late_by", ["data_loading", "gemm"])
def test_the_arrival_chain_answers_as_every_pair_of_ranks_does(tmp_path: Path, late_by: str) -> None:
    # GIVEN a run WHEN its collectives join the ranks through arrival nodes (3n - 1 edges a call) THEN every path
    # (the names of its waits included) and every what-if are those of an edge from each rank's arrival to each
    # other rank's end (n (n - 1) edges)
    _same_answers(graph_of(tmp_path, late_by))


def test_the_arrival_chain_on_the_gloo_sample_and_a_synthetic_16_rank_run(tmp_path: Path) -> None:
    import sys

    if SAMPLE.is_dir():
        _same_answers(load_run(SAMPLE))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from make_run import write_run as write_synthetic_run

    write_synthetic_run(tmp_path / "run", ranks=16, steps=2, ops=6, late=3)
    run = load_run(tmp_path / "run", cache_dir=tmp_path / "cache")
    assert run.graph.edge_counts()["collective"] == 16 * run.collectives_joined
    _same_answers(run)


def test_the_arrival_chain_on_dlrm(corpus: Path) -> None:
    _same_answers(load_run(corpus / "traces" / "param" / "dlrm_kineto"))
