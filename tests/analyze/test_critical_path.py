"""Critical path (stepscope.analyze.critical_path) and the dependency graph under it (depgraph): exact paths on
traces built by hand, the replay against a slow obvious longest-path computation, and the HTA corpus."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import critical_path_traces as cp
import numpy as np
import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, step, trace
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze.critical_path import HELD_START, _walk_python, critical_path, walk_paths
from stepscope.analyze.depgraph import NO_STEPS_NOTE, DependencyGraph, EdgeType, build_graph, replay, step_times

US = 1_000


def segments(doc: dict[str, Any], tmp_path: Path) -> list[tuple[str, str, int, int]]:
    """(name, kind, start µs, duration µs) of the first step's critical path."""
    result = critical_path(load_events(tmp_path, doc))
    rows = result.segments.filter(pl.col("step") == result.segments["step"][0])
    return [(r["name"], r["kind"], r["start_ns"] // US, r["dur_ns"] // US) for r in rows.iter_rows(named=True)]


def slow_longest_times(graph: DependencyGraph, weights: np.ndarray) -> list[int]:
    """Node times by relaxing every edge until nothing changes (Bellman-Ford for longest paths on a DAG): each node
    the latest t(u) + w over its in-edges, nodes without in-edges at their measured time."""
    edges = list(zip(graph.edges["src"].to_list(), graph.edges["dst"].to_list(), weights.tolist(), strict=True))
    measured = graph.nodes["t_ns"].to_list()
    has_in = {d for _, d, _ in edges}
    t: list[float] = [measured[v] if v not in has_in else float("-inf") for v in range(len(measured))]
    changed = True
    while changed:
        changed = False
        for s, d, w in edges:
            if t[s] != float("-inf") and t[s] + w > t[d]:
                t[d] = t[s] + w
                changed = True
    return [int(x) for x in t]


# ------------------------------------------------------------------------------------------------ exact paths


def test_a_sync_serializes_the_cpu_behind_the_gemm(tmp_path: Path) -> None:
    # GIVEN a GEMM the CPU waits for in cudaDeviceSynchronize WHEN the path is walked THEN it runs through the
    # GEMM and back to the CPU through the sync (hand-computed in the builder's docstring)
    assert segments(cp.sync_serializes(), tmp_path) == [
        ("ProfilerStep#1", "cpu", 0, 10), ("aten::mm", "cpu", 10, 5),
        ("(launch latency)", "launch_overhead", 15, 15), ("sgemm_128x64_nn", "kernel", 30, 100),
        ("cudaDeviceSynchronize", "sync_wait", 130, 5), ("ProfilerStep#1", "cpu", 135, 5),
        ("aten::add", "cpu", 140, 5), ("cudaLaunchKernel", "launch_overhead", 145, 5), ("aten::add", "cpu", 150, 10),
        ("ProfilerStep#1", "cpu", 160, 40),
    ]


def test_two_streams_joined_by_an_event(tmp_path: Path) -> None:
    # the add on stream 20 waits (cudaStreamWaitEvent on the record after the conv) for the conv on stream 7
    assert segments(cp.two_streams(), tmp_path) == [
        ("ProfilerStep#1", "cpu", 0, 10), ("aten::conv2d", "cpu", 10, 2),
        ("(launch latency)", "launch_overhead", 12, 8), ("implicit_convolve_sgemm", "kernel", 20, 150),
        ("(stream wait)", "idle", 170, 1), ("vectorized_elementwise_kernel", "kernel", 171, 9),
        ("cudaDeviceSynchronize", "sync_wait", 180, 5), ("ProfilerStep#1", "cpu", 185, 115),
    ]
    graph = build_graph(load_events(tmp_path / "g", cp.two_streams()))
    assert graph.edge_counts()[EdgeType.CROSS_STREAM.value] == 1


def test_a_launch_bound_loop_has_the_cpu_as_its_path(tmp_path: Path) -> None:
    expected = [("ProfilerStep#1", "cpu", 0, 10)]
    for i in range(4):
        t = 10 + 16 * i
        expected += [("aten::add", "cpu", t, 2), ("cudaLaunchKernel", "launch_overhead", t + 2, 10),
                     ("aten::add", "cpu", t + 12, 3), ("ProfilerStep#1", "cpu", t + 15, 1)]
    expected += [("aten::add", "cpu", 74, 2), ("(launch latency)", "launch_overhead", 76, 12),
                 ("vectorized_elementwise_kernel", "kernel", 88, 2)]
    assert segments(cp.launch_bound(), tmp_path) == expected


def test_a_gpu_bound_loop_has_the_kernels_as_its_path(tmp_path: Path) -> None:
    assert segments(cp.gpu_bound(), tmp_path) == [
        ("ProfilerStep#1", "cpu", 0, 2), ("aten::mm", "cpu", 2, 1), ("(launch latency)", "launch_overhead", 3, 7),
        ("sgemm_0", "kernel", 10, 40), ("sgemm_1", "kernel", 50, 40), ("sgemm_2", "kernel", 90, 40),
        ("sgemm_3", "kernel", 130, 40), ("cudaStreamSynchronize", "sync_wait", 170, 5),
        ("ProfilerStep#1", "cpu", 175, 5),
    ]


def test_data_loading_and_a_pageable_copy_are_attributed(tmp_path: Path) -> None:
    assert ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "data_loading", 1, 30) in segments(
        cp.data_loading(), tmp_path / "a")
    assert segments(cp.pageable_copy(), tmp_path / "b") == [
        ("ProfilerStep#1", "cpu", 0, 5), ("(launch latency)", "launch_overhead", 5, 5),
        ("Memcpy HtoD (Pageable -> Device)", "copy", 10, 40), ("vectorized_elementwise_kernel", "kernel", 50, 10),
    ]


def test_a_graph_replay_s_overlapping_kernels_wait_for_what_ended_before_them(tmp_path: Path) -> None:
    # GIVEN one graph launch whose kernels overlap on their stream (k3 starts before k2 ends, after k1 did)
    # WHEN the path is walked THEN k3 waited for k1, not for its launch (the edge from k2's end would run backwards
    # and be dropped, leaving 45 µs of "launch latency"), and no edge is dropped
    assert segments(cp.graph_replay(), tmp_path) == [
        ("ProfilerStep#1", "cpu", 0, 5), ("replay", "cpu", 5, 5), ("(launch latency)", "launch_overhead", 10, 10),
        ("k1", "kernel", 20, 30), ("(stream gap)", "idle", 50, 5), ("k3", "kernel", 55, 15),
    ]
    graph = build_graph(load_events(tmp_path / "g", cp.graph_replay()))
    assert graph.dropped_edges == 0
    assert graph.edge_counts()[EdgeType.STREAM.value] == 1  # k1 -> k3 (k2 began before anything on it ended)


def test_a_start_held_long_after_its_launch_is_not_launch_overhead(tmp_path: Path) -> None:
    # GIVEN three launches that start 5 µs after their call, then one whose kernel starts 205 µs after it on an
    # idle stream THEN 5 µs of it is the launch's and the other 200 µs idle, held by something the trace does not
    # record, which a note says
    result = critical_path(load_events(tmp_path / "a", cp.held_start()))
    assert result.typical_launch_latency_ns == 5 * US
    assert [(r["name"], r["kind"], r["start_ns"] // US, r["dur_ns"] // US)
            for r in result.segments.iter_rows(named=True)][-4:] == [
        ("aten::mm", "cpu", 70, 2), ("(launch latency)", "launch_overhead", 72, 5),
        (HELD_START, "idle", 77, 200), ("sgemm", "kernel", 277, 13)]
    assert result.path_share["idle"] == pytest.approx(200 / 290)
    assert len(result.notes) == 1 and result.notes[0].startswith(
        "1 GPU start on the path came more than 10x the typical launch latency (320 µs without one) after its "
        "launch onto an idle stream (200 µs in all, the longest 200 µs)")
    # WHEN a collective on another stream of the GPU ended 2 µs before the held start THEN a note says it most
    # likely waited for it (an event wait the trace does not link); 100 µs before, nothing is said
    after = critical_path(load_events(tmp_path / "f", cp.held_start(comm_ends_before=2)))
    assert len(after.notes) == 2 and after.notes[1].startswith(
        "1 held GPU start on the path began just after a collective on another stream of its GPU ended (the longest, "
        "200 µs before sgemm (stream 7), 2 µs after ncclDevKernel_AllReduce_Sum_f32_RING_LL (stream 20) ended): "
        "most likely a wait for that collective")
    assert len(critical_path(load_events(tmp_path / "g", cp.held_start(comm_ends_before=100))).notes) == 1
    # up to ten typical latencies it is the launch's
    assert ("(launch latency)", "launch_overhead", 72, 40) in segments(cp.held_start(wait=40), tmp_path / "b")
    # a start before the launch call returned (a pageable copy staged inside its call) is all the launch's
    assert ("(launch latency)", "launch_overhead", 72, 205) in segments(cp.held_start(call=210), tmp_path / "e")
    # without a typical latency (one sample), the bound is 320 µs, and past it the launch owns its call's 2 µs
    assert segments(cp.held_start(wait=300, launches=0), tmp_path / "c")[-2:] == [
        ("(launch latency)", "launch_overhead", 72, 300), ("sgemm", "kernel", 372, 13)]
    assert segments(cp.held_start(wait=400, launches=0), tmp_path / "d")[-3:] == [
        ("(launch latency)", "launch_overhead", 72, 2), (HELD_START, "idle", 74, 398), ("sgemm", "kernel", 472, 13)]


def test_attribution_adds_up_to_the_step(tmp_path: Path) -> None:
    result = critical_path(load_events(tmp_path, cp.sync_serializes()))
    step = result.steps.row(0, named=True)
    assert step["wall_ns"] == 200 * US
    assert step["kernel_ns"] == 100 * US and step["sync_wait_ns"] == 5 * US
    assert step["launch_overhead_ns"] == 20 * US and step["cpu_ns"] == 75 * US
    assert sum(step[f"{k}_ns"] for k in ("cpu", "launch_overhead", "kernel", "copy", "sync_wait", "data_loading",
                                         "idle")) == step["wall_ns"]
    assert result.bound_by == "kernel"
    gemm = result.attribution.filter(pl.col("kind") == "kernel").row(0, named=True)
    assert gemm["category"] == "gemm" and gemm["mean_ns"] == 100 * US and gemm["step_share"] == pytest.approx(0.5)
    assert result.top.row(0, named=True)["name"] == "sgemm_128x64_nn"


# ------------------------------------------------------------------------------------- the replay and the graph


@pytest.mark.parametrize("build", [cp.sync_serializes, cp.two_streams, cp.launch_bound, cp.gpu_bound,
                                   cp.data_loading, cp.pageable_copy])
def test_the_replay_is_the_longest_path_under_any_weights(build: Any, tmp_path: Path) -> None:
    graph = build_graph(load_events(tmp_path, build()))
    measured = graph.measured_weights()
    timed = replay(graph, measured)
    assert timed.t_ns.tolist() == graph.nodes["t_ns"].to_list()  # measured weights reproduce every time
    rng = random.Random(7)
    for _ in range(5):
        weights = np.array([rng.randint(0, 50_000) for _ in measured], dtype=np.int64)
        assert replay(graph, weights).t_ns.tolist() == slow_longest_times(graph, weights)


@pytest.mark.parametrize("build", [cp.sync_serializes, cp.two_streams, cp.data_loading])
def test_the_compiled_replay_is_the_python_replay(build: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a graph, random weights and random disabled edges THEN the C walk (_scan.replay) sets every node to the
    # Python walk's time through the same in-edge; a time beyond int64 is replayed exactly in Python instead
    from stepscope.analyze import _columns, depgraph

    if not _columns.scanner_available():
        pytest.skip("the compiled scanner is not built here")
    graph = build_graph(load_events(tmp_path, build()))
    rng = random.Random(11)
    runs = []
    for _ in range(20):
        weights = np.array([rng.randint(-5, 50_000) for _ in range(graph.edges.height)], dtype=np.int64)
        enabled = np.array([rng.random() < 0.8 for _ in range(graph.edges.height)])
        runs.append((weights, enabled))
    compiled = [replay(graph, w, enabled=e) for w, e in runs]
    monkeypatch.setattr(depgraph, "_scan", None)
    python = [replay(graph, w, enabled=e) for w, e in runs]
    for c, p in zip(compiled, python, strict=True):
        assert c.t_ns.tolist() == p.t_ns.tolist() and c.via_edge.tolist() == p.via_edge.tolist()
    monkeypatch.undo()
    huge = np.full(graph.edges.height, 2**62, dtype=np.int64)  # two such edges in a row pass int64: refused in C
    with pytest.raises(OverflowError):  # ... and by numpy after Python's exact sum, never wrapped
        replay(graph, huge)


def test_step_times_follow_the_step_window_rule(tmp_path: Path) -> None:
    # the step's CPU span ends at 89 µs, its last kernel at 90: the window ends at 90 (window.step_windows)
    graph = build_graph(load_events(tmp_path, cp.launch_bound()))
    times = step_times(graph, replay(graph, graph.measured_weights()).t_ns).row(0, named=True)
    assert (times["step"], times["start_ns"], times["end_ns"], times["wall_ns"]) == (1, 0, 90 * US, 90 * US)


def test_a_cpu_only_trace_without_steps_is_one_cpu_path(tmp_path: Path) -> None:
    from builders import cpu_op, trace

    result = critical_path(load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5))))
    assert (result.window_kind, result.steps_found, result.bound_by) == ("trace (no steps)", 1, "cpu")
    assert result.segments.select("name", "dur_ns").rows() == [("aten::add", 5 * US)]
    # and it says that its one window is its work's span (summary's runs from the first event to the last)
    assert result.notes[0].startswith("no steps: the trace is one window (the 1 step found)")


