"""`stepscope capture -- python script.py`: unmodified scripts written here, run through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from capture_helpers import manifest, profiler_steps, traces
from click.testing import CliRunner

from stepscope.capture.runner import parse_target
from stepscope.cli import cli
from stepscope.errors import CaptureError

torch = pytest.importorskip("torch", reason="the capture shim needs torch (pip install 'stepscope[capture]')")

SCHEDULE = ["--skip-first", "1", "--baseline", "2", "--wait", "1", "--warmup", "1", "--active", "2"]

TRAIN = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
fail_at = int(sys.argv[2]) if len(sys.argv) > 2 else -1
for i in range(int(sys.argv[1])):
    if i == fail_at:
        raise RuntimeError(f"boom at step {i}")
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

INFER = """
import torch
model = torch.nn.Linear(8, 8)

def generate(x):
    with torch.no_grad():
        return model(x)

for _ in range(12):
    generate(torch.randn(2, 8))
"""

# raises inside a function: line 5 is the raise, line 8 the call
FAIL = """import torch

def train_step(i):
    if i == 2:
        raise RuntimeError(f"boom at step {i}")

for i in range(10):
    train_step(i)
"""

ANNOTATED = """
import torch
model = torch.nn.Linear(8, 8)
for _ in range(10):
    with torch.profiler.record_function("serve_batch"):
        with torch.profiler.record_function("other"):
            model(torch.randn(2, 8))
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _capture(run: Path, *args: str) -> object:
    return CliRunner().invoke(cli, ["capture", "-o", str(run), *args])


def test_target_forms() -> None:
    assert parse_target(["python", "-u", "-m", "pkg.x", "a"]).argv == ("pkg.x", "a")
    assert parse_target([sys.executable, __file__, "--n", "1"]).argv == (__file__, "--n", "1")
    assert parse_target([__file__]).script == Path(__file__)
    for bad, message in ((["torchrun", "train.py"], "launcher outside"), (["python", "-c", "1"], "script file"),
                         (["nope.py"], "no such script"), (["python"], "nothing to run")):
        with pytest.raises(CaptureError, match=message):
            parse_target(bad)


def test_an_unmodified_training_script_is_profiled_per_optimizer_step_and_ingests(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    res = _capture(run, *SCHEDULE, "--no-stack", "--", "python", str(script), "12")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    (trace,) = traces(run)
    assert profiler_steps(trace) == [2, 3]
    m = manifest(run)
    assert m["command"]["argv"] == ["python", str(script), "12"] and m["steps_seen"] == 12
    assert m["baseline"]["steps"] == 2 and m["profiled"]["steps"] == 2
    assert f"{run}: 1 trace, 2 of 12 steps profiled, profiled/baseline step" in res.output  # type: ignore[attr-defined]
    # the capture goes straight into the analyzer and the batch ingest
    from stepscope.analyze import load

    loaded = load(trace, cache_dir=tmp_path / "cache")
    assert loaded.steps.collect()["step"].to_list() == [2, 3]
    import polars as pl

    assert loaded.events.filter(pl.col("name").str.starts_with("ProfilerStep#")).collect().height == 2
    res = CliRunner().invoke(cli, ["ingest", str(run), "-o", str(tmp_path / "ds"), "-q"])
    assert res.exit_code == 0 and "1 ingested" in res.output, res.output


def test_an_inference_loop_steps_on_a_named_function_with_stacks_on(tmp_path: Path) -> None:
    # with_stack's Python tracer takes sys.setprofile over: counting calls must not depend on it
    script = _write(tmp_path, "serve.py", INFER)
    run = tmp_path / "run"
    res = _capture(run, *SCHEDULE, "--step-on", "generate", "--", str(script))
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert profiler_steps(traces(run)[0]) == [2, 3]
    assert manifest(run)["steps_seen"] == 12


def test_steps_on_a_module_method_under_python_m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "capture_cli_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("import torch\nclass Decoder:\n    m = torch.nn.Linear(4, 4)\n"
                                  "    def decode(self, x):\n        return self.m(x)\n")
    (pkg / "bench.py").write_text("import torch\nfrom capture_cli_pkg.model import Decoder\nd = Decoder()\n"
                                  "for _ in range(6):\n    d.decode(torch.randn(1, 4))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    res = _capture(run, "--skip-first", "0", "--baseline", "0", "--wait", "0", "--warmup", "1", "--active", "2",
                   "--step-on", "capture_cli_pkg.model:Decoder.decode", "--no-stack", "--",
                   "python", "-m", "capture_cli_pkg.bench")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert profiler_steps(traces(run)[0]) == [1, 2]


def test_steps_on_a_record_function_annotation(tmp_path: Path) -> None:
    script = _write(tmp_path, "annotated.py", ANNOTATED)
    run = tmp_path / "run"
    res = _capture(run, *SCHEDULE, "--step-on-annotation", "serve_batch", "--no-stack", "--", str(script))
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert profiler_steps(traces(run)[0]) == [2, 3] and manifest(run)["steps_seen"] == 10


def test_rank_env_vars_write_per_rank_files_into_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        res = _capture(run, *SCHEDULE, "--no-stack", "--", str(script), "8")
        assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert sorted(p.name.split(".")[0] for p in traces(run)) == ["rank0", "rank1"]
    assert sorted(p.name for p in run.glob("manifest*.json")) == ["manifest.rank0.json", "manifest.rank1.json"]


