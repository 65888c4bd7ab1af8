"""The verdict rule table: each rule triggered by a synthetic trace, and the real resnet50 pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import annotation, cpu_op, kernel, load_events, memcpy, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.info import trace_warnings
from stepscope.analyze.steps import step_breakdown
from stepscope.analyze.summary import (
    RULES,
    SummaryResult,
    Verdict,
    decide,
    decision_margin,
    rules_markdown,
    runner_up,
    verdict,
)

FALLBACKS = {Verdict.LAUNCH_BOUND, Verdict.GPU_BOUND}  # broad rules that also hold under a specific one


def _launched(name: str, ts: float, dur: float, corr: int, launch_ts: float) -> list[dict[str, Any]]:
    return [runtime("cudaLaunchKernel", ts=launch_ts, dur=1, correlation=corr),
            kernel(name, ts=ts, dur=dur, correlation=corr)]


CASES: dict[Verdict, list[dict[str, Any]]] = {
    Verdict.NO_GPU: [step(1, ts=0, dur=100), cpu_op("aten::add", ts=10, dur=50)],
    # DataLoader 0-30 with the GPU idle (30% exposed); GPU busy 70%.
    Verdict.DATA_LOADING_BOUND: [step(1, ts=0, dur=100),
                                 annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 30),
                                 *_launched("sgemm", 30, 70, 1, 29)],
    # cudaDeviceSynchronize 10-40 (30%) while the GPU is busy only 10%.
    Verdict.SYNC_BOUND: [step(1, ts=0, dur=100), *_launched("sgemm", 5, 10, 1, 2),
                         runtime("cudaDeviceSynchronize", ts=10, dur=30)],
    # a 20 µs pageable HtoD copy in a step whose GPU is busy 90%.
    Verdict.TRANSFER_BOUND: [step(1, ts=0, dur=100), runtime("cudaMemcpyAsync", ts=1, dur=2, correlation=9),
                             memcpy("HtoD", ts=10, dur=20, nbytes=1 << 20, correlation=9),
                             *_launched("sgemm", 30, 70, 1, 5)],
    # ten 2 µs kernels: GPU busy 20%.
    Verdict.LAUNCH_BOUND: [step(1, ts=0, dur=100),
                           *[e for i in range(10) for e in _launched("add", 10 * i + 5, 2, 100 + i, 10 * i)]],
    Verdict.GPU_BOUND: [step(1, ts=0, dur=100), *_launched("sgemm", 3, 97, 1, 1)],
}


def _evidence(r: SummaryResult) -> dict[str, float | None]:
    return {"gpu_events": 0.0 if r.verdict is Verdict.NO_GPU else 1.0, "gpu_busy_fraction": r.gpu_busy_fraction,
            "data_loading_fraction": r.data_loading_fraction, "sync_fraction": r.sync_fraction,
            "memcpy_fraction": r.memcpy_fraction, "pageable_memcpy_fraction": r.pageable_memcpy_fraction,
            "sync_idle_fraction": r.sync_idle_fraction, "memcpy_idle_fraction": r.memcpy_idle_fraction,
            "launch_idle_fraction": r.launch_idle_fraction, "tiny_kernel_fraction": r.tiny_kernel_fraction}


#: the second clause of a rule, each triggered alone (the first clause stays below its threshold)
CLAUSES: dict[str, tuple[Verdict, list[dict[str, Any]]]] = {
    # kernel 0-50; aten::item 5-65, its cudaStreamSynchronize 6-50 (the host blocked 44%) waits for it; the next
    # kernel, launched at 64, runs 75-100: the gap 50-75 has its midpoint in aten::item (GPU idle 25% behind a
    # host sync), and with GPU busy 75% the sync calls' clause (busy < 60%) does not hold
    "sync: GPU idle behind aten::item, the host blocked in it": (Verdict.SYNC_BOUND, [
        step(1, ts=0, dur=100), *_launched("sgemm", 0, 50, 1, 0),
        cpu_op("aten::item", ts=5, dur=60), runtime("cudaStreamSynchronize", ts=6, dur=44),
        *_launched("sgemm", 75, 25, 2, 64)]),
    # a 4 µs pinned HtoD copy (memcpy 4%, not pageable) that the GPU waits 16 µs for (gap 10-26 ends with it)
    "transfer: GPU idle waiting for a copy": (Verdict.TRANSFER_BOUND, [
        step(1, ts=0, dur=100), *_launched("sgemm", 0, 10, 1, 0),
        runtime("cudaMemcpyAsync", ts=5, dur=2, correlation=9),
        memcpy("HtoD", ts=26, dur=4, nbytes=1 << 20, correlation=9, src="Pinned"),
        *_launched("sgemm", 30, 70, 2, 8)]),
}


@pytest.mark.parametrize("case", list(CLAUSES))
def test_each_second_clause_triggers_its_rule_alone(tmp_path: Path, case: str) -> None:
    expected, events = CLAUSES[case]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.verdict is expected
    triggered = {rule.verdict for rule in RULES if rule.condition(_evidence(r))}
    assert triggered - FALLBACKS == {expected}
    if expected is Verdict.SYNC_BOUND:
        assert r.sync_fraction == pytest.approx(0.44) and r.sync_idle_fraction == pytest.approx(0.25)
        assert r.places.row(0, named=True) == {"what": "GPU idle behind sync at", "name": "aten::item",
                                               "total_ns": 25_000, "count": 1}
        assert r.sync_note is None
    else:
        assert r.memcpy_fraction == pytest.approx(0.04) and r.pageable_memcpy_fraction == 0.0
        assert r.memcpy_idle_fraction == pytest.approx(0.16)


@pytest.mark.parametrize("expected", list(CASES))
def test_each_rule_triggered_by_its_trace(tmp_path: Path, expected: Verdict) -> None:
    r = verdict(load_events(tmp_path, trace(*CASES[expected])))
    assert r.verdict is expected
    assert r.per_step["verdict"].to_list() == [expected.value]
    triggered = {rule.verdict for rule in RULES if rule.condition(_evidence(r))}
    assert triggered - FALLBACKS == ({expected} - FALLBACKS)
    assert r.rules.filter(r.rules["matched"])["verdict"].to_list() == [expected.value]
    assert r.places.height >= 1


def _item_gap(sync_us: float) -> list[dict[str, Any]]:
    """kernel 0-10; aten::item 10-60 whose cudaStreamSynchronize (11..11+sync_us) returns at once; the CPU then
    takes until 65 to launch the next kernel, which runs 70-100. The gap 10-70 has its midpoint in aten::item: the
    GPU idles 60% of the step behind a host sync, while the host is blocked in it for sync_us."""
    return [step(1, ts=0, dur=100), *_launched("sgemm", 0, 10, 1, 0), cpu_op("aten::item", ts=10, dur=50),
            runtime("cudaStreamSynchronize", ts=11, dur=sync_us), *_launched("sgemm", 70, 30, 2, 65)]


def test_idle_behind_syncs_that_barely_block_the_host_is_not_sync_bound(tmp_path: Path) -> None:
    """Removing the syncs saves at most the host's blocked time (1% here): the GPU then waits for the CPU's launch
    as long as before. The replay without syncs (`whatif --no-sync`, an independent computation over the
    dependency graph) agrees: it saves no more than that."""
    from stepscope.analyze.whatif import WhatIf, what_if

    t = load_events(tmp_path, trace(*_item_gap(1)))
    r = verdict(t)
    assert r.sync_idle_fraction == pytest.approx(0.6) and r.sync_fraction == pytest.approx(0.01)
    assert r.verdict is Verdict.LAUNCH_BOUND and r.per_step["verdict"].to_list() == ["launch_bound"]
    assert r.sync_note is not None and r.sync_note.startswith(
        "GPU idle behind host syncs 60.0%, but the host was blocked in them for 1.0% of the step")
    saving = what_if(t, WhatIf(no_sync=True)).saving_fraction
    assert saving is not None and r.sync_fraction is not None and saving <= r.sync_fraction + 1e-9
    # AND where the host is blocked as long as the GPU idles (40%: it waits for work queued on the stream), the
    # syncs are the cost: sync_bound
    assert verdict(load_events(tmp_path / "b", trace(*_item_gap(40)))).verdict is Verdict.SYNC_BOUND


def test_syncs_on_two_threads_at_once_count_their_blocked_time_once(tmp_path: Path) -> None:
    """The host's time blocked in syncs is the time some thread was blocked: two threads' overlapping syncs
    (10-40 and 20-50) block it for 40 µs of the 100 µs step, not 60, with or without ProfilerStep."""
    syncs = [runtime("cudaDeviceSynchronize", ts=10, dur=30), runtime("cudaStreamSynchronize", ts=20, dur=30, tid=2)]
    work = [*_launched("sgemm", 5, 5, 1, 2), *_launched("sgemm", 60, 5, 2, 55)]
    stepped = verdict(load_events(tmp_path / "a", trace(step(1, ts=0, dur=100), *work, *syncs)))
    assert stepped.sync_calls == 2 and stepped.sync_fraction == pytest.approx(0.4)
    assert stepped.per_step["sync_fraction"].to_list() == pytest.approx([0.4])
    # no step: the window is the GPU's first to last event (5-65, 60 µs), the syncs' union still 40 µs
    whole = verdict(load_events(tmp_path / "b", trace(*work, *syncs)))
    assert whole.sync_calls == 2 and whole.sync_fraction == pytest.approx(40 / 60)


def test_without_runtime_calls_the_idle_behind_syncs_decides_alone(tmp_path: Path) -> None:
    """A trace that records no runtime calls (no launch linked to its GPU work, no sync call) cannot show the
    host's blocked time: unknown, not 0, and the GPU idle behind aten::item decides."""
    events = [e for e in _item_gap(1) if e.get("cat") != "cuda_runtime"]
    for e in events:
        e.get("args", {}).pop("correlation", None)
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.sync_fraction is None and r.sync_idle_fraction == pytest.approx(0.6)
    assert r.verdict is Verdict.SYNC_BOUND


