"""Iterations inferred without ProfilerStep: each signal, the set-up iteration, the corpus, real captures."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from builders import annotation, cpu_op, kernel, load_events, python_fn, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.frames import TraceFrames
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.info import trace_info
from stepscope.analyze.iterations import Iterations, Signal, iterations
from stepscope.analyze.steps import step_breakdown
from stepscope.analyze.summary import verdict
from stepscope.analyze.trace import Trace

AUTOGRAD_TID = 2
SGD = "Optimizer.step#SGD.step"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _found(t: Trace) -> Iterations:
    return TraceFrames(t).iterations


def _spans(found: Iterations) -> list[tuple[int, int, int]]:
    """(step, start µs, end µs) of every inferred iteration."""
    return [(s, a // 1000, b // 1000) for s, a, b in found.spans.select("step", "ts_ns", "end_ns").iter_rows()]


def _training(t0: float, n: int, *, optimizer: str | None = SGD, loader: bool = False,
              corr: int = 0) -> list[dict[str, Any]]:
    """One 100 µs training iteration from t0: [DataLoader 0-10] forward 10-40 (a kernel) | backward on the
    autograd thread 45-75 | [Optimizer.step 80-95]."""
    c = corr + n
    events = [
        cpu_op("aten::linear", ts=t0 + 10, dur=30, external_id=c),
        runtime("cudaLaunchKernel", ts=t0 + 15, dur=5, correlation=c, external_id=c),
        kernel("sgemm", ts=t0 + 20, dur=30, correlation=c),
        cpu_op("autograd::engine::evaluate_function: AddmmBackward0", ts=t0 + 45, dur=30, tid=AUTOGRAD_TID,
               fwd_thread_id=1),
    ]
    if loader:
        events.append(annotation(LOADER, ts=t0, dur=10))
    if optimizer:
        events.append(annotation(optimizer, ts=t0 + 80, dur=15))
    return events


# GIVEN each signal alone WHEN iterations are inferred THEN the spans follow the module docstring's anchors


def test_optimizer_step_ends_each_iteration(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(*[e for i in range(3) for e in _training(100 * i, i + 1)]))
    found = _found(t)
    assert (found.signal, found.marker, found.inferred) == (Signal.OPTIMIZER_STEP, SGD, True)
    assert _spans(found) == [(1, 10, 95), (2, 95, 195), (3, 195, 295)]  # the first from the thread's first op
    assert found.warmup is None and found.source == f"inferred from Optimizer.step annotations ({SGD})"
    assert found.spans["tid"].unique().to_list() == ["1"]  # the loop's thread, not the busier autograd one


def test_two_optimizers_end_at_the_last(tmp_path: Path) -> None:
    """Shampoo then an EMA each iteration (HTA's trace_filter traces): the iteration ends with the EMA."""
    events = [e for i in range(2) for e in _training(100 * i, i + 1, optimizer="Optimizer.step#Shampoo.step")]
    events += [annotation("Optimizer.step#EMAOptimizer.step", ts=100 * i + 96, dur=2) for i in range(2)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.marker == "Optimizer.step#EMAOptimizer.step" and _spans(found) == [(1, 10, 98), (2, 98, 198)]


def test_two_optimizers_of_one_class_each_iteration_are_one_iteration(tmp_path: Path) -> None:
    """A GAN: each batch (one DataLoader fetch) runs a discriminator and a generator step, two Adam optimizers, so
    Optimizer.step#Adam.step comes twice per iteration: the iteration ends with the second (once: twice the
    iterations, every other one read as set-up or an outlier)."""
    adam = "Optimizer.step#Adam.step"
    events = [e for i in range(3) for e in _training(100 * i, i + 1, optimizer=adam, loader=True)]
    events += [annotation(adam, ts=100 * i + 42, dur=2) for i in range(3)]  # the discriminator's step
    events.append(annotation(LOADER, ts=300, dur=2))  # the StopIteration fetch
    found = _found(load_events(tmp_path, trace(*events)))
    assert (found.signal, found.marker, found.markers) == (Signal.OPTIMIZER_STEP, adam, 3)
    assert _spans(found) == [(1, 0, 95), (2, 95, 195), (3, 195, 295)] and found.warmup is None


def test_optimizer_ops_grouped_between_backward_passes(tmp_path: Path) -> None:
    """No Optimizer.step annotation: runs of _foreach ops (clip_grad_norm's _foreach_norm, then the update) with
    no backward between them are one optimizer step; zero_grad's _foreach_zero_ is no marker."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        t0 = 100 * i
        events += _training(t0, i + 1, optimizer=None)
        events += [cpu_op("aten::_foreach_zero_", ts=t0 + 5, dur=3),
                   cpu_op("aten::_foreach_norm", ts=t0 + 78, dur=2), cpu_op("aten::stack", ts=t0 + 81, dur=1),
                   cpu_op("aten::_foreach_mul_", ts=t0 + 83, dur=4), cpu_op("aten::_foreach_add_", ts=t0 + 88, dur=5)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.signal is Signal.OPTIMIZER_OPS
    assert _spans(found) == [(1, 5, 93), (2, 93, 193), (3, 193, 293)]


def test_dataloader_starts_each_iteration_and_stop_iteration_opens_none(tmp_path: Path) -> None:
    """An inference loop over a DataLoader: 3 batches, then the __next__ that raises StopIteration (no op after
    it) opens no iteration."""
    events = [e for i in range(3) for e in _training(100 * i, i + 1, optimizer=None, loader=True)]
    events.append(annotation(LOADER, ts=300, dur=2))
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.signal is Signal.DATALOADER and found.markers == 4
    assert _spans(found) == [(1, 0, 100), (2, 100, 200), (3, 200, 300)]


def test_two_loaders_zipped_are_one_fetch_per_iteration(tmp_path: Path) -> None:
    """`for (a, _), (b, _) in zip(loader_a, loader_b)`: two fetches back to back, nothing between them, then the
    body; the loop ends at loader_a's StopIteration. Three iterations, not six (once: one per fetch)."""
    events = [e for i in range(3) for e in (annotation(LOADER, ts=100 * i, dur=4),  # loader_a, then loader_b
                                            annotation(LOADER, ts=100 * i + 5, dur=4),
                                            cpu_op("aten::linear", ts=100 * i + 10, dur=80))]
    events.append(annotation(LOADER, ts=300, dur=2))
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.signal is Signal.DATALOADER and found.markers == 4  # fetch pairs, and the StopIteration
    assert _spans(found) == [(1, 0, 100), (2, 100, 200), (3, 200, 300)]


def test_work_after_the_loop_is_no_iteration(tmp_path: Path) -> None:
    """An evaluation loop whose fetches run ops (collate), then work after the loop (a checkpoint, metrics): the
    last fetch, the StopIteration, runs no op, so it opens no iteration though ops follow it (once: a fourth
    iteration of 300 µs)."""
    events = [e for i in range(3) for e in _training(100 * i, i + 1, optimizer=None, loader=True)]
    events += [cpu_op("aten::stack", ts=100 * i + 2, dur=6) for i in range(3)]
    events += [annotation(LOADER, ts=300, dur=2), cpu_op("aten::mm", ts=310, dur=300)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.signal is Signal.DATALOADER and _spans(found) == [(1, 0, 100), (2, 100, 200), (3, 200, 300)]


def test_repeated_top_level_annotation(tmp_path: Path) -> None:
    """record_function("train_step") around each iteration; the nested "loss" (twice as many) and torch's
    own collective annotations are not candidates."""
    events: list[dict[str, Any]] = []
    for i in range(4):
        t0 = 100 * i
        events += _training(t0, i + 1, optimizer=None)
        events += [annotation("train_step", ts=t0 + 2, dur=95), annotation("loss", ts=t0 + 40, dur=2),
                   annotation("loss", ts=t0 + 42, dur=2)]
        events += [annotation("nccl:all_reduce", ts=t0 + 98, dur=0.5),
                   annotation("nccl:all_reduce", ts=t0 + 99, dur=0.5)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert (found.signal, found.marker) == (Signal.ANNOTATION, "train_step")
    assert [s for s, _, _ in _spans(found)] == [1, 2, 3, 4]
    assert _spans(found)[:3] == [(1, 2, 102), (2, 102, 202), (3, 202, 302)]


def test_repeated_top_level_module_call(tmp_path: Path) -> None:
    """with_modules: Net_0 and then the loss module are called once per iteration (ties: the first seen wins);
    Linear_0 inside Net_0 is not top level."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        t0 = 100 * i
        events += _training(t0, i + 1, optimizer=None)
        events += [python_fn("nn.Module: Net_0", ts=t0 + 8, dur=34),
                   python_fn("nn.Module: Linear_0", ts=t0 + 9, dur=30),
                   python_fn("nn.Module: Linear_0", ts=t0 + 39.5, dur=1),
                   python_fn("nn.Module: CrossEntropyLoss_0", ts=t0 + 42, dur=2)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert (found.signal, found.marker) == (Signal.MODULE, "nn.Module: Net_0")
    assert _spans(found)[:2] == [(1, 8, 108), (2, 108, 208)] and found.spans.height == 3


def test_strongest_signal_wins(tmp_path: Path) -> None:
    events = [e for i in range(3) for e in _training(100 * i, i + 1, loader=True)]
    events += [annotation("train_step", ts=100 * i + 1, dur=98) for i in range(3)]
    assert _found(load_events(tmp_path, trace(*events))).signal is Signal.OPTIMIZER_STEP


def test_one_optimizer_step_means_one_iteration(tmp_path: Path) -> None:
    """One Optimizer.step: the trace holds one iteration, and the three all-reduce-like annotations repeating
    inside it are not iterations (PARAM's DLRM traces with their step hidden)."""
    events = _training(0, 1) + [annotation("bucket_allreduce", ts=50 + 5 * i, dur=2) for i in range(3)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.signal is None and found.spans.height == 0 and found.source == "none"


def test_repeats_nested_in_one_call_are_not_iterations(tmp_path: Path) -> None:
    """One forward of a compiled model: 25 GraphModule pieces inside one top-level module call (vLLM)."""
    events = [python_fn("nn.Module: Model_0", ts=0, dur=1000)]
    events += [python_fn("nn.Module: GraphModule_0", ts=10 + 30 * i, dur=20) for i in range(25)]
    events += [cpu_op("aten::mm", ts=11 + 30 * i, dur=10) for i in range(25)]
    assert _found(load_events(tmp_path, trace(*events))).signal is None


def test_profiler_steps_are_read_not_inferred(tmp_path: Path) -> None:
    events = [step(7 + i, ts=100 * i, dur=100) for i in range(3)]
    events += [e for i in range(3) for e in _training(100 * i, i + 1)]
    events[0]["dur"] = 100  # a slow first step stays: a schedule's warm-up is outside ProfilerStep already
    found = _found(load_events(tmp_path, trace(*events)))
    assert (found.signal, found.inferred, found.warmup, found.source) == (Signal.PROFILER_STEP, False, None,
                                                                         "ProfilerStep")
    assert found.spans["step"].to_list() == [7, 8, 9]


# GIVEN a first iteration full of set-up WHEN the trace is analysed THEN it is reported and left out


def _with_setup(tmp_path: Path) -> Trace:
    """Four iterations; the first runs 300 µs longer: cudaMalloc, cuDNN autotuning, stream creation."""
    events = [cpu_op("aten::empty", ts=0, dur=300),
              runtime("cudaMalloc", ts=10, dur=100), runtime("cudnnFindConvolutionForwardAlgorithmEx", ts=120, dur=150),
              runtime("cudaStreamCreateWithPriority", ts=280, dur=5)]
    events += [e for i in range(4) for e in _training(300 + 100 * i, i + 1, loader=True)]
    return load_events(tmp_path, trace(*events))


def test_setup_iteration_reported_and_excluded(tmp_path: Path) -> None:
    t = _with_setup(tmp_path)
    frames = TraceFrames(t)
    found = frames.iterations
    assert _spans(found)[0] == (1, 0, 395) and found.spans.height == 4
    w = found.warmup
    assert w is not None and (w.step, w.wall_ns, w.median_ns, w.setup_ns) == (1, 395_000, 100_000, 295_000)
    assert w.setup_calls["name"].to_list() == ["cudnnFindConvolutionForwardAlgorithmEx", "cudaMalloc",
                                               "cudaStreamCreateWithPriority"]
    assert w.text.startswith("first iteration: 295 µs of set-up, excluded (395 µs against a median of 100 µs; "
                             "cudnnFindConvolutionForwardAlgorithmEx ×1, cudaMalloc ×1")
    # every steady-state figure starts at iteration 2
    assert frames.profiler_steps["step"].to_list() == [2, 3, 4]
    steps = step_breakdown(frames)
    assert steps.steps["step"].to_list() == [2, 3, 4] and steps.steps["wall_ns"].to_list() == [100_000] * 3
    gaps = gpu_gaps(frames)
    assert gaps.window_ns == 300_000 and gaps.window_kind.startswith("steps (inferred from Optimizer.step")
    info = trace_info(frames)
    assert (info.steps_found, info.step_numbers, info.step_source) == (3, "2..4", found.source)
    codes = dict(zip(info.warnings["code"], info.warnings["count"], strict=True))
    assert codes["steps_inferred"] == 4 and codes["setup_iteration_excluded"] == 1 and "missing_steps" not in codes


def test_the_first_step_waits_for_the_set_up_iterations_gpu_work(tmp_path: Path) -> None:
    """The set-up iteration [0, 395) launches a kernel that runs until 412, into iteration 2's CPU span [395, 495),
    before iteration 2's own kernel (415-445): like GPU work launched before the trace, it stands for the previous
    step, so step 2's window starts at 412 (once at 395, its busy time counting 17 µs of the set-up's kernel)."""
    events = [cpu_op("aten::empty", ts=0, dur=300), runtime("cudaMalloc", ts=10, dur=100),
              runtime("cudaLaunchKernel", ts=200, dur=5, correlation=900),
              kernel("setup_fill", ts=210, dur=202, correlation=900)]
    events += [e for i in range(4) for e in _training(300 + 100 * i, i + 1, loader=True)]
    frames = TraceFrames(load_events(tmp_path, trace(*events)))
    assert frames.iterations.warmup is not None and frames.setup_span == (0, 395_000)
    steps = step_breakdown(frames)
    assert steps.steps.select("step", "wall_ns", "gpu_busy_ns").rows() == [
        (2, 83_000, 30_000), (3, 100_000, 30_000), (4, 100_000, 30_000)]
    # AND the dependency graph's replay of step 2 starts there too
    from stepscope.analyze.whatif import WhatIf, what_if
    assert what_if(frames, WhatIf()).steps["replay_ns"].to_list() == [83_000, 100_000, 100_000]


def test_first_iteration_within_twice_the_median_is_steady(tmp_path: Path) -> None:
    events = [cpu_op("aten::empty", ts=0, dur=80)] + [e for i in range(3) for e in _training(80 + 100 * i, i + 1)]
    found = _found(load_events(tmp_path, trace(*events)))
    assert found.warmup is None and found.spans["dur_ns"].to_list() == [175_000, 100_000, 100_000]


# GIVEN a trace without ProfilerStep WHEN summary, steps and gaps report exposed data loading THEN they agree


def _exposed(t: Trace) -> tuple[int, int, int | None]:
    b = TraceAnalysis.of(t)
    v = b.verdict
    from_summary = round((v.data_loading_fraction or 0.0) * v.wall_ns)
    from_steps = int(b.steps.steps["data_loading_exposed_ns"].sum()) if b.steps.steps_found else 0
    return from_summary, from_steps, b.gaps.data_loading_exposed_ns


def test_exposed_data_loading_agrees_on_inferred_steps(tmp_path: Path) -> None:
    assert _exposed(_with_setup(tmp_path)) == (30_000, 30_000, 30_000)  # 10 µs a step, no GPU work then
    # AND summary's places to look count the fetches of those steps, not the set-up iteration's (once 40 µs, 4)
    v = verdict(_with_setup(tmp_path / "again"))
    assert v.places.rows()[0] == ("annotation", "DataLoader __next__", 30_000, 3)


def test_exposed_data_loading_agrees_without_any_steps(tmp_path: Path) -> None:
    """No repeating structure: summary used to pass 0 while gaps blamed the idle time on data loading."""
    events = [kernel("k", ts=40, dur=20), annotation(LOADER, ts=60, dur=35), kernel("k", ts=70, dur=5),
              runtime("cudaLaunchKernel", ts=96, dur=2, correlation=9), kernel("k", ts=100, dur=10, correlation=9)]
    t = load_events(tmp_path, trace(*events))
    assert _found(t).signal is None
    g = gpu_gaps(t)
    assert g.window_kind == "trace (no ProfilerStep)" and g.window_ns == 70_000
    assert g.data_loading_exposed_ns == 30_000  # 60-95 less the kernel at 70-75
    assert "data_loading" in g.idle_by_cause["cause"].to_list()
    v = verdict(t)
    assert v.steps_found == 0 and v.data_loading_fraction == pytest.approx(30_000 / 70_000)


# GIVEN the corpus WHEN iterations are inferred THEN the counts match a slow count of the raw JSON


def _raw_events(path: Path) -> list[dict[str, Any]]:
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    doc = json.loads(text)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


NO_STEP_TRACES = {
    # path under traces/: the marker whose CPU-side events the slow count counts (None: no repeating structure)
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz": "Optimizer.step#SGD.step",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": None,
    "hta/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz": None,
    "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz": None,
    "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz": None,
    "kineto/docs/after_fix_trace.json": None,
    "kineto/docs/before_fix_trace.json": None,
    "tracelens/b200/eager_trace.json.gz": None,
    "tracelens/torch_compile_triton/trace.json.gz": None,
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz": None,
    "tracelens/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz": None,
    "tracelens/inference/vllm_prefilldecode_piecewise/capture_traces/"
    "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz": None,
    "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz": None,
    "zoology/trace.json": None,
}


@pytest.mark.parametrize("name", sorted(NO_STEP_TRACES))
def test_corpus_traces_without_profiler_step(corpus: Path, tmp_path: Path, name: str) -> None:
    path = corpus / "traces" / name
    raw = _raw_events(path)
    assert not any(str(e.get("name", "")).startswith("ProfilerStep#") for e in raw)
    found = _found(load(path, cache_dir=tmp_path))
    marker = NO_STEP_TRACES[name]
    if marker is None:
        # the slow check: no optimizer step or DataLoader call, and no name repeating at the top level
        assert not any(str(e.get("name", "")).startswith(("Optimizer.step#", "enumerate(DataLoader)")) for e in raw)
        assert found.signal is None and found.spans.height == 0
        return
    cpu_markers = [e for e in raw if e.get("name") == marker and e.get("cat") != "gpu_user_annotation"]
    assert found.marker == marker and found.spans.height == len(cpu_markers) == 5


# ProfilerStep traces with their steps hidden: the iterations found must be the ProfilerSteps, one for one
HIDDEN_STEP_TRACES = (
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "kineto/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
    "param/dlrm_kineto/worker2_step_12.1694128201554.pt.trace.json",  # one step: nothing inferred
)


@pytest.mark.parametrize("name", HIDDEN_STEP_TRACES)
def test_hidden_profiler_steps_are_recovered(corpus: Path, tmp_path: Path, name: str) -> None:
    path = corpus / "traces" / name
    by_name = Counter(str(e.get("name")) for e in _raw_events(path))
    steps = sum(n for k, n in by_name.items() if k.startswith("ProfilerStep#"))
    t = load(path, cache_dir=tmp_path)
    profiler_steps = t.steps.collect()
    found = iterations(t, profiler_steps.clear())
    assert found.spans.height == (steps if steps > 1 else 0)
    if steps > 1:
        # each iteration overlaps its ProfilerStep for most of both
        for a, b in zip(profiler_steps.iter_rows(named=True), found.spans.iter_rows(named=True), strict=True):
            overlap = min(a["end_ns"], b["end_ns"]) - max(a["ts_ns"], b["ts_ns"])
            assert overlap > 0.6 * max(a["dur_ns"], b["dur_ns"])


def test_corpus_setup_iteration(corpus: Path, tmp_path: Path) -> None:
    """HTA's step_based_trace: the first iteration's first copy to the GPU allocates (aten::to 2.3 ms)."""
    t = load(corpus / "traces/hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz", cache_dir=tmp_path)
    b = TraceAnalysis.of(t)
    w = b.frames.iterations.warmup
    assert w is not None and w.step == 1 and w.wall_ns > 2 * w.median_ns
    assert b.steps.steps["step"].to_list() == [2, 3, 4, 5] and b.verdict.steps_found == 4


@pytest.mark.parametrize("name", ["kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                                  "hta/trace_diff/control/control.json.gz"])
def test_exposed_data_loading_agrees_on_profiler_steps(corpus: Path, tmp_path: Path, name: str) -> None:
    s, st, g = _exposed(load(corpus / "traces" / name, cache_dir=tmp_path))
    assert s == st == g and st > 0


# GIVEN real captures without a schedule WHEN analysed THEN the loop's iterations and its set-up are found

TRAIN_STEPS = 6
INFER_BATCHES = 5


def _capture_training(path: Path) -> None:
    """A tiny CPU training loop under a plain profile(): the model (lazy), the optimizer and a 600x600 warm-up
    matmul are built inside the first iteration."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(TRAIN_STEPS * 8, 16), torch.randint(0, 4, (TRAIN_STEPS * 8,))),
                        batch_size=8)
    model: Any = None
    opt: Any = None
    with torch.profiler.profile() as prof:
        for x, y in loader:
            if model is None:
                model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 4))
                w = torch.randn(600, 600)
                for _ in range(10):
                    w = w @ w / 600
            loss: Any = nn.functional.cross_entropy(model(x), y)
            if opt is None:
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
    prof.export_chrome_trace(str(path))


def _capture_inference(path: Path, *, loader: bool) -> None:
    """A tiny CPU inference loop with module frames, over a DataLoader or a list of batches."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    data = torch.randn(INFER_BATCHES * 4, 16)
    batches: Any = DataLoader(TensorDataset(data), batch_size=4) if loader else [(b,) for b in data.split(4)]
    with torch.profiler.profile(with_stack=True, with_modules=True) as prof, torch.no_grad():
        for (x,) in batches:
            model(x)
    prof.export_chrome_trace(str(path))


@pytest.fixture(scope="module")
def training_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "train.pt.trace.json"
    _capture_training(path)
    return path


def test_capture_training_loop(training_capture: Path, tmp_path: Path) -> None:
    raw = _raw_events(training_capture)
    assert sum(str(e["name"]).startswith("Optimizer.step#") for e in raw) == TRAIN_STEPS  # the slow count
    b = TraceAnalysis.of(load(training_capture, cache_dir=tmp_path))
    found = b.frames.iterations
    assert found.signal is Signal.OPTIMIZER_STEP and found.spans.height == TRAIN_STEPS
    assert found.warmup is not None and found.warmup.step == 1
    assert b.steps.steps_found == TRAIN_STEPS - 1 and b.steps.steps["step"].to_list() == list(range(2, TRAIN_STEPS + 1))
    assert b.info.step_source == found.source and "setup_iteration_excluded" in b.info.warnings["code"].to_list()
    assert b.verdict.steps_found == TRAIN_STEPS - 1
    s, st, g = _exposed(b.trace)
    assert s == st == g and st > 0  # CPU only: every DataLoader ns is exposed
    assert st == int(b.steps.steps["data_loading_ns"].sum())


@pytest.mark.parametrize(("loader", "signal", "marker"), [(True, Signal.DATALOADER, "enumerate(DataLoader)#"),
                                                          (False, Signal.MODULE, "nn.Module: Sequential_0")])
def test_capture_inference_loop(tmp_path: Path, loader: bool, signal: Signal, marker: str) -> None:
    path = tmp_path / "infer.pt.trace.json"
    _capture_inference(path, loader=loader)
    raw = _raw_events(path)
    # the slow count: DataLoader calls (one more than the batches: StopIteration), or the model's calls
    assert sum(str(e["name"]).startswith(marker) for e in raw) == INFER_BATCHES + loader
    found = _found(load(path, cache_dir=tmp_path / "cache"))
    assert found.signal is signal and str(found.marker).startswith(marker)
    assert found.spans.height == INFER_BATCHES  # StopIteration opens none


def _capture_loop(path: Path, kind: str) -> int:
    """A tiny CPU loop under a plain profile() of `kind`: "gan" (a discriminator and a generator step a batch, two
    Adam optimizers), "zip" (an evaluation over two DataLoaders zipped) or "after" (an evaluation loop, then work
    after it); returns how many iterations ran."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)

    def batches() -> Any:
        return DataLoader(TensorDataset(torch.randn(INFER_BATCHES * 4, 16)), batch_size=4)

    ran = 0
    with torch.profiler.profile() as prof:
        if kind == "gan":
            gen, disc = nn.Linear(16, 16), nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
            opt_g, opt_d = torch.optim.Adam(gen.parameters()), torch.optim.Adam(disc.parameters())
            for (x,) in batches():
                loss_d: Any = disc(x).mean() - disc(gen(x).detach()).mean()
                opt_d.zero_grad()
                loss_d.backward()
                opt_d.step()
                loss_g: Any = -disc(gen(x)).mean()
                opt_g.zero_grad()
                loss_g.backward()
                opt_g.step()
                ran += 1
        else:
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            with torch.no_grad():
                if kind == "zip":
                    for (a,), (b,) in zip(batches(), batches(), strict=False):
                        model(a), model(b)
                        ran += 1
                else:
                    for (a,) in batches():
                        model(a)
                        ran += 1
                    for _ in range(20):  # after the loop: a checkpoint, metrics
                        torch.randn(256, 256) @ torch.randn(256, 256)
    prof.export_chrome_trace(str(path))
    return ran


@pytest.mark.parametrize("kind", ["gan", "zip", "after"])
def test_capture_loops_whose_markers_are_not_one_per_iteration(tmp_path: Path, kind: str) -> None:
    # GIVEN real captures of loops with two Optimizer.step of one name per iteration, two DataLoader fetches per
    # iteration, or ops after the loop's StopIteration fetch THEN each iteration that ran is one step
    path = tmp_path / f"{kind}.pt.trace.json"
    ran = _capture_loop(path, kind)
    raw = _raw_events(path)
    optimizer_steps = sum(str(e["name"]).startswith("Optimizer.step#") for e in raw)
    fetches = sum(str(e["name"]).startswith("enumerate(DataLoader)#") for e in raw)
    assert (optimizer_steps, fetches) == {"gan": (2 * ran, ran + 1), "zip": (0, 2 * ran + 1),
                                          "after": (0, ran + 1)}[kind]  # the slow count
    found = _found(load(path, cache_dir=tmp_path / "cache"))
    assert found.spans.height == ran == INFER_BATCHES