# ------------------------------------------------------------------------------------------------- HTA corpus


def _corpus_trace(corpus: Path, name: str) -> Path:
    return next((corpus / "traces/hta/critical_path" / name).glob("*.json.gz"))


def _gpu_by_correlation(graph: DependencyGraph, trace: Any, correlation: int) -> tuple[int, int]:
    """(start node, end node) of the GPU event with that correlation."""
    gpu = graph.edges.filter(pl.col("type") == EdgeType.GPU.value)
    ids = trace.gpu.filter(pl.col("correlation") == correlation).select("event_id").collect()["event_id"]
    row = gpu.filter(pl.col("event_id").is_in(ids.implode())).row(0, named=True)
    return int(row["src"]), int(row["dst"])


def test_hta_event_sync_edges(corpus: Path) -> None:
    # HTA's test: the spin kernel ends -> cudaEventSynchronize ends, and -> cudaDeviceSynchronize
    from stepscope.analyze import load

    trace = load(_corpus_trace(corpus, "cuda_event_sync"))
    graph = build_graph(trace)
    _, spin_end = _gpu_by_correlation(graph, trace, 1526)
    syncs = graph.edges.filter((pl.col("type") == EdgeType.SYNC.value) & (pl.col("src") == spin_end))
    assert set(syncs["name"]) == {"cudaEventSynchronize", "cudaDeviceSynchronize"}
    result = critical_path(trace)
    path = result.segments["name"].to_list()
    assert "at::cuda::(anonymous namespace)::spin_kernel(long)" in path
    assert path[path.index("at::cuda::(anonymous namespace)::spin_kernel(long)") + 1] == "cudaEventSynchronize"
    assert result.steps["wall_ns"].to_list() == [3_154 * US]


