"""`stepscope summary RUN` and `stepscope report RUN` on runs of several ranks: a synthetic run with CliRunner, the
real dlrm set, and a real 2-rank gloo run captured under torchrun with one rank sleeping before its all_reduce."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_comm_cli import capture_gloo_run
from test_ranks_cli import LATE

from stepscope.cli import cli


def _late_run(directory: Path) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))
    from test_ranks import write_run  # the 3-rank run of tests/analyze/test_ranks.py

    return write_run(directory, {"host_delay": 150})


def test_summary_of_a_directory_is_the_runs_verdict(tmp_path: Path) -> None:
    run = _late_run(tmp_path / "run")
    out = CliRunner().invoke(cli, ["summary", str(run)])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("verdict: straggler  (one rank's late arrivals cost")
    # two others wait 150 µs each in a 1000 µs step
    assert ("straggler: rank 2 (the others wait 300 µs per step in all, 15.0% of each one's step); "
            "cause: host_delay") in out.output
    assert "train.py(5): slow_host" in out.output and "per rank" in out.output
    data = json.loads(CliRunner().invoke(cli, ["summary", str(run), "--json"]).output)
    assert data["verdict"] == "straggler" and data["straggler"] == 2 and len(data["per_rank"]) == 3
    one = CliRunner().invoke(cli, ["summary", str(run / "rank0.pt.trace.json")])
    assert one.exit_code == 0 and one.output.startswith("verdict: communication_bound")
    assert "a straggler cannot be seen from one rank" in one.output.replace("A straggler", "a straggler")


def test_report_of_a_run_has_the_multi_rank_section(tmp_path: Path) -> None:
    run = _late_run(tmp_path / "run")
    out = CliRunner().invoke(cli, ["report", str(run), "--batch", "-o", str(tmp_path / "out")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "out" / "index.html").read_text()
    section = page[page.index('<section id="run-verdict">'):]
    section = section[:section.index("</section>")]
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", section)
    assert [c.split(":")[0].split(" (")[0] for c in captions] == [
        "Each rank&#39;s mean step", "Rank x collective", "Collective bus bandwidth vs message size"]
    assert "Straggler: rank 2, late at the collectives: the others wait" in section
    links = re.findall(r'<a href="([^"#]+)">rank (\d)', section)
    assert sorted(r for _, r in links) == ["0", "1", "2"]
    for href, _ in links:  # each rank's own page exists and links back
        assert "back to the index" in (tmp_path / "out" / href).read_text()


def test_dlrm_summary_of_the_run(corpus: Path) -> None:
    out = CliRunner().invoke(cli, ["summary", str(corpus / "traces" / "param" / "dlrm_kineto")])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("verdict: straggler") and "rank verdicts: communication_bound ×7, launch_bound ×1" \
        in out.output
    assert "late: began the step late" in out.output and "aten::lift_fresh" not in out.output


def test_a_dataset_of_several_jobs_keeps_the_run_s_own_traces(corpus: Path, tmp_path: Path) -> None:
    # GIVEN a dataset of the dlrm run (8 ranks, distributedInfo) and a single-GPU capture whose file name says
    # worker0 (no distributedInfo) THEN the run is dlrm's alone, as its own directory gives it, and the other trace
    # is named as left out: it was pooled into rank 0 as a window of that rank (rank 0 data-loading bound)
    dlrm = corpus / "traces" / "param" / "dlrm_kineto"
    single = next((corpus / "traces" / "kineto" / "resnet50_num_workers_0").glob("worker0*.json.gz"))
    dataset = tmp_path / "ds"
    ingested = CliRunner().invoke(cli, ["ingest", str(dlrm), str(single), "-o", str(dataset)])
    assert ingested.exit_code == 0, ingested.output
    mixed = CliRunner().invoke(cli, ["summary", str(dataset)])
    alone = CliRunner().invoke(cli, ["summary", str(dlrm)])
    assert mixed.exit_code == 0 and alone.exit_code == 0, mixed.output + alone.output
    assert f"left out 1 trace that states no world size (no distributedInfo) beside traces of world size 8: " \
           f"{single.name}" in mixed.output
    assert [line for line in mixed.output.splitlines() if not line.startswith("warning")] == \
           [line for line in alone.output.splitlines() if not line.startswith("warning")]


def test_real_gloo_run_with_a_sleeping_rank_is_a_straggler_run(tmp_path: Path) -> None:
    run = capture_gloo_run(tmp_path, LATE, stack=True)
    out = CliRunner().invoke(cli, ["summary", str(run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    # rank 1 sleeps 50 ms before every step's all_reduce; rank 0 waits for it most of its step
    assert data["verdict"] == "straggler" and data["straggler"] == 1 and data["straggler_cause"] == "host_delay"
    assert data["straggler_wait_fraction"] >= 0.5
    line = LATE.splitlines().index("def slow_host():") + 1
    assert data["places"][0] == {"what": "late: host busy at (Python)", "name": f"late.py({line}): slow_host",
                                 "total_ns": data["places"][0]["total_ns"], "count": 2}
    assert "1" in data["advice"] and "Rank 1" in data["advice"]
    by_rank = {r["rank"]: r for r in data["per_rank"]}
    assert by_rank[0]["verdict"] == "communication_bound" and by_rank[0]["exposed_comm_fraction"] >= 0.5
    report = CliRunner().invoke(cli, ["report", str(run), "-o", str(tmp_path / "out")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "out" / "index.html").read_text()
    assert "Straggler: rank 1, late at the collectives" in page
    # the run section's table and the index mark the late rank (the index once marked the slowest median step)
    assert re.findall(r">(rank \d)[^<]*\(straggler\)</a>", page) == ["rank 1", "rank 1"]


def test_a_directory_of_traces_naming_no_rank_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builders import kernel, step, trace, write_trace
    from test_comm_cli import _main

    for name in ("a.pt.trace.json", "b.pt.trace.json"):
        write_trace(tmp_path / "many", trace(step(1, 0, 100), kernel("sgemm", 1, 90)), name)
    code, err = _main(["summary", str(tmp_path / "many")], capsys)
    assert code == 2 and len(err) == 1 and "none names its rank" in err[0] and str(tmp_path / "many") in err[0]