def test_rule_order_data_loading_before_launch(tmp_path: Path) -> None:
    """The docstring's before/after: exposed data loading wins over low GPU busy (rule 2 before rule 5)."""
    events = [step(1, ts=0, dur=100), annotation("enumerate(DataLoader)#It.__next__", 0, 30),
              *_launched("sgemm", 40, 40, 1, 35)]
    assert verdict(load_events(tmp_path / "a", trace(*events))).verdict is Verdict.DATA_LOADING_BOUND
    events[1] = annotation("enumerate(DataLoader)#It.__next__", 0, 5)
    assert verdict(load_events(tmp_path / "b", trace(*events))).verdict is Verdict.LAUNCH_BOUND


def test_evidence_figures(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(*CASES[Verdict.TRANSFER_BOUND]))
    r = verdict(t)
    given = verdict(t, gaps=gpu_gaps(t), steps=step_breakdown(t))  # a report's own gaps and steps: same answer
    assert given.verdict is r.verdict and given.per_step.equals(r.per_step) and given.places.equals(r.places)
    assert r.memcpy_fraction == pytest.approx(0.2) and r.pageable_memcpy_fraction == pytest.approx(0.2)
    assert r.gpu_busy_fraction == pytest.approx(0.9)
    assert r.places.row(0, named=True)["total_ns"] == 20_000