def test_hta_multi_stream_event_wait(corpus: Path) -> None:
    # HTA's test: the record on stream 20 syncs back to kernel 1 (correlation 27), not kernel 2 on stream 28;
    # the memset on stream 24 (correlation 1411) waits for it
    from stepscope.analyze import load

    trace = load(_corpus_trace(corpus, "cuda_event_sync_multi_stream"))
    graph = build_graph(trace)
    _, kernel1_end = _gpu_by_correlation(graph, trace, 27)
    memset_start, _ = _gpu_by_correlation(graph, trace, 1411)
    cross = graph.edges.filter(pl.col("type") == EdgeType.CROSS_STREAM.value)
    assert cross.select("src", "dst").rows() == [(kernel1_end, memset_start)]


def test_hta_alexnet_gpu_to_gpu_sync(corpus: Path) -> None:
    # HTA's test: fft2d_c2r on stream 20 (correlation 5606) -> the elementwise kernel on stream 7 (5629)
    from stepscope.analyze import load

    trace = load(_corpus_trace(corpus, "alexnet"))
    graph = build_graph(trace)
    _, fft_end = _gpu_by_correlation(graph, trace, 5606)
    elementwise_start, _ = _gpu_by_correlation(graph, trace, 5629)
    cross = graph.edges.filter(pl.col("type") == EdgeType.CROSS_STREAM.value)
    assert (fft_end, elementwise_start) in cross.select("src", "dst").rows()


