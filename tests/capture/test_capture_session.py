"""profile_steps on real CPU torch: the schedule, the exported files, the manifest, ranks, failures."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from capture_helpers import manifest, profiler_steps, traces

from stepscope.capture import CaptureOptions, profile_steps
from stepscope.errors import CaptureError

torch = pytest.importorskip("torch", reason="the capture shim needs torch (pip install 'stepscope[capture]')")

QUICK = {"with_stack": False, "with_modules": False}


def _loop(out: Path, steps: int, *, fail_at: int | None = None, sleep_s: float = 0.0, **options: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile_steps(out, **options) as prof:
        for i in range(steps):
            if i == fail_at:
                raise RuntimeError(f"boom at step {i}")
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(sleep_s)
            prof.step()


def test_only_the_active_steps_are_in_the_trace(tmp_path: Path) -> None:
    # GIVEN 1 skipped, 2 baseline, 1 wait, 1 warm-up and 2 active steps in a 12-step loop
    _loop(tmp_path, 12, skip_first=1, baseline=2, wait=1, warmup=1, active=2, **QUICK)
    # THEN one trace holds exactly the 2 active steps: skipped, baseline, wait and warm-up steps are absent
    (trace,) = traces(tmp_path)
    assert profiler_steps(trace) == [2, 3]
    m = manifest(tmp_path)
    assert m["files"][0] == {"name": trace.name, "kind": "trace", "bytes": trace.stat().st_size, "cycle": 0,
                             "profiler_steps": [2, 3], "complete": True}
    # ProfilerStep#N is the loop's 0-based step N + offset: steps 5 and 6 (skip 0, baseline 1-2, wait 3, warm-up 4)
    assert m["profiler"]["profiler_step_offset"] == 3
    assert m["steps_seen"] == 12 and m["schedule_complete"] and m["status"] == "ok"


def test_trace_names_follow_tensorboard_trace_handler(tmp_path: Path) -> None:
    _loop(tmp_path, 4, skip_first=0, baseline=0, wait=0, warmup=1, active=1, **QUICK)
    (trace,) = traces(tmp_path)
    worker, stamp, *rest = trace.name.split(".")
    # <host>_<pid>.<time_ns>.pt.trace.json.gz, what torch.profiler.tensorboard_trace_handler writes
    assert worker.rsplit("_", 1)[1].isdigit() and stamp.isdigit() and rest == ["pt", "trace", "json", "gz"]


def test_repeat_exports_one_trace_per_active_cycle(tmp_path: Path) -> None:
    _loop(tmp_path, 12, skip_first=0, baseline=0, wait=1, warmup=1, active=1, repeat=2, **QUICK)
    assert [profiler_steps(t) for t in traces(tmp_path)] == [[2], [5]]
    assert [f.get("profiler_steps") for f in manifest(tmp_path)["files"] if f["kind"] == "trace"] == [[2], [5]]


def test_manifest_is_complete_and_lists_every_file_with_its_size(tmp_path: Path) -> None:
    _loop(tmp_path, 10, skip_first=1, baseline=3, wait=1, warmup=1, active=2, batch_size=4, device="cpu")
    m = manifest(tmp_path)
    assert m["manifest_version"] == 1 and m["status"] == "ok" and m["error"] is None and m["error_traceback"] is None
    assert m["command"]["argv"] == sys.argv and m["command"]["started_at"] and m["command"]["host"]
    assert m["versions"]["torch"] == torch.__version__ and m["versions"]["python"]
    assert m["device"]["type"] == "cpu" and m["device"]["torch_threads"] >= 1
    assert m["profiler"]["record_shapes"] and m["profiler"]["activities"] == ["cpu"]
    assert m["timing_method"] == "perf_counter_ns"
    b, p = m["baseline"], m["profiled"]
    assert b["steps"] == 3 and len(b["durations_ns"]) == 3 and 0 < b["p50_ns"] <= b["p95_ns"] <= b["p99_ns"]
    assert b["samples_per_s"] == pytest.approx(4 * b["steps_per_s"])
    assert p["steps"] == 2 and m["overhead_ratio"] == pytest.approx(p["mean_ns"] / b["mean_ns"])
    assert {f["kind"] for f in m["files"]} == {"trace", "memory_timeline"}
    assert sorted(f["name"] for f in m["files"]) == sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".json")
    for f in m["files"]:
        assert (tmp_path / f["name"]).stat().st_size == f["bytes"]
    # the memory timeline export works on CPU torch: gzip JSON rows [time_ns, action, bytes, category]
    timeline = json.loads(gzip.decompress((tmp_path / next(f["name"] for f in m["files"]
                                                           if f["kind"] == "memory_timeline")).read_bytes()))
    assert timeline and all(len(row) == 4 for row in timeline)


def test_baseline_times_each_unprofiled_step(tmp_path: Path) -> None:
    # GIVEN steps that each sleep 20 ms; the first (skipped) step's start-up is not part of the baseline
    _loop(tmp_path, 6, skip_first=1, baseline=3, wait=0, warmup=1, active=1, sleep_s=0.02, **QUICK)
    b = manifest(tmp_path)["baseline"]
    assert b["steps"] == 3 and all(20_000_000 <= d < 200_000_000 for d in b["durations_ns"])


def test_rank_env_vars_give_per_rank_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                        "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "job7"}.items():
        monkeypatch.setenv(name, value)
    _loop(tmp_path, 4, skip_first=0, baseline=0, wait=0, warmup=1, active=1, **QUICK)
    assert [p.name.split(".")[0] for p in traces(tmp_path)] == ["rank3"]
    assert not (tmp_path / "manifest.json").exists()
    d = manifest(tmp_path, "manifest.rank3.json")["distributed"]
    assert d == {"rank": 3, "local_rank": 1, "world_size": 4, "local_world_size": 2, "group_rank": 1,
                 "launcher": "torchrun", "run_id": "job7"}


def test_an_error_in_the_loop_leaves_a_trace_and_a_failed_manifest(tmp_path: Path) -> None:
    # GIVEN a loop that raises in its 2nd active step (steps 0-1 wait/warm-up, 2-5 active)
    with pytest.raises(RuntimeError, match="boom at step 3"):  # THEN the user's error propagates unchanged
        _loop(tmp_path, 10, fail_at=3, skip_first=0, baseline=0, wait=1, warmup=1, active=4, **QUICK)
    (trace,) = traces(tmp_path)
    assert profiler_steps(trace) == [2, 3]  # the finished active step and the one that failed
    m = manifest(tmp_path)
    assert m["status"] == "failed" and m["error"] == "RuntimeError: boom at step 3"
    assert m["files"][0]["complete"] is False
    tb = m["error_traceback"]  # and the manifest keeps where it was raised
    assert tb.startswith("Traceback (most recent call last):") and tb.endswith("RuntimeError: boom at step 3\n")
    assert f'File "{__file__}"' in tb and "in _loop" in tb


def test_a_short_loop_says_so_and_writes_no_trace(tmp_path: Path) -> None:
    _loop(tmp_path, 3, skip_first=1, baseline=2, wait=1, warmup=1, active=1, **QUICK)
    m = manifest(tmp_path)
    assert not traces(tmp_path) and not m["schedule_complete"]
    assert any("ended after 3 steps; the schedule needs 6" in n for n in m["notes"])


def test_a_second_capture_into_the_same_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    _loop(tmp_path, 4, skip_first=0, baseline=0, wait=0, warmup=1, active=1, **QUICK)
    (old,) = traces(tmp_path)
    with pytest.raises(CaptureError, match="already holds a capture"):
        _loop(tmp_path, 4, skip_first=0, baseline=0, wait=0, warmup=1, active=1, **QUICK)
    _loop(tmp_path, 4, skip_first=0, baseline=0, wait=0, warmup=1, active=1, overwrite=True, **QUICK)
    (new,) = traces(tmp_path)
    assert new != old and not old.exists()


def test_options_object_and_keywords_combine(tmp_path: Path) -> None:
    session = profile_steps(tmp_path, options=CaptureOptions(active=7), wait=0)
    assert session.options.active == 7 and session.options.wait == 0
    with pytest.raises(CaptureError, match="unknown capture option"):
        profile_steps(tmp_path, activ=3)


def test_importing_capture_does_not_import_torch_and_no_torch_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import stepscope.capture as c\n"
        "from stepscope.errors import CaptureError\n"
        "try:\n"
        f"    c.profile_steps({str(tmp_path)!r}).__enter__()\n"
        "except CaptureError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith("ERR capture needs torch") and "stepscope[capture]" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (snapshots and CUDA events)")
def test_cuda_capture_writes_a_snapshot_and_times_with_events(tmp_path: Path) -> None:  # pragma: no cover
    model = torch.nn.Linear(256, 256).cuda()
    with profile_steps(tmp_path, skip_first=1, baseline=2, wait=0, warmup=1, active=2, device="cuda") as prof:
        for _ in range(6):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            prof.step()
    m = manifest(tmp_path)
    assert m["device"]["type"] == "cuda" and m["device"]["sm_count"] > 0 and m["timing_method"] == "cuda_event"
    assert m["profiler"]["activities"] == ["cpu", "cuda"] and m["baseline"]["steps"] == 2
    assert {"trace", "memory_snapshot"} <= {f["kind"] for f in m["files"]}
    (trace,) = traces(tmp_path)
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (OutOfMemoryError)")
def test_cuda_oom_dumps_a_snapshot_and_reraises(tmp_path: Path) -> None:  # pragma: no cover
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with profile_steps(tmp_path, skip_first=0, baseline=0, wait=0, warmup=0, active=3, device="cuda") as prof:
            x = torch.ones(1024, device="cuda")
            prof.step()
            torch.empty(free * 4, dtype=torch.uint8, device="cuda") + x.sum()
    m = manifest(tmp_path)
    assert m["status"] == "failed" and "OutOfMemoryError" in m["error"]
    assert any(f["name"].endswith(".oom.memory_snapshot.pickle") for f in m["files"])


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_the_bundled_samples_are_small_and_say_what_device_they_ran_on() -> None:
    runs = sorted(p.parent for p in SAMPLES.glob("*/manifest.json"))
    assert len(runs) >= 7
    assert sum(f.stat().st_size for f in SAMPLES.rglob("*") if f.is_file()) < 8 * 1024 * 1024
    for run in runs:
        m = manifest(run)
        assert m["manifest_version"] == 1 and m["device"]["type"] in ("cpu", "cuda")
        assert [f["profiler_steps"] for f in m["files"] if f["kind"] == "trace"] == [[2, 3, 4]]
    pinned = manifest(SAMPLES / "pageable_vs_pinned")
    if pinned["device"]["type"] == "cpu":
        assert any("CUDA only" in n for n in pinned["notes"])
