"""Serving iterations: each engine's names read, the window rule per iteration, the phase table against a slow
obvious computation, the summary line, the corpus's vLLM traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import load_events, python_fn, step, trace
from serving_traces import SGLANG_BUSY_US, SGLANG_STEPS, SGLANG_WALL_US, VLLM_MIXED, iteration, sglang_server

from stepscope.analyze import load
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.serving import (
    Engine,
    Phase,
    ServingResult,
    parse_generic,
    parse_sglang,
    parse_vllm,
    serving_iterations,
)
from stepscope.analyze.summary import verdict
from stepscope.reports.summary_text import render_summary

VLLM_RUN = "tracelens/inference/vllm_prefilldecode_piecewise"
@pytest.fixture
def sglang(tmp_path: Path) -> ServingResult:
    return serving_iterations(load_events(tmp_path, sglang_server()))


# GIVEN each engine's iteration names WHEN read THEN kind, requests and tokens are what the name says


@pytest.mark.parametrize(("name", "expected"), [
    (VLLM_MIXED, ("mixed", 46, 9, 37, 8155, 37, 8192)),
    ("execute_context_1(888_788544)_generation_0(0)", ("prefill", 1, 1, 0, 888, 0, 888)),
    ("execute_context_0(0)_generation_32(32)", ("decode", 32, 0, 32, 0, 32, 32)),
    ("execute_512_context_2(512)_generation_0(0)", ("prefill", 2, 2, 0, 512, 0, 512)),
    ("execute_context_0(0)_generation_0(0)", ("idle", 0, 0, 0, 0, 0, 0)),
    ("execute_new_2_cached_30", ("mixed", 32, 2, 30, None, None, None)),
    ("execute_new_0_cached_8", ("decode", 8, 0, 8, None, None, None)),
])
def test_vllm_annotations(name: str, expected: tuple[Any, ...]) -> None:
    row = parse_vllm(name)
    assert row is not None
    keys = ("kind", "batch_size", "prefill_requests", "decode_requests", "prefill_tokens", "decode_tokens",
            "total_tokens")
    assert tuple(row[k] for k in keys) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("step[EXTEND bs=15 toks=15360]", ("prefill", 15, 15, 0, 15360, 0, 15360)),
    ("step[EXTEND bs=1 toks=1025 c_sqsq=1050625 c_sqsk=1050625 c_sk=1025]", ("prefill", 1, 1, 0, 1025, 0, 1025)),
    ("step[DECODE bs=32]", ("decode", 32, 0, 32, 0, 32, 32)),
    ("step[DECODE bs=64 g_sqsq=64 g_sqsk=100032 g_sk=100032]", ("decode", 64, 0, 64, 0, 64, 64)),
    ("step[MIXED bs=66 c=2 g=64 c_sq=2048 c_sk=2048 c_sqsq=2097152 c_sqsk=2097152 g_sq=64 g_sk=65600 g_sqsq=64 "
     "g_sqsk=65600]", ("mixed", 66, 2, 64, 2048, 64, 2112)),
    ("step[MIXED bs=6]", ("mixed", 6, None, None, None, None, None)),
    ("step[mixed bs=6 ext=256 dec=4]", ("mixed", 6, None, None, 256, 4, 260)),
    ("step[prefill bs=4 toks=512]", ("prefill", 4, 4, 0, 512, 0, 512)),
    ("step[decode bs=8]", ("decode", 8, 0, 8, 0, 8, 8)),
    ("step[IDLE bs=0]", ("idle", 0, 0, 0, 0, 0, 0)),
    ("step[idle]", ("idle", 0, 0, 0, 0, 0, 0)),
    ("step[TARGET_VERIFY bs=4]", ("decode", 4, 0, 4, 0, None, None)),
    ("step[DRAFT_EXTEND_V2 bs=1]", ("unknown", 1, None, None, None, None, None)),
])
def test_sglang_step_names(name: str, expected: tuple[Any, ...]) -> None:
    row = parse_sglang(name)
    assert row is not None
    keys = ("kind", "batch_size", "prefill_requests", "decode_requests", "prefill_tokens", "decode_tokens",
            "total_tokens")
    assert tuple(row[k] for k in keys) == expected


@pytest.mark.parametrize(("name", "kind", "batch", "tokens"), [
    ("prefill", "prefill", None, None), ("decode_step_3", "decode", None, None),
    ("decode bs=8 toks=8", "decode", 8, 8), ("Prefill[batch_size=4 tokens=512]", "prefill", 4, 512),
])
def test_generic_annotations(name: str, kind: str, batch: int | None, tokens: int | None) -> None:
    row = parse_generic(name)
    assert row is not None and (row["kind"], row["batch_size"], row["total_tokens"]) == (kind, batch, tokens)


@pytest.mark.parametrize("name", ["## decoder fp32 None ##", "decoder_layer", "step[0] must be an object",
                                  "execute_model", "ProfilerStep#3", "prefiller"])
def test_other_names_are_not_iterations(name: str) -> None:
    assert parse_vllm(name) is None and parse_generic(name) is None
    if not name.startswith("step["):
        assert parse_sglang(name) is None


# GIVEN an SGLang server's trace WHEN its iterations are read THEN one row per step, windows by the one rule


def test_sglang_iterations_by_the_window_rule(sglang: ServingResult) -> None:
    assert (sglang.engine, sglang.iterations_found, sglang.mixed_iterations) == (Engine.SGLANG, 8, 1)
    its = sglang.iterations
    assert its["kind"].to_list() == ["prefill", "decode", "decode", "prefill", "decode", "mixed", "decode", "idle"]
    assert its["batch_size"].to_list() == [2, 2, 2, 1, 3, 4, 3, 0]
    assert its["total_tokens"].to_list() == [1024, 2, 2, 300, 3, 259, 3, 0]
    assert its["mode"].to_list()[:2] == ["EXTEND", "DECODE"]
    # the GPU-side copies of the annotations are not iterations; walls reach the end of the GPU work
    assert its["wall_ns"].to_list() == [w * 1000 for w in SGLANG_WALL_US]
    assert its["gpu_busy_ns"].to_list() == [b * 1000 for b in SGLANG_BUSY_US]
    assert its["offset_ns"].to_list() == [int(t0 * 1000) for _, t0, _, _ in SGLANG_STEPS]


def test_phase_table_matches_a_slow_computation(sglang: ServingResult) -> None:
    """Percentiles by numpy's linear interpolation (numpy.percentile method="linear"); tokens/s by hand."""
    its = sglang.iterations.to_dicts()
    phases = {r["kind"]: r for r in sglang.phases.to_dicts()}
    assert list(phases) == ["prefill", "decode", "mixed", "idle", "all"]
    for kind in ("prefill", "decode", "mixed", "idle", "all"):
        rows = [r for r in its if kind in ("all", r["kind"])]
        walls = np.array([r["wall_ns"] for r in rows], dtype=float)
        got = phases[kind]
        assert got["iterations"] == len(rows)
        for q in (50, 95, 99):
            assert got[f"p{q}_ns"] == pytest.approx(np.percentile(walls, q, method="linear"))
        assert got["mean_ns"] == pytest.approx(walls.mean())
        assert got["gpu_busy_fraction"] == pytest.approx(sum(r["gpu_busy_ns"] for r in rows) / walls.sum())
        tokens = sum(r["total_tokens"] for r in rows)
        assert got["tokens"] == tokens
        assert got["tokens_per_s"] == round(tokens / (walls.sum() / 1e9))
    # decode by hand: 4 iterations of 11, 12, 9, 10 µs -> p50 10.5 µs, 10 tokens in 42 µs
    assert phases["decode"]["p50_ns"] == 10_500
    assert phases["decode"]["tokens_per_s"] == round(10 / 42e-6)
    assert sglang.tokens == 1024 + 2 + 2 + 300 + 3 + 259 + 3
    assert sglang.tokens_per_s == round(sglang.tokens / (sum(SGLANG_WALL_US) * 1e-6))
    assert sglang.gpu_busy_fraction == pytest.approx(sum(SGLANG_BUSY_US) / sum(SGLANG_WALL_US))