@pytest.mark.parametrize("name", ["alexnet", "simple_add", "cuda_event_sync", "cuda_event_sync_multi_stream"])
def test_corpus_paths_tile_their_windows(corpus: Path, name: str) -> None:
    from stepscope.analyze import load

    trace = load(_corpus_trace(corpus, name))
    result = critical_path(trace)
    graph = build_graph(trace)
    walls = step_times(graph, replay(graph, graph.measured_weights()).t_ns)["wall_ns"].to_list()
    assert result.steps["wall_ns"].to_list() == walls
    assert result.dropped_edges == 0
    per_step = result.segments.group_by("step").agg(pl.col("dur_ns").sum(), pl.col("seq").max())
    assert per_step["dur_ns"].to_list() == walls


def test_top_contributors_carry_the_users_python_line(tmp_path: Path) -> None:
    # GIVEN a with_stack capture WHEN the GEMM tops the path THEN its line is the frame around its launch
    from builders import python_fn

    doc = cp.sync_serializes()
    doc["traceEvents"] += [python_fn("train.py(3): main", 0, 200), python_fn("model.py(7): forward", 10, 20),
                           python_fn("torch/nn/modules/module.py(1501): _call_impl", 11, 18)]
    top = critical_path(load_events(tmp_path, doc)).top
    lines = dict(zip(top["name"], top["python"], strict=True))
    assert lines["sgemm_128x64_nn"] == "model.py(7): forward"
    assert lines["ProfilerStep*"] == "train.py(3): main"  # (every step's own time, one row)


