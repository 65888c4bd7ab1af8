"""What-if (stepscope.analyze.whatif): predictions on traces with known paths, worked out by hand; the replay
with no change reproduces the measured steps (synthetic and the HTA corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import critical_path_traces as cp
import pytest
from builders import cpu_op, kernel, load_events, memcpy, runtime, step, trace

from stepscope.analyze.whatif import WhatIf, parse_speedup, what_if
from stepscope.errors import UsageError

US = 1_000


def predicted(doc: dict[str, Any], tmp_path: Path, change: WhatIf) -> int:
    result = what_if(load_events(tmp_path, doc), change)
    assert result.replay_residual_fraction == 0.0
    return int(result.steps["predicted_ns"][0]) // US


def test_no_change_replays_the_measured_steps(tmp_path: Path) -> None:
    result = what_if(load_events(tmp_path, cp.two_streams()), WhatIf())
    assert result.steps.select("measured_ns", "replay_ns", "predicted_ns").row(0) == (300 * US,) * 3
    assert result.saving_ns == 0 and result.changes == ["(none: the measured graph replayed)"]


def test_a_faster_gemm_shortens_a_step_that_waits_for_it(tmp_path: Path) -> None:
    # sgemm 30-130 becomes 30-80; the sync returns 5 µs later (85) and the rest of the CPU moves up 50 µs
    assert predicted(cp.sync_serializes(), tmp_path, WhatIf(speedups=(("gemm", 2.0),))) == 150
    # in the GPU-bound loop the four 40 µs GEMMs become 20 µs: they end at 90, the sync at 95, the step at 100
    result = what_if(load_events(tmp_path / "b", cp.gpu_bound()), WhatIf(speedups=(("sgemm_[0-3]", 2.0),)))
    assert int(result.steps["predicted_ns"][0]) == 100 * US
    assert result.saving_fraction == pytest.approx(80 / 180)
    assert result.bound_by_measured == "kernel"


def test_a_gpu_bound_loop_made_faster_is_bound_by_the_cpu_that_ran_ahead(tmp_path: Path) -> None:
    # GIVEN a GPU-bound loop whose CPU issues each step in 20 µs, 80 µs ahead of the GPU (cp.cpu_ahead: the step
    # windows begin where the GPU reached their work, after every launch of theirs)
    doc = cp.cpu_ahead()
    measured = what_if(load_events(tmp_path / "a", doc), WhatIf())
    assert measured.steps["measured_ns"].to_list() == [80 * US, 80 * US] == measured.steps["replay_ns"].to_list()
    # WHEN its GEMMs run twice as fast THEN each step takes 40 µs: the GPU still bounds it
    assert what_if(load_events(tmp_path / "b", doc), WhatIf(speedups=(("sgemm", 2.0),))).steps[
        "predicted_ns"].to_list() == [40 * US, 40 * US]
    # WHEN they take 40 ns THEN no step is shorter than the CPU's issue of it (by hand: step 2 from the queued
    # GEMM's end at 0.1 µs to its CPU end at 20, step 3 from 20 to 40), where the launches stayed out of the
    # graph and the GEMMs ran before they were issued (80 ns a step)
    fast = what_if(load_events(tmp_path / "c", doc), WhatIf(speedups=(("sgemm", 1000.0),)))
    assert fast.steps["predicted_ns"].to_list() == [19_900, 20 * US]
    assert fast.bound_by_predicted == "cpu"


def test_dropping_the_sync(tmp_path: Path) -> None:
    # without the sync the CPU runs on at once (its end moves from 200 to 105) but the add kernel still follows
    # the GEMM on the stream: 130-140, so the step ends at 140
    assert predicted(cp.sync_serializes(), tmp_path, WhatIf(no_sync=True)) == 140


def test_free_launches_shorten_a_launch_bound_loop(tmp_path: Path) -> None:
    # each iteration loses its 10 µs launch call: the CPU span ends 5 x 10 µs earlier, at 39; the last kernel
    # (launched at 36 with no latency) ends at 38
    assert predicted(cp.launch_bound(), tmp_path, WhatIf(launch_overhead_ns=0)) == 39


def test_free_launches_keep_what_held_a_start(tmp_path: Path) -> None:
    # the matmul's kernel started 205 µs after its launch, 200 µs past the typical 5 µs: free launches take the 2 µs
    # calls off the CPU (4 of them: the launch comes at 66, the CPU ends at 92) and the launch's own 5 µs, but what
    # held the start still does: the kernel starts at 66 + 200 and ends at 279 (without the held part it ended at 79)
    assert predicted(cp.held_start(), tmp_path, WhatIf(launch_overhead_ns=0)) == 279


def test_a_step_that_starts_earlier_is_predicted_longer_and_a_note_says_why(tmp_path: Path) -> None:
    # GIVEN step 1's GEMM (20-80) running into step 2 (CPU 50-100), which therefore starts at 80
    doc = trace(step(1, ts=0, dur=50), cpu_op("aten::mm", ts=5, dur=10, external_id=1),
                runtime("cudaLaunchKernel", ts=10, dur=2, correlation=1, external_id=1),
                kernel("sgemm", ts=20, dur=60, correlation=1),
                step(2, ts=50, dur=50), cpu_op("aten::add", ts=55, dur=10, external_id=2),
                runtime("cudaLaunchKernel", ts=60, dur=2, correlation=2, external_id=2),
                kernel("elementwise", ts=80, dur=5, correlation=2))
    # WHEN the GEMM is twice as fast
    result = what_if(load_events(tmp_path, doc), WhatIf(speedups=(("gemm", 2.0),)))
    # THEN step 1 ends at 50 and step 2 starts there, 30 µs earlier and 30 µs longer; the mean saves nothing, and
    # a note says why step 2 grew
    assert result.steps.select("step", "measured_ns", "predicted_ns").rows() == [(1, 80 * US, 50 * US),
                                                                                  (2, 20 * US, 50 * US)]
    assert result.saving_ns == 0
    assert result.notes[-1].startswith("1 step predicted longer than measured, as each now starts earlier (step 2: "
                                       "30 µs longer, starting 30 µs earlier)")
    # and without the change, no such note
    assert what_if(load_events(tmp_path / "b", doc), WhatIf()).notes == []


def test_hiding_data_loading(tmp_path: Path) -> None:
    assert predicted(cp.data_loading(), tmp_path, WhatIf(no_data_loading=True)) == 30


def test_pinned_copies_without_a_pinned_copy_to_measure(tmp_path: Path) -> None:
    # no pinned HtoD copy in the trace: twice as fast (40 -> 20 µs, 10-30), the kernel follows at 30-40
    result = what_if(load_events(tmp_path, cp.pageable_copy()), WhatIf(pinned=True))
    assert int(result.steps["predicted_ns"][0]) == 40 * US
    assert any("assumed 2x" in note for note in result.notes)


def test_pinned_copies_free_the_call_that_staged_them(tmp_path: Path) -> None:
    """A cudaMemcpyAsync from pageable memory stages the data and returns when it is copied: the host is held
    (resnet50's 19 MB input: 2 ms a step); from pinned memory the call only queues the copy. --pinned gives the
    staged call a pinned copy's call time (its median in the trace), not only a faster copy."""
    # GIVEN a CPU-bound step: a pageable copy's call 5-105 (10 MB copied 8-104), a pinned copy's call 110-114 (1 MB
    # copied 115-120: twice the pageable bandwidth), then 75 µs of CPU work; the step is the CPU's 200 µs
    doc = trace(step(1, ts=0, dur=200),
                runtime("cudaMemcpyAsync", ts=5, dur=100, correlation=1),
                memcpy("HtoD", ts=8, dur=96, nbytes=10_000_000, correlation=1),
                runtime("cudaMemcpyAsync", ts=110, dur=4, correlation=2),
                memcpy("HtoD", ts=115, dur=5, nbytes=1_000_000, correlation=2, src="Pinned"),
                cpu_op("aten::add", ts=120, dur=75))
    result = what_if(load_events(tmp_path, doc), WhatIf(pinned=True))
    # THEN the staged call costs 4 µs, not 100: the CPU's step is 96 µs shorter, and the copy (8-58 at the pinned
    # bandwidth) ends before it
    assert int(result.steps["measured_ns"][0]) == 200 * US
    assert int(result.steps["predicted_ns"][0]) == 104 * US


def test_pinned_copies_whose_names_do_not_say_pageable(tmp_path: Path) -> None:
    # GIVEN the same copy named as ROCm names copies ("Host -> Device"): whether it was pageable is unknown
    doc = cp.pageable_copy()
    doc["traceEvents"] = [e if e.get("cat") != "gpu_memcpy" else {**e, "name": "Memcpy HtoD (Host -> Device)"}
                          for e in doc["traceEvents"]]
    result = what_if(load_events(tmp_path, doc), WhatIf(pinned=True))
    # THEN it is left as recorded, and the note says why (not "the steps hold no pageable copy")
    assert int(result.steps["predicted_ns"][0]) == int(result.steps["measured_ns"][0])
    assert result.notes == ["--pinned: 1 host copy whose name does not say pageable or pinned (AMD's names) left "
                            "as recorded"]


def test_speedup_parsing() -> None:
    assert parse_speedup("gemm=2") == ("gemm", 2.0)
    assert parse_speedup("flash.*fwd=1.5") == ("flash.*fwd", 1.5)
    for bad in ("gemm", "gemm=0", "gemm=-1", "=2", "gemm=fast", "(=2"):
        with pytest.raises(UsageError):
            parse_speedup(bad)


@pytest.mark.parametrize("name", ["alexnet", "simple_add", "cuda_event_sync", "cuda_event_sync_multi_stream"])
def test_corpus_replay_residual_is_under_one_percent(corpus: Path, name: str) -> None:
    from stepscope.analyze import load

    path = next((corpus / "traces/hta/critical_path" / name).glob("*.json.gz"))
    result = what_if(load(path), WhatIf())
    assert result.replay_residual_fraction is not None and result.replay_residual_fraction < 0.01
    faster = what_if(load(path), WhatIf(launch_overhead_ns=0))
    assert faster.predicted_mean_ns is not None and result.predicted_mean_ns is not None
    assert faster.predicted_mean_ns <= result.predicted_mean_ns
