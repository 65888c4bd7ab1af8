"""The capture shim, run for real on CPU torch: schedule, files, manifest, unmodified scripts, failures."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import cli
from stepscope.errors import CaptureError

torch = pytest.importorskip("torch")

from stepscope.capture import CaptureOptions, profile_steps  # noqa: E402


def _profiler_steps(trace_path: Path) -> list[str]:
    doc = json.loads(gzip.decompress(trace_path.read_bytes()))
    return sorted({e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")})


def _loop(out: Path, steps: int, **options: object) -> None:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile_steps(out, **options) as prof:
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def test_schedule_records_exactly_the_active_steps(tmp_path: Path) -> None:
    # GIVEN 2 baseline, 1 wait, 1 warmup and 2 active steps in a 10-step loop
    _loop(tmp_path, 10, baseline=2, wait=1, warmup=1, active=2, with_stack=False)
    traces = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    # THEN one trace holds exactly the 2 active steps; baseline, wait and warm-up steps are absent
    assert len(traces) == 1
    assert _profiler_steps(traces[0]) == ["ProfilerStep#2", "ProfilerStep#3"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["baseline"]["steps"] == 2 and manifest["steps_seen"] == 10
    assert manifest["profiler"]["active"] == 2 and manifest["status"] == "ok"


def test_repeat_exports_one_trace_per_active_cycle(tmp_path: Path) -> None:
    _loop(tmp_path, 12, baseline=0, wait=1, warmup=1, active=1, repeat=2, with_stack=False)
    traces = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    assert len(traces) == 2
    assert sorted(_profiler_steps(t)[0] for t in traces) == ["ProfilerStep#2", "ProfilerStep#5"]


def test_manifest_is_complete_and_files_exist(tmp_path: Path) -> None:
    _loop(tmp_path, 8, baseline=3, wait=1, warmup=1, active=2, batch_size=4)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["manifest_version"] == 1
    assert set(m) >= {"status", "command", "distributed", "versions", "device", "profiler", "baseline", "files"}
    assert m["versions"]["torch"] == torch.__version__ and m["device"]["type"] == "cpu"
    b = m["baseline"]
    assert b["steps"] == 3 and 0 < b["p50_ns"] <= b["p95_ns"] <= b["p99_ns"]
    assert b["samples_per_s"] == pytest.approx(4 * b["steps_per_s"])
    kinds = {f["kind"] for f in m["files"]}
    assert kinds == {"trace", "memory_timeline"}
    for f in m["files"]:
        assert (tmp_path / f["name"]).stat().st_size == f["bytes"]


def test_rank_env_vars_give_per_rank_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    _loop(tmp_path, 4, baseline=0, wait=0, warmup=1, active=1, with_stack=False)
    assert [p.name.split(".")[0] for p in tmp_path.glob("*.pt.trace.json.gz")] == ["rank3"]
    m = json.loads((tmp_path / "manifest.rank3.json").read_text())
    assert m["distributed"] == {"rank": 3, "local_rank": 1, "world_size": 4}


def test_options_are_validated() -> None:
    with pytest.raises(CaptureError):
        CaptureOptions(active=0)


TRAIN = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
fail_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
for i in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if i == fail_at:
        raise RuntimeError(f"boom at step {i}")
"""

INFER = """
import torch
model = torch.nn.Linear(8, 8)

def generate(x):
    with torch.no_grad():
        return model(x)

for _ in range(9):
    generate(torch.randn(2, 8))
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_cli_profiles_an_unmodified_training_script_and_it_round_trips(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    res = CliRunner().invoke(cli, ["capture", "-o", str(run), "--baseline", "2", "--wait", "1", "--warmup", "1",
                                   "--active", "2", "--no-stack", "--", "python", str(script), "10"])
    assert res.exit_code == 0, res.output
    traces = list(run.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and _profiler_steps(traces[0]) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert json.loads((run / "manifest.json").read_text())["command"]["argv"] == ["python", str(script), "10"]
    # the capture goes straight into the analyzer
    from stepscope.analyze import load

    trace = load(traces[0], cache_dir=tmp_path / "cache")
    assert trace.steps.collect()["step"].to_list() == [2, 3]
    res = CliRunner().invoke(cli, ["ingest", str(run), "-o", str(tmp_path / "ds"), "-q"])
    assert res.exit_code == 0 and "1 ingested" in res.output


def test_cli_inference_loop_steps_on_a_named_function(tmp_path: Path) -> None:
    script = _write(tmp_path, "serve.py", INFER)
    run = tmp_path / "run"
    res = CliRunner().invoke(cli, ["capture", "-o", str(run), "--baseline", "1", "--wait", "1", "--warmup", "1",
                                   "--active", "3", "--step-on", "generate", "--no-stack", "--", str(script)])
    assert res.exit_code == 0, res.output
    assert _profiler_steps(next(run.glob("*.pt.trace.json.gz"))) == [f"ProfilerStep#{i}" for i in (2, 3, 4)]
    assert json.loads((run / "manifest.json").read_text())["steps_seen"] == 9


def test_cli_inference_loop_steps_on_module_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mypkg_capture_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("import torch\nm = torch.nn.Linear(4, 4)\ndef decode(x):\n    return m(x)\n")
    (pkg / "bench.py").write_text("import torch\nfrom mypkg_capture_test import model\n"
                                  "for _ in range(6):\n    model.decode(torch.randn(1, 4))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    res = CliRunner().invoke(cli, ["capture", "-o", str(run), "--baseline", "0", "--wait", "0", "--warmup", "1",
                                   "--active", "2", "--step-on", "mypkg_capture_test.model:decode", "--no-stack",
                                   "--", "python", "-m", "mypkg_capture_test.bench"])
    assert res.exit_code == 0, res.output
    assert _profiler_steps(next(run.glob("*.pt.trace.json.gz"))) == ["ProfilerStep#1", "ProfilerStep#2"]


def test_a_failing_script_still_leaves_a_readable_trace_and_a_clear_error(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "stepscope", "capture", "-o", str(run), "--baseline", "0",
                           "--wait", "0", "--warmup", "1", "--active", "5", "--no-stack", "--", "python",
                           str(script), "20", "3"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 3
    errors = [line for line in proc.stderr.splitlines() if line.startswith("stepscope: error:")]
    assert len(errors) == 1 and "RuntimeError: boom at step 3" in errors[0] and str(run) in errors[0]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "boom at step 3" in manifest["error"]
    traces = list(run.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and _profiler_steps(traces[0])  # the steps recorded before the failure


def test_nothing_to_profile_is_an_error(tmp_path: Path) -> None:
    script = _write(tmp_path, "noop.py", "x = 1\n")
    res = CliRunner().invoke(cli, ["capture", "-o", str(tmp_path / "run"), "--", "python", str(script)])
    assert res.exit_code != 0 and "nothing was profiled" in str(res.exception or res.output)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (memory snapshots are CUDA-only)")
def test_cuda_capture_writes_a_memory_snapshot(tmp_path: Path) -> None:  # pragma: no cover - GPU only
    model = torch.nn.Linear(256, 256).cuda()
    with profile_steps(tmp_path, baseline=2, wait=0, warmup=1, active=2, device="cuda") as prof:
        for _ in range(5):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            prof.step()
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["device"]["type"] == "cuda" and "memory_snapshot" in {f["kind"] for f in m["files"]}
