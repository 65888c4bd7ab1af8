"""The communication_bound rule of the verdict: exposed communication from synthetic traces with known shares
(each side of COMM_MIN), checked against a µs-by-µs count; NCCL kernels never read as compute; a CPU backend;
one rank's hint at waiting; and the real 8-rank dlrm set, rank by rank, against the raw JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from builders import annotation, cpu_op, kernel, load_events, runtime, slow_union, step, trace

from stepscope.analyze import load
from stepscope.analyze.summary import COMM_MIN, RULES, Verdict, verdict

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ARGS: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                        "dtype": "Float"}


def _launched(name: str, ts: float, dur: float, corr: int, **args: Any) -> list[dict[str, Any]]:
    return [runtime("cudaLaunchKernel", ts=max(ts - 2, 0), dur=1, correlation=corr),
            kernel(name, ts=ts, dur=dur, correlation=corr, **args)]


def exposed_by_count(events: list[dict[str, Any]], start: int, end: int) -> int:
    """The oracle, slow and obvious: µs of [start, end) where a NCCL kernel runs and no other kernel does."""
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()]
    return sum(1 for t in range(start, end)
               if any(s <= t < e for s, e in nccl) and not any(s <= t < e for s, e in compute))


def comm_step(exposed_us: int) -> list[dict[str, Any]]:
    """A 100 µs step: compute [0, 70) on stream 7, an all_reduce [60, 70 + exposed_us) on stream 20 (10 µs under
    compute, `exposed_us` after it); GPU busy >= 70%, nothing else near a threshold."""
    return [step(1, ts=0, dur=100), *_launched("sgemm", 2, 68, 1),
            *_launched(AR, 60, 10 + exposed_us, 2, stream=20, **ARGS)]


@pytest.mark.parametrize(("exposed_us", "expected"), [
    (round(100 * COMM_MIN), Verdict.COMMUNICATION_BOUND),  # exactly the threshold: >= holds
    (round(100 * COMM_MIN) - 1, Verdict.GPU_BOUND),  # one µs under it: a busy GPU
    (25, Verdict.COMMUNICATION_BOUND),
])
def test_exposed_communication_each_side_of_the_threshold(tmp_path: Path, exposed_us: int, expected: Verdict) -> None:
    # GIVEN a step whose all_reduce runs `exposed_us` µs past the compute it overlaps
    events = comm_step(exposed_us)
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN the exposed share is the µs count, and the verdict flips exactly at COMM_MIN
    assert r.exposed_comm_fraction == pytest.approx(exposed_by_count(events, 0, 100) / 100)
    assert r.exposed_comm_fraction == pytest.approx(exposed_us / 100)
    assert r.verdict is expected and r.per_step["verdict"].to_list() == [expected.value]
    assert r.per_step["exposed_comm_fraction"].to_list() == pytest.approx([exposed_us / 100])
    if expected is Verdict.COMMUNICATION_BOUND:
        assert r.places.row(0, named=True) == {"what": "collective, exposed time", "name": "all_reduce 4,096 B",
                                               "total_ns": exposed_us * 1000, "count": 1}
        assert "bucket_cap_mb" in r.advice and "stepscope summary RUN" in r.advice
    else:  # the margin says how close communication_bound was
        assert r.margin is not None and r.margin.towards is Verdict.COMMUNICATION_BOUND
        assert r.margin.text == "exposed communication 19.0% < 20%: 1.0 points from communication_bound"


@pytest.mark.parametrize("layout", [
    # (kernel name, start µs, duration µs, stream): several streams, comm partly under compute
    [("sgemm", 0, 30, 7), (AR, 10, 40, 20), ("relu", 45, 20, 7), (AR, 70, 25, 20), ("add", 80, 5, 8)],
    [(AR, 0, 50, 20), (AR, 20, 40, 21), ("sgemm", 30, 10, 7), ("sgemm", 55, 40, 7)],
    [("sgemm", 0, 95, 7), (AR, 5, 80, 20)],
])
def test_exposed_share_equals_the_count_on_overlapping_streams(tmp_path: Path, layout: list[tuple[str, int, int,
                                                                                                     int]]) -> None:
    events = [step(1, ts=0, dur=100)]
    for i, (name, ts, dur, stream) in enumerate(layout):
        events += _launched(name, ts, dur, 10 + i, stream=stream, **(ARGS if name == AR else {}))
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.exposed_comm_fraction == pytest.approx(exposed_by_count(events, 0, 100) / 100)
    assert r.verdict is (Verdict.COMMUNICATION_BOUND if exposed_by_count(events, 0, 100) >= 20
                         else Verdict.GPU_BOUND)


def test_gpu_bound_never_points_at_nccl_kernels(tmp_path: Path) -> None:
    # GIVEN a busy GPU whose longest kernel is an all_reduce hidden under compute
    events = [step(1, ts=0, dur=100), *_launched("sgemm", 2, 50, 1), *_launched("relu", 52, 45, 2),
              *_launched(AR, 5, 90, 3, stream=20, **ARGS)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN gpu_bound (nothing exposed), and the kernels to speed up are the compute ones only
    assert r.exposed_comm_fraction == 0 and r.verdict is Verdict.GPU_BOUND
    assert r.places["name"].to_list() == ["sgemm", "relu"] and "compute kernels" in r.advice


def test_before_launch_and_sync_calls(tmp_path: Path) -> None:
    # GIVEN a step whose GPU is busy 40% (launch_bound alone), 30 µs of it an exposed all_reduce, while the CPU
    # sits 25 µs in a cudaStreamSynchronize waiting for it (sync calls >= 10% with GPU busy < 60%)
    events = [step(1, ts=0, dur=100), *_launched("sgemm", 2, 10, 1), *_launched(AR, 12, 30, 2, stream=20, **ARGS),
              runtime("cudaStreamSynchronize", ts=15, dur=25)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN the collective decides: the sync waits for it, the idle GPU is the host's (runner-up)
    assert r.verdict is Verdict.COMMUNICATION_BOUND and r.exposed_comm_fraction == pytest.approx(0.30)
    holds = r.rules.filter("holds")["verdict"].to_list()
    assert holds[:2] == ["communication_bound", "sync_bound"] and "launch_bound" in holds
    assert r.runner_up is Verdict.SYNC_BOUND
    order = [rule.verdict for rule in RULES]
    assert order.index(Verdict.COMMUNICATION_BOUND) < order.index(Verdict.LAUNCH_BOUND) < order.index(
        Verdict.GPU_BOUND)


def test_a_cpu_backend_waiting_in_its_collectives(tmp_path: Path) -> None:
    # GIVEN a CPU-only (gloo) step: 30 µs of its 100 in gloo:all_reduce
    events = [step(1, ts=0, dur=100), cpu_op("aten::mm", ts=5, dur=40), annotation("gloo:all_reduce", 50, 30)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN communication_bound, not just "no GPU"; with 15 µs it is no_gpu again
    assert r.verdict is Verdict.COMMUNICATION_BOUND and r.exposed_comm_fraction == pytest.approx(0.3)
    assert r.runner_up is Verdict.NO_GPU and "NCCL backend" in r.advice
    events[-1] = annotation("gloo:all_reduce", 50, 15)
    assert verdict(load_events(tmp_path / "b", trace(*events))).verdict is Verdict.NO_GPU


def test_a_cpu_backend_without_steps_is_measured_over_the_trace(tmp_path: Path) -> None:
    # GIVEN the same gloo work with no step at all: aten::mm 5-45 µs, gloo:all_reduce 50-80 µs, an op to 100 µs
    events = [cpu_op("aten::mm", ts=5, dur=40), annotation("gloo:all_reduce", 50, 30),
              cpu_op("aten::add", ts=95, dur=5)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN the shares are of the trace, first event to last (95 µs), and its 30 µs of collectives decide: not a
    # 0% read off a GPU window that does not exist
    assert (r.steps_found, r.wall_ns) == (0, 95_000)
    assert r.exposed_comm_fraction == pytest.approx(30 / 95) and r.verdict is Verdict.COMMUNICATION_BOUND


def test_one_rank_hints_at_waiting_but_names_no_straggler(tmp_path: Path) -> None:
    # GIVEN two steps with the same all_reduce: 10 µs in step 1, 40 µs in step 2 (30 µs above its fastest)
    events = [step(1, ts=0, dur=100), step(2, ts=100, dur=100),
              *_launched("sgemm", 2, 50, 1), *_launched(AR, 60, 10, 2, stream=20, **ARGS),
              *_launched("sgemm", 102, 50, 3), *_launched(AR, 155, 40, 4, stream=20, **ARGS)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN the hint is 30 µs of 200, said as a hint, and the verdict is never straggler from one rank
    assert r.comm_excess_fraction == pytest.approx(30 / 200)
    assert r.comm_note is not None and "cannot be seen from one rank" in r.comm_note and "15.0%" in r.comm_note
    assert r.verdict is not Verdict.STRAGGLER and all(rule.verdict is not Verdict.STRAGGLER for rule in RULES)


def test_a_trace_without_collectives_says_nothing_of_communication(tmp_path: Path) -> None:
    r = verdict(load_events(tmp_path, trace(step(1, ts=0, dur=100), *_launched("sgemm", 2, 90, 1))))
    assert r.exposed_comm_fraction == 0 and r.comm_excess_fraction is None and r.comm_note is None


# ------------------------------------------------------------------------ the real 8-rank NCCL set, rank by rank


def raw_shares(path: Path, wall_us: float) -> dict[str, float]:
    """From the raw JSON, obviously: NCCL kernel time not under any other kernel (merged unions, µs rounded
    inward as HTA does), and NCCL's share of the GPU's busy time, over the step's wall time."""
    doc = json.loads(path.read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    iv = [(float(math.ceil(e["ts"])), float(math.floor(e["ts"] + e["dur"])), "nccl" in e["name"].lower())
          for e in kernels]
    nccl = slow_union([(s, e) for s, e, c in iv if c])
    compute = slow_union([(s, e) for s, e, c in iv if not c])
    covered = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in nccl for b in compute)
    nccl_us = sum(e - s for s, e in nccl)
    busy_us = sum(e - s for s, e in slow_union([(s, e) for s, e, _ in iv]))
    return {"exposed": (nccl_us - covered) / wall_us, "nccl_of_busy": nccl_us / busy_us}