def test_a_pageable_share_over_copies_whose_names_do_not_say_is_refused(tmp_path: Path) -> None:
    # GIVEN the transfer-bound step with its copy named as ROCm names copies ("Host -> Device": pageable or pinned
    # unsaid), once with ProfilerStep and once without (whole-trace figures)
    events = [e if e.get("cat") != "gpu_memcpy" else memcpy("HtoD", ts=10, dur=20, nbytes=1 << 20, correlation=9,
                                                            src="Host") for e in CASES[Verdict.TRANSFER_BOUND]]
    for name, doc in (("steps", trace(*events)), ("no_steps", trace(*events[1:]))):
        r = verdict(load_events(tmp_path / name, doc))
        # THEN the copy's share is there and its pageable share is refused, not 0 (the rule on it does not hold)
        assert r.memcpy_fraction is not None and r.memcpy_fraction > 0, name
        assert r.pageable_memcpy_fraction is None, name
        if name == "steps":
            assert r.per_step["pageable_memcpy_fraction"].to_list() == [None]
    # AND with NVIDIA's names the share is exact (the case above: 20%)
    assert verdict(load_events(tmp_path / "nvidia", trace(*CASES[Verdict.TRANSFER_BOUND]))
                   ).pageable_memcpy_fraction == pytest.approx(0.2)


