"""`stepscope counters`: the CUPTI range profiler's counters per kernel, paired with their launch calls in order,
against HTA's published figures for its cupti_profiler trace and a slow, obvious recomputation from the JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import MAIN_TID, PID, cpu_op, kernel, load_events, python_fn, runtime, trace, write_trace
from click.testing import CliRunner

from stepscope.analyze import load
from stepscope.analyze.counters import FLOP_COUNTERS, counter_ranges
from stepscope.analyze.summary import Verdict, verdict
from stepscope.cli import cli

CUPTI = "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"
SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"


def counter_range(name: str, ts: float, **counters: Any) -> dict[str, Any]:
    """What the range profiler writes per kernel: pid/tid 0, the range's time, the counters as args."""
    return {"ph": "X", "cat": "cuda_profiler_range", "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": 121,
            "args": counters}


def sass(**by_op: int) -> dict[str, int]:
    """SASS instruction counters by their short name: sass(ffma=3) -> {smsp__…_ffma_pred_on.sum: 3}."""
    return {SASS.format(op): n for op, n in by_op.items()}


def test_htas_published_figures_for_its_cupti_profiler_trace(corpus: Path) -> None:
    # HTA's tests/test_cupti_profiler.py: 77 kernels measured; the 6th to run is fft2d_r2c_32x32 with fadd
    # 86,114,304, launched under aten::conv2d (top-level op) and aten::cudnn_convolution (bottom-level op)
    r = counter_ranges(load(corpus / "traces" / CUPTI))
    assert (r.ranges_found, r.launches_found, r.matched, r.note) == (77, 77, True, "")
    assert set(r.counters) == {counter for pairs in FLOP_COUNTERS.values() for counter, _ in pairs}
    sixth = r.ranges.row(5, named=True)
    assert sixth["range"] == 6 and "fft2d_r2c_32x32" in sixth["name"]
    assert sixth[SASS.format("fadd")] == 86_114_304
    assert (sixth["top_op"], sixth["op"]) == ("aten::conv2d", "aten::cudnn_convolution")


def test_every_range_matches_a_slow_recomputation_from_the_json(corpus: Path) -> None:
    # GIVEN the trace read with json: ranges and cudaLaunchKernel calls in time order, each launch's enclosing
    # cpu_ops found by scanning every op of its thread
    doc = json.loads(gzip.open(corpus / "traces" / CUPTI).read())
    events = doc["traceEvents"]
    ranges = sorted((e for e in events if e.get("cat") == "cuda_profiler_range"), key=lambda e: e["ts"])
    launches = sorted((e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaLaunchKernel"),
                      key=lambda e: e["ts"])
    ops = [e for e in events if e.get("cat") == "cpu_op"]

    def enclosing(launch: dict[str, Any]) -> list[dict[str, Any]]:
        around = [o for o in ops if o["tid"] == launch["tid"] and o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]]
        return sorted(around, key=lambda o: (o["ts"], -o["dur"]))  # outermost first

    expected = []
    for rng, launch in zip(ranges, launches, strict=True):
        stack = enclosing(launch)
        flops = sum(w * rng["args"][c] for pairs in FLOP_COUNTERS.values() for c, w in pairs)
        name = "(no kernel name recorded)" if rng["name"] == "__missing__" else rng["name"]  # CUPTI's placeholder
        expected.append((name, stack[-1]["name"] if stack else None, stack[0]["name"] if stack else None,
                         flops, rng["args"][SASS.format("ffma")]))
    # THEN each row is the same, and the total FLOPs are their sum
    r = counter_ranges(load(corpus / "traces" / CUPTI))
    got = r.ranges.select("name", "op", "top_op", "flops", SASS.format("ffma")).rows()
    assert got == expected
    assert r.flops == sum(row[3] for row in expected)
    assert r.by_kernel["ranges"].sum() == 77 and r.by_op["flops"].sum() == r.flops
    assert "(no kernel name recorded)" in r.by_kernel["name"].to_list()  # the range CUPTI could not name


