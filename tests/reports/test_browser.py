"""The report in a real browser (headless chromium): the DOM holds the sections and tables, the page paints."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from builders import load_events
from report_traces import gpu_doc

from stepscope.analyze.bundle import TraceAnalysis
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