def test_mixed_batches_say_so(sglang: ServingResult) -> None:
    assert "1 mixed iteration: prefill and decode requests in one batch" in sglang.note
    line = sglang.line
    assert line is not None and line.startswith("SGLang, 8 iterations: 2 prefill (p50 ")
    assert "1 mixed" in line and "mixed = prefill and decode in one batch" in line


# GIVEN vLLM's annotations WHEN a CUDA graph replays the kernels THEN they count: cudaGraphLaunch is in the span


def test_vllm_mixed_iteration_with_graph_replays(tmp_path: Path) -> None:
    doc = trace(*iteration(VLLM_MIXED, 0, 30, [(5, 10), (12, 10), (20, 15)], corr=7, graph=True),
                python_fn("vllm/v1/worker/gpu_model_runner.py(3380): execute_model", ts=0.5, dur=29))
    result = serving_iterations(load_events(tmp_path, doc))
    assert (result.engine, result.source) == (Engine.VLLM, "vLLM execute_… annotations")
    row = result.iterations.row(0, named=True)
    assert (row["kind"], row["batch_size"], row["prefill_requests"], row["decode_requests"]) == ("mixed", 46, 9, 37)
    assert (row["prefill_tokens"], row["decode_tokens"], row["total_tokens"]) == (8155, 37, 8192)
    assert (row["wall_ns"], row["cpu_ns"], row["gpu_busy_ns"]) == (35_000, 30_000, 30_000)  # union [5, 35) µs
    assert result.tokens_per_s == round(8192 / 35e-6)
    assert result.iterations_found == 1 and result.mixed_iterations == 1 and "mixed" in result.note