def test_an_event_wait_without_sync_events_pairs_record_and_wait_on_the_thread(tmp_path: Path) -> None:
    # older traces have no cuda_sync events: the wait pairs with the thread's previous cudaEventRecord, whose
    # stream is the one launched on last (the conv's), and holds the thread's next launch on another stream
    doc = cp.two_streams()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_sync"]
    assert ("(stream wait)", "idle", 170, 1) in segments(doc, tmp_path)


def test_a_helper_thread_waits_for_the_main_thread(tmp_path: Path) -> None:
    # the autograd thread (tid 2) starts MmBackward0 at 40 while the main thread is in backward() since 30
    doc = trace(step(1, ts=0, dur=100), cpu_op("torch::autograd::backward", ts=30, dur=65),
                cpu_op("MmBackward0", ts=40, dur=20, tid=2, external_id=1),
                runtime("cudaLaunchKernel", ts=45, dur=5, correlation=1, external_id=1, tid=2),
                kernel("sgemm_nt", ts=50, dur=100, correlation=1))
    assert segments(doc, tmp_path) == [
        ("ProfilerStep#1", "cpu", 0, 30), ("(thread wait)", "idle", 30, 10), ("MmBackward0", "cpu", 40, 5),
        ("(launch latency)", "launch_overhead", 45, 5), ("sgemm_nt", "kernel", 50, 100),
    ]


def test_the_main_thread_waits_for_the_autograd_thread_to_run_backward(tmp_path: Path) -> None:
    """loss.backward() returns when the autograd thread has run the backward: the main thread's time inside no op
    of its own while that thread works is a wait (item_in_forward_cuda once had 49.5% of its path in
    `ProfilerStep*`, the backward's own ops and launches nowhere on it)."""
    # GIVEN the main thread in its step with no op from 10 to 80 (loss.backward(), recorded as no op), the autograd
    # thread (tid 2) running MmBackward0 15-70 with its launch, then the main thread's optimizer op 80-95
    doc = trace(step(1, ts=0, dur=100), cpu_op("aten::mse_loss", ts=2, dur=8),
                cpu_op("autograd::engine::evaluate_function: MmBackward0", ts=15, dur=55, tid=2),
                cpu_op("MmBackward0", ts=16, dur=50, tid=2, external_id=1),
                runtime("cudaLaunchKernel", ts=20, dur=40, correlation=1, external_id=1, tid=2),
                kernel("sgemm_nt", ts=62, dur=5, correlation=1),
                cpu_op("Optimizer.step#SGD.step", ts=80, dur=15))
    got = segments(doc, tmp_path)
    # THEN the path runs through the autograd thread's launch and joins the main thread where backward returns:
    # the launch is on it, and the step's own untraced time is only its Python around the ops, not the wait
    assert ("cudaLaunchKernel", "launch_overhead", 20, 40) in got
    assert ("(thread join)", "cpu", 70, 10) in got
    assert sum(d for name, kind, _s, d in got if name == "ProfilerStep#1") == 2 + 5


def test_an_annotation_s_instances_can_be_the_steps(tmp_path: Path) -> None:
    # GIVEN a "forward" annotation around aten::mm (9-31 µs) WHEN it is the step THEN its window runs to the end
    # of the GEMM it launched (130) and the path is the annotation's own time, the op, the launch and the GEMM
    from builders import annotation

    from stepscope.errors import UsageError

    doc = cp.sync_serializes()
    doc["traceEvents"].append(annotation("forward", ts=9, dur=22))
    trace = load_events(tmp_path, doc)
    result = critical_path(trace, annotation="^forward$")
    assert result.window_kind == "annotation ^forward$" and result.steps["step"].to_list() == [0]
    rows = result.segments.select("name", "kind", "start_ns", "dur_ns").rows()
    assert rows == [("forward", "cpu", 0, 1 * US), ("aten::mm", "cpu", 1 * US, 5 * US),
                    ("(launch latency)", "launch_overhead", 6 * US, 15 * US),
                    ("sgemm_128x64_nn", "kernel", 21 * US, 100 * US)]
    with pytest.raises(UsageError, match="no annotation or op"):
        critical_path(trace, annotation="backward")