def test_flops_per_precision_op_pairing_and_totals(tmp_path: Path) -> None:
    # GIVEN two launches under aten::linear > aten::addmm and aten::add_, and their ranges: an fp32 GEMM (ffma
    # counts twice), an fp16 add with a rate metric besides; a third range lacks fp64's counters
    full = sass(dadd=0, dmul=0, dfma=0, hadd=0, hmul=0, hfma=0)
    doc = trace(
        python_fn("train.py(7): step", ts=0, dur=100),
        cpu_op("aten::linear", ts=1, dur=30), cpu_op("aten::addmm", ts=2, dur=20),
        runtime("cudaLaunchKernel", ts=5, dur=4),
        cpu_op("aten::add_", ts=40, dur=10), runtime("cudaLaunchKernel", ts=42, dur=3),
        cpu_op("aten::mul", ts=60, dur=10), runtime("cudaLaunchKernel", ts=61, dur=3),
        counter_range("sgemm", 200, **{**full, **sass(fadd=10, fmul=20, ffma=100)}),
        counter_range("add_kernel", 400, **{**full, **sass(fadd=0, fmul=0, ffma=0, hadd=8)},
                      **{"sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.5}),
        counter_range("mul_kernel", 600, **sass(fadd=1, fmul=2, ffma=3)),
    )
    r = counter_ranges(load_events(tmp_path, doc))
    rows = r.ranges.select("range", "name", "op", "top_op", "python", "fp32_flops", "fp16_flops", "fp64_flops",
                           "flops").rows()
    # THEN fp32 = fadd + fmul + 2 ffma = 230; fp16 = 8; without fp64's counters, fp64 and the total are unknown
    assert rows == [(1, "sgemm", "aten::addmm", "aten::linear", "train.py(7): step", 230, 0, 0, 230),
                    (2, "add_kernel", "aten::add_", "aten::add_", "train.py(7): step", 0, 8, 0, 8),
                    (3, "mul_kernel", "aten::mul", "aten::mul", "train.py(7): step", 1 + 2 + 6, None, None, None)]
    assert r.flops is None  # one range's total is unknown: never the sum of the others
    # AND totals add additive counters only: the rate is per range, not summed
    assert "sm__throughput.avg.pct_of_peak_sustained_elapsed" in r.ranges.columns
    assert "sm__throughput.avg.pct_of_peak_sustained_elapsed" not in r.by_kernel.columns
    by_op = {row["op"]: row for row in r.by_op.iter_rows(named=True)}
    assert by_op["aten::addmm"]["flops"] == 230 and by_op["aten::addmm"][SASS.format("ffma")] == 100
    assert by_op["aten::mul"]["flops"] is None and by_op["aten::mul"][SASS.format("dadd")] is None


def test_counts_that_differ_name_no_op_rather_than_pair_wrongly(tmp_path: Path) -> None:
    # GIVEN three ranges but two launch calls, and a driver call inside a runtime launch (counted once)
    doc = trace(cpu_op("aten::mm", ts=0, dur=50), runtime("cudaLaunchKernel", ts=2, dur=6),
                {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": PID, "tid": MAIN_TID, "ts": 3,
                 "dur": 2},
                runtime("cudaLaunchKernel", ts=20, dur=5),
                *(counter_range(f"k{i}", 100 * i, **sass(ffma=1)) for i in (1, 2, 3)))
    r = counter_ranges(load_events(tmp_path, doc))
    assert (r.ranges_found, r.launches_found, r.matched) == (3, 2, False)
    assert r.ranges["op"].null_count() == 3 and r.by_op.height == 0
    assert "3 counter ranges but 2 kernel launch calls" in r.note
    assert r.by_kernel.height == 3  # the counters themselves are still there


def test_a_trace_without_ranges_says_so_and_the_verdict_names_the_counters(tmp_path: Path) -> None:
    plain = counter_ranges(load_events(tmp_path / "plain", trace(kernel("k", ts=0, dur=5))))
    assert plain.ranges_found == 0 and plain.flops is None and "not recorded by the CUPTI range profiler" in plain.note
    # a counter-range trace: no_gpu, but by the rule that says why and points at `stepscope counters`
    ranged = load_events(tmp_path / "ranged", trace(cpu_op("aten::mm", ts=0, dur=9),
                                                     runtime("cudaLaunchKernel", ts=1, dur=3),
                                                     counter_range("k", 50, **sass(ffma=1))))
    result = verdict(ranged)
    assert result.verdict is Verdict.NO_GPU and "CUPTI range profiler" in result.reason
    assert "stepscope counters" in result.advice


def test_cli_table_json_csv(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=9), runtime("cudaLaunchKernel", ts=1, dur=3),
                                       counter_range("gemm", 50, **sass(fadd=1, fmul=1, ffma=4)),
                                       counter_range("gemm", 90, **sass(fadd=0, fmul=0, ffma=1))), "c.pt.trace.json")
    runner = CliRunner()
    table = runner.invoke(cli, ["counters", str(path)])
    assert table.exit_code == 0, table.output
    # the metric names shown by the part that differs, with the pattern that gives them back
    assert "smsp__sass_thread_inst_executed_op_*_pred_on.sum: fadd, fmul, ffma" in table.output
    assert "2 counter ranges but 1 kernel launch calls" in table.output
    data = json.loads(runner.invoke(cli, ["counters", str(path), "--json"]).output)
    # fp32's three counters alone: its FLOPs (1 + 1 + 2x4, then 2x1), the total unknown without fp64's and fp16's
    assert data["ranges_found"] == 2 and data["by_kernel"][0]["fp32_flops"] == 10 + 2
    assert data["by_kernel"][0]["flops"] is None
    assert data["ranges"][0][SASS.format("ffma")] == 4  # whole names in JSON
    csv = runner.invoke(cli, ["counters", str(path), "--csv", "--table", "by_kernel"]).output
    assert csv.splitlines()[0].startswith("name,ranges,flops,fp64_flops,fp32_flops,fp16_flops,")
    assert csv.splitlines()[1].startswith("gemm,2,,,12,,")
    empty = runner.invoke(cli, ["counters", str(write_trace(tmp_path, trace(kernel("k", ts=0, dur=5)), "k.json"))])
    assert empty.exit_code == 0 and "no cuda_profiler_range events" in empty.output