def test_vllm_decode_only_and_prefill_only(tmp_path: Path) -> None:
    decode = [e for i in range(3) for e in iteration("execute_context_0(0)_generation_32(32)", 100 * i, 8,
                                                      [(2, 10 + i)], corr=10 * (i + 1))]
    prefill = iteration("execute_context_2(1024)_generation_0(0)", 400, 50, [(2, 60)], corr=90)
    result = serving_iterations(load_events(tmp_path, trace(*decode, *prefill)))
    phases = {r["kind"]: r for r in result.phases.to_dicts()}
    assert list(phases) == ["prefill", "decode", "all"] and result.mixed_iterations == 0 and result.note == ""
    assert phases["decode"]["iterations"] == 3 and phases["decode"]["tokens"] == 96
    assert phases["decode"]["p50_ns"] == 13_000  # walls 12, 13, 14 µs
    assert phases["decode"]["tokens_per_s"] == round(96 / 39e-6)
    assert phases["prefill"]["tokens_per_s"] == round(1024 / 62e-6)
    assert phases["decode"]["mean_batch_size"] == 32


def test_old_vllm_annotations_leave_tokens_unknown(tmp_path: Path) -> None:
    doc = trace(*iteration("execute_new_0_cached_4", 0, 10, [(2, 5)], corr=1),
                *iteration("execute_new_1_cached_0", 100, 10, [(2, 5)], corr=2))
    result = serving_iterations(load_events(tmp_path, doc))
    assert result.iterations["kind"].to_list() == ["decode", "prefill"]
    assert result.tokens is None and result.tokens_per_s is None
    assert result.phases["tokens_per_s"].null_count() == result.phases.height
    assert "do not say their tokens" in result.note


# GIVEN no engine annotation WHEN the engines' forward frames are there THEN they give the iterations


def test_sglang_forward_frames_give_kinds(tmp_path: Path) -> None:
    frame = "/opt/venv/lib/python3.12/site-packages/sglang/srt/model_executor/model_runner.py({}): forward_{}"
    doc = trace(*iteration(frame.format(1710, "extend"), 0, 20, [(2, 20)], corr=1, frame=True),
                *iteration(frame.format(1690, "decode"), 100, 10, [(2, 5)], corr=2, frame=True),
                *iteration(frame.format(1690, "decode"), 200, 10, [(2, 5)], corr=3, frame=True))
    result = serving_iterations(load_events(tmp_path, doc))
    assert (result.engine, result.iterations_found) == (Engine.SGLANG, 3)
    assert result.iterations["kind"].to_list() == ["prefill", "decode", "decode"]
    assert result.iterations["batch_size"].null_count() == 3 and result.tokens is None
    assert "batch sizes and tokens are not recorded" in result.note


def test_vllm_execute_model_frames_give_spans_only(tmp_path: Path) -> None:
    frame = "vllm/v1/worker/gpu_model_runner.py(2907): execute_model"
    doc = trace(*iteration(frame, 0, 20, [(2, 20)], corr=1, frame=True),
                python_fn("vllm/v1/worker/gpu_model_runner.py(2726): _model_forward", ts=1, dur=15))
    result = serving_iterations(load_events(tmp_path, doc))
    assert (result.engine, result.iterations_found) == (Engine.VLLM, 1)
    assert result.iterations["kind"].to_list() == [Phase.UNKNOWN.value]


