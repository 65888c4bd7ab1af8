"""HTML report: sections present with the analyses' numbers, every trace string escaped, self-contained."""

from __future__ import annotations

import re
from pathlib import Path

from builders import cpu_op, kernel, load_events, runtime, step, trace
from markupsafe import escape
from report_traces import XSS, gpu_doc

from stepscope.analyze import Trace, load
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.summary import RULES
from stepscope.reports import html as H
from stepscope.reports.units import human_ns


def report(trace: Trace, source: str) -> str:
    return H.trace_report(TraceAnalysis.of(trace), source=source)


def test_report_sections_numbers_and_escaping(tmp_path: Path) -> None:
    t = load_events(tmp_path, gpu_doc())
    page = report(t, "synthetic.json")
    assert page.index('id="verdict"') < page.index('id="steps"') < page.index('id="info"')  # verdict first
    for sid in ("verdict", "steps", "kernels", "ops", "memory", "info", "reproduce"):
        assert f'id="{sid}"' in page
    assert XSS not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http://" not in page and "https://" not in page  # no CDN, no network
    assert page.count("data:image/png;base64,") >= 5  # steps, timeline, kernels, ops, memory
    assert "<dt>outlier steps</dt>" not in page  # empty lists are left out of the headline
    assert human_ns(100_000) in page  # the median step (100 µs)
    assert "aten::mm" in page and "sgemm_128x64" in page
    assert "stepscope report synthetic.json -o OUT/" in page
    assert re.search(r'<td class="num" data-v="100000(\.0)?">', page)  # raw value for the sorter


def test_cpu_only_trace_says_what_is_missing(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("aten::add", ts=0, dur=5)))
    page = report(t, "cpu.json")
    assert "No [memory] events in this trace" in page
    assert 'id="steps"' not in page  # no steps and no GPU work: no section


def test_a_trace_without_steps_shows_the_whole_trace_and_says_so(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(kernel("sgemm", ts=0, dur=10), kernel("sgemm", ts=30, dur=10)))
    page = report(t, "nosteps.json")
    assert "GPU timeline of the whole trace:" in page and "median-duration step" not in page


def test_a_last_step_without_gpu_work_is_said_to_be_left_out(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=10, dur=5, correlation=1),
        kernel("sgemm", ts=20, dur=50, correlation=1), step(2, ts=100, dur=4)))
    page = report(t, "tail.json")
    steps = page[page.index('id="steps"'):page.index('id="gaps"')]
    # THEN the steps section says so once, as a note (not a card too), and the verdict's warnings list it
    assert steps.count("step 2 (4 µs): no GPU work launched") == 1 and "Left out: step 2 (4 µs)" in steps
    assert "tail_steps_excluded" in page[:page.index('id="steps"')]


def test_a_failing_section_becomes_a_problem_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(ctx: H.ReportContext) -> H.Section:
        raise RuntimeError("boom <b>")

    monkeypatch.setattr(H, "SECTIONS", [("broken", broken), *H.SECTIONS])
    page = report(load_events(tmp_path, gpu_doc()), "x")
    assert "section &#39;broken&#39; could not be built: RuntimeError: boom &lt;b&gt;" in page
    assert 'id="ops"' in page


def test_display_names() -> None:
    assert H.display_name("self_cpu_ns") == "self cpu"
    assert H.display_name("self_cpu_fraction") == "self cpu %"
    assert H.display_name("peak_allocated_bytes") == "peak allocated"
    # rates name their unit as nccl-tests and spec sheets write it: busbw_gbps is GB/s, not Gbit/s
    assert [H.display_name(c) for c in ("busbw_gbps", "gbps", "attainable_tflops", "flops")] == [
        "busbw GB/s", "GB/s", "attainable TFLOP/s", "flops"]


def test_text_tables_and_headlines_name_rate_units() -> None:
    import polars as pl

    from stepscope.reports.text import render_frame, render_headline

    assert render_frame(pl.DataFrame({"algbw_gbps": [0.3], "tflops": [1.5]})).splitlines()[0].split() == [
        "algbw_GB/s", "TFLOP/s"]
    assert render_headline({"peak_tflops": 989.5}).split()[:2] == ["peak", "TFLOP/s"]


