"""Collectives across the ranks of a run: synthetic runs with exact answers, and the real 8-rank dlrm set
checked against the independent oracle ../shared/tools/reference_comm.py."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import annotation, cpu_op, kernel, runtime, step, trace, write_trace
from conftest import reference_comm

from stepscope.analyze._comm_events import canonical_dtype, collective_type
from stepscope.analyze._text import numbers
from stepscope.analyze.collectives import CollectivesResult, _loose_alignment, collectives
from stepscope.errors import InputError

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
US = 1000  # ns per µs


def ns(us: float) -> int:
    """The oracle's µs (a float parsed from the trace's text) as our exact integer ns."""
    return int(Decimal(repr(us)) * US)


def comm_kernel(name: str, ts: float, dur: float, *, nelems: int, coll: str = "allreduce", dtype: str = "Float",
                seq: int | None = None, pg: str = "0", ranks: str = "[0, 1, 2, 3]") -> dict[str, Any]:
    """A communication kernel with the args torch >= 2.3 copies onto it (Seq where given)."""
    args: dict[str, Any] = {"Collective name": coll, "In msg nelems": nelems, "Out msg nelems": nelems,
                            "dtype": dtype, "Group size": 4, "Process Group Name": pg, "Process Group Ranks": ranks}
    if seq is not None:
        args["Seq"] = seq
    return kernel(name, ts, dur, **args)


def rank_trace(directory: Path, rank: int, *events: dict[str, Any], world: int = 4, name: str | None = None,
               **top: Any) -> Path:
    doc = trace(*events, distributedInfo={"backend": "nccl", "rank": rank, "world_size": world}, **top)
    path: Path = write_trace(directory, doc, name or f"rank{rank}.pt.trace.json")
    return path


def analyze(paths: Any, tmp_path: Path, **kw: Any) -> CollectivesResult:
    return collectives(paths, cache_dir=tmp_path / "cache", **kw)


@pytest.mark.parametrize(("name", "expected"), [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "broadcast"), ("rcclKernel_AllGather_RING_LL", "all_gather"),
    ("gloo:all_reduce", "all_reduce"), ("nccl:all_to_all", "all_to_all"), ("_allgather_base", "all_gather"),
    ("alltoall_base", "all_to_all"), ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("barrier", "barrier"), ("send", "send_recv"), ("reduce", "reduce"), ("aten::mm", None), (None, None),
])
def test_collective_type_from_names(name: str | None, expected: str | None) -> None:
    assert collective_type(name) == expected


def test_dtypes_canonical() -> None:
    assert [canonical_dtype(d) for d in ("Float", "float", "c10::Half", "BFloat16", "long int", "Long", "int",
                                          "unsigned char", None)] == [
        "float32", "float32", "float16", "bfloat16", "int64", "int64", "int32", "uint8", None]


# ----------------------------------------------------------------------------------- a synthetic 4-rank run

#: each rank's clock runs ahead of the true time by this much (µs): rank r's trace says true + CLOCK[r]
CLOCK = {0: 0, 1: 500, 2: -300}
#: true arrival (start) of each rank at each call (µs); every call ends at the same true time END
ARRIVE = {0: [100, 1000, 2000], 1: [130, 1000, 2050], 2: [110, 1080, 2010]}
END = [200, 1100, 2100]
NELEMS = [1 << 20, 0, 256]  # the second call is dist.barrier()'s 0-element all-reduce


def _synthetic_run(directory: Path) -> list[Path]:
    """Ranks 0-2 of a world of 4 (rank 3 missing); rank 2 runs one extra all_reduce nobody else runs."""
    paths = []
    for r, starts in ARRIVE.items():
        events = [comm_kernel(AR, s + CLOCK[r], e - s, nelems=n) for s, e, n in zip(starts, END, NELEMS, strict=True)]
        if r == 2:
            events.append(comm_kernel(AR, 5000, 40, nelems=999))
        paths.append(rank_trace(directory, r, *events))
    return paths


def test_synthetic_run_offsets_skew_latency_waits_exactly(tmp_path: Path) -> None:
    # GIVEN three ranks whose clocks are off by known amounts and who arrive at known times
    _synthetic_run(tmp_path / "run")
    # WHEN the run is analysed
    res = analyze(tmp_path / "run", tmp_path)
    # THEN the clock offsets undo the clocks (relative to rank 0), with no residual
    offsets = dict(res.ranks.select("rank", "clock_offset_ns").iter_rows())
    assert offsets == {r: -CLOCK[r] * US for r in CLOCK}
    assert res.max_clock_residual_ns == 0
    # the matched calls: skew = latest - earliest true arrival, latency = shortest duration
    calls = res.calls.filter(pl.col("ranks") == 3).sort("call")
    assert calls["skew_ns"].to_list() == [30 * US, 80 * US, 50 * US]
    assert calls["latency_ns"].to_list() == [70 * US, 20 * US, 50 * US]
    assert calls["last_ranks"].to_list() == ["1", "2", "1"]
    assert calls["message_bytes"].to_list() == [4 << 20, 0, 1024]
    # algbw = bytes / latency (GB/s = bytes per ns); busbw = algbw x 2(n-1)/n with n = 4; none for 0 bytes
    assert calls["algbw_gbps"].to_list() == [pytest.approx((4 << 20) / 70_000), None, pytest.approx(1024 / 50_000)]
    assert calls["busbw_gbps"][0] == pytest.approx((4 << 20) / 70_000 * 1.5)
    # wait on a rank = its duration - latency
    waits = res.waits.filter(pl.col("call") == calls["call"][0]).sort("rank")
    assert waits["wait_ns"].to_list() == [30 * US, 0, 20 * US]
    assert waits["arrival"].to_list() == [1, 3, 2]
    # rank 1 arrives last twice, costing the others (30 + 20) + (50 + 40) µs of wait; rank 2 once, in the
    # barrier, costing 80 + 80 µs: the straggler is the rank whose late arrivals cost most, not the one last
    # most often
    cost = dict(res.waits.join(res.calls.select("call", "last_ranks"), on="call")
                .filter(pl.col("rank").cast(pl.String) != pl.col("last_ranks"))
                .group_by("last_ranks").agg(pl.col("wait_ns").sum()).iter_rows())
    assert cost == {"1": (30 + 20 + 50 + 40) * US, "2": (80 + 80) * US}
    assert (res.straggler_rank, res.straggler_last_arrivals, res.straggler_wait_cost_ns) == (2, 1, 160 * US)


def test_synthetic_run_names_the_missing_rank_and_the_unmatched_call(tmp_path: Path) -> None:
    _synthetic_run(tmp_path / "run")
    res = analyze(tmp_path / "run", tmp_path)
    assert res.rank_count == 3 and res.call_count == 4 and res.unmatched_calls == 1
    (lone,) = res.calls.filter(pl.col("ranks") == 1).iter_rows(named=True)
    assert lone["missing_ranks"] == "0, 1" and lone["message_bytes"] == 3996 and lone["skew_ns"] is None
    assert any("rank 3 of world size 4 has no trace" in w for w in res.warnings)
    assert any("1 call not seen on every rank" in w for w in res.warnings)


def test_groups_by_collective_size_bucket_dtype_and_group(tmp_path: Path) -> None:
    _synthetic_run(tmp_path / "run")
    res = analyze(tmp_path / "run", tmp_path, link_bandwidth_gbps=100.0)
    buckets = dict(res.groups.select("size_bucket_bytes", "calls").iter_rows())
    assert buckets == {0: 1, 1024: 1, 2048: 1, 4 << 20: 1}  # 3996 B falls in the 2 KiB bucket
    big = res.groups.filter(pl.col("size_bucket_bytes") == 4 << 20).row(0, named=True)
    assert big["link_share"] == pytest.approx(big["busbw_gbps"] / 100.0)
    assert "link_share" in res.calls.columns


def test_a_group_of_calls_of_unknown_size_has_no_byte_total(tmp_path: Path) -> None:
    # GIVEN two ranks' all-reduces: one of 64 floats, and one whose dtype the trace does not name
    d = tmp_path / "run"
    for r in (0, 1):
        rank_trace(d, r, comm_kernel(AR, 100, 10, nelems=64, seq=1, ranks="[0, 1]"),
                   comm_kernel(AR, 200, 10, nelems=64, seq=2, dtype="Mystery", ranks="[0, 1]"), world=2)
    groups = analyze(d, tmp_path).groups
    # THEN the known call's group totals its bytes; the other's total is unknown, not 0 B
    assert dict(groups.select("size_bucket_bytes", "total_message_bytes").iter_rows()) == {256: 256, None: None}


def test_sequence_numbers_match_calls_where_the_order_would_not(tmp_path: Path) -> None:
    # rank 1's window starts one call later: by order its first call would pair with rank 0's first
    d = tmp_path / "run"
    rank_trace(d, 0, *[comm_kernel(AR, 100 * k, 10, nelems=64, seq=k, ranks="[0, 1]") for k in (1, 2, 3)], world=2)
    rank_trace(d, 1, *[comm_kernel(AR, 100 * k + 5, 5, nelems=64, seq=k, ranks="[0, 1]") for k in (2, 3)], world=2)
    res = analyze(d, tmp_path)
    assert res.calls.sort("call")["seq"].to_list() == [1, 2, 3]
    assert res.calls.sort("call")["missing_ranks"].to_list() == ["1", None, None]
    assert res.calls.filter(pl.col("seq") == 2)["skew_ns"].item() == 5 * US


def test_ranks_on_one_named_host_share_a_clock(tmp_path: Path) -> None:
    # the same skewed clocks, but both traces name one host: no offset is fitted, the residual shows it
    d = tmp_path / "run"
    for r in (0, 1):
        rank_trace(d, r, comm_kernel(AR, 100 + 50 * r, 100 - 50 * r + 7 * r, nelems=8, ranks="[0, 1]"), world=2,
                   host_name="node7", baseTimeNanoseconds=1_700_000_000_000_000_000)
    res = analyze(d, tmp_path)
    assert res.clocks == 1 and res.ranks["clock_offset_ns"].to_list() == [0, 0]
    assert res.calls["skew_ns"].item() == 50 * US and res.max_clock_residual_ns == 3500


def test_ranks_on_one_host_traced_at_different_times_are_not_one_run(tmp_path: Path) -> None:
    # GIVEN rank 0 of one run and rank 1 of a later one on the same host (one clock): no instant in common
    d = tmp_path / "run"
    for r in (0, 1):
        rank_trace(d, r, comm_kernel(AR, 100 + 60_000_000 * r, 50, nelems=8, ranks="[0, 1]"), world=2,
                   host_name="node7", baseTimeNanoseconds=1_700_000_000_000_000_000)
    # THEN they are refused (matched, they gave a 60 s skew and rank 1 as a straggler), naming both ranks
    with pytest.raises(InputError, match=r"ranks 0 \(rank0.pt.trace.json\) and 1 \(rank1.pt.trace.json\) share "
                       r"host node7's clock but were traced at different times \(rank 0's trace ends 60.0 s before"):
        analyze(d, tmp_path)
    # while on hosts of their own (clocks that may differ by anything) they are aligned by their collectives
    for r in (0, 1):
        rank_trace(d, r, comm_kernel(AR, 100 + 60_000_000 * r, 50, nelems=8, ranks="[0, 1]"), world=2,
                   host_name=f"node{r}")
    assert analyze(d, tmp_path).max_skew_ns == 0


def test_windows_of_a_rank_are_pooled_in_time_order(tmp_path: Path) -> None:
    d = tmp_path / "run"
    for r in (0, 1):
        for w, base in enumerate((0, 10_000)):
            rank_trace(d / f"rank_{r}", r, comm_kernel(AR, base + 100 + r, 50 - r, nelems=8, ranks="[0, 1]"),
                       world=2, name=f"w{w}.pt.trace.json")
    res = analyze(d, tmp_path)
    assert res.ranks["traces"].to_list() == [2, 2] and res.call_count == 2 and res.unmatched_calls == 0


def test_duplicate_and_mixed_and_rankless_traces_are_named_and_left_out(tmp_path: Path) -> None:
    d = tmp_path / "batch"
    for r in (0, 1):
        rank_trace(d, r, comm_kernel(AR, 100, 50, nelems=8, ranks="[0, 1]"), world=2)
    rank_trace(d, 1, comm_kernel(AR, 90, 60, nelems=8, ranks="[0, 1]"), world=2, name="rank1_again.pt.trace.json")
    rank_trace(d, 0, comm_kernel(AR, 100, 50, nelems=8), world=8, name="other_job_rank0.pt.trace.json")
    write_trace(d, trace(comm_kernel(AR, 100, 50, nelems=8)), "anonymous.pt.trace.json")
    res = analyze(d, tmp_path)
    text = "\n".join(res.warnings)
    # (the earlier of two overlapping traces of one rank is kept, and the warning says which is which)
    assert ("duplicate rank 1: rank1.pt.trace.json overlaps rank1_again.pt.trace.json in time (or is on another "
            "host); rank1.pt.trace.json left out, rank1_again.pt.trace.json kept") in text
    assert "other_job_rank0.pt.trace.json (8)" in text and "anonymous.pt.trace.json" in text
    assert res.rank_count == 2 and res.call_count == 1 and res.unmatched_calls == 0


def test_a_rank_without_collectives_is_named(tmp_path: Path) -> None:
    d = tmp_path / "run"
    rank_trace(d, 0, comm_kernel(AR, 100, 50, nelems=8, ranks="[0, 1]"), world=2)
    rank_trace(d, 1, kernel("sgemm", 100, 50), world=2)
    res = analyze(d, tmp_path)
    assert any("rank 1 ran no collective" in w for w in res.warnings)
    assert res.calls["missing_ranks"].to_list() == ["1"]


def test_a_single_rank_trace_lists_its_collectives_and_says_there_is_one_rank(tmp_path: Path) -> None:
    path = rank_trace(tmp_path, 0, comm_kernel(AR, 100, 50, nelems=8), comm_kernel(AR, 300, 20, nelems=8), world=1)
    res = analyze(path, tmp_path)
    assert res.rank_count == 1 and res.call_count == 2 and res.note and res.note.startswith("one rank")
    assert res.calls["latency_ns"].to_list() == [50 * US, 20 * US] and res.straggler_rank is None


def test_old_traces_take_type_and_size_from_the_launching_annotation(tmp_path: Path) -> None:
    # PARAM-era NCCL: no collective args on the kernel; an all-to-all runs as SendRecv kernels
    path = rank_trace(
        tmp_path, 0,
        cpu_op("record_param_comms", 10, 30), annotation("nccl:all_to_all", 12, 20),
        runtime("cudaLaunchKernel", 15, 3, correlation=9, external_id=9),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 40, 25,
               correlation=9),
        world=1)
    doc = json.loads(path.read_text())
    doc["traceEvents"][1]["args"] = {"Input Dims": [[6144]], "Input type": ["float"]}
    path.write_text(json.dumps(doc))
    res = analyze(path, tmp_path)
    row = res.calls.row(0, named=True)
    assert (row["collective"], row["message_bytes"], row["dtype"]) == ("all_to_all", 6144 * 4, "float32")


def test_gloo_cpu_collectives(tmp_path: Path) -> None:
    d = tmp_path / "run"
    for r, (start, dur) in enumerate(((100, 500), (580, 20))):
        ev = annotation("gloo:all_reduce", start, dur, tid=77)
        ev["args"] = {"Input Dims": [[64, 64]], "Input type": ["float"]}
        pg = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]
        write_trace(d, {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2,
                                                                "pg_config": pg},
                        "host_name": "vm", "traceEvents": [ev]}, f"rank{r}.pt.trace.json")
    res = analyze(d, tmp_path)
    row = res.calls.row(0, named=True)
    assert res.source == "cpu" and row["process_group"] == "0" and row["message_bytes"] == 4096 * 4
    assert (row["skew_ns"], row["latency_ns"], row["last_ranks"]) == (480 * US, 20 * US, "1")
    assert res.waits.filter(pl.col("rank") == 0)["wait_ns"].item() == 480 * US


def test_a_rank_that_lost_calls_is_matched_within_each_step(tmp_path: Path) -> None:
    # GIVEN two ranks of steps 1 and 2, two all-reduces a step (rank 1 arrives 10 µs after rank 0 in each), where
    # rank 0's trace lost step 1's second call (a sampled trace)
    d = tmp_path / "run"
    starts = {0: [100, 1100, 1200], 1: [100, 200, 1100, 1200]}
    for r, times in starts.items():
        events: list[dict[str, Any]] = [step(1, 0, 1000), step(2, 1000, 1000)]
        for t in times:
            ev = annotation("gloo:all_reduce", t + 10 * r, 50 - 10 * r)
            ev["args"] = {"Input Dims": [[64, 64]], "Input type": ["float"]}
            events.append(ev)
        write_trace(d, trace(*events, distributedInfo={"backend": "gloo", "rank": r, "world_size": 2},
                             host_name="vm"), f"rank{r}.pt.trace.json")
    res = analyze(d, tmp_path)
    # THEN step 2's calls pair with step 2's (by order they paired with step 1's second call, 900 µs apart)
    both = res.calls.filter(pl.col("ranks") == 2)
    assert both.height == 3 and both["skew_ns"].to_list() == [10 * US] * 3 and res.unmatched_calls == 1
    assert res.calls.filter(pl.col("ranks") == 1)["missing_ranks"].to_list() == ["0"]


# ------------------------------------------------------------------------ the real 8-rank NCCL set vs the oracle


@pytest.fixture
def dlrm(corpus: Path, tmp_path: Path) -> tuple[CollectivesResult, dict[str, Any]]:
    d = corpus / "traces" / "param" / "dlrm_kineto"
    files = sorted(d.glob("*.json"))
    ranks_files = {str(int(f.name[len("worker"):].split("_")[0])): [str(f)] for f in files}
    return analyze(d, tmp_path), reference_comm().analyze("dlrm", ranks_files)


def test_dlrm_counts_per_type_match_thereference_comm(dlrm: tuple[CollectivesResult, dict[str, Any]]) -> None:
    ours, ref = dlrm
    # the oracle types a kernel by its name: PyTorch runs all_to_all as grouped send/recv, so its SendRecv
    # kernels are our all_to_all (the nccl:all_to_all op that launched them says so)
    names = {"AllReduce": "all_reduce", "SendRecv": "all_to_all"}
    per_rank = ours.waits.group_by("rank", "collective").len()
    for rank_row in ref["per_rank"]:
        want = {names[k]: v for k, v in rank_row["collectives_by_type"].items()}
        got = dict(per_rank.filter(pl.col("rank") == rank_row["rank"]).select("collective", "len").iter_rows())
        assert got == want
    assert ours.call_count == ref["calls_total"] == 8 and ours.unmatched_calls == 0


def test_dlrm_per_call_latency_skew_and_straggler_match_thereference_comm(
        dlrm: tuple[CollectivesResult, dict[str, Any]]) -> None:
    ours, ref = dlrm
    ref_offsets_ns = {int(r): round(o * US) for r, o in ref["clock_alignment"]["offset_us"].items()}
    ours_offsets = dict(ours.ranks.select("rank", "clock_offset_ns").iter_rows())
    # the oracle aligns on one anchor call, we on the median over every call: the offsets differ by a few µs
    drift = max(abs(ours_offsets[r] - ref_offsets_ns[r]) for r in ref_offsets_ns)
    assert drift <= 2 * US
    for call in ref["calls_first_50"]:
        start0 = ns(call["start_us"]["0"])
        (ours_call,) = ours.waits.filter((pl.col("rank") == 0) & (pl.col("ts_ns") == start0))["call"]
        rows = ours.waits.filter(pl.col("call") == ours_call)
        row = ours.calls.filter(pl.col("call") == ours_call).row(0, named=True)
        # the same matching: the same kernel on every rank, so the same durations and latency, exactly
        assert {str(r): d / US for r, d in rows.select("rank", "dur_ns").iter_rows()} == call["dur_us"]
        assert row["latency_ns"] == ns(call["latency_us"])
        # skew: exactly the oracle's on the oracle's offsets; on ours, within the offsets' drift
        aligned = [ts + ref_offsets_ns[r] for r, ts in rows.select("rank", "ts_ns").iter_rows()]
        assert max(aligned) - min(aligned) == ns(call["arrival_skew_us"])
        assert abs(row["skew_ns"] - call["arrival_skew_us"] * US) <= 2 * drift
        assert row["last_ranks"] == ", ".join(map(str, call["last_arrival"]))
        assert row["group_size"] == call["group_size"] == 8
    assert [ours.straggler_rank] == ref["straggler_ranks"] == [7]
    assert ours.straggler_last_arrivals == ref["last_arrival_counts"]["7"] == 5


def test_dlrm_bytes_and_bandwidth(dlrm: tuple[CollectivesResult, dict[str, Any]]) -> None:
    ours, ref = dlrm
    # these 2023 traces carry no `In msg nelems`: the oracle reports no bytes; ours come from the launching
    # nccl:* op's recorded shape (Input Dims [[394241]], float for the first all_reduce)
    assert all(c["bytes"] is None for c in ref["calls_first_50"])
    first_ar = ours.calls.filter(pl.col("collective") == "all_reduce").sort("call").row(0, named=True)
    assert first_ar["message_bytes"] == 394241 * 4 and first_ar["dtype"] == "float32"
    assert first_ar["algbw_gbps"] == pytest.approx(394241 * 4 / first_ar["latency_ns"])
    # busbw factors: all_reduce 2(n-1)/n as the oracle's; all_to_all (n-1)/n where the oracle, typing the
    # kernel as SendRecv, uses 1
    ref_factor = {c["type"]: c["bus_factor"] for c in ref["calls_first_50"]}
    assert ref_factor == {"AllReduce": 1.75, "SendRecv": 1.0}
    for row in ours.calls.iter_rows(named=True):
        factor = 1.75 if row["collective"] == "all_reduce" else 7 / 8
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)


def test_missing_ranks_are_named_as_ranges(corpus: Path, tmp_path: Path) -> None:
    # two ranks' traces of a world of 128: the other 126 read as one range, not 126 numbers
    res = analyze(corpus / "traces" / "hta" / "trace_filter", tmp_path)
    assert "ranks 2..127 of world size 128 have no trace: results for the rest" in res.warnings
    assert numbers([0, 2, 3, 4, 9, 10]) == "0, 2..4, 9, 10" and numbers([7, 5, 6, 6]) == "5..7" and numbers([]) == ""


def test_bytes_and_bandwidth_where_the_trace_has_collective_args(corpus: Path, tmp_path: Path) -> None:
    # one rank of a 2-rank job, with `In msg nelems` / `dtype` / `Group size` on every NCCL kernel
    path = corpus / "traces" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
    ours = analyze(path, tmp_path)
    ref = reference_comm().analyze("nccl", {"0": [str(path)]})
    assert ours.call_count == ref["calls_total"] == 21 and ours.note and "one rank" in ours.note
    by_start = dict(ours.waits.select("ts_ns", "call").iter_rows())
    for call in ref["calls_first_50"]:
        row = ours.calls.filter(pl.col("call") == by_start[ns(call["start_us"]["0"])]).row(0, named=True)
        assert row["message_bytes"] == call["bytes_nccl_tests"]
        assert row["algbw_gbps"] == pytest.approx(call["algbw_GBps"], rel=1e-9)
        assert row["busbw_gbps"] == pytest.approx(call["busbw_GBps"], rel=1e-9)
        assert row["group_size"] == call["group_size"] == 2


def test_a_large_run_is_read_in_worker_processes_with_the_same_answer(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a synthetic 4-rank run (benchmarks/make_run.py: rank 2 late to every step's first all-reduce)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from make_run import write_run

    write_run(tmp_path / "run", 4, steps=2, ops=5, late=2)
    # WHEN it is read one rank after another, then by worker processes (from 2 traces on), cold and warm
    monkeypatch.setattr("stepscope.analyze._comm_run.PARALLEL_FROM", 10**9)
    serial = analyze(tmp_path / "run", tmp_path / "serial")
    monkeypatch.setattr("stepscope.analyze._comm_run.PARALLEL_FROM", 2)
    monkeypatch.setattr("stepscope.analyze._comm_run.usable_cores", lambda: 2)
    cold = analyze(tmp_path / "run", tmp_path / "parallel")
    warm = analyze(tmp_path / "run", tmp_path / "parallel")
    # THEN the same answer, exactly: the straggler, offsets and every table
    assert serial.straggler_rank == 2 and serial.max_skew_ns == 2_000_000
    for other in (cold, warm):
        assert (other.straggler_rank, other.straggler_wait_cost_ns, other.total_wait_ns) == (
            serial.straggler_rank, serial.straggler_wait_cost_ns, serial.total_wait_ns)
        for table in ("calls", "groups", "waits", "ranks"):
            assert getattr(other, table).equals(getattr(serial, table)), table


# ------------------------------------------------------------------- the group size n of busbw, and all_gather sizes

AG = "ncclKernel_AllGather_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _ar_run(directory: Path, ranks: tuple[int, ...], world: int, **args: Any) -> None:
    """An all-reduce of 1 Mi floats on each of `ranks` (of `world`): latency 50 µs (rank 0 arrives last), with
    the kernel args `args` besides its type, counts and dtype."""
    for r in ranks:
        rank_trace(directory, r, kernel(AR, 150 - 50 * (r > 0), 50 + 50 * (r > 0), **{
            "Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "Float",
            **args}), world=world)


@pytest.mark.parametrize(("args", "n"), [
    ({"Group size": 4}, 4),                                    # stated
    ({"Process Group Ranks": "[0, 1, 2, 3]"}, 4),              # listed: all four, though two have no trace
    ({"Group size": 4, "Process Group Ranks": "[0, 1]"}, 4),   # `Group size` first
])
def test_busbw_takes_the_group_size_the_call_states_not_the_ranks_with_a_trace(
        tmp_path: Path, args: dict[str, Any], n: int) -> None:
    # GIVEN ranks 0 and 1 of a world of 8 in an all-reduce whose group is stated
    _ar_run(tmp_path / "run", (0, 1), 8, **args)
    # WHEN analysed
    res = analyze(tmp_path / "run", tmp_path)
    (call,) = res.calls.iter_rows(named=True)
    # THEN n is the group's size, not the 2 ranks that have a trace; the missing ranks are those of the run only
    algbw = 4 * (1 << 20) / 50_000
    assert call["group_size"] == n and call["algbw_gbps"] == pytest.approx(algbw)
    assert call["busbw_gbps"] == pytest.approx(algbw * 2 * (n - 1) / n) and call["missing_ranks"] is None
    assert not any("busbw unknown" in w for w in res.warnings)


def test_busbw_without_group_information_needs_every_rank_of_the_world(tmp_path: Path) -> None:
    # GIVEN an all-reduce with no group size or ranks (PARAM-era args), on 2 of 4 ranks, then on all 4
    _ar_run(tmp_path / "two", (0, 1), 4)
    _ar_run(tmp_path / "all", (0, 1, 2, 3), 4)
    two, every = analyze(tmp_path / "two", tmp_path), analyze(tmp_path / "all", tmp_path)
    # THEN with ranks missing the group size is unknown: busbw is refused, and a warning says why, once
    (call,) = two.calls.iter_rows(named=True)
    assert call["algbw_gbps"] == pytest.approx(4 * (1 << 20) / 50_000)
    assert (call["group_size"], call["busbw_gbps"], call["missing_ranks"]) == (None, None, None)
    assert two.groups["busbw_gbps"].to_list() == [None]
    assert [w for w in two.warnings if "busbw unknown" in w] == [
        "busbw unknown for 1 call: group size unknown (no `Group size` or group ranks in the trace, and not every "
        "rank of the world took part)"]
    # AND with every rank of the world in the call, n is the world size, observed
    (call,) = every.calls.iter_rows(named=True)
    assert call["group_size"] == 4 and call["busbw_gbps"] == pytest.approx(call["algbw_gbps"] * 1.5)
    assert not any("busbw unknown" in w for w in every.warnings)


def _gather_rank(directory: Path, rank: int, world: int, *, c10d: bool, **top: Any) -> None:
    """An older torch's all-gather on `rank`: no counts in any args; the nccl:_all_gather_base annotation records
    this rank's input (1,024 floats); with `c10d`, the c10d::_allgather_base_ op around it records the output
    (4,096: a group of 4) and the input."""
    start = 100 + 10 * rank  # every rank ends at 200 µs: the latency is the last rank's duration
    events = [
        cpu_op("record_param_comms", start - 8, 30),
        {**annotation("nccl:_all_gather_base", start - 6, 20), "args": {"Input Dims": [[1024]],
                                                                         "Input type": ["float"]}},
        runtime("cudaLaunchKernel", start - 4, 3, correlation=9, external_id=9),
        kernel(AG, start, 200 - start, correlation=9),
    ]
    if c10d:
        shapes: dict[str, Any] = {"Input Dims": [[4096], [1024], []], "Input type": ["float", "float", ""]}
        events.insert(0, cpu_op("c10d::_allgather_base_", start - 10, 40, **shapes))
    rank_trace(directory, rank, *events, world=world, **top)


def test_an_all_gathers_size_is_its_c10d_ops_output_not_the_annotations_input(tmp_path: Path) -> None:
    # GIVEN ranks 0 and 1 of a world of 16, each all-gather inside its c10d::_allgather_base_ op
    for r in (0, 1):
        _gather_rank(tmp_path / "run", r, 16, c10d=True)
    res = analyze(tmp_path / "run", tmp_path)
    (call,) = res.calls.iter_rows(named=True)
    # THEN the size is the gathered output (nccl-tests' size) and n its ratio to the input, though the world is 16
    assert (call["collective"], call["message_bytes"], call["group_size"]) == ("all_gather", 4096 * 4, 4)
    assert call["latency_ns"] == 90 * US and call["busbw_gbps"] == pytest.approx(4096 * 4 / 90_000 * 3 / 4)


def test_an_all_gather_from_its_annotations_input_alone_has_no_size(tmp_path: Path) -> None:
    # GIVEN all-gathers whose only record of size is the annotation's input: no counts, no c10d op
    for r in (0, 1):
        _gather_rank(tmp_path / "two", r, 4, c10d=False)
    res = analyze(tmp_path / "two", tmp_path)
    (call,) = res.calls.iter_rows(named=True)
    # THEN its size is refused, not read as the input: no algbw, no busbw, and a warning says why
    assert call["collective"] == "all_gather" and call["ranks"] == 2
    assert (call["message_bytes"], call["algbw_gbps"], call["busbw_gbps"]) == (None, None, None)
    assert res.groups["total_message_bytes"].to_list() == [None]
    assert any("size and bandwidth unknown for 1 all_gather call" in w for w in res.warnings)
    # AND where the group size is known exactly (every rank of the world took part; or listed), out = in x n
    for r in range(4):
        _gather_rank(tmp_path / "all", r, 4, c10d=False)
    (call,) = analyze(tmp_path / "all", tmp_path).calls.iter_rows(named=True)
    assert (call["message_bytes"], call["group_size"]) == (1024 * 4 * 4, 4)
    path = tmp_path / "listed" / "rank0.pt.trace.json"
    _gather_rank(path.parent, 0, 8, c10d=False)
    doc = json.loads(path.read_text())
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_size": 2, "ranks": [0, 5]}]
    path.write_text(json.dumps(doc))
    (call,) = analyze(path, tmp_path).calls.iter_rows(named=True)
    assert (call["message_bytes"], call["group_size"]) == (1024 * 4 * 2, 2)


def test_gloo_all_gather_records_its_input_only(tmp_path: Path) -> None:
    # GIVEN gloo all-gathers (CPU annotations on a worker thread, no c10d op around them) of 64 floats per rank
    def run(directory: Path, pg: list[dict[str, Any]] | None) -> CollectivesResult:
        for r in (0, 1):
            ev = annotation("gloo:all_gather", 100 + 10 * r, 50 - 10 * r, tid=77)
            ev["args"] = {"Input Dims": [[64]], "Input type": ["float"]}
            info: dict[str, Any] = {"backend": "gloo", "rank": r, "world_size": 4}
            write_trace(directory, {"schemaVersion": 1, "distributedInfo": info | ({"pg_config": pg} if pg else {}),
                                    "host_name": "vm", "traceEvents": [ev]}, f"rank{r}.pt.trace.json")
        return analyze(directory, tmp_path)
    # THEN with the group listed in pg_config the size is in x n; without it (2 of 4 ranks) it is unknown
    (listed,) = run(tmp_path / "listed", [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]).calls.iter_rows(named=True)
    assert (listed["collective"], listed["message_bytes"], listed["group_size"]) == ("all_gather", 64 * 4 * 2, 2)
    (unknown,) = run(tmp_path / "unknown", None).calls.iter_rows(named=True)
    assert (unknown["message_bytes"], unknown["group_size"], unknown["busbw_gbps"]) == (None, None, None)


def test_dlrm_busbw_over_some_ranks_is_unknown_and_over_all_is_exact(corpus: Path, tmp_path: Path) -> None:
    # GIVEN the 8-rank dlrm run, whose calls name no group (world size 8 in distributedInfo)
    d = corpus / "traces" / "param" / "dlrm_kineto"
    every = analyze(d, tmp_path)
    some = analyze([next(d.glob("worker0_*")), next(d.glob("worker7_*"))], tmp_path)
    # THEN over all 8 ranks n = 8 for every call: busbw = bytes / latency x 2(n-1)/n for the 1.5 MiB all-reduce
    big = every.calls.filter(pl.col("collective") == "all_reduce").sort("message_bytes").row(-1, named=True)
    assert 1 << 20 < big["message_bytes"] < 2 << 20
    assert big["group_size"] == 8
    assert big["busbw_gbps"] == pytest.approx(big["message_bytes"] / big["latency_ns"] * 2 * 7 / 8)
    # AND over 2 of them n is unknown: no busbw anywhere (it read 2 before: 18.34 GB/s, not 32.09), said once
    assert some.calls["group_size"].null_count() == some.calls.height == 8
    assert some.calls["busbw_gbps"].null_count() == 8 and some.groups["busbw_gbps"].null_count() == some.groups.height
    assert some.calls["algbw_gbps"].null_count() == 0
    assert sum("busbw unknown for 8 calls" in w for w in some.warnings) == 1


def test_trace_filter_all_gather_is_its_gathered_output(corpus: Path, tmp_path: Path) -> None:
    # GIVEN 2 sampled ranks of a world of 128: c10d::_allgather_base_ [[1073741824], [16777216], []] int8 around
    # nccl:_all_gather_base [[16777216]]
    res = analyze(corpus / "traces" / "hta" / "trace_filter", tmp_path)
    gathers = res.calls.filter(pl.col("collective") == "all_gather")
    # THEN the size is the 1 GiB output, n its ratio 64, busbw (n-1)/n of algbw; the other calls' n is unknown
    assert gathers.height == 2 and gathers["message_bytes"].to_list() == [1073741824] * 2
    assert gathers["group_size"].to_list() == [64, 64]
    for row in gathers.iter_rows(named=True):
        assert row["busbw_gbps"] == pytest.approx(1073741824 / row["latency_ns"] * 63 / 64)
    assert res.calls.filter(pl.col("collective") != "all_gather")["busbw_gbps"].null_count() == res.calls.height - 2


def test_a_single_rank_of_a_sharded_run_reads_its_groups_from_the_c10d_ops(corpus: Path, tmp_path: Path) -> None:
    # GIVEN rank 0 of 16 alone: c10d::_allgather_base_ [[65536, 64], [8192, 64], []] float (a group of 8) and
    # c10d::_reduce_scatter_base_ [[8192, 384], [65536, 384], ...]
    res = analyze(corpus / "traces" / "hta" / "negative_queue_length_values_check", tmp_path)
    sharded = res.calls.filter(pl.col("collective").is_in(["all_gather", "reduce_scatter"]))
    # THEN each is its whole tensor (the output gathered, the input scattered) in a group of 8, not 16 or 1
    assert sorted(set(sharded["message_bytes"].to_list())) == [65536 * 64 * 4, 65536 * 384 * 4]
    assert set(sharded["group_size"].to_list()) == {8}
    # AND the all-reduces' n is unknown (1 trace of 16, no group in the trace): busbw null, not 0
    assert res.calls.filter(pl.col("collective") == "all_reduce")["busbw_gbps"].to_list() == [None] * 10


def test_calls_matched_by_order_keep_their_dtype(tmp_path: Path) -> None:
    # GIVEN two ranks without sequence numbers; rank 1's trace lacks the small int64 all_to_all rank 0 ran first
    # (sampled or cut traces): all_to_all sizes differ between ranks, so only the order and the dtype pair them
    a2a = "ncclDevKernel_SendRecv"
    small = comm_kernel(a2a, 100, 10, nelems=384, coll="all_to_all", dtype="Long", ranks="[0, 1]")
    big = [comm_kernel(a2a, 200 + r, 50, nelems=1 << 20 + r, coll="all_to_all", dtype="Float", ranks="[0, 1]")
           for r in range(2)]
    rank_trace(tmp_path / "run", 0, small, big[0], world=2)
    rank_trace(tmp_path / "run", 1, big[1], world=2)
    res = analyze(tmp_path / "run", tmp_path)
    # THEN the float calls pair, and the int64 call is rank 0's alone (once paired with rank 1's float call)
    assert sorted(res.calls.select("dtype", "ranks").rows()) == [("float32", 2), ("int64", 1)]
    assert res.unmatched_calls == 1


def test_a_loose_alignment_is_a_warning(corpus: Path, tmp_path: Path) -> None:
    # GIVEN two sampled ranks of 128 whose matched calls cannot be made to end together (residuals of 308 ms)
    res = analyze(corpus / "traces" / "hta" / "trace_filter", tmp_path)
    assert res.max_clock_residual_ns is not None and res.max_clock_residual_ns > 100_000_000
    # THEN the run says the pairing or the clocks are off; dlrm's 8 ranks end together to 4 µs and say nothing
    assert any("do not end together after clock alignment" in w for w in res.warnings)
    dlrm = analyze(corpus / "traces" / "param" / "dlrm_kineto", tmp_path)
    assert not any("end together" in w for w in dlrm.warnings)


@pytest.mark.parametrize(("one_clock", "cpu", "causes"), [
    (False, False, "calls paired wrongly (traces missing calls, sampled or cut) or drifting clocks"),
    (True, False, "calls paired wrongly (traces missing calls, sampled or cut)"),
    (True, True, "calls paired wrongly (traces missing calls, sampled or cut) or CPU collectives whose ranks return "
                 "at different times (gloo's ring on a busy host)"),
])
def test_a_loose_alignment_names_only_the_causes_the_run_allows(one_clock: bool, cpu: bool, causes: str) -> None:
    # GIVEN calls ending 6 ms apart after alignment: ranks on one clock cannot drift; gloo's ranks leave a ring
    # one after another
    waits = pl.DataFrame({"residual_ns": [6_000_000, -6_000_000]})
    calls = pl.DataFrame({"ranks": [2], "latency_ns": [2_000_000]})
    (warning,) = _loose_alignment(waits, calls, one_clock=one_clock, cpu=cpu)
    assert f"(residual up to 6.0 ms, above their median latency 2.0 ms): {causes}; read" in warning