def _simulated(ops: list[tuple[int, int, int, int, bool, int]]) -> dict[str, Any]:
    """A loop simulated the way a GPU runs it: each op (cpu µs, launch µs, kernel µs, stream bit, sync after,
    delay µs) launches one kernel, which starts 5 µs after its launch or when its stream is free, whichever is
    later, plus the delay (the GPU's own jitter); a sync waits for every kernel launched so far and returns 2 µs
    after the last one ends."""
    events: list[dict[str, Any]] = []
    t, free, corr = 1, {7: 0, 20: 0}, 0
    for cpu, launch, dur, stream_bit, sync, delay in ops:
        corr += 1
        stream = 20 if stream_bit else 7
        events += [cpu_op("aten::op", ts=t, dur=cpu + launch + 1, external_id=corr),
                   runtime("cudaLaunchKernel", ts=t + cpu, dur=launch, correlation=corr, external_id=corr)]
        start = max(t + cpu + 5, free[stream]) + delay
        free[stream] = start + dur
        events.append(kernel(f"gemm_{corr}", ts=start, dur=dur, correlation=corr, stream=stream))
        t += cpu + launch + 1
        if sync:
            end = max(t + 1, max(free.values()) + 2)
            events.append(runtime("cudaDeviceSynchronize", ts=t, dur=end - t, correlation=10_000 + corr))
            t = end
    return trace(step(1, ts=0, dur=t + 1), *events)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10), st.integers(1, 80), st.integers(0, 1),
                          st.booleans(), st.integers(0, 20)), min_size=1, max_size=12),
       st.floats(1.0, 8.0))
def test_paths_tile_the_step_and_speedups_never_slow_it(ops: list[tuple[int, int, int, int, bool, int]],
                                                       factor: float) -> None:
    from stepscope.analyze.whatif import WhatIf, what_if

    with tempfile.TemporaryDirectory() as tmp:
        trace = load_events(Path(tmp), _simulated(ops))
        graph = build_graph(trace)
        measured = replay(graph, graph.measured_weights())
        assert measured.t_ns.tolist() == graph.nodes["t_ns"].to_list()
        result = critical_path(trace, graph=graph)
        segs = result.segments
        assert segs["dur_ns"].sum() == result.steps["wall_ns"][0]  # the path tiles the window
        assert (segs["start_ns"] + segs["dur_ns"]).to_list()[:-1] == segs["start_ns"].to_list()[1:]
        faster = what_if(trace, WhatIf(speedups=(("gemm", factor),), no_sync=True), graph=graph)
        assert faster.replay_residual_fraction == 0.0
        assert faster.predicted_mean_ns is not None and faster.measured_mean_ns is not None
        assert faster.predicted_mean_ns <= faster.measured_mean_ns