def test_the_report_has_a_counters_section_only_where_the_trace_has_ranges(corpus: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "rep"
    assert runner.invoke(cli, ["report", str(corpus / "traces" / CUPTI), "-o", str(out)]).exit_code == 0
    page = (out / "index.html").read_text()
    assert 'id="counters"' in page and "aten::cudnn_convolution" in page
    assert "stepscope counters" in page
    plain = tmp_path / "plain"
    doc = trace(kernel("k", ts=0, dur=5), runtime("cudaLaunchKernel", ts=0, dur=1))
    assert runner.invoke(cli, ["report", str(write_trace(tmp_path, doc, "p.json")), "-o", str(plain)]).exit_code == 0
    assert 'id="counters"' not in (plain / "index.html").read_text()


@pytest.mark.parametrize("name", ["cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                                  "hipLaunchKernel", "hipExtModuleLaunchKernel", "cudaLaunchCooperativeKernel"])
def test_kernel_launch_calls_are_recognized(name: str, tmp_path: Path) -> None:
    doc = trace(cpu_op("aten::mm", ts=0, dur=9), runtime(name, ts=1, dur=3), counter_range("k", 50, **sass(ffma=1)))
    assert counter_ranges(load_events(tmp_path, doc)).matched


def test_counters_past_int64_stay_exact_and_an_unreadable_number_is_unknown(tmp_path: Path) -> None:
    # GIVEN one range whose ffma count is 2**70 (past int64) and one whose args hold 1e400 (past any float)
    huge = {**sass(dadd=0, dmul=0, dfma=0, hadd=0, hmul=0, hfma=0, fadd=0, fmul=0), SASS.format("ffma"): 2**70}
    doc = trace(cpu_op("aten::mm", ts=0, dur=9), runtime("cudaLaunchKernel", ts=1, dur=3),
                cpu_op("aten::mm", ts=20, dur=9), runtime("cudaLaunchKernel", ts=21, dur=3),
                counter_range("big", 50, **huge), counter_range("odd", 90, **sass(ffma=123456789)))
    path = write_trace(tmp_path, doc, "c.pt.trace.json")
    path.write_text(path.read_text().replace("123456789", "1e400"))
    r = counter_ranges(load(path))
    # THEN the big one's FLOPs are exact (2 x 2**70), not wrapped; the other's counters and FLOPs are unknown
    assert r.ranges.select("name", "flops").rows() == [("big", 2**71), ("odd", None)]
    assert r.flops is None and "1 range whose counters could not be read" in r.note
    by_kernel = {row["name"]: row for row in r.by_kernel.iter_rows(named=True)}
    assert by_kernel["big"]["flops"] == 2**71 and by_kernel["big"][SASS.format("dadd")] == 0
    assert r.by_kernel.schema[SASS.format("dadd")] == pl.Int64  # sums that fit stay Int64
