"""CUDA/HIP graph replays (stepscope.analyze.graphs) and their mapping to ops through a capture profile
(stepscope.analyze.graph_capture).

GIVEN synthetic runs whose kernels a graph launch replays (one FULL graph per step; piecewise graphs between eager
ops) and synthetic profiles of their capture (ROCm-style launch calls that name their kernel; CUDA-style calls
that do not, with an eager warm-up run that does) THEN each replay lists its kernels, GPU share and Python line,
replays group per distinct graph, and every replayed kernel maps to the op that launched it at capture time, so
the op table and FLOPs count those ops once per replay. GIVEN the corpus's vLLM run and its capture THEN the GEMM
FLOPs per op match TraceLens's GEMM.csv and every replayed kernel is mapped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import cpu_op, kernel, load_events, runtime, trace, write_trace
from graph_traces import (
    MM_FLOPS,
    full_graph_capture,
    full_graph_run,
    launch,
    piecewise_capture,
    piecewise_run,
)

from stepscope.analyze import load
from stepscope.analyze.flops import op_flops
from stepscope.analyze.frames import TraceFrames
from stepscope.analyze.graph_capture import _align
from stepscope.analyze.graphs import (
    CaptureChoice,
    GraphMappedFrames,
    graph_replays,
    load_replayed,
    locate_capture,
    with_graph_capture,
)
from stepscope.analyze.inputs import is_capture_file
from stepscope.analyze.kernels import kernel_summary
from stepscope.analyze.ops import op_table


def mapped(tmp_path: Path, run: dict[str, Any], capture: dict[str, Any]) -> GraphMappedFrames:
    return with_graph_capture(load_events(tmp_path / "run", run), load_events(tmp_path / "capture", capture))


# ------------------------------------------------------------------------------------------------- replays
def test_full_graph_replays_are_listed_with_their_kernels_share_and_python_line(tmp_path: Path) -> None:
    # GIVEN a run whose every kernel a graph launch replayed, once per step
    r = graph_replays(load_events(tmp_path, full_graph_run()))
    # THEN three replays of one graph, 2 kernels each, all the GPU time, launched from serve.py(10)
    assert (r.graph_launches, r.graph_count, r.replayed_kernels) == (3, 1, 6)
    assert r.replayed_gpu_ns == 3 * 40_000 and r.replayed_gpu_share == pytest.approx(1.0)
    assert r.replays["kernels"].to_list() == [2, 2, 2]
    assert set(r.replays["python"]) == {"serve.py(10): decode"}
    g = r.graphs.row(0, named=True)
    assert (g["replays"], g["kernels_per_replay"], g["gpu_ns"], g["first_kernel"]) == (3, 2, 120_000, "gemm_kernel")
    # AND without a capture nothing is mapped, and the note says how to map them
    assert r.mapped_kernels is None and g["mapped_share"] is None and "--graph-capture" in r.note


def test_a_trace_without_graphs_says_so(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("aten::mm", 0, 10, external_id=1), launch(2, 1, 1),
                                    kernel("gemm", 5, 10, correlation=1)))
    r = graph_replays(t)
    assert r.graph_launches == 0 and r.graphs.height == 0 and r.note == "no CUDA/HIP graph launches in this trace"


# ------------------------------------------------------------------------------------------------- mapping
@pytest.mark.parametrize(("named", "extra", "source"), [
    (True, False, "capture segment"), (False, False, "capture segment"), (False, True, "eager run")],
    ids=["rocm-launch-names-kernel", "cuda-launch-order", "cuda-eager-warmup"])
def test_full_graph_kernels_map_to_the_ops_that_launched_them(tmp_path: Path, named: bool, extra: bool,
                                                              source: str) -> None:
    # GIVEN the capture profile: launches inside the capture name their kernel (ROCm), or name none (CUDA) but
    # are as many as the one-stream graph replays, or are not, and only the eager warm-up before names them
    frames = mapped(tmp_path, full_graph_run(), full_graph_capture(named=named, extra_launch=extra))
    # THEN every replayed kernel maps to its op, from the capture segment (by name, or in launch order) or else
    # the warm-up
    r = graph_replays(frames)
    assert (r.mapped_kernels, r.mapped_share) == (6, 1.0)
    assert frames.mapping.graphs["source"].to_list() == [source]
    ops = dict(zip(frames.launches["name"], frames.launches["op_name"], strict=True))
    assert ops == {"gemm_kernel": "aten::mm", "relu_kernel": "aten::relu"}
    # AND the ops count once per replay in the op table (no CPU time: they did not run on the CPU) and FLOPs
    table = op_table(frames).ops.filter(pl.col("kind") == "cpu_op")
    mm_row = table.filter(pl.col("name") == "aten::mm").row(0, named=True)
    assert (mm_row["calls"], mm_row["self_device_ns"], mm_row["cpu_total_ns"]) == (3, 90_000, 0)
    f = op_flops(frames)
    assert f.total_flops == 3 * MM_FLOPS and f.ops.filter(pl.col("name") == "aten::mm").height == 3
    # AND kernels say which op launched them
    by_op = dict(zip(kernel_summary(frames).by_op["op"], kernel_summary(frames).by_op["total_ns"], strict=True))
    assert by_op == {"aten::mm": 90_000, "aten::relu": 30_000}


def test_piecewise_pieces_map_to_their_own_capture_segments(tmp_path: Path) -> None:
    # GIVEN piecewise replays between eager ops, two pieces holding the same kernels, and their capture
    frames = mapped(tmp_path, piecewise_run(), piecewise_capture())
    r = graph_replays(frames)
    # THEN three replays of two distinct graphs, every replayed kernel mapped
    assert (r.graph_launches, r.graph_count, r.replayed_kernels, r.mapped_kernels) == (3, 2, 5, 5)
    # AND the k-th replay of a graph takes the k-th equally good segment: A -> segment 1, B -> segment 2
    m = frames.mapping.kernels.sort("correlation", "gpu_event_id")
    cap = frames.graph_ops.filter(pl.col("name") == "aten::mm").sort("replay_correlation")
    assert cap["replay_correlation"].to_list() == [10, 12]
    assert cap["capture_event_id"].n_unique() == 2
    assert m.filter(pl.col("correlation") == 13)["op_name"].to_list() == ["aten::matmul"]
    # AND a launching op's ancestor inside the segment (the wrapper) comes along, once per replay
    wrappers = frames.graph_ops.filter(pl.col("name") == "vllm::gemm_wrapper")
    assert wrappers["replay_correlation"].to_list() == [10, 12]
    table = op_table(frames).ops
    row = table.filter(pl.col("name") == "vllm::gemm_wrapper").row(0, named=True)
    assert (row["calls"], row["device_total_ns"], row["self_device_ns"]) == (2, 20_000, 0)
    # AND the eager attention keeps its own op
    attn = frames.launches.filter(pl.col("name") == "attn_kernel")
    assert attn["op_name"].to_list() == ["vllm::attention"]
    # AND the per-op table of the graphs result counts calls per replay
    ops = dict(zip(r.ops["op_name"], r.ops["calls"], strict=True))
    assert ops == {"aten::matmul": 1, "aten::mm": 2, "aten::relu": 2}


def test_kernels_the_capture_does_not_hold_stay_unmapped_and_the_note_says_so(tmp_path: Path) -> None:
    # GIVEN a capture profile of some other graph
    other = trace(runtime("hipStreamBeginCapture", 0, 1), cpu_op("aten::add", 2, 5, external_id=1),
                  launch(3, 1, 1, "add_kernel"), runtime("hipStreamEndCapture", 10, 1))
    frames = mapped(tmp_path, full_graph_run(), other)
    r = graph_replays(frames)
    assert r.mapped_kernels == 0 and r.mapped_share == 0.0 and "match no launch" in r.note
    assert frames.launches["op_name"].null_count() == frames.launches.height


def test_align_matches_each_stream_in_order_using_each_launch_once() -> None:
    assert _align([["a", "b", "c"]], ["a", "x", "b", "c"]) == [[0, 2, 3]]
    assert _align([["a", "c"], ["b"]], ["a", "b", "c"]) == [[0, 2], [1]]
    assert _align([["a", "a"]], ["a"]) == [[0, None]]


# ----------------------------------------------------------------------------------------------- discovery
def test_a_run_directory_holding_a_capture_profile_finds_it(tmp_path: Path) -> None:
    run = write_trace(tmp_path / "run", full_graph_run(), "graph_execution.json")
    capture = write_trace(tmp_path / "run" / "capture_traces", full_graph_capture(), "rank_0.pt.trace.json")
    choice = locate_capture(tmp_path / "run")
    assert (choice.trace, choice.capture, choice.found) == (run, capture, True)
    frames, _ = load_replayed(tmp_path / "run", cache_dir=tmp_path / "cache")
    assert isinstance(frames, GraphMappedFrames)
    # a trace file alone in its folder gets plain frames
    alone = write_trace(tmp_path / "alone", full_graph_run(), "graph_execution.json")
    plain, choice = load_replayed(alone, cache_dir=tmp_path / "cache")
    assert type(plain) is TraceFrames and choice.capture is None
    assert is_capture_file(Path("x/graph_capture_rank_0.json.gz")) and not is_capture_file(run)


def test_a_trace_file_takes_the_one_capture_profile_of_its_folder(tmp_path: Path) -> None:
    # GIVEN a run's trace FILE whose folder holds its capture profile (capture_traces/, or *graph_capture* beside it)
    run = write_trace(tmp_path / "run", full_graph_run(), "graph_execution.json")
    capture = write_trace(tmp_path / "run" / "capture_traces", full_graph_capture(), "rank_0.pt.trace.json")
    # WHEN its capture is looked for THEN the folder counts as its run directory (once: the file was taken alone)
    assert locate_capture(run) == CaptureChoice(trace=run, capture=capture, found=True)
    frames, _ = load_replayed(run, cache_dir=tmp_path / "cache")
    assert isinstance(frames, GraphMappedFrames) and op_flops(frames).total_flops == 3 * MM_FLOPS
    # AND a capture given wins over the one found
    other = write_trace(tmp_path / "elsewhere", full_graph_capture(), "cap.json")
    assert locate_capture(run, other) == CaptureChoice(trace=run, capture=other, found=False)
    # AND the capture file itself is not taken for a run with a capture
    assert locate_capture(capture).capture is None
    flat = write_trace(tmp_path / "flat", full_graph_run(), "graph_execution.json")
    beside = write_trace(tmp_path / "flat", full_graph_capture(), "graph_capture_rank_0.json")
    assert locate_capture(flat).capture == beside


@pytest.mark.parametrize("extra", ["second capture", "second run"])
def test_a_trace_file_whose_folder_is_ambiguous_takes_no_capture(tmp_path: Path, extra: str) -> None:
    # GIVEN a trace file whose folder holds two capture profiles, or another run's trace beside it
    run = write_trace(tmp_path / "run", full_graph_run(), "graph_execution.json")
    write_trace(tmp_path / "run" / "capture_traces", full_graph_capture(), "rank_0.pt.trace.json")
    if extra == "second capture":
        write_trace(tmp_path / "run" / "capture_traces", full_graph_capture(), "rank_1.pt.trace.json")
    else:
        write_trace(tmp_path / "run", full_graph_run(), "graph_execution_2.json")
    # WHEN its capture is looked for THEN none is taken: which capture belongs to it is not known
    assert locate_capture(run) == CaptureChoice(trace=run, capture=None, found=False)


# -------------------------------------------------------------------------------------------------- corpus
VLLM = "traces/tracelens/inference/vllm_prefilldecode_piecewise"


@pytest.mark.corpus
def test_vllm_piecewise_gemm_flops_match_tracelens_through_the_capture(corpus: Path, tmp_path: Path) -> None:
    # GIVEN the vLLM run on MI300X with piecewise HIP graphs and the profile of its graph capture
    frames, choice = load_replayed(corpus / VLLM, cache_dir=tmp_path)
    assert choice.found and choice.capture is not None and "capture_traces" in choice.capture.parts
    # THEN every replayed kernel maps to an op (TraceLens maps them all too)
    r = graph_replays(frames)
    assert (r.graph_launches, r.replayed_kernels, r.mapped_kernels) == (25, 361, 361)
    # AND the GEMM FLOPs per op match TraceLens's GEMM.csv (which adds M*N for a bias, torch's rule does not)
    ops = op_flops(frames).ops

    def gflop(name: str, bias_of: Any = None) -> tuple[int, Any]:
        rows = ops.filter(pl.col("name") == name)
        bias = sum(bias_of(json.loads(d)) for d in rows["input_dims"].to_list()) if bias_of else 0
        return rows.height, (int(rows["flops"].sum()) + bias) / 1e9

    def linear_bias(d: list[Any]) -> int:
        return d[0][0] * d[1][0] if d[2] else 0

    assert gflop("vllm::rocm_unquantized_gemm", linear_bias) == (73, pytest.approx(10_527.869, abs=0.001))
    assert gflop("aten::addmm", lambda d: d[1][0] * d[2][1]) == (72, pytest.approx(10_474.588, abs=0.001))
    assert gflop("aten::mm") == (1, pytest.approx(53.280, abs=0.001))
    # AND the op table's direct kernel time per op matches TraceLens's ops_summary.csv
    table = op_table(frames).ops.filter(pl.col("kind") == "cpu_op")
    device = dict(zip(table["name"], table["self_device_ns"], strict=True))
    assert device["vllm::moe_forward"] / 1e3 == pytest.approx(124_885.786, abs=0.01)
    assert device["aten::addmm"] / 1e3 == pytest.approx(17_301.817, abs=0.01)


@pytest.mark.corpus
def test_vllm_without_the_capture_lists_the_graphs_unmapped(corpus: Path, tmp_path: Path) -> None:
    r = graph_replays(load(corpus / VLLM / "graph_execution.json.gz", cache_dir=tmp_path))
    assert (r.graph_launches, r.graph_count, r.replayed_kernels) == (25, 3, 361)
    assert r.replayed_gpu_share is not None and r.replayed_gpu_share > 0.9
    assert r.graphs["kernels_per_replay"].sort().to_list() == [4, 12, 15]
    assert r.mapped_kernels is None


def test_cuda_capture_launches_without_kernel_names_map_in_launch_order_only_when_exact() -> None:
    from stepscope.analyze.graph_capture import _Candidate, _in_launch_order

    # a CUDA capture segment: launches name no kernel (None), copies and sets say what they are
    seg = _Candidate("segment 1", True, (0, 1, 2, 3), ("[memset]", None, None, "[memcpy]"))
    one_stream = [["[memset]", "gemm", "gelu", "[memcpy]"]]
    assert _in_launch_order(one_stream, [seg]) == [seg]
    # a set where the replay has a kernel, a different number of launches, or a second stream: no mapping
    assert _in_launch_order([["gemm", "gemm", "gelu", "[memcpy]"]], [seg]) == []
    assert _in_launch_order([["[memset]", "gemm", "[memcpy]"]], [seg]) == []
    assert _in_launch_order([["[memset]", "gemm"], ["gelu", "[memcpy]"]], [seg]) == []