def test_gpu_bound_places_group_template_instances(tmp_path: Path) -> None:
    """Two instances of one templated kernel (10 + 30 µs) outrank a 35 µs kernel as one place."""
    events = [step(1, ts=0, dur=100), *_launched("void at::native::elementwise_kernel<Add>(int)", 1, 10, 1, 0),
              *_launched("void at::native::elementwise_kernel<Mul>(int)", 11, 30, 2, 1),
              *_launched("sgemm", 41, 35, 3, 2), *_launched("relu", 76, 20, 4, 3)]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.verdict is Verdict.GPU_BOUND
    assert r.places.select("name", "total_ns", "count").rows() == [
        ("at::native::elementwise_kernel", 40_000, 2), ("sgemm", 35_000, 1), ("relu", 20_000, 1)]


def test_without_steps_uses_gpu_span(tmp_path: Path) -> None:
    r = verdict(load_events(tmp_path, trace(*_launched("sgemm", 0, 90, 1, 0), *_launched("add", 95, 5, 2, 1))))
    assert r.steps_found == 0 and r.wall_ns == 100_000 and r.verdict is Verdict.GPU_BOUND


RESNET = "traces/kineto/resnet50_num_workers_{}/"


def test_resnet50_pair(corpus: Path, tmp_path: Path) -> None:
    """num_workers=0 spends a third of each step loading data; num_workers=4 does not."""
    r0 = verdict(load(next((corpus / RESNET.format(0)).glob("*.json.gz")), cache_dir=tmp_path))
    r4 = verdict(load(next((corpus / RESNET.format(4)).glob("*.json.gz")), cache_dir=tmp_path))
    assert r0.verdict is Verdict.DATA_LOADING_BOUND
    assert r0.data_loading_fraction == pytest.approx(59_262 / 177_592, rel=0.02)  # tb_plugin: 33.37%
    assert r4.verdict is not Verdict.DATA_LOADING_BOUND
    assert r4.data_loading_fraction is not None and r4.data_loading_fraction < 0.02  # tb_plugin: 0.84%


def test_the_verdict_carries_the_traces_warnings(tmp_path: Path) -> None:
    # GIVEN a trace with a kernel of negative duration
    t = load_events(tmp_path, trace(step(1, ts=0, dur=100), kernel("k", ts=2, dur=90), kernel("k3", ts=95, dur=-3)))
    # WHEN its verdict is computed
    r = verdict(t)
    # THEN the warnings are info's, on the same trace
    assert r.warnings.equals(trace_warnings(t)) and r.warnings["code"].to_list() == ["negative_durations"]


# ------------------------------------------------------------------------------------ advice, margin, README
def _gpu_evidence(**figures: float) -> dict[str, float | None]:
    """A GPU trace's evidence with every figure far from its threshold, but for `figures`."""
    return {"gpu_events": 10.0, "gpu_busy_fraction": 0.9, "data_loading_fraction": 0.0, "sync_fraction": 0.0,
            "memcpy_fraction": 0.0, "pageable_memcpy_fraction": 0.0, "sync_idle_fraction": 0.0,
            "memcpy_idle_fraction": 0.0, "launch_idle_fraction": 0.0, "tiny_kernel_fraction": 0.0, **figures}