# ------------------------------------------------------------------------------------------ typical launch latency

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def slow_launch_latency(path: Path, lo: int, hi: int) -> int | None:
    """The typical launch latency from the raw JSON (exact decimal µs -> ns), one event at a time: for each GPU
    event overlapping [lo, hi) whose launch call is in the trace, the stream was idle at launch if every event before
    it on its stream (over the whole trace) had ended by then; the median of start - launch over those (of an even
    count, the mean of the middle two rounded down), None where there are fewer than three."""
    import gzip
    import json
    from decimal import Decimal

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        doc = json.load(fh, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc

    def ns(v: Any) -> int:
        return int(Decimal(v) * 1000)

    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS and "dur" in e]
    launch = {e["args"]["correlation"]: ns(e["ts"]) for e in events
              if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in (e.get("args") or {})}
    by_stream: dict[tuple[Any, Any], list[tuple[int, int, Any]]] = {}
    for e in gpu:
        args = e.get("args") or {}
        by_stream.setdefault((args.get("device"), args.get("stream")), []).append(
            (ns(e["ts"]), ns(e["dur"]), args.get("correlation")))
    latencies = []
    for stream_events in by_stream.values():
        stream_events.sort(key=lambda x: (x[0], x[1]))
        prev_end = None
        for start, dur, corr in stream_events:
            launched = launch.get(corr)
            if start < hi and start + dur > lo and launched is not None and (prev_end is None or prev_end <= launched):
                latencies.append(max(0, start - launched))
            prev_end = max(prev_end or 0, start + dur)  # (overlapping events: the stream is idle once all have ended)
    if len(latencies) < 3:
        return None
    latencies.sort()
    n = len(latencies)
    return latencies[n // 2] if n % 2 else (latencies[n // 2 - 1] + latencies[n // 2]) // 2


@pytest.mark.parametrize("run", ["gemm_bound_cuda", "convnet_train_cuda", "item_in_forward_cuda",
                                 "pageable_vs_pinned_cuda"])
def test_typical_launch_latency_counts_only_launches_onto_an_idle_stream(run: str) -> None:
    # GIVEN a GPU capture WHEN its graph is built THEN the typical launch latency is the median over the launches
    # that found their stream idle, the stream's previous event looked up over the whole trace (a window's first
    # kernel queued behind the previous step's work is not one): on the GPU-bound GEMM loop, whose CPU runs 10 to
    # 50 ms ahead, there is none, and critical-path says why instead of calling that queue a launch latency
    from stepscope.analyze import load
    from stepscope.analyze.depgraph import QUEUED_NOTE

    path = next((SAMPLES / run).glob("*.pt.trace.json.gz"))
    graph = build_graph(load(path))
    lo, hi = int(graph.windows["start_ns"].min()), int(graph.windows["end_ns"].max())  # type: ignore[arg-type]
    expected = slow_launch_latency(path, lo, hi)
    assert graph.launch_latency_ns == expected
    result = critical_path(load(path))
    if run == "gemm_bound_cuda":
        assert expected is None and result.notes == [QUEUED_NOTE]
    else:
        assert expected is not None and 0 < expected < 100 * US and result.notes == []


def test_a_launch_while_an_overlapping_event_still_runs_did_not_find_its_stream_idle(tmp_path: Path) -> None:
    # GIVEN a graph's long kernel with a short one inside it, an add launched while the long one runs (after the
    # short one ended), and two adds launched onto an idle stream THEN the stream was busy at the first add's launch:
    # its 159 µs wait is no launch latency sample, and the typical latency is 5 µs of three samples
    graph = build_graph(load_events(tmp_path, cp.launch_behind_a_graph()))
    assert (graph.launch_latency_ns, graph.launch_samples) == (5 * US, 3)


def test_gpu_work_without_launch_calls_has_no_latency_and_no_queue_note(corpus: Path) -> None:
    # GIVEN a trace whose GPU work has no launch call recorded (HTA's large_integer_trace: kernels only) THEN no
    # launch latency is measured, and critical-path does not claim the launches queued
    from stepscope.analyze import load

    trace = load(next((corpus / "traces/hta/large_integer_trace").glob("*.json.gz")))
    assert trace.launches().filter(pl.col("launch_ts_ns").is_not_null()).collect().height == 0
    graph = build_graph(trace)
    assert graph.nodes["lane"].str.starts_with("gpu ").any()
    result = critical_path(trace)
    assert result.typical_launch_latency_ns is None and result.notes == [NO_STEPS_NOTE]  # (and no steps)


def test_one_launch_onto_an_idle_stream_is_too_few_for_a_typical_latency(corpus: Path) -> None:
    # GIVEN HTA's triton example, whose one launch found its stream idle (45 µs to start) THEN no typical latency is
    # made of it (a serving trace's one such copy had waited 149 ms and every launch edge weighed that), and
    # critical-path says why
    from stepscope.analyze import load

    trace = load(next((corpus / "traces/hta/triton_example").glob("*.json.gz")))
    graph = build_graph(trace)
    assert (graph.launch_latency_ns, graph.launch_samples) == (None, 1)
    assert critical_path(trace).notes == ["only 1 launch found its stream idle, fewer than 3: too few to say "
                                          "what a typical launch latency is, so launch edges weigh 0"]


def slow_stream_predecessors(graph: DependencyGraph) -> set[tuple[int, int]]:
    """(end node, start node) of every stream edge, from the graph's GPU nodes alone: events by lane in node order
    (start, end pairs), each waiting for the one before it if that ended by its start, else for the one before it
    that ended last by then (the later one of equal ends), else for nothing."""
    gpu = graph.nodes.filter(pl.col("lane").str.starts_with("gpu ")).sort("node")
    nodes, times, lanes = gpu["node"].to_list(), gpu["t_ns"].to_list(), gpu["lane"].to_list()
    by_lane: dict[str, list[tuple[int, int, int, int]]] = {}
    for i in range(0, len(nodes), 2):
        by_lane.setdefault(lanes[i], []).append((nodes[i], times[i], nodes[i + 1], times[i + 1]))
    pairs = set()
    for events in by_lane.values():
        for k, (start_node, start, _, _) in enumerate(events):
            if k == 0:
                continue
            if events[k - 1][3] <= start:
                pairs.add((events[k - 1][2], start_node))
                continue
            ended = [(end, j) for j, (_, _, _, end) in enumerate(events[:k]) if end <= start]
            if ended:
                pairs.add((events[max(ended)[1]][2], start_node))
    return pairs


def test_stream_edges_come_from_what_ended_before_on_a_serving_trace(corpus: Path) -> None:
    # GIVEN vLLM's piecewise CUDA-graph serving trace (MI300X), one of whose replayed kernels starts 112 ns before
    # the one before it on its stream ends THEN every stream edge is the slow oracle's, none is dropped, and the
    # path is not bound by a 169 ms "launch latency" into that kernel; the first copy, 149 ms after its launch
    # on an idle GPU (a clock offset: the CPU's work all ends at 26 ms), is held, not launch overhead
    from stepscope.analyze import load

    trace = load(corpus / "traces/tracelens/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz")
    graph = build_graph(trace)
    stream = graph.edges.filter(pl.col("type") == EdgeType.STREAM.value)
    assert set(stream.select("src", "dst").iter_rows()) == slow_stream_predecessors(graph)
    assert graph.dropped_edges == 0
    result = critical_path(trace, graph=graph)
    assert result.bound_by == "kernel"
    assert result.path_share.get("launch_overhead", 0) < 1e-3  # the copy's 21 µs call
    held = result.segments.filter(pl.col("name") == HELD_START)
    assert held.height == 1 and 148 * 1000 * US < held["dur_ns"][0] < 150 * 1000 * US


@pytest.mark.parametrize("run", ["gemm_bound_cuda", "convnet_train_cuda", "cuda_graph_replay_cuda"])
def test_stream_edges_are_the_slow_oracle_s_on_gpu_captures(run: str) -> None:
    from stepscope.analyze import load

    graph = build_graph(load(next((SAMPLES / run).glob("*.pt.trace.json.gz"))))
    stream = graph.edges.filter(pl.col("type") == EdgeType.STREAM.value)
    assert set(stream.select("src", "dst").iter_rows()) == slow_stream_predecessors(graph)


def test_every_step_s_own_time_is_one_contributor(tmp_path: Path) -> None:
    """The top contributors sum over steps: the CPU time directly under each step's ProfilerStep#N (Python between
    ops) is one row, `ProfilerStep*`, as torch's table names it, not one small row per step that a long run
    would push out of the top."""
    events: list[dict[str, Any]] = []
    for i in range(3):  # each 100 µs step: aten::add 10-30 µs launches a 5 µs kernel; the rest is the step's own
        t = i * 100
        events += [step(i + 1, ts=t, dur=100), cpu_op("aten::add", ts=t + 10, dur=20, external_id=i + 1),
                   runtime("cudaLaunchKernel", ts=t + 12, dur=3, correlation=i + 1, external_id=i + 1),
                   kernel("k", ts=t + 16, dur=5, correlation=i + 1, external_id=i + 1)]
    top = critical_path(load_events(tmp_path, trace(*events))).top
    steps = top.filter(pl.col("name").str.starts_with("ProfilerStep"))
    assert steps.select("kind", "name", "total_ns").rows() == [("cpu", "ProfilerStep*", 3 * (100 - 20) * 1000)]
    assert top["name"][0] == "ProfilerStep*"


@st.composite
def _walks(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    """A replay's result as `walk_paths` reads it: nodes in time order, each set by an edge from an earlier node or
    by none, and windows of a start and an end node."""
    n = draw(st.integers(1, 40))
    t = np.cumsum(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))).astype(np.int64)
    src: list[int] = []
    via = np.full(n, -1, dtype=np.int64)
    for v in range(1, n):
        if draw(st.booleans()):
            via[v] = len(src)
            src.append(draw(st.integers(0, v - 1)))
    src += draw(st.lists(st.integers(0, n - 1), max_size=5))  # edges on no path
    k = draw(st.integers(0, 6))
    starts = np.asarray(draw(st.lists(st.integers(-1, int(t[-1]) + 1), min_size=k, max_size=k)), dtype=np.int64)
    ends = np.asarray(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)), dtype=np.int64)
    return via, np.asarray(src, dtype=np.int64), t, starts, ends


