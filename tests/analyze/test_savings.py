"""What a fix would buy (stepscope.analyze.savings, `summary --predict`): each verdict's change replayed on
traces whose paths are worked out by hand (tests/critical_path_traces.py), and through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import critical_path_traces as cp
import pytest
from builders import kernel, load_events, write_trace
from click.testing import CliRunner

from stepscope.analyze.savings import GPU_SPEEDUP, fix_for, predicted_savings, top_compute_category
from stepscope.analyze.summary import Verdict
from stepscope.analyze.whatif import WhatIf
from stepscope.cli import cli

US = 1_000


def test_each_verdict_names_the_change_its_advice_asks_for(tmp_path: Path) -> None:
    t = load_events(tmp_path, cp.gpu_bound())
    assert fix_for(Verdict.DATA_LOADING_BOUND, t) == WhatIf(no_data_loading=True)
    assert fix_for(Verdict.SYNC_BOUND, t) == WhatIf(no_sync=True)
    assert fix_for(Verdict.TRANSFER_BOUND, t) == WhatIf(pinned=True)
    assert fix_for(Verdict.LAUNCH_BOUND, t) == WhatIf(launch_overhead_ns=0)
    assert fix_for(Verdict.GPU_BOUND, t) == WhatIf(speedups=(("gemm", GPU_SPEEDUP),))  # sgemm_*: gemm
    # no GPU work to replay; no communication kernel to hide, and a run's straggler is not one trace's
    assert fix_for(Verdict.COMMUNICATION_BOUND, t) is None and fix_for(Verdict.NO_GPU, t) is None
    assert fix_for(Verdict.COMMUNICATION_BOUND, load_events(tmp_path / "comm", cp.compute_waits_for_comm())) == (
        WhatIf(overlap_comm=True))


def test_the_top_compute_category_leaves_communication_out(tmp_path: Path) -> None:
    doc = cp.gpu_bound()
    doc["traceEvents"].append(kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts=200, dur=500))
    assert top_compute_category(load_events(tmp_path, doc)) == "gemm"


def test_savings_by_hand(tmp_path: Path) -> None:
    # the GPU-bound loop of four 40 µs GEMMs (step 180 µs; tests/critical_path_traces.py):
    #   gemm x2         GEMMs 20 µs each, end at 90, the sync at 95, the step at 100: saves 80 µs
    #   --no-sync       the CPU ends at 30, but the GEMMs still run to 170: the step ends at 170, saves 10 µs
    #   launch 0 µs     the first GEMM starts at its launch (3) instead of 10: all 7 µs earlier, saves 7 µs
    #   --no-data-loading, --pinned: nothing to remove, saves 0
    rows = {r["verdict"]: r for r in predicted_savings(load_events(tmp_path, cp.gpu_bound())).iter_rows(named=True)}
    assert list(rows) == ["data_loading_bound", "sync_bound", "transfer_bound", "launch_bound", "gpu_bound"]
    assert {r["measured_ns"] for r in rows.values()} == {180 * US}
    assert rows["gpu_bound"]["change"] == "--speedup gemm=2"
    assert rows["gpu_bound"]["predicted_ns"] == 100 * US and rows["gpu_bound"]["saving_ns"] == 80 * US
    assert rows["gpu_bound"]["saving_fraction"] == pytest.approx(80 / 180)
    assert rows["sync_bound"]["predicted_ns"] == 170 * US and rows["launch_bound"]["predicted_ns"] == 173 * US
    assert rows["data_loading_bound"]["saving_ns"] == 0 and rows["transfer_bound"]["saving_ns"] == 0
    assert all(r["replay_residual_fraction"] == 0.0 for r in rows.values())
    # the data-loading step of 60 µs loses its 30 µs fetch
    dl = predicted_savings(load_events(tmp_path / "dl", cp.data_loading()))
    assert dl.filter(dl["verdict"] == "data_loading_bound")["predicted_ns"].item() == 30 * US


def test_hiding_the_collective_a_gemm_waits_for_saves_what_the_wait_cost(tmp_path: Path) -> None:
    # GIVEN a step whose GEMM waits for an all_reduce (tests/critical_path_traces.py): it ends at 91 µs with the
    # GEMM; hidden behind compute, the GEMM runs 20-50 and the step ends with the all_reduce at 60
    rows = {r["verdict"]: r for r in
            predicted_savings(load_events(tmp_path, cp.compute_waits_for_comm())).iter_rows(named=True)}
    # THEN communication_bound has its row, in the rule table's order, with that saving
    assert list(rows) == ["data_loading_bound", "communication_bound", "sync_bound", "transfer_bound",
                          "launch_bound", "gpu_bound"]
    comm = rows["communication_bound"]
    assert (comm["change"], comm["measured_ns"], comm["predicted_ns"], comm["saving_ns"]) == (
        "--overlap-comm", 91 * US, 60 * US, 31 * US)


def test_summary_predict_puts_the_savings_under_the_verdict(tmp_path: Path) -> None:
    path = write_trace(tmp_path, cp.gpu_bound(), "gemm.pt.trace.json")
    runner = CliRunner()
    text = runner.invoke(cli, ["summary", str(path), "--predict"])
    assert text.exit_code == 0, text.output
    assert "what a fix would buy" in text.stdout and "--speedup gemm=2" in text.stdout
    verdict = json.loads(runner.invoke(cli, ["summary", str(path), "--json"]).stdout)["verdict"]
    assert f"{verdict} (this)" in text.stdout  # the verdict's own row is marked
    data = json.loads(runner.invoke(cli, ["summary", str(path), "--predict", "--json"]).stdout)
    by = {r["verdict"]: r for r in data["predicted_savings"]}
    assert by["gpu_bound"]["saving_ns"] == 80 * US
    # AND without --predict no graph is built and no table shown
    assert "what a fix would buy" not in runner.invoke(cli, ["summary", str(path)]).stdout