def test_cpu_only_data_loading_keeps_the_verdict_without_pin_memory_advice() -> None:
    # GIVEN a CPU-only capture (no GPU work) that waits for data 30% of the step, and the same on a GPU
    cpu_only: dict[str, float | None] = {"gpu_events": 0.0, "data_loading_fraction": 0.3, "sync_fraction": 0.0}
    # WHEN the rule table decides
    rule, gpu_rule = decide(cpu_only), decide(_gpu_evidence(data_loading_fraction=0.3, gpu_busy_fraction=0.7))
    # THEN both are data-loading-bound; only the GPU one is told to pin memory, both to load in parallel
    assert rule.verdict is gpu_rule.verdict is Verdict.DATA_LOADING_BOUND
    assert "pin_memory" not in rule.advice and "pin_memory=True" in gpu_rule.advice
    for word in ("num_workers>0", "persistent_workers=True", "prefetch_factor"):
        assert word in rule.advice and word in gpu_rule.advice
    # AND what would decide without the data loading is no_gpu, 20 points away
    second, close = runner_up(cpu_only), decision_margin(cpu_only)
    assert second is not None and second.verdict is Verdict.NO_GPU
    assert close is not None and close.text == "exposed data loading 30.0% >= 10%: 20.0 points from no_gpu"