@given(_walks())
@settings(max_examples=300, deadline=None)
def test_the_compiled_walk_is_the_python_walk(case: tuple[np.ndarray, ...]) -> None:
    # GIVEN any replay's edges and windows WHEN the paths are walked in C and in Python THEN the answers are one,
    # and each path is the chain of setting edges from its end node back to its window's start
    ours, theirs = walk_paths(*case), _walk_python(*case)
    for a, b in zip(ours, theirs, strict=True):
        assert a.tolist() == b.tolist()
    via, src, t, starts, ends = case
    rows, counts, heads = ours
    at = 0
    for start, end, count, head in zip(starts, ends, counts, heads, strict=True):
        path: list[int] = []
        v = int(end)
        while t[v] > start and via[v] >= 0:  # the definition, walked again
            path.insert(0, int(via[v]))
            v = int(src[via[v]])
        assert head == (v if t[v] > start else -1)
        assert rows[at:at + count].tolist() == ([-1] if t[v] > start else []) + path
        at += count
    assert at == len(rows)


def test_a_bad_walk_is_refused_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    import stepscope.analyze.critical_path as module

    def ints(*values: int) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    # (via, src, t, starts, ends): node 0 at t 5 is set by edge 0, from node 0 itself; edge 3 does not exist
    cycle = (ints(0), ints(0), ints(5), ints(0), ints(0))
    out_of_range = (ints(3), ints(0), ints(5), ints(0), ints(0))
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(module, "_scan", None)
        with pytest.raises(ValueError, match="form a cycle"):
            walk_paths(*cycle)
        with pytest.raises(IndexError, match="out of range"):
            walk_paths(*out_of_range)
