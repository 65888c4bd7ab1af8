"""Ranks of a run side by side: synthetic runs with exact answers (compute, communication, overlap, data
loading, one late rank and why), one rank alone, and the real 8-rank dlrm set checked against HTA's
definitions computed here from the raw JSON and against ../shared/tools/reference_comm.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import annotation, cpu_op, kernel, python_fn, slow_before_trace, slow_union, step, trace, write_trace
from conftest import reference_comm

from stepscope.analyze._text import numbered
from stepscope.analyze.ranks import Cause, RanksResult, imbalance, per_window, ranks

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
US = 1000  # ns per µs
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
ARGS: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                        "dtype": "Float", "Group size": 3, "Process Group Name": "0",
                        "Process Group Ranks": "[0, 1, 2]"}


def rank_events(*, host_delay: float = 0, extra_compute: float = 0, extra_dl: float = 0, asleep: bool = False,
                shift: float = 0) -> list[dict[str, Any]]:
    """One rank's step 1 (µs): data loading [0, 50 + extra_dl), compute [100, 300) (+ extra_dl), then
    extra_compute more, then a host delay in train.py's slow_host (in aten::copy_, or in time.sleep where
    `asleep`); the all_reduce from 400 + the three delays to 700 (every rank's ends together), and compute
    [550, 600) under it. `shift` moves the rank's clock."""
    late = host_delay + extra_compute + extra_dl
    arrive = 400 + late
    events = [
        step(1, 0, 1000), annotation(DL, 0, 50 + extra_dl),
        python_fn("train.py(20): train_step", 0, 1000),
        kernel("sgemm", 100 + extra_dl, 200, stream=7),
        kernel(AR, arrive, 700 - arrive, stream=20, **ARGS),
        kernel("relu", 550, 50, stream=7),
    ]
    if extra_compute:
        events.append(kernel("sgemm", 300 + extra_dl, extra_compute, stream=7))
    if host_delay:
        inner = python_fn("<built-in function sleep>", arrive - host_delay + 1, host_delay - 10) if asleep else (
            cpu_op("aten::copy_", arrive - host_delay + 1, host_delay - 10))
        events += [python_fn("train.py(5): slow_host", arrive - host_delay, host_delay - 5), inner]
    return [{**e, "ts": e["ts"] + shift} for e in events]


def write_run(directory: Path, late: dict[str, Any], *, shifts: tuple[float, ...] = (0, 5000, -3000)) -> Path:
    """Three ranks of one step; rank 2 late as `late` says (rank_events' keywords); each rank on its own clock."""
    for r in range(3):
        events = rank_events(**(late if r == 2 else {}), shift=shifts[r])
        write_trace(directory, trace(*events, distributedInfo={"rank": r, "world_size": 3}),
                    f"rank{r}.pt.trace.json")
    return directory


def analyze(directory: Path, tmp_path: Path) -> RanksResult:
    return ranks(directory, cache_dir=tmp_path / "cache")


def row(result: RanksResult, rank: int) -> dict[str, Any]:
    return result.steps.filter(pl.col("rank") == rank).row(0, named=True)


def test_per_rank_time_split_is_exact(tmp_path: Path) -> None:
    # GIVEN three ranks, rank 2 reaching the all_reduce 80 µs late after a slow host call
    res = analyze(write_run(tmp_path / "run", {"host_delay": 80}), tmp_path)
    # THEN on time ranks: compute 200 + 50, comm [400, 700), exposed comm 300 - 50, idle 1000 - 500
    assert res.rank_count == 3 and res.step_count == 1 and res.source == "kernel"
    on_time = row(res, 0)
    assert {k: on_time[k] for k in ("step", "wall_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns",
                                    "data_loading_ns", "cpu_ns", "wait_ns", "last_arrivals")} == {
        "step": 1, "wall_ns": 1000 * US, "compute_ns": 250 * US, "comm_ns": 300 * US, "exposed_comm_ns": 250 * US,
        "idle_ns": 500 * US, "data_loading_ns": 50 * US, "cpu_ns": 1000 * US, "wait_ns": 80 * US,
        "last_arrivals": 0}
    late = row(res, 2)
    assert (late["comm_ns"], late["exposed_comm_ns"], late["idle_ns"], late["wait_ns"], late["last_arrivals"]) == (
        220 * US, 170 * US, 580 * US, 0, 1)
    per_rank = res.ranks.row(0, named=True)
    assert per_rank["rank"] == 0 and per_rank["comm_overlap_fraction"] == pytest.approx(50 / 300)


def test_late_rank_by_host_delay_is_named_with_its_cost_and_line(tmp_path: Path) -> None:
    res = analyze(write_run(tmp_path / "run", {"host_delay": 80}), tmp_path)
    # the two others wait 80 µs each for rank 2
    assert (res.straggler, res.straggler_last_arrivals, res.straggler_wait_cost_ns) == (2, 1, 160 * US)
    assert res.straggler_wait_cost_per_step_ns == 160 * US
    assert res.straggler_cause is Cause.HOST_DELAY
    assert (res.straggler_host_op, res.straggler_host_line) == ("aten::copy_", "train.py(5): slow_host")
    s = res.stragglers.row(0, named=True)
    assert (s["step"], s["straggler"], s["lateness_ns"], s["excess_compute_ns"], s["excess_data_loading_ns"],
            s["host_delay_ns"], s["cause"]) == (1, 2, 80 * US, 0, 0, 80 * US, "host_delay")


def test_a_host_delay_with_no_op_names_the_builtin_the_host_sat_in(tmp_path: Path) -> None:
    # GIVEN rank 2 late by 80 µs asleep in time.sleep (a Python builtin, no CPU op under it)
    res = analyze(write_run(tmp_path / "run", {"host_delay": 80, "asleep": True}), tmp_path)
    # THEN the builtin stands for the op (a builtin names no source line: the line is its caller's)
    assert (res.straggler, res.straggler_cause) == (2, Cause.HOST_DELAY)
    assert (res.straggler_host_op, res.straggler_host_line) == ("<built-in function sleep>", "train.py(5): slow_host")


@pytest.mark.parametrize(("late", "cause", "excess"), [
    ({"extra_compute": 80}, Cause.COMPUTE, ("excess_compute_ns", 80)),
    ({"extra_dl": 120}, Cause.DATA_LOADING, ("excess_data_loading_ns", 120)),
])
def test_late_rank_by_compute_or_data_loading(tmp_path: Path, late: dict[str, float], cause: Cause,
                                              excess: tuple[str, int]) -> None:
    res = analyze(write_run(tmp_path / "run", late), tmp_path)
    lateness = int(sum(late.values()))
    s = res.stragglers.row(0, named=True)
    assert (res.straggler, res.straggler_cause, res.straggler_wait_cost_ns) == (2, cause, 2 * lateness * US)
    assert (s["lateness_ns"], s[excess[0]], s["host_delay_ns"]) == (lateness * US, excess[1] * US, 0)
    assert res.straggler_host_line is None  # no host blame unless the host is the cause


def test_imbalance_is_max_over_median(tmp_path: Path) -> None:
    res = analyze(write_run(tmp_path / "run", {"extra_compute": 80}), tmp_path)
    by = {r["metric"]: r for r in res.imbalance.to_dicts()}
    # compute 250, 250, 330: median 250, max 330 on rank 2
    assert (by["compute"]["median_ns"], by["compute"]["max_ns"], by["compute"]["max_rank"]) == (
        250 * US, 330 * US, 2)
    assert by["compute"]["imbalance"] == pytest.approx(330 / 250)
    assert by["data_loading"]["imbalance"] == 1.0


def test_imbalance_without_values_or_with_a_zero_median() -> None:
    frame = pl.DataFrame({"rank": [0, 1, 2], "wait_ns": [0, 0, 30]}).with_columns(
        [pl.lit(None, pl.Int64).alias(m) for m in ("wall_ns", "compute_ns", "comm_ns", "exposed_comm_ns",
                                                    "idle_ns", "data_loading_ns", "cpu_ns")])
    by = {r["metric"]: r for r in imbalance(frame).to_dicts()}
    assert by["wait"]["imbalance"] is None and by["wait"]["max_rank"] == 2
    assert by["compute"]["median_ns"] is None


def test_per_window_splits_pieces_at_window_edges() -> None:
    pieces = pl.LazyFrame({"start_ns": [0, 20], "end_ns": [12, 25]})
    windows = pl.DataFrame({"step": [1, 2], "start_ns": [0, 10], "end_ns": [10, 22]})
    assert per_window(pieces, windows, "n").sort("step").rows() == [(1, 10), (2, 4)]


def test_one_rank_says_so_and_keeps_its_row(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "one", trace(*rank_events()), "solo.pt.trace.json")
    res = analyze(path, tmp_path)
    assert res.rank_count == 1 and res.note is not None and "one rank" in res.note
    assert res.straggler is None and res.stragglers.height == 0
    assert row(res, 0)["compute_ns"] == 250 * US and res.ranks.height == 1


def test_a_trace_without_steps_is_one_window_its_gpu_span(tmp_path: Path) -> None:
    """No steps: one window, the GPU span (first kernel's start 100 µs to the all_reduce's end 700 µs), which is
    the window `summary` of the trace alone takes; counted as no step, and said so."""
    from stepscope.analyze import load
    from stepscope.analyze.summary import verdict

    events = [e for e in rank_events() if not e["name"].startswith("ProfilerStep")]
    path = write_trace(tmp_path / "nostep", trace(*events), "solo.pt.trace.json")
    res = analyze(path, tmp_path)
    r = row(res, 0)
    assert r["step"] is None and r["wall_ns"] == 600 * US and r["comm_ns"] == 300 * US
    assert r["wall_ns"] == verdict(load(path, cache_dir=tmp_path / "cache")).wall_ns
    assert res.step_count == 0 and res.ranks["steps"].to_list() == [0]
    assert res.note is not None and "rank 0: no steps" in res.note


def test_a_cpu_trace_without_steps_is_one_window_first_event_to_last(tmp_path: Path) -> None:
    events = [e for e in rank_events() if not e["name"].startswith("ProfilerStep") and e.get("cat") != "kernel"]
    res = analyze(write_trace(tmp_path / "cpu", trace(*events), "solo.pt.trace.json"), tmp_path)
    assert row(res, 0)["wall_ns"] == 1000 * US and res.step_count == 0


# ------------------------------------------------------------------------ the real 8-rank NCCL set vs HTA


def _length(u: list[list[float]]) -> float:
    return sum(e - s for s, e in u)


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    return sum(max(0.0, min(x[1], y[1]) - max(x[0], y[0])) for x in a for y in b)


def hta_figures(path: Path, *, step_only: bool = False) -> dict[str, Any]:
    """HTA's figures for one rank, slow and obvious from the raw JSON: GPU events are those with a stream;
    communication: 'nccl' in the name, memory: Memcpy/Memset, compute: the rest; each event rounded inward to
    whole µs. get_comm_comp_overlap: overlap of merged comm and merged compute / merged comm;
    get_temporal_breakdown: span = first start to last end, idle = span - union, compute = union of compute,
    non-compute = span - idle - compute. `step_only`: over the step alone, which starts where the GPU work
    launched before the trace began ends (`slow_before_trace`: the previous step's, which HTA counts)."""
    doc = json.loads(path.read_text())
    before = slow_before_trace(doc["traceEvents"]) if step_only else []
    earlier = {id(e) for e in before}
    start = max((e["ts"] + e["dur"] for e in before), default=-math.inf)
    gpu = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "stream" in (e.get("args") or {})
           and id(e) not in earlier and e["ts"] + e.get("dur", 0) > start]

    def iv(e: dict[str, Any]) -> tuple[float, float]:
        return float(math.ceil(max(e["ts"], start))), float(math.floor(e["ts"] + e.get("dur", 0)))

    comm = slow_union([iv(e) for e in gpu if "nccl" in e["name"].lower()])
    compute = slow_union([iv(e) for e in gpu if "nccl" not in e["name"].lower()
                      and "Memcpy" not in e["name"] and "Memset" not in e["name"]])
    every = slow_union([iv(e) for e in gpu])
    span = every[-1][1] - every[0][0]
    idle = span - _length(every)
    return {"rank": doc["distributedInfo"]["rank"], "comm_us": _length(comm), "compute_us": _length(compute),
            "overlap": _overlap(comm, compute) / _length(comm), "non_compute_us": span - idle - _length(compute),
            "busy_us": _length(every)}


