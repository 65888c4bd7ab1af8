"""The Fleet section of a batch's index (collection.fleet_stats, assemble.fleet_section, fleet_figures): verdict
counts, the spread of step time and GPU busy across traces, the worst runs linked to their pages; the same
verdicts and the same worst-run order as `stepscope fleet` on the same traces."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest
from builders import cpu_op, kernel, runtime, step, trace, write_trace
from click.testing import CliRunner

from stepscope.analyze.collection import NO_VERDICT, fleet_stats
from stepscope.cli import cli
from stepscope.reports import fleet_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def busy_doc(step_us: float, busy: float, steps: int = 3) -> dict[str, Any]:
    """`steps` steps of `step_us` µs, each with one kernel that keeps the GPU busy for `busy` of the step."""
    events: list[dict[str, Any]] = []
    for i in range(steps):
        base, corr = i * step_us, 10 * (i + 1)
        events += [step(i + 1, ts=base, dur=step_us),
                   cpu_op("aten::mm", ts=base + 1, dur=step_us * 0.05, external_id=corr),
                   runtime("cudaLaunchKernel", ts=base + 2, dur=1, correlation=corr, external_id=corr),
                   kernel("sgemm", ts=base + 3, dur=step_us * busy, correlation=corr)]
    return trace(*events)


#: name -> (step µs, GPU busy): two gpu-bound traces and three launch-bound ones, steps from 100 µs to 20 ms
BATCH = {"a": (100, 0.9), "b": (1000, 0.2), "c": (5000, 0.5), "d": (300, 0.95), "e": (20000, 0.1)}


def write_batch(directory: Path) -> Path:
    for name, (step_us, busy) in BATCH.items():
        write_trace(directory, busy_doc(step_us, busy), f"{name}.pt.trace.json")
    (directory / "bad.pt.trace.json").write_text("{not json")
    return directory


def row(name: str, verdict: str | None, p50: float | None, busy: float | None) -> dict[str, Any]:
    return {"trace": name, "steps": 3, "verdict": verdict, "median_step_ns": p50, "p95_step_ns": p50 and p50 * 2,
            "summary_gpu_busy_fraction": busy, "href": f"{name}/index.html"}


def test_fleet_stats_counts_spreads_and_ranks() -> None:
    # GIVEN four reported rows (one without a verdict, one without steps) and a failed one
    rows = [row("a", "gpu_bound", 10e6, 0.9), row("b", "launch_bound", 40e6, 0.3), row("c", "gpu_bound", 20e6, 0.8),
            row("d", None, None, None), {"trace": "bad", "error": "ValueError: no"}]
    # WHEN they are summed up, two worst runs each
    stats = fleet_stats(rows, worst=2)
    # THEN verdicts are counted most first, the failed one apart
    assert stats.verdicts == {"gpu_bound": 2, NO_VERDICT: 1, "launch_bound": 1}
    assert (stats.traces, stats.failed) == (5, 1)
    # and the spreads are over the traces that have the figure (linear interpolation)
    assert stats.step_p50 is not None and stats.gpu_busy is not None
    assert (stats.step_p50.traces, stats.step_p50.min, stats.step_p50.p50, stats.step_p50.max) == (3, 10e6, 20e6, 40e6)
    assert stats.step_p50.p90 == pytest.approx(36e6)
    assert (stats.gpu_busy.min, stats.gpu_busy.p50, stats.gpu_busy.max) == (0.3, 0.8, 0.9)
    # and the worst runs are the lowest busy and the longest p95, the rows themselves
    assert [r["trace"] for r in stats.lowest_busy] == ["b", "c"]
    assert [r["trace"] for r in stats.longest_p95] == ["b", "c"]


def test_ties_keep_input_order_and_nothing_known_is_none() -> None:
    stats = fleet_stats([row("x", "gpu_bound", 5.0, 0.5), row("y", "gpu_bound", 5.0, 0.5)])
    assert [r["trace"] for r in stats.lowest_busy] == ["x", "y"] == [r["trace"] for r in stats.longest_p95]
    empty = fleet_stats([row("x", None, None, None)])
    assert empty.step_p50 is None and empty.gpu_busy is None and empty.lowest_busy == []


def assert_png(data: bytes | None, min_w: int = 400) -> None:
    assert data is not None and data.startswith(PNG_MAGIC)
    img = mpimg.imread(io.BytesIO(data), format="png")
    h, w = img.shape[:2]
    assert min_w <= w <= 2000 and 80 <= h <= 1200 and img.std() > 0.01


def test_figures_of_forty_traces_and_of_too_few() -> None:
    verdicts = ["gpu_bound", "launch_bound", "data_loading_bound", None] * 10
    p50 = [1e5 * 1.2 ** i for i in range(40)]  # 100 µs to about 120 ms: a log axis
    busy = [i / 40 for i in range(40)]
    assert_png(fleet_figures.verdicts_figure(dict(Counter(v or NO_VERDICT for v in verdicts))))
    assert_png(fleet_figures.step_spread_figure(p50, [v * 1.5 for v in p50], verdicts))
    assert_png(fleet_figures.step_spread_figure([1e6, 2e6], [None, 3e6], ["gpu_bound", None]))  # linear axis
    assert_png(fleet_figures.busy_figure(busy, verdicts))
    assert fleet_figures.verdicts_figure({}) is None
    assert fleet_figures.step_spread_figure([1e6], [None], ["gpu_bound"]) is None
    assert fleet_figures.busy_figure([0.5, None], ["gpu_bound", None]) is None


def table_after(page: str, title: str) -> list[list[str]]:
    """The cells' sort values (data-v), row by row, of the table under the heading `title`."""
    body = page.split(f"<h3>{title}</h3>", 1)[1].split("</table>", 1)[0]
    return [re.findall(r'data-v="([^"]*)"', tr) for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S)[1:]]


