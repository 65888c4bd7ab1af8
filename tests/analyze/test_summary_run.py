"""The verdict of a run of several ranks (`run_summary`): straggler when one rank's late arrivals cost the others
a large share of their step, with its cause as where to look; else the verdict most ranks share. Synthetic runs
with exact answers, and the real 8-rank dlrm set against its waits recomputed here."""

from __future__ import annotations

import json
import statistics
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from test_ranks import write_run

from stepscope.analyze.run_summary import STRAGGLER_MIN, run_analysis, run_summary
from stepscope.analyze.summary import Verdict

US = 1000


def test_a_late_host_is_the_straggler_with_its_line(tmp_path: Path) -> None:
    # GIVEN three 1000 µs steps; rank 2 reaches the all_reduce 80 µs late after train.py's slow_host
    res = run_summary(write_run(tmp_path / "run", {"host_delay": 80}), cache_dir=tmp_path / "cache")
    # THEN each of the two others waits 80 µs of its 1000: 8% < 10%, not a straggler run
    assert res.straggler == 2 and res.straggler_wait_fraction == pytest.approx(80 / 1000)
    assert res.verdict is not Verdict.STRAGGLER
    # WHEN rank 2 is 150 µs late
    late = run_summary(write_run(tmp_path / "run2", {"host_delay": 150}), cache_dir=tmp_path / "cache")
    # THEN 15% of the others' step: straggler, where to look its Python line and op, then its cost
    assert late.verdict is Verdict.STRAGGLER and late.straggler_wait_fraction == pytest.approx(150 / 1000)
    assert (late.straggler_wait_fraction or 0) >= STRAGGLER_MIN and "Rank 2" in late.advice
    assert late.places.rows() == [("late: host busy at (Python)", "train.py(5): slow_host", 150 * US, 1),
                                  ("late: host busy at (op)", "aten::copy_", 150 * US, 1),
                                  ("its late arrivals cost the others", "rank 2", 300 * US, 1)]
    assert late.rules.filter("matched")["verdict"].to_list() == ["straggler"]


def test_late_by_compute_says_so(tmp_path: Path) -> None:
    res = run_summary(write_run(tmp_path / "run", {"extra_compute": 200}), cache_dir=tmp_path / "cache")
    assert res.verdict is Verdict.STRAGGLER and res.straggler == 2
    assert "computes more" in res.advice
    # its compute before its arrival at 600 µs: [100, 500) and the relu [550, 600), 450 µs; the others' 200 µs
    assert res.places.row(0) == ("late: more compute before the call", "rank 2", 250 * US, 1)


def test_without_a_costly_straggler_the_ranks_verdicts_decide(tmp_path: Path) -> None:
    # GIVEN ranks on time (rank 2 1 µs late): each exposes 250 µs of its all_reduce in a 1000 µs step
    res = run_summary(write_run(tmp_path / "run", {"host_delay": 1}), cache_dir=tmp_path / "cache")
    # THEN the verdict every rank has: communication_bound, with its places, named by rank
    assert res.per_rank["verdict"].to_list() == ["communication_bound"] * 3
    assert res.verdict is Verdict.COMMUNICATION_BOUND and res.rank_verdicts == {"communication_bound": 3}
    assert res.places["what"].str.starts_with("rank ").all()
    assert res.rules.filter("matched")["verdict"].to_list() == ["communication_bound"]


def test_dlrm_run_names_rank_7_and_its_cost(corpus: Path, tmp_path: Path) -> None:
    a = run_analysis(corpus / "traces" / "param" / "dlrm_kineto", cache_dir=tmp_path)
    s = a.summary
    assert s.verdict is Verdict.STRAGGLER and s.straggler == 7 and s.rank_count == 8
    # the others' wait in the calls rank 7 arrived last in, per other rank, over their mean step: from the waits
    waits = a.collectives.waits
    last7 = waits.filter(pl.col("last") & (pl.col("rank") == 7))["call"]
    cost = int(waits.filter(pl.col("call").is_in(last7.implode()) & (pl.col("rank") != 7))["wait_ns"].sum())
    walls = a.ranks.steps.filter(pl.col("rank") != 7)["wall_ns"].mean()
    assert isinstance(walls, float)
    assert s.straggler_wait_fraction == pytest.approx(cost / 7 / walls)
    # rank 7 entered its step late: its ProfilerStep's start on the aligned clock less the others' median, from the
    # raw files (4.52 ms of its 4.67 ms lateness), not a host busy inside the step (once "aten::lift_fresh", an op
    # of 0-1 µs that happened to run at the point looked up)
    offsets = dict(a.collectives.ranks.select("rank", "clock_offset_ns").iter_rows())
    starts = {}
    for f in sorted((corpus / "traces" / "param" / "dlrm_kineto").glob("*.json")):
        doc = json.loads(f.read_text(), parse_float=Decimal)  # µs since the epoch: a float would lose the ns
        rank = doc["distributedInfo"]["rank"]
        step = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
        starts[rank] = int(Decimal(step["ts"]) * 1000) + offsets[rank]
    late_start = starts[7] - statistics.median(v for r, v in starts.items() if r != 7)
    row = a.ranks.stragglers.filter(pl.col("straggler") == 7).row(0, named=True)
    assert row["cause"] == "late_start" and row["late_start_ns"] == pytest.approx(late_start, abs=1)
    assert 4.5e6 < late_start < 4.6e6 < row["lateness_ns"] < 4.7e6
    assert s.places.row(0) == ("late: began the step late", "rank 7", row["late_start_ns"], 1)
    assert s.straggler_host_op is None and "(the op and Python line below)" not in s.advice
    assert "begins its steps later than the others" in s.advice
    assert s.rank_verdicts == {"communication_bound": 7, "launch_bound": 1}
    assert s.per_rank.filter(pl.col("rank") == 7)["verdict"].item() == "launch_bound"
