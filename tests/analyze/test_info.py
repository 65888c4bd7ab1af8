"""`info`: options detected from the events, and each warning fires on a trace built to trigger it."""

from __future__ import annotations

import json
from pathlib import Path

from builders import (
    cpu_op,
    flow,
    kernel,
    load_events,
    memcpy,
    memory,
    python_fn,
    runtime,
    step,
    trace,
    write_trace,
)

from stepscope.analyze.info import trace_info


def test_clean_trace_has_no_warnings_and_reports_what_it_holds(tmp_path: Path) -> None:
    doc = trace(
        step(1, ts=0, dur=100), step(2, ts=100, dur=100),
        cpu_op("aten::mm", ts=5, dur=20, external_id=3, **{"Input Dims": [[2, 3]]}),
        runtime("cudaLaunchKernel", ts=10, dur=5, correlation=7, external_id=3),
        kernel("sgemm", ts=30, dur=10, correlation=7),
        flow(7, "s", 10, pid=1000, tid=1), flow(7, "f", 30, pid=0, tid=7),
        runtime("cudaLaunchKernel", ts=110, dur=5, correlation=8),  # step 2's own work (a last step without any
        kernel("sgemm", ts=130, dur=10, correlation=8),             # is the loop's exit, and a warning)
        memory(12, 4096, total_allocated=4096, total_reserved=8192),
        python_fn("train.py(10): step", ts=1, dur=90),
        distributedInfo={"rank": 3, "world_size": 8},
    )
    info = trace_info(load_events(tmp_path, doc))
    assert info.warnings.height == 0
    assert (info.rank, info.world_size, info.steps_found, info.step_numbers) == (3, 8, 2, "1..2")
    assert info.profiler_options == {"record_shapes": True, "profile_memory": True, "with_stack": True,
                                     "with_modules": False, "with_flops": False}
    assert info.devices.select("device", "gpu_events", "name").rows() == [(0, 2, "Synthetic GPU")]
    assert dict(info.counts_by_kind.select("kind", "events").rows())["kernel"] == 2
    assert info.gpu_span_ns == 110_000


def test_devices_are_named_by_the_listed_gpu_the_work_ran_on(tmp_path: Path) -> None:
    """ROCm lists the one GPU a process sees as device 0 and numbers its work by the physical GPU (2): the lone
    listed device is the one that ran it. Several listed: by id only."""
    one = [{"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 192 * 2**30, "numSms": 304}]
    info = trace_info(load_events(tmp_path / "one", trace(kernel("k", 0, 10, device=2), deviceProperties=one)))
    assert info.devices.select("device", "gpu_events", "name", "num_sms").rows() == [(2, 1, "AMD Instinct MI300X", 304)]
    two = [{"id": i, "name": f"GPU {i}"} for i in range(2)]
    info = trace_info(load_events(tmp_path / "two", trace(kernel("k", 0, 10, device=1), kernel("k", 20, 10, device=3),
                                                          deviceProperties=two)))
    assert info.devices.select("device", "name").rows() == [(1, "GPU 1"), (3, None)]


def test_each_warning_fires_on_its_oddity(tmp_path: Path) -> None:
    doc = trace(
        step(1, ts=100, dur=50), step(3, ts=150, dur=50),                    # step 2 missing
        kernel("a", ts=110, dur=20), kernel("b", ts=120, dur=5),              # overlap on one stream
        kernel("early", ts=10, dur=5),                                        # before the first step
        kernel("late", ts=190, dur=30, correlation=9),                        # past step 3's CPU end, its own
        runtime("cudaLaunchKernel", ts=195, dur=2, correlation=9),           # ... and before its launch
        kernel("orphan", ts=230, dur=5),                                      # after the last step's window
        memcpy("HtoD", ts=140, dur=-1, nbytes=10),                            # negative duration
        flow(1, "s", 101, pid=1000, tid=1), flow(2, "f", 111, pid=0, tid=7),  # dangling both ways
        {"ph": "X", "cat": "mystery", "name": "m", "pid": 1, "tid": 1, "ts": 101, "dur": 1},
        {"cat": "cpu_op", "name": "no phase", "pid": 1, "tid": 1, "ts": 102, "dur": 1},
    )
    info = trace_info(load_events(tmp_path, doc))
    got = dict(info.warnings.select("code", "count").rows())
    assert got == {"overlapping_kernels": 1, "negative_durations": 1, "gpu_before_launch": 1,
                   "dangling_flow_starts": 1, "dangling_flow_finishes": 1, "gpu_after_last_step": 1,
                   "gpu_before_first_step": 1, "missing_steps": 1, "unknown_categories": 1, "missing_phases": 1}


def test_a_trace_of_counter_ranges_without_kernels_says_why_it_has_no_gpu_timeline(tmp_path: Path) -> None:
    # GIVEN what the CUPTI range profiler (profiler_metrics) records: a launch, then one cuda_profiler_range event
    # per kernel with its hardware counters (pid/tid 0, no correlation), and no kernel event at all
    def counter_range(name: str, ts: float) -> dict[str, object]:
        return {"ph": "X", "cat": "cuda_profiler_range", "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": 121,
                "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 9_119_334_400}}

    ranges = trace(cpu_op("aten::mm", ts=0, dur=20), runtime("cudaLaunchKernel", ts=2, dur=5),
                   counter_range("ampere_sgemm_128x64_tn", 10), counter_range("__missing__", 131))
    got = dict(trace_info(load_events(tmp_path / "ranges", ranges)).warnings.select("code", "count").rows())
    # THEN the warning counts them (they are not an unknown category: Kineto writes them)
    assert got == {"counter_ranges_only": 2}
    # AND a trace with its kernels recorded, ranges or not, has no such warning
    timed = trace(kernel("k", ts=10, dur=5), counter_range("k", 10))
    assert "counter_ranges_only" not in trace_info(load_events(tmp_path / "timed", timed)).warnings["code"].to_list()


def test_a_trace_of_a_failed_capture_says_so(tmp_path: Path) -> None:
    # GIVEN a trace whose capture manifest beside it says the script failed (the trace exported at the failure)
    from stepscope.analyze import load

    doc = trace(step(1, ts=0, dur=100), cpu_op("aten::add", ts=5, dur=20))
    path = write_trace(tmp_path / "run", doc, "vm_1.pt.trace.json")
    error = "OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB. " + "GPU 0 has … " * 40
    manifest = {"status": "failed", "error": error, "files": [{"name": "vm_1.pt.trace.json", "kind": "trace"}]}
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    # THEN info (and summary, which shows the same warnings) says the capture failed, its error cut to a line
    info = trace_info(load(path, cache_dir=tmp_path / "cache"))
    assert info.warnings.select("code", "count", "detail").rows() == [(
        "capture_failed", 1, "the capture that wrote this trace failed (OutOfMemoryError: CUDA out of memory, "
        "manifest.json): the script stopped partway, so its last step can be cut short")]
    # a capture that ended well, or a manifest of other files, says nothing
    for status, name in (("ok", "vm_1.pt.trace.json"), ("failed", "other.pt.trace.json")):
        (tmp_path / "run" / "manifest.json").write_text(json.dumps({**manifest, "status": status,
                                                                    "files": [{"name": name}]}))
        assert trace_info(load(path, cache_dir=tmp_path / "cache")).warnings.height == 0
