"""Figure workers (_render.py): a page drawn by worker processes is the page drawn here, byte for byte; a
figure that fails loses its section with the same problem line; a dead worker's figures are drawn here."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import wait
from pathlib import Path

import pytest
from builders import load_events
from report_traces import gpu_doc

from stepscope.analyze.bundle import TraceAnalysis
from stepscope.reports import html as H
from stepscope.reports._render import INLINE, FigureRenderer, FigureWorkers, draw


def _page(bundle: TraceAnalysis, renderer: FigureRenderer) -> str:
    page = H.trace_report(bundle, source="synthetic.json", renderer=renderer)
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "TIME", page)  # the time the page was generated


def test_workers_draw_the_same_page(tmp_path: Path) -> None:
    # GIVEN a trace with steps, kernels, copies and memory
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    # WHEN its report is drawn here and by two workers
    here = _page(bundle, INLINE)
    with FigureWorkers(2) as workers:
        there = _page(bundle, workers)
    # THEN the pages are the same, PNG bytes included, and have their figures
    assert there == here
    assert here.count("data:image/png;base64,") >= 5


def test_a_failing_figure_loses_its_section_wherever_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a section whose figure raises (a figure of the wrong result) before the page's own sections
    def broken(ctx: H.ReportContext) -> H.Section:
        return H.Section(id="broken", title="Broken", figures=[ctx.figure("x", "figures.gaps_figure", "<b>")])

    monkeypatch.setattr(H, "SECTIONS", [("broken", broken), *H.SECTIONS])
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    # WHEN the report is drawn here and by a worker
    here = _page(bundle, INLINE)
    with FigureWorkers(1) as workers:
        there = _page(bundle, workers)
    # THEN both say so in one line (escaped), the other sections are there, and the pages agree
    assert "section &#39;broken&#39; could not be built: AttributeError:" in here
    assert 'id="broken"' not in here and 'id="steps"' in here
    assert there == here


def test_draw_takes_only_figures() -> None:
    with pytest.raises(ValueError, match="not a figure"):
        draw("html.render_page", ())


def test_a_dead_worker_figures_are_drawn_here(tmp_path: Path) -> None:
    # GIVEN figure workers whose worker was killed (out of memory, a signal)
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    here = _page(bundle, INLINE)
    with FigureWorkers(1) as workers:
        workers.submit("figures.overlap_figure", bundle.overlap).result()  # the worker is up
        for process in list(workers._pool._processes.values()):  # type: ignore[union-attr]
            process.kill()
            process.join()
        # WHEN the report is drawn
        there = _page(bundle, workers)
    # THEN every figure is there all the same
    assert there == here


def test_leaving_on_an_error_does_not_wait_for_the_workers() -> None:
    # GIVEN workers still warming up (importing matplotlib) WHEN the report fails at once
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="boom"), FigureWorkers(1) as workers:
        pending = workers.submit("figures.overlap_figure", None)
        raise RuntimeError("boom")
    # THEN the error comes out promptly and the figure is given up (cancelled, or failed with its worker)
    assert time.perf_counter() - start < 5
    assert pending.future is not None
    wait([pending.future], timeout=10)
    assert pending.future.done()




@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc (Linux)")
def test_the_fork_server_starts_early_without_a_thread_or_matplotlib_here() -> None:
    # GIVEN a fresh process (the CLI's) that has not loaded a trace yet
    code = ("import os, sys\n"
            "from multiprocessing import forkserver\n"
            "from stepscope.reports._render import start_early\n"
            "threads = sorted(os.listdir('/proc/self/task'))\n"
            "start_early()\n"
            "assert forkserver._forkserver._forkserver_pid is not None, 'no fork server'\n"
            "assert sorted(os.listdir('/proc/self/task')) == threads, 'a thread started here'\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported here'\n"
            "from stepscope.reports._render import FigureWorkers\n"
            "with FigureWorkers(1) as w:\n"
            "    assert w.submit('figures.gaps_figure', None).future is not None\n")
    # WHEN it starts the figure workers' fork server early, then the workers
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # THEN the server runs, this process has the same threads and no matplotlib, and the workers come from it
    assert done.returncode == 0, done.stderr