def hrefs_after(page: str, title: str) -> list[str]:
    body = page.split(f"<h3>{title}</h3>", 1)[1].split("</table>", 1)[0]
    return re.findall(r'<a href="([^"]+)"', body)


def test_the_index_fleet_section_agrees_with_the_fleet_command(tmp_path: Path) -> None:
    # GIVEN a batch of five small traces and a broken one
    src = write_batch(tmp_path / "in")
    # WHEN it is reported and its fleet table asked for
    report = CliRunner().invoke(cli, ["report", str(src), "--batch", "-o", str(tmp_path / "out")])
    table = CliRunner().invoke(cli, ["fleet", str(src), "--json"])
    assert report.exit_code == 1 and table.exit_code == 1  # (the broken file)
    fleet_rows = json.loads(table.stdout)["fleet"]
    page = (tmp_path / "out" / "index.html").read_text()
    # THEN the Fleet section comes first, with its three figures
    assert page.index('id="fleet"') < page.index('id="traces"')
    for caption in ("Traces by verdict", "Step time across traces", "GPU busy across traces"):
        assert f"<figcaption>{caption}</figcaption>" in page
    # and its verdict counts are the fleet table's
    counts = {v: int(n) for v, n, _share in
              (cells for cells in table_after(page, "Verdict counts") if cells[0])}
    assert counts == dict(Counter(r["verdict"] for r in fleet_rows if r["verdict"] is not None))
    assert counts == {"launch_bound": 3, "gpu_bound": 2}
    assert ["", "1"] == table_after(page, "Verdict counts")[-1][:2]  # the broken file, apart
    # and its worst runs are `fleet --sort gpu_busy` and `fleet --sort step_p95 --desc`, linked to their pages
    by_busy = sorted((r for r in fleet_rows if r["gpu_busy_fraction"] is not None),
                     key=lambda r: r["gpu_busy_fraction"])
    by_p95 = sorted((r for r in fleet_rows if r["step_p95_ns"] is not None), key=lambda r: -r["step_p95_ns"])
    assert hrefs_after(page, "Worst traces: the 5 with the lowest GPU busy") == \
        [f"{Path(r['path']).name.removesuffix('.json')}/index.html" for r in by_busy] == \
        [f"{n}.pt.trace/index.html" for n in "ebcad"]
    assert hrefs_after(page, "Worst traces: the 5 with the longest p95 step") == \
        [f"{Path(r['path']).name.removesuffix('.json')}/index.html" for r in by_p95]
    busy = [float(cells[2]) for cells in table_after(page, "Worst traces: the 5 with the lowest GPU busy")]
    assert busy == pytest.approx([r["gpu_busy_fraction"] for r in by_busy])
    for href in hrefs_after(page, "Worst traces: the 5 with the lowest GPU busy"):
        assert (tmp_path / "out" / href).is_file()
    # and the spread table's median step p50 is the median of the traces' p50s
    spread = table_after(page, "Spread across traces (each trace&#39;s figure; p50, p90: of the traces)")
    assert float(spread[0][2]) == pytest.approx(sorted(r["step_p50_ns"] for r in fleet_rows if r["step_p50_ns"])[2])


def test_a_run_and_a_batch_of_one_have_no_fleet_section(tmp_path: Path) -> None:
    write_trace(tmp_path / "one", busy_doc(100, 0.5), "a.pt.trace.json")
    write_trace(tmp_path / "one", busy_doc(100, 0.5), "b.pt.trace.json")
    (tmp_path / "one" / "b.pt.trace.json").write_text("{not json")
    CliRunner().invoke(cli, ["report", str(tmp_path / "one"), "--batch", "-o", str(tmp_path / "out")])
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="traces"' in page and 'id="fleet"' not in page
