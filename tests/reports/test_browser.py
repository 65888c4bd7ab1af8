"""The report in a real browser (headless chromium): the DOM holds the sections and tables, the page paints, and
the pages fit a laptop screen (nothing sticks out sideways but the tables that scroll in their own box)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pytest
from builders import kernel, load_events, write_trace
from click.testing import CliRunner
from report_traces import gpu_doc

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.cli import cli
from stepscope.reports.html import trace_report

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync"]


def test_report_in_headless_chromium(tmp_path: Path) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not on PATH (apt-get install chromium) : the real-browser check cannot run")
    page = tmp_path / "index.html"
    page.write_text(trace_report(TraceAnalysis.of(load_events(tmp_path, gpu_doc())), source="x"), encoding="utf-8")
    profile = tmp_path / "profile"
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=60).stdout
    for sid in ("steps", "ops", "memory", "info"):
        assert f'id="{sid}"' in dom
    assert dom.count("<table") >= 4 and "aten::mm" in dom
    assert "<script>alert(1)</script>" not in dom.replace("&lt;", "<").split("<body")[0]
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1280,2000",
                    page.as_uri()], capture_output=True, timeout=60, check=False)
    img = mpimg.imread(shot)
    assert img.shape[1] == 1280 and img.std() > 0.05


# Every element and every run of text ends inside the viewport, or sits inside a box that scrolls sideways
# (a wide table); the commands under "How to reproduce" wrap and never need scrolling. The result is written
# into the DOM, which --dump-dom returns.
LAYOUT_PROBE = """<script>
(function () {
  var width = document.documentElement.clientWidth, bad = [];
  function scrolls(node) {
    for (var a = node.parentElement; a && a !== document.body; a = a.parentElement) {
      var o = getComputedStyle(a).overflowX;
      if (o === "auto" || o === "scroll") { return true; }
    }
    return false;
  }
  function what(node) {
    var el = node.nodeType === 1 ? node : node.parentElement;
    return el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + ": "
      + (node.textContent || "").trim().slice(0, 50);
  }
  document.querySelectorAll("body *").forEach(function (el) {
    var r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 0.5 && !scrolls(el)) { bad.push(what(el)); }
  });
  var walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT), node, range = document.createRange();
  while ((node = walk.nextNode())) {
    range.selectNodeContents(node);
    var t = range.getBoundingClientRect();
    if (t.width > 0 && t.right > width + 0.5 && !scrolls(node)) { bad.push("text in " + what(node)); }
  }
  document.querySelectorAll("#reproduce, #reproduce *").forEach(function (el) {
    if (el.scrollWidth > el.clientWidth + 1) { bad.push("scrolls: " + what(el)); }
  });
  if (document.documentElement.scrollWidth > width) { bad.push("the page scrolls sideways"); }
  var out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify(bad);
  document.body.appendChild(out);
})();
</script>"""
ROCM_GEMM = ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT{}x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_"
             "CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_WS64_WG32_8_1")


def overflows(exe: str, page: Path, profile: Path, width: int = 1280) -> list[str]:
    """What sticks out of a `width`-pixel viewport (see LAYOUT_PROBE), as chromium lays the page out."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found is not None, f"chromium did not run the layout probe on {page}"
    bad: list[str] = json.loads(html.unescape(found.group(1)))
    return bad


def wide_doc(scale: float) -> dict[str, Any]:
    """The report traces' steps with six long ROCm GEMM names sharing their first 48 characters."""
    doc = gpu_doc(scale)
    doc["traceEvents"] += [kernel(ROCM_GEMM.format(64 * (i + 1)), ts=60 + 5 * i, dur=2 * scale) for i in range(6)]
    return doc


def test_report_pages_fit_a_laptop_screen(tmp_path: Path) -> None:
    """GIVEN a batch of traces with long names in a deep directory, and a diff of two of them
    WHEN the index, each trace's page and the diff page are laid out 1280 pixels wide
    THEN nothing sticks out of the page: wide tables scroll in their own box, long commands wrap."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not on PATH (apt-get install chromium) : the real-browser check cannot run")
    batch = tmp_path / ("a_directory_with_a_long_name_" * 5) / "batch"
    names = [f"{'rank_and_run_' * 6}{i}.pt.trace.json" for i in range(3)]
    for i, name in enumerate(names):
        write_trace(batch, wide_doc(1.0 + i), name)
    runner = CliRunner()
    done = runner.invoke(cli, ["report", str(batch), "--batch", "-o", str(tmp_path / "report")])
    assert done.exit_code == 0, done.output
    done = runner.invoke(cli, ["diff", str(batch / names[0]), str(batch / names[2]), "-o", str(tmp_path / "diff")])
    assert done.exit_code == 0, done.output
    pages = [tmp_path / "report" / "index.html", *sorted((tmp_path / "report").glob("*/index.html")),
             tmp_path / "diff" / "index.html"]
    assert len(pages) == 5
    for page in pages:
        assert overflows(exe, page, tmp_path / "profile") == [], page