def test_corpus_report(corpus: Path) -> None:
    t = load(corpus / "traces" / "kineto" / "resnet50_num_workers_0")
    page = report(t, "resnet")
    assert "aten::cudnn_convolution" in page and 'id="memory"' in page
    assert "176.3 ms" in page  # median ProfilerStep (steps 5..10)
    assert "data loading bound: exposed data loading" in page  # the verdict leads the page


def test_gaps_section(corpus: Path) -> None:
    t = load(corpus / "traces" / "kineto" / "resnet50_num_workers_0")
    page = report(t, "resnet")
    assert 'id="gaps"' in page and "Longest gaps" in page and "data_loading" in page
    assert page.index('id="steps"') < page.index('id="gaps"') < page.index('id="kernels"')
    for sid in ("overlap", "transfers"):  # landed with gaps.py
        assert f'id="{sid}"' in page
    assert "Memcpy HtoD" in page or "HtoD" in page
    idle = gpu_gaps(t).idle_ns
    assert human_ns(idle) in page
    assert "GPU idle by cause, per step" in page and "69.6 ms" in page  # step 5 waited 69.6 ms for data


def test_verdict_box_shows_margin_runner_up_and_the_rule_table(tmp_path: Path) -> None:
    # GIVEN a step whose GPU is busy 59 of its 100 µs: launch_bound, 1 point from gpu_bound
    t = load_events(tmp_path, trace(step(1, ts=0, dur=100), runtime("cudaLaunchKernel", ts=0, dur=1, correlation=1),
                                    kernel("sgemm", ts=1, dur=59, correlation=1)))
    # WHEN the report is built
    page = report(t, "near.json")
    verdict_box = page[page.index('id="verdict"'):page.index("</section>", page.index('id="verdict"'))]
    # THEN the verdict box says how close the call was and what came second
    assert "<dt>margin</dt><dd>GPU busy 59.0% &lt; 60%: 1.0 points from gpu_bound</dd>" in verdict_box
    assert "<dt>runner-up</dt><dd>gpu_bound: otherwise, with GPU work in the trace</dd>" in verdict_box
    # AND the command to profile next is a note of its own (a command cut into a headline cell reads badly)
    assert '<p class="note">Profile next, where this verdict points: nsys profile --trace=cuda' in verdict_box
    assert "<dt>profile next</dt>" not in verdict_box
    # AND its rule table is RULES: every rule, in order, in the same words (the README's table renders them too)
    pos = verdict_box.index("Rules, in order")
    for rule in RULES:
        pos = verdict_box.index(f'>{escape(rule.verdict.value)}</td><td data-v="{escape(rule.when)}">', pos)


def test_critical_path_section(tmp_path: Path) -> None:
    # GIVEN a GPU trace WHEN its report is written THEN the critical path has a section after the steps, with the
    # analysis' verdict on what bounds the step, its split by kind and its top contributors
    from stepscope.analyze.critical_path import critical_path

    t = load_events(tmp_path / "a", gpu_doc())
    page = report(t, "synthetic.json")
    result = critical_path(t)
    assert page.index('id="steps"') < page.index('id="critical_path"') < page.index('id="gaps"')
    section = page[page.index('id="critical_path"'):page.index('id="gaps"')]
    assert f"<dd>{str(result.bound_by).replace('_', ' ')}</dd>" in section
    assert "Critical path by kind (mean per step)" in section and "Top contributors (all steps)" in section
    for row in result.attribution.iter_rows(named=True):
        assert f'data-v="{row["mean_ns"]}"' in section or f'data-v="{float(row["mean_ns"])}"' in section
    assert "stepscope critical-path synthetic.json" in page  # (in "How to reproduce")
    # AND a held start's note is on the page
    import critical_path_traces as cp

    held = report(load_events(tmp_path / "b", cp.held_start()), "held.json")
    section = held[held.index('id="critical_path"'):held.index('id="info"')]
    assert "(start held after launch)" in section and "1 GPU start on the path came more than 10x" in section