def test_dlrm_ranks_busy_with_nccl_are_communication_bound(corpus: Path, tmp_path: Path) -> None:
    files = sorted((corpus / "traces" / "param" / "dlrm_kineto").glob("*.json"))
    verdicts: dict[int, Verdict] = {}
    for f in files:
        r = verdict(load(f, cache_dir=tmp_path))
        raw = raw_shares(f, r.wall_ns / 1000)
        assert r.exposed_comm_fraction == pytest.approx(raw["exposed"], abs=1e-9)
        assert raw["nccl_of_busy"] > 0.6  # every rank's GPU time is mostly NCCL
        expected = Verdict.COMMUNICATION_BOUND if raw["exposed"] >= COMM_MIN else None
        if expected is not None:
            assert r.verdict is expected
            assert not any("nccl" in str(n).lower() for n in r.places["name"].to_list())
        else:  # the straggler: its own exposed share is small, its GPU idles behind its host
            assert r.verdict is Verdict.LAUNCH_BOUND
        rank = load(f, cache_dir=tmp_path).rank
        assert rank is not None
        verdicts[rank] = r.verdict
    # the two ranks the issue names (85%+ NCCL: launch_bound and gpu_bound before) and five more
    assert verdicts[0] is verdicts[1] is Verdict.COMMUNICATION_BOUND
    assert sorted(r for r, v in verdicts.items() if v is Verdict.COMMUNICATION_BOUND) == [0, 1, 2, 3, 4, 5, 6]


