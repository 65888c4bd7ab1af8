"""`stepscope overlap`: shares, launch latency, queue depth and sync sources with exact figures."""

from __future__ import annotations

import json
from pathlib import Path

from builders import cpu_op, kernel, memcpy, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.cli import cli


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, trace(
        step(1, ts=0, dur=100),
        cpu_op("aten::copy_", ts=5, dur=40),
        runtime("cudaMemcpy", ts=10, dur=30, correlation=1),
        memcpy("HtoD", ts=20, dur=10, nbytes=1_000_000, correlation=1),
        runtime("cudaLaunchKernel", ts=50, dur=5, correlation=2),
        kernel("k", ts=60, dur=30, correlation=2),
    ), "t.json")


def test_overlap_json_exact(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["overlap", str(_trace(tmp_path)), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["window_ns"] == 100_000
    # GPU busy [20,30)+[60,90) = 40; CPU op [5,45) = 40; both [20,30) = 10
    assert (d["gpu_busy_fraction"], d["cpu_busy_fraction"], d["both_busy_fraction"]) == (0.4, 0.4, 0.1)
    assert d["sync_calls"] == 1 and d["sync_ns"] == 30_000
    (lat,) = d["launch_latency"]
    assert lat["launches"] == 2 and lat["max_ns"] == 10_000        # 10->20 and 50->60
    assert d["queue_depth"][0]["max_depth"] == 1
    assert d["sync_sources"] == [{"name": "cudaMemcpy", "source": "aten::copy_", "calls": 1, "total_ns": 30_000}]


def test_overlap_table(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["overlap", str(_trace(tmp_path))])
    assert res.exit_code == 0
    for section in ("gpu busy    40.0%", "launch latency:", "queue depth:", "sync sources:"):
        assert section in res.stdout
