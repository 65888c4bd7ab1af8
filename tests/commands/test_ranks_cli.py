"""`stepscope ranks` end to end: output options with CliRunner on a synthetic run, one rank alone, and a real
2-rank gloo run captured under torchrun with one rank sleeping before its all_reduce."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from builders import kernel, python_fn, step, trace, write_trace
from click.testing import CliRunner
from test_comm_cli import capture_gloo_run

from stepscope.cli import cli

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ARGS: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                        "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}


def _two_ranks(directory: Path) -> Path:
    """Rank 1 reaches the all_reduce 40 µs late, in train.py's wait_for_io."""
    for r in (0, 1):
        events = [step(1, 0, 200), python_fn("train.py(9): main", 0, 200), kernel("sgemm", 10, 50),
                  kernel(AR, 100 + 40 * r, 60 - 40 * r, stream=20, **ARGS)]
        if r == 1:
            events.append(python_fn("train.py(3): wait_for_io", 80, 55))
        write_trace(directory, trace(*events, distributedInfo={"rank": r, "world_size": 2}), f"rank{r}.pt.trace.json")
    return directory


def test_table_json_and_csv(tmp_path: Path) -> None:
    run = _two_ranks(tmp_path / "run")
    out = CliRunner().invoke(cli, ["ranks", str(run)])
    assert out.exit_code == 0, out.output
    assert re.search(r"^straggler +1$", out.output, re.M) and "host_delay" in out.output
    assert "train.py(3): wait_for_io" in out.output and "imbalance (max / median across ranks):" in out.output
    data = json.loads(CliRunner().invoke(cli, ["ranks", str(run), "--json"]).output)
    assert data["straggler"] == 1 and data["straggler_wait_cost_ns"] == 40_000
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and all("rank" in r for r in data["steps"])
    csv = CliRunner().invoke(cli, ["ranks", str(run), "--csv"]).output
    assert all(f"# {name}" in csv for name in ("ranks", "imbalance", "stragglers", "steps"))
    one = CliRunner().invoke(cli, ["ranks", str(run), "--csv", "--table", "ranks"]).output
    assert one.splitlines()[0].startswith("rank,steps,wall_ns")
    assert CliRunner().invoke(cli, ["ranks", str(run), "--json", "--csv"]).exit_code == 2


def test_one_rank(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(step(1, 0, 100), kernel("sgemm", 10, 50)))
    out = CliRunner().invoke(cli, ["ranks", str(path)])
    assert out.exit_code == 0, out.output
    assert "note: one rank" in out.output and re.search(r"^ +0 +1 +100 µs", out.output, re.M)


LATE = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def slow_host():
    time.sleep(0.05)  # rank 1 reaches every step's all_reduce late


for _ in range(6):
    model(torch.randn(16, 64)).sum().backward()
    if rank == 1:
        slow_host()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
dist.barrier()  # neither rank tears gloo down while the other still talks to it (an abort at exit otherwise)
dist.destroy_process_group()
"""


def test_real_gloo_run_names_the_sleeping_rank_and_its_line(tmp_path: Path) -> None:
    run = capture_gloo_run(tmp_path, LATE, stack=True)
    out = CliRunner().invoke(cli, ["ranks", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["rank_count"] == 2 and data["source"] == "cpu" and data["step_count"] == 2
    assert data["straggler"] == 1 and data["straggler_cause"] == "host_delay"
    # the profiler names a Python frame by its function's first line: slow_host's `def`
    line = LATE.splitlines().index("def slow_host():") + 1
    assert data["straggler_host_line"] == f"late.py({line}): slow_host"
    assert data["straggler_wait_cost_per_step_ns"] >= 30_000_000
    for s in data["stragglers"]:
        assert s["straggler"] == 1 and s["cause"] == "host_delay" and s["lateness_ns"] >= 30_000_000
    waits = {(r["rank"], r["step"]): r["wait_ns"] for r in data["steps"]}
    assert all(waits[(0, s)] >= 30_000_000 for s in (1, 2))