def test_a_distributed_run_directory_ingests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _capture(run, *SCHEDULE, "--no-stack", "--", str(script), "8").exit_code == 0  # type: ignore[attr-defined]
    res = CliRunner().invoke(cli, ["ingest", str(run), "-o", str(tmp_path / "ds"), "-q"])
    assert res.exit_code == 0 and "1 ingested" in res.output


def _capture_process(run: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m stepscope capture -o RUN ARGS` in a child process: the real exit code and stderr."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "stepscope", "capture", "-o", str(run), *args], capture_output=True,
                          text=True, timeout=120, check=False, env=env)


def test_a_failing_script_leaves_a_readable_trace_and_one_clear_error_line(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    proc = _capture_process(run, tmp_path, "--skip-first", "0", "--baseline", "0", "--wait", "0", "--warmup", "1",
                            "--active", "5", "--no-stack", "--", "python", str(script), "20", "3")
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("stepscope: error:")]
    assert len(errors) == 1 and "RuntimeError: boom at step 3" in errors[0] and str(run) in errors[0]
    assert proc.stderr.splitlines()[-1] == errors[0]  # the summary line comes last, below the script's traceback
    m = manifest(run)
    assert m["status"] == "failed" and m["error"] == "RuntimeError: boom at step 3"
    (trace,) = traces(run)
    assert profiler_steps(trace) == [1, 2, 3]  # steps 1-2 finished, step 3 failed part-way


def test_a_failing_script_prints_and_keeps_its_traceback_as_python_would(tmp_path: Path) -> None:
    # GIVEN a script that raises inside a function (line 5), called from module level (line 8)
    script = _write(tmp_path, "fail.py", FAIL)
    run = tmp_path / "run"
    # WHEN it is captured
    proc = _capture_process(run, tmp_path, *SCHEDULE, "--no-stack", "--", "python", str(script))
    # THEN stderr holds the script's traceback, as `python fail.py` prints it, then stepscope's one line; exit 3
    assert proc.returncode == 3, proc.stderr
    expected = (f'Traceback (most recent call last):\n'
                f'  File "{script}", line 8, in <module>\n    train_step(i)\n'
                f'  File "{script}", line 5, in train_step\n    raise RuntimeError(f"boom at step {{i}}")\n'
                f'RuntimeError: boom at step 2\n')
    assert expected + "stepscope: error: the script failed (RuntimeError: boom at step 2)" in proc.stderr
    assert "runpy" not in proc.stderr and "runner.py" not in proc.stderr  # stepscope's own frames left out
    # AND the manifest keeps the same traceback beside its one-line error
    m = manifest(run)
    assert m["status"] == "failed" and m["error"] == "RuntimeError: boom at step 2"
    assert m["error_traceback"] == expected


def test_each_rank_of_a_failing_run_keeps_its_own_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    for rank, fail_at in ((0, "2"), (1, "3")):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        res = _capture(run, *SCHEDULE, "--no-stack", "--", str(script), "8", fail_at)
        error = res.exception  # type: ignore[attr-defined]
        assert isinstance(error, CaptureError) and error.exit_code == 3
        assert "Traceback (most recent call last)" in res.stderr  # type: ignore[attr-defined]
    for rank, step in ((0, 2), (1, 3)):
        tb = manifest(run, f"manifest.rank{rank}.json")["error_traceback"]
        assert f'File "{script}", line 9, in <module>' in tb and tb.endswith(f"RuntimeError: boom at step {step}\n")


def test_a_script_that_exits_non_zero_fails_without_a_traceback(tmp_path: Path) -> None:
    script = _write(tmp_path, "exit.py", "import sys\nsys.exit(4)\n")
    run = tmp_path / "run"
    res = _capture(run, *SCHEDULE, "--no-stack", "--", str(script))
    assert isinstance(res.exception, CaptureError) and "SystemExit: 4" in str(res.exception)  # type: ignore[attr-defined]
    assert "Traceback" not in res.stderr  # type: ignore[attr-defined]  # as python prints none for sys.exit
    assert manifest(run)["error"] == "SystemExit: 4" and manifest(run)["error_traceback"] is None


def test_a_script_with_too_few_steps_is_an_error_with_the_arithmetic(tmp_path: Path) -> None:
    script = _write(tmp_path, "train.py", TRAIN)
    run = tmp_path / "run"
    res = _capture(run, *SCHEDULE, "--no-stack", "--", str(script), "3")
    error = res.exception  # type: ignore[attr-defined]
    assert isinstance(error, CaptureError) and error.exit_code == 3
    assert "made 3 optimizer steps" in str(error) and "number 6" in str(error) and "--step-on" in str(error)
    assert manifest(run)["status"] == "failed" and not traces(run)


def test_conflicting_step_triggers_are_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["capture", "-o", str(tmp_path / "r"), "--step-on", "f",
                                   "--step-on-annotation", "g", "--", "x.py"], standalone_mode=True)
    assert res.exit_code == 2 and "cannot be combined" in res.output


def test_capture_help_and_a_clear_error_without_torch(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from stepscope.cli import main\n"
            "main(sys.argv[1:])\n")
    helped = subprocess.run([sys.executable, "-c", code, "capture", "--help"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert helped.returncode == 0 and "--step-on-annotation" in helped.stdout
    script = _write(tmp_path, "train.py", TRAIN)
    ran = subprocess.run([sys.executable, "-c", code, "capture", "-o", str(tmp_path / "run"), "--", str(script)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 3 and "pip install 'stepscope[capture]'" in ran.stderr
