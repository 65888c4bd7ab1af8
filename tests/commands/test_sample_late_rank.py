"""The bundled 2-rank sample (sample_traces/late_rank: torchrun, gloo, rank 1 sleeps 30 ms before each step's
all-reduces): `comm` and `ranks` name rank 1 and measure the wait it costs rank 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import cli

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "late_rank"
SLEEP_NS = 30_000_000
WEIGHT_BYTES = 256 * 256 * 4  # the first Linear's weight gradient: the all-reduce rank 1 reaches late


def _json(*args: str) -> dict:  # type: ignore[type-arg]
    if not SAMPLE.is_dir():
        pytest.skip("sample_traces/late_rank is not present")
    out = CliRunner().invoke(cli, [*args, str(SAMPLE), "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.output)  # type: ignore[no-any-return]


def test_comm_names_the_late_rank_and_the_wait_it_costs() -> None:
    data = _json("comm")
    assert (data["rank_count"], data["source"], data["unmatched_calls"], data["straggler_rank"]) == (2, "cpu", 0, 1)
    # each of the 3 recorded steps: the weight gradient's all-reduce, rank 1 last by about its 30 ms sleep
    late = [c for c in data["calls"] if c["message_bytes"] == WEIGHT_BYTES]
    assert len(late) == 3 and all(c["last_ranks"] == "1" for c in late)
    for c in late:
        wait0 = next(w["wait_ns"] for w in data["waits"] if w["call"] == c["call"] and w["rank"] == 0)
        assert wait0 >= 0.8 * SLEEP_NS and c["skew_ns"] >= 0.8 * SLEEP_NS
    assert data["straggler_wait_cost_ns"] >= 3 * 0.8 * SLEEP_NS


def test_ranks_blames_rank_1s_host() -> None:
    data = _json("ranks")
    assert (data["rank_count"], data["step_count"], data["straggler"]) == (2, 3, 1)
    assert data["straggler_cause"] == "host_delay"  # it sleeps on the host: no more compute, no data loading
    # the wait rank 0 spends in collectives per step is its share of rank 1's lateness
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert ranks[0]["wait_ns"] > 10 * ranks[1]["wait_ns"]
    # each step's straggler is the rank whose late arrivals cost the other most wait: rank 1 in every step (once
    # rank 0 in step 3, last by clock noise in three calls that cost nothing), so their costs add up to the run's
    assert [(s["step"], s["straggler"]) for s in data["stragglers"]] == [(2, 1), (3, 1), (4, 1)]
    assert sum(s["wait_cost_ns"] for s in data["stragglers"]) == data["straggler_wait_cost_ns"]
    # and none began its step late by more than a few ms: the 30 ms sleep is inside the step, on the host
    assert all(s["cause"] == "host_delay" and s["late_start_ns"] < 0.2 * SLEEP_NS for s in data["stragglers"])


def test_the_run_report_has_the_run_s_critical_path(tmp_path: Path) -> None:
    # GIVEN the 2-rank sample WHEN its report is written THEN the run's page has the critical path across ranks,
    # as `critical-path` computes it: bound by the CPU, most of it on rank 1, and where rank 0 waits for rank 1
    if not SAMPLE.is_dir():
        pytest.skip("sample_traces/late_rank is not present")
    path = _json("critical-path")
    out = CliRunner().invoke(cli, ["report", str(SAMPLE), "-o", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert page.index('id="run-verdict"') < page.index('id="run-path"')
    section = page[page.index('id="run-path"'):page.index("</section>", page.index('id="run-path"'))]
    assert f"<dt>bound by</dt><dd>{path['bound_by']}</dd>" in section
    top = max(path["rank_path_share"], key=path["rank_path_share"].get)
    assert top == "1" and f"<dd>rank 1 {100 * path['rank_path_share']['1']:.1f}%" in section
    assert "wait for rank 1 (all_reduce)" in section


def test_a_run_over_the_rank_limit_has_no_path_but_a_line_saying_why() -> None:
    from types import SimpleNamespace

    from stepscope.commands.report import RUN_PATH_MAX_EVENTS, RUN_PATH_MAX_RANKS, _run_path

    def run(ranks: int, events: int) -> SimpleNamespace:
        trace = SimpleNamespace(meta=SimpleNamespace(counts=SimpleNamespace(events=events)))
        return SimpleNamespace(calls=SimpleNamespace(ranks=(SimpleNamespace(traces=(trace,)),) * ranks))

    sections, problems = _run_path(run(RUN_PATH_MAX_RANKS + 1, 10), "run/")  # type: ignore[arg-type]
    assert sections == [] and problems == [
        f"run critical path left out: {RUN_PATH_MAX_RANKS + 1} ranks, over {RUN_PATH_MAX_RANKS} (its graph holds "
        "every rank at once); `stepscope critical-path run/` computes it"]
    sections, problems = _run_path(run(2, RUN_PATH_MAX_EVENTS // 2 + 1), "run/")  # type: ignore[arg-type]
    assert sections == [] and problems == [
        f"run critical path left out: {RUN_PATH_MAX_EVENTS + 2:,} events, over {RUN_PATH_MAX_EVENTS:,} (its graph "
        "holds every rank at once); `stepscope critical-path run/` computes it"]