def test_the_places_hold_each_call_s_exposed_time_as_counted(tmp_path: Path) -> None:
    # GIVEN two kinds of all_reduce overlapping each other on two streams, partly under one GEMM, repeated on a
    # second device (the places join each call with the exposed pieces it overlaps, device by device)
    big = {**ARGS, "In msg nelems": 2048, "Out msg nelems": 2048}
    events = [step(1, ts=0, dur=100)]
    corr = 0
    for device, shift in ((0, 0), (1, 5)):
        for name, ts, dur, stream, args in ((AR, 0, 50, 20, ARGS), (AR, 20 + shift, 40, 21, big),
                                            ("sgemm", 30, 10, 7, {})):
            corr += 1
            events += [runtime("cudaLaunchKernel", ts=max(ts - 2, 0), dur=1, correlation=corr),
                       kernel(name, ts=ts, dur=dur, correlation=corr, stream=stream, device=device, **args)]
    r = verdict(load_events(tmp_path, trace(*events)))
    # THEN each kind's exposed time is the µs count over its calls' spans, on their own device
    def counted(device: int) -> list[dict[str, Any]]:
        return [e for e in events if e.get("cat") != "kernel" or e["args"].get("device") == device]
    expected = {
        "all_reduce 4,096 B": sum(exposed_by_count(counted(d), 0, 50) for d in (0, 1)),
        "all_reduce 8,192 B": sum(exposed_by_count(counted(d), 20 + s, 60 + s) for d, s in ((0, 0), (1, 5))),
    }
    places = {row["name"]: row["total_ns"] for row in r.places.to_dicts() if row["what"] == "collective, exposed time"}
    assert places == {name: us * 1000 for name, us in expected.items()}
    assert expected == {"all_reduce 4,096 B": 80, "all_reduce 8,192 B": 60}


def test_symmetric_memory_collectives_are_communication_not_compute(tmp_path: Path) -> None:
    """torch's symmetric-memory all-reduce (b200's multimem_all_reduce_kernel) is what `kernels` calls
    communication: `summary` counts it as exposed communication, and `comm` lists it as an all_reduce."""
    from stepscope.analyze._comm_events import rank_calls

    mm = "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)"
    events = [step(1, ts=0, dur=100), *_launched("sgemm", 2, 68, 1), *_launched(mm, 60, 35, 2, stream=20)]
    r = verdict(load_events(tmp_path, trace(*events)))
    assert r.exposed_comm_fraction == pytest.approx(0.25)  # [70, 95): after the sgemm, before the step's end
    calls = rank_calls(load_events(tmp_path / "again", trace(*events)))
    assert calls.select("collective", "dur_ns").rows() == [("all_reduce", 35_000)]