def test_a_training_trace_has_no_iterations(tmp_path: Path) -> None:
    doc = trace(step(1, ts=0, dur=100), *iteration("forward", 5, 50, [(2, 30)], corr=1))
    t = load_events(tmp_path, doc)
    result = serving_iterations(t)
    assert (result.engine, result.iterations_found, result.source) == (None, 0, "none")
    assert result.iterations.height == 0 and result.phases.height == 0 and result.line is None
    assert result.note.startswith("no engine iterations")
    assert (result.wall_ns, result.gpu_wait_ns) == (None, None)  # no wall to speak of (once "wall 0 ns")
    assert verdict(t).serving is None


# GIVEN a serving trace WHEN summarized THEN one line says its phases; the bundle shares one result


def test_summary_line(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, sglang_server()))
    assert bundle.verdict.serving == bundle.serving.line
    text = render_summary(bundle.verdict)
    line = next(x for x in text.splitlines() if x.startswith("serving: "))
    assert "SGLang, 8 iterations" in line and "1,593 tokens" in line and "`stepscope serving`" in line
    assert "% of their wall" in line and "before the GPU started" not in line


# GIVEN the corpus's vLLM traces THEN each gets a sensible result


def test_corpus_vllm_mixediteration(corpus: Path) -> None:
    result = serving_iterations(load(corpus / "traces" / VLLM_RUN / "graph_execution.json.gz"))
    assert (result.engine, result.iterations_found, result.mixed_iterations) == (Engine.VLLM, 1, 1)
    row = result.iterations.row(0, named=True)
    assert (row["batch_size"], row["prefill_requests"], row["prefill_tokens"]) == (46, 9, 8155)
    assert (row["decode_requests"], row["decode_tokens"], row["total_tokens"]) == (37, 37, 8192)
    assert row["annotation"] == VLLM_MIXED
    # every GPU event was launched inside the annotation: busy is TraceLens's busy_time (gpu_timeline.csv)
    assert row["gpu_busy_ns"] == pytest.approx(156_085_798, abs=20_000)
    # the first copy starts 149 ms after its launch: the wall holds that wait, and the note says so
    assert row["wall_ns"] > row["cpu_ns"] and "1 iteration waits long for the GPU to start its work" in result.note
    # AND summary's one line says its GPU busy is of the iteration's wall, with that wait in it (beside the
    # summary's own figure over the GPU span, which holds no wait)
    assert result.gpu_wait_ns is not None and 148e6 < result.gpu_wait_ns < 150e6
    assert result.line is not None
    assert "GPU busy 50.7% of their wall, 149 ms of it before the GPU started" in result.line


def test_corpus_other_vllm_traces(corpus: Path) -> None:
    b200 = serving_iterations(load(corpus / "traces" / "tracelens" / "b200" / "eager_trace.json.gz"))
    assert b200.iterations[["kind", "prefill_requests", "total_tokens"]].row(0) == ("prefill", 1, 888)
    capture = next((corpus / "traces" / VLLM_RUN / "capture_traces").glob("*.json.gz"))
    none = serving_iterations(load(capture))
    assert none.iterations_found == 0 and "graph capture, not served requests" in none.note


def test_a_trace_without_gpu_work_has_no_gpu_figures(tmp_path: Path) -> None:
    doc = trace(*iteration("step[DECODE bs=2]", 0, 10, [], corr=1), *iteration("step[DECODE bs=2]", 20, 14, [], corr=2))
    result = serving_iterations(load_events(tmp_path, doc))
    assert result.iterations["wall_ns"].to_list() == [10_000, 14_000]
    assert result.gpu_busy_fraction is None and result.iterations["gpu_busy_ns"].null_count() == 2
    assert result.phases["gpu_busy_fraction"].to_list() == [None]
    assert result.tokens_per_s == round(4 / 24e-6)


def test_a_span_inside_another_is_not_an_iteration(tmp_path: Path) -> None:
    doc = trace(*iteration("step[DECODE bs=2]", 0, 10, [(2, 5)], corr=1),
                *iteration("step[TARGET_VERIFY bs=2]", 2, 6, [(6, 2)], corr=5),  # its kernel [8, 10) µs
                *iteration("step[DECODE bs=2]", 10, 10, [(2, 5)], corr=9))
    result = serving_iterations(load_events(tmp_path, doc))
    assert result.iterations["mode"].to_list() == ["DECODE", "DECODE"]
    assert result.iterations["offset_ns"].to_list() == [0, 10_000]
    assert result.iterations["gpu_busy_ns"].to_list() == [5_000 + 2_000, 5_000]  # the nested launch is the outer's