def test_cpu_only_trace_waiting_for_data(tmp_path: Path) -> None:
    # GIVEN a CPU-only step that spends 30 of its 100 µs in the DataLoader
    events = [step(1, ts=0, dur=100), annotation("enumerate(DataLoader)#It.__next__", 0, 30),
              cpu_op("aten::add", ts=40, dur=50)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN it is data-loading-bound, with advice that fits a run without a GPU
    assert r.verdict is Verdict.DATA_LOADING_BOUND and "pin_memory" not in r.advice
    assert r.runner_up is Verdict.NO_GPU and r.per_step["runner_up"].to_list() == ["no_gpu"]


def test_cpu_only_trace_without_steps_is_taken_whole(tmp_path: Path) -> None:
    """Without ProfilerStep and without GPU work there is no GPU span: the figures are shares of the trace from
    its first event to its last (the window `ranks` takes), so a loop waiting for data still says so."""
    from stepscope.reports.summary_text import render_summary

    # GIVEN no step and no GPU: the DataLoader 0-30 µs, ops until 100 µs
    events = [annotation("enumerate(DataLoader)#It.__next__", 0, 30), cpu_op("aten::add", ts=40, dur=50),
              cpu_op("aten::mul", ts=95, dur=5)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN the window is the trace's 100 µs, 30% of it data loading, and the verdict follows
    assert (r.steps_found, r.wall_ns) == (0, 100_000) and r.data_loading_fraction == pytest.approx(0.3)
    assert r.verdict is Verdict.DATA_LOADING_BOUND and r.runner_up is Verdict.NO_GPU
    assert ("no ProfilerStep and no GPU work in the trace: over the trace (first event to last), 100 µs; share of it:"
            in render_summary(r).splitlines())


def test_places_sum_the_steps_as_one_row(tmp_path: Path) -> None:
    """An older Kineto trace records ProfilerStep#N as a cpu_op: idle and launches under the step itself are one
    place, `ProfilerStep*` (torch's name for every step), not one row per step."""
    events: list[dict[str, Any]] = []
    for i in range(2):  # each 100 µs step launches 3 µs kernels at 10 and 80 µs from no op of its own
        events.append(cpu_op(f"ProfilerStep#{i + 1}", ts=i * 100, dur=100))
        for at in (10, 80):
            corr = len(events)
            events += [runtime("cudaLaunchKernel", ts=i * 100 + at, dur=2, correlation=corr),
                       kernel("k", ts=i * 100 + at + 3, dur=3, correlation=corr)]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.verdict is Verdict.LAUNCH_BOUND and r.steps_found == 2
    assert r.places.select("what", "name", "count").rows() == [
        ("GPU idle, launch late at", "ProfilerStep*", 4), ("op (launches, launch time)", "ProfilerStep*", 4)]


def test_a_graph_launch_is_one_launch_place_not_one_per_replayed_kernel(tmp_path: Path) -> None:
    """A cudaGraphLaunch starts every kernel of its graph: its CPU time is one launch, counted once, under the graph
    launch (sample_traces/cuda_graph_replay_cuda once showed 10x its three 52 µs launches, under aten::addmm)."""
    events: list[dict[str, Any]] = []
    for i in range(2):  # each 100 µs step: one 20 µs graph launch of three 3 µs kernels, one plain 2 µs launch
        events += [cpu_op(f"ProfilerStep#{i + 1}", ts=i * 100, dur=100),
                   runtime("cudaGraphLaunch", ts=i * 100 + 10, dur=20, correlation=10 * i + 1)]
        events += [kernel(f"g{j}", ts=i * 100 + 31 + 4 * j, dur=3, correlation=10 * i + 1) for j in range(3)]
        events += [cpu_op("aten::add", ts=i * 100 + 60, dur=5),
                   runtime("cudaLaunchKernel", ts=i * 100 + 61, dur=2, correlation=10 * i + 2),
                   kernel("add", ts=i * 100 + 70, dur=3, correlation=10 * i + 2)]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.verdict is Verdict.LAUNCH_BOUND
    launches = r.places.filter(pl.col("what") == "op (launches, launch time)")
    assert sorted(launches.select("name", "count", "total_ns").rows()) == [
        ("aten::add", 2, 4_000), ("cudaGraphLaunch", 2, 40_000)]


def test_a_near_call_says_how_near_and_what_came_second() -> None:
    # GIVEN GPU busy 59.6% with every other figure far from its threshold
    ev = _gpu_evidence(gpu_busy_fraction=0.596)
    # WHEN the rule table decides
    close, second = decision_margin(ev), runner_up(ev)
    # THEN launch_bound, 0.4 points from gpu_bound, which is also the runner-up
    assert decide(ev).verdict is Verdict.LAUNCH_BOUND
    assert close is not None and second is not None
    assert (close.figure, close.threshold_fraction, close.towards) == ("gpu_busy_fraction", 0.6, Verdict.GPU_BOUND)
    assert close.margin_fraction == pytest.approx(0.004)
    assert close.text == "GPU busy 59.6% < 60%: 0.4 points from gpu_bound"
    assert second.verdict is Verdict.GPU_BOUND


def test_the_margin_is_the_nearest_threshold_whatever_the_rule() -> None:
    # GIVEN launch_bound by far (GPU busy 30%) but exposed data loading just under its 10%
    ev = _gpu_evidence(gpu_busy_fraction=0.3, data_loading_fraction=0.098)
    close, second = decision_margin(ev), runner_up(ev)
    # THEN the margin is the data loading's 0.2 points; the runner-up is still the next rule that holds
    assert decide(ev).verdict is Verdict.LAUNCH_BOUND and close is not None and second is not None
    assert close.towards is Verdict.DATA_LOADING_BOUND and close.margin_fraction == pytest.approx(0.002)
    assert second.verdict is Verdict.GPU_BOUND


def test_gpu_bound_runner_up_is_the_rule_nearest_to_holding() -> None:
    # GIVEN GPU busy 65%: gpu_bound, the last rule, so no rule after it can hold
    ev = _gpu_evidence(gpu_busy_fraction=0.65)
    close, second = decision_margin(ev), runner_up(ev)
    # THEN the runner-up is the rule that would have decided had GPU busy been under 60%
    assert decide(ev).verdict is Verdict.GPU_BOUND and close is not None and second is not None
    assert second.verdict is Verdict.LAUNCH_BOUND
    assert close.text == "GPU busy 65.0% >= 60%: 5.0 points from launch_bound"


def test_no_gpu_without_figures_has_no_margin_nor_runner_up() -> None:
    ev: dict[str, float | None] = {"gpu_events": 0.0, "data_loading_fraction": None}
    assert decide(ev).verdict is Verdict.NO_GPU and decision_margin(ev) is None and runner_up(ev) is None


def test_the_result_carries_margin_runner_up_and_the_rules_as_applied(tmp_path: Path) -> None:
    # GIVEN the launch-bound case (ten 2 µs kernels: GPU busy 20%)
    r = verdict(load_events(tmp_path, trace(*CASES[Verdict.LAUNCH_BOUND])))
    # THEN the overall and per-step margin and runner-up agree, and the rule table marks them
    assert r.margin is not None and r.margin.towards is Verdict.GPU_BOUND
    assert r.margin.margin_fraction == pytest.approx(0.4) and r.runner_up is Verdict.GPU_BOUND
    assert r.per_step.select("runner_up", "margin").row(0) == ("gpu_bound", r.margin.text)
    assert r.rules.filter("runner_up")["verdict"].to_list() == ["gpu_bound"]
    assert r.rules.filter("holds")["verdict"].to_list() == ["launch_bound", "gpu_bound"]


README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- verdict-rules:start -->", "<!-- verdict-rules:end -->"


def test_readme_rule_table_is_rules_markdown() -> None:
    # GIVEN the README's copy of the verdict rule table, between its two marker lines
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == text.count(END) == 1, f"README.md needs one {START} ... {END} block"
    block = text.split(START, 1)[1].split(END, 1)[0]
    # THEN it is exactly what the code renders from RULES
    assert block.strip("\n") == rules_markdown().strip("\n"), (
        "README.md's verdict rule table differs from RULES; paste the output of "
        "python -c 'from stepscope.analyze.summary import rules_markdown; print(rules_markdown(), end=\"\")'")


def test_readme_prose_names_the_sync_rule_by_its_number() -> None:
    """The prose under the table names the two-figure sync rule by its row number, which moves when a rule is
    added above it."""
    import re

    text = README.read_text(encoding="utf-8").split(END, 1)[1]
    numbers = re.findall(r"Rule (\d+) asks for two figures because removing a sync", text)
    assert len(numbers) == 1
    rule = RULES[int(numbers[0]) - 1]
    assert rule.verdict is Verdict.SYNC_BOUND and "GPU idle behind host syncs" in rule.when


def test_rules_markdown_has_every_rule_in_order() -> None:
    rows = rules_markdown().splitlines()[2:]
    assert [row.split(" | ")[1].strip("`") for row in rows] == [r.verdict.value for r in RULES]
    assert all(r.when in row and r.advice in row for r, row in zip(RULES, rows, strict=True))


def test_every_rule_reads_whole_in_a_table_cell() -> None:
    """The report's and the CLI's rule tables cut a cell past MAX_CELL characters: a rule's condition never is."""
    from stepscope.reports.text import MAX_CELL

    assert all(len(r.when) <= MAX_CELL for r in RULES)


@pytest.mark.parametrize(("shares", "verdict_", "says", "never"), [
    # launch-bound code already compiled: no "use torch.compile", but CUDA graphs and graph breaks
    ({"gpu_busy_fraction": 0.4, "compiled_fraction": 0.8}, Verdict.LAUNCH_BOUND,
     ("reduce-overhead", "graph_breaks"), "fuse small ops (torch.compile)"),
    # launch-bound while replaying graphs: the eager part and the CPU between replays
    ({"gpu_busy_fraction": 0.4, "graph_replay_fraction": 0.9}, Verdict.LAUNCH_BOUND,
     ("between replays", "stepscope graphs"), "use CUDA graphs"),
    # a busy GPU whose matmuls are bandwidth-bound: not "speed up the math"
    ({"gpu_busy_fraction": 0.95, "memory_bound_fraction": 0.9}, Verdict.GPU_BOUND,
     ("bandwidth-bound", "quantize"), "mixed precision"),
    # a busy GPU replaying graphs: map the kernels to ops first
    ({"gpu_busy_fraction": 0.95, "graph_replay_fraction": 0.9}, Verdict.GPU_BOUND,
     ("--graph-capture", "stepscope flops"), "channels_last"),
])
def test_advice_fits_compiled_graph_replayed_and_bandwidth_bound_work(
        shares: dict[str, float], verdict_: Verdict, says: tuple[str, ...], never: str) -> None:
    rule = decide(_gpu_evidence(**shares))
    assert rule.verdict is verdict_ and all(s in rule.advice for s in says) and never not in rule.advice
    # AND below "most" (50%) the plain rule of the same verdict decides
    plain = decide(_gpu_evidence(**{k: (0.3 if k != "gpu_busy_fraction" else v) for k, v in shares.items()}))
    assert plain.verdict is verdict_ and plain is not rule


def test_workload_shares_from_a_trace(tmp_path: Path) -> None:
    # GIVEN 30 µs of kernels replayed by one cudaGraphLaunch, 60 µs of triton kernels, 10 µs of a plain one
    events = [step(1, ts=0, dur=200),
              runtime("cudaGraphLaunch", ts=1, dur=2, correlation=1),
              kernel("gemm_a", ts=10, dur=20, correlation=1), kernel("gemm_b", ts=30, dur=10, correlation=1),
              *_launched("triton_poi_fused_add_0", 50, 60, 2, 45), *_launched("elementwise", 120, 10, 3, 115)]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.graph_replay_fraction == pytest.approx(0.3) and r.compiled_fraction == pytest.approx(0.6)
    assert r.memory_bound_fraction is None  # no FLOP op, no device: nothing to place on a roofline


def test_the_idle_causes_and_busy_add_up_to_the_step(corpus: Path, tmp_path: Path) -> None:
    # GIVEN one-GPU traces: HTA's triton example (one 13.3 s step whose GPU idles after its one kernel while the
    # host compiles), a synthetic trace without steps, resnet50 waiting for its data, df_index before collectives
    triton = verdict(load(corpus / "traces/hta/triton_example/triton_example.json.gz", cache_dir=tmp_path))
    plain = verdict(load_events(tmp_path, trace(*_launched("sgemm", 0, 40, 1, 0), *_launched("add", 90, 10, 2, 80))))
    resnet = verdict(load(next((corpus / RESNET.format(0)).glob("*.json.gz")), cache_dir=tmp_path))
    df_index = verdict(load(corpus / "traces/hta/df_index_resolver/df_index_resolver.json.gz", cache_dir=tmp_path))
    assert (resnet.data_loading_idle_fraction or 0) > 0.3 and (df_index.comm_idle_fraction or 0) > 0.1
    for r in (triton, plain, resnet, df_index):
        # THEN busy and the idle by cause (host syncs, copies, launch overhead, data loading, collectives, and what
        # gaps could not name) cover the window, so the summary shows where every moment went
        parts = (r.gpu_busy_fraction, r.sync_idle_fraction, r.memcpy_idle_fraction, r.launch_idle_fraction,
                 r.data_loading_idle_fraction, r.comm_idle_fraction, r.other_idle_fraction)
        assert all(p is not None for p in parts) and sum(p for p in parts if p is not None) == pytest.approx(1.0)
    assert triton.other_idle_fraction is not None and triton.other_idle_fraction > 0.99
    # and where launch_bound holds by GPU busy alone while nearly all idle has no cause found, a note says so; the
    # synthetic trace's idle is its late launch, and its launch_bound needs no such note
    assert triton.verdict is Verdict.LAUNCH_BOUND and triton.idle_note is not None
    assert triton.idle_note.startswith(f"GPU idle with no cause found {triton.other_idle_fraction:.1%}, behind late "
                                       "launches 0.0%: launch_bound here says only that the GPU is busy under 60%")
    assert plain.verdict is Verdict.LAUNCH_BOUND and plain.idle_note is None


def test_one_summary_links_the_launches_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every analysis a summary runs shares one set of derived frames: the launch links (the costliest frame,
    4 s of a 9M-event trace) are built once, not again for the kernels behind a gpu_bound verdict's places."""
    from stepscope.analyze import frames

    calls = []
    real = frames.ops_by_nesting

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(frames, "ops_by_nesting", counted)
    r = verdict(load_events(tmp_path, trace(*CASES[Verdict.GPU_BOUND])))
    assert r.verdict is Verdict.GPU_BOUND and r.places["what"].to_list() == ["kernel"]
    assert len(calls) == 1
