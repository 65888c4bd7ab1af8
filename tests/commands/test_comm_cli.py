"""`stepscope comm` end to end: output options and errors with CliRunner, the real dlrm set, and a real
2-rank gloo run captured under torchrun with one rank made late."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import kernel, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli, main

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _two_ranks(directory: Path) -> Path:
    for r in (0, 1):
        args: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                                "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                                "Process Group Ranks": "[0, 1]"}
        write_trace(directory, trace(kernel(AR, 100 + 40 * r, 60 - 40 * r, **args),
                                     distributedInfo={"rank": r, "world_size": 2}), f"rank{r}.pt.trace.json")
    return directory


def test_table_json_csv_and_one_table(tmp_path: Path) -> None:
    run = _two_ranks(tmp_path / "run")
    out = CliRunner().invoke(cli, ["comm", str(run), "--link-bandwidth", "50"])
    assert out.exit_code == 0, out.output
    assert "straggler rank           1" in out.output and "calls, most skewed first:" in out.output
    assert "link" in out.output
    data = json.loads(CliRunner().invoke(cli, ["comm", str(run), "--json"]).output)
    assert data["straggler_rank"] == 1 and data["calls"][0]["skew_ns"] == 40_000
    assert {w["rank"]: w["wait_ns"] for w in data["waits"]} == {0: 40_000, 1: 0}
    csv = CliRunner().invoke(cli, ["comm", str(run), "--csv"]).output
    assert all(f"# {name}" in csv for name in ("groups", "calls", "waits", "ranks"))
    one = CliRunner().invoke(cli, ["comm", str(run), "--csv", "--table", "waits"]).output
    assert one.splitlines()[0].startswith("call,rank,collective")


def test_several_files_are_one_run(tmp_path: Path) -> None:
    run = _two_ranks(tmp_path / "run")
    out = CliRunner().invoke(cli, ["comm", *map(str, sorted(run.iterdir())), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["rank_count"] == 2


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Exit code and stderr lines of the real entry point (which maps errors to exit codes)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 1, capsys.readouterr().err.strip().splitlines()


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(["comm", str(tmp_path / "nope")], capsys)
    assert code == 2 and err == [f"stepscope: error: {tmp_path / 'nope'}: no such file or directory"]
    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(b"\x80\x04N.")
    code, err = _main(["comm", str(snapshot)], capsys)
    assert code == 2 and len(err) == 1 and "not a trace" in err[0] and str(snapshot) in err[0]
    run = _two_ranks(tmp_path / "run")
    assert CliRunner().invoke(cli, ["comm", str(run), "--json", "--csv"]).exit_code == 2
    code, err = _main(["comm", str(run), "--csv", "--table", "nope"], capsys)
    assert code == 2 and "choose one of: groups, calls, waits, ranks" in err[0]
    assert CliRunner().invoke(cli, ["comm"]).exit_code == 2


def test_unreadable_ranks_are_named_in_the_error_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN one truncated trace, and a run whose every trace is truncated
    run = _two_ranks(tmp_path / "run")
    for path in run.iterdir():
        path.write_bytes(path.read_bytes()[:40])
    one = run / "rank0.pt.trace.json"
    # THEN each is one line that says what is wrong (no "see the warnings above" with none printed)
    for command in ("comm", "ranks", "critical-path"):
        code, err = _main([command, str(one)], capsys)
        assert (code, err) == (2, [f"stepscope: error: {one} (byte 40): truncated JSON (the file ends in the middle "
                                   "of the document)"])
        code, err = _main([command, str(run)], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"stepscope: error: {run}: no trace could be read: ")
        assert "truncated JSON" in err[0] and err[0].endswith("(and 1 more)")


def test_a_trace_without_collectives(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(kernel("sgemm", 0, 10)))
    out = CliRunner().invoke(cli, ["comm", str(path)])
    assert out.exit_code == 0 and "no collective found" in out.output


def test_dlrm_run(corpus: Path) -> None:
    out = CliRunner().invoke(cli, ["comm", str(corpus / "traces" / "param" / "dlrm_kineto"), "--top", "3"])
    assert out.exit_code == 0, out.output
    assert "rank count               8" in out.output and "straggler rank           7" in out.output
    assert "all_to_all" in out.output and "… 5 more rows" in out.output


LATE = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    model(torch.randn(16, 64)).sum().backward()
    if rank == 1:
        time.sleep(0.05)  # rank 1 arrives late at every step's first all_reduce
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
dist.barrier()  # neither rank tears gloo down while the other still talks to it (an abort at exit otherwise)
dist.destroy_process_group()
"""


def capture_gloo_run(tmp_path: Path, script_text: str, *, stack: bool = False) -> Path:
    """A real 2-rank gloo run of `script_text` captured under torchrun (skip first 1, warmup 1, active 2): the
    run directory. Skips where torch is not installed."""
    pytest.importorskip("torch", reason="the capture needs torch (pip install 'stepscope[capture]')")
    pytest.importorskip("torch.distributed.run")
    script = tmp_path / "late.py"
    script.write_text(script_text)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "stepscope", "capture", "-o", str(run), "--skip-first", "1", "--baseline", "0", "--wait", "0",
           "--warmup", "1", "--active", "2", *([] if stack else ["--no-stack"]), "--", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(2):  # torch's gloo teardown now and then aborts at exit, after the capture is written: once more
        shutil.rmtree(run, ignore_errors=True)
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # each rank's process says which rank its line is (once two unlabelled "1 trace" lines)
        assert f"rank {rank}: {run}: 1 trace of this rank, " in done.stderr, done.stderr[-3000:]
    return run


def test_real_gloo_run_names_the_late_rank_and_measures_the_others_wait(tmp_path: Path) -> None:
    run = capture_gloo_run(tmp_path, LATE)
    out = CliRunner().invoke(cli, ["comm", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["rank_count"] == 2 and data["source"] == "cpu" and data["unmatched_calls"] == 0
    # rank 0 arrives last at the small bias all_reduce too, microseconds late: the straggler is the rank whose
    # late arrivals cost the others more wait
    assert data["straggler_rank"] == 1
    # the weight gradient's all_reduce (64 x 64 float32) is the one rank 1 reaches 50 ms late, every step
    late_calls = [c for c in data["calls"] if c["message_bytes"] == 64 * 64 * 4]
    assert len(late_calls) == 2 and all(c["last_ranks"] == "1" for c in late_calls)
    for c in late_calls:
        wait0 = next(w["wait_ns"] for w in data["waits"] if w["call"] == c["call"] and w["rank"] == 0)
        assert wait0 >= 30_000_000 and c["skew_ns"] >= 30_000_000
    assert data["straggler_wait_cost_ns"] >= 60_000_000