def test_dlrm_matches_hta_and_the_reference(corpus: Path, tmp_path: Path) -> None:
    d = corpus / "traces" / "param" / "dlrm_kineto"
    res = analyze(d, tmp_path)
    assert res.rank_count == 8 and res.step_count == 1 and res.straggler == 7
    ours = {r["rank"]: r for r in res.steps.to_dicts()}
    # ranks whose step has more CPU time than wall time are named, with why (their windows open late)
    over = sorted(r for r, row in ours.items() if row["cpu_ns"] > row["wall_ns"])
    assert over and res.note is not None and f"{numbered('rank', over)}: more CPU time than wall time" in res.note
    overlap = {r["rank"]: r["comm_overlap_fraction"] for r in res.ranks.to_dicts()}
    files = sorted(d.glob("*.json"))
    ref = {r["rank"]: r for r in reference_comm().analyze("dlrm", {str(i): [str(f)] for i, f in enumerate(files)})[
        "per_rank"]}
    earlier = {}
    for f in files:
        whole, hta = hta_figures(f), hta_figures(f, step_only=True)
        o = ours[hta["rank"]]
        earlier[hta["rank"]] = whole["compute_us"] - hta["compute_us"]
        # every GPU event but the previous step's lies inside the step: the same unions; our idle counts the
        # step's edges too
        assert o["comm_ns"] == hta["comm_us"] * US == ref[hta["rank"]]["comm_kernel_union_us"] * US
        assert o["compute_ns"] == hta["compute_us"] * US
        assert o["wall_ns"] - o["idle_ns"] == hta["busy_us"] * US
        assert o["wall_ns"] - o["idle_ns"] - o["compute_ns"] == hta["non_compute_us"] * US
        assert overlap[hta["rank"]] == pytest.approx(hta["overlap"], abs=1e-12)
        assert 0.005 < hta["overlap"] < 0.1  # dlrm's NCCL is barely hidden: 0.6% to 9.5%
    # ranks 1 and 3 still run the previous step's optimizer kernels (Adam's, queued before the trace began) when
    # step 10 begins: HTA counts them as step 10's compute (and on rank 1 a 1 µs copy of step 10's on another
    # stream that ran beside them, before step 10's window, as any step's work beside its predecessor's)
    assert {r: us for r, us in earlier.items() if us} == {1: 203.0, 3: 176.0}
