"""Figure workers (_render.py): a page drawn by worker processes is the page drawn here, byte for byte; a
figure that fails loses its section with the same problem line; a dead worker's figures are drawn here. Analyses
handed to the workers ahead (bundle.start_ahead) give the same page; an analysis that raised there raises here,
and one whose hand-over failed is computed here."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from pathlib import Path

import pytest
from builders import load_events
from click.testing import CliRunner
from report_traces import gpu_doc

from stepscope.analyze import _workers
from stepscope.analyze.bundle import AHEAD, MEANWHILE, TraceAnalysis, ahead_fits, compute_group
from stepscope.cli import cli
from stepscope.reports import _render
from stepscope.reports import html as H
from stepscope.reports._render import INLINE, FigureRenderer, FigureWorkers, draw

LATE_RANK = Path(__file__).resolve().parents[2] / "sample_traces" / "late_rank"


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




class _SlowToStart:
    """A worker pool whose processes take `delay` seconds each to start (a fork server still importing
    matplotlib), or cannot be started at all (`fails`)."""

    def __init__(self, pool: ProcessPoolExecutor, delay: float = 0.0, fails: bool = False) -> None:
        self.pool, self.delay, self.fails = pool, delay, fails
        self.threads: set[str] = set()

    def submit(self, fn: Callable[..., object], *args: object) -> Future[object]:
        self.threads.add(threading.current_thread().name)
        if self.fails:
            raise OSError("the fork server is gone")
        if fn is _render.warm_up:
            time.sleep(self.delay)
        return self.pool.submit(fn, *args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def test_the_analyses_do_not_wait_for_the_figure_workers_to_start(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN figure workers that take a second each to start, without analyses ahead (a machine of few cores)
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    here = _page(bundle, INLINE)
    pools: list[_SlowToStart] = []
    real_pool = _workers.worker_pool

    def slow_pool(workers: int, **kwargs: object) -> _SlowToStart:
        pools.append(_SlowToStart(real_pool(workers, **kwargs), delay=1.0))  # type: ignore[arg-type]
        return pools[-1]

    monkeypatch.setattr(_workers, "worker_pool", slow_pool)
    # WHEN the report enters them
    start = time.perf_counter()
    with FigureWorkers(2, ahead=False) as workers:
        entered = time.perf_counter() - start
        there = _page(bundle, workers)
    # THEN it goes on at once (the workers are started by a thread of its own), and the page is the same
    assert entered < 0.5
    assert len(pools) == 1 and "stepscope-figure-workers" in pools[0].threads
    assert there == here
    assert not any(t.name == "stepscope-figure-workers" for t in threading.enumerate())


@pytest.mark.parametrize("ahead", [False, True])
def test_figure_workers_that_cannot_start_leave_the_figures_to_be_drawn_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool) -> None:
    # GIVEN a machine where no worker process can be started (the fork server failed)
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    here = _page(bundle, INLINE)
    monkeypatch.setattr(_workers, "worker_pool",
                        lambda workers, **kwargs: _SlowToStart(ProcessPoolExecutor(1), fails=True))
    # WHEN the report is drawn with figure workers
    with FigureWorkers(2, ahead=ahead) as workers:
        there = _page(TraceAnalysis.of(bundle.trace), workers)
    # THEN every figure is drawn here: the same page, and no error
    assert there == here


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


def test_analyses_computed_ahead_by_the_workers_give_the_same_page(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a trace's report drawn here, analyses and all
    trace = load_events(tmp_path, gpu_doc())
    here = _page(TraceAnalysis.of(trace), INLINE)
    handed: set[str] = set()
    start_ahead = TraceAnalysis.start_ahead

    def spied(self: TraceAnalysis, *args: object) -> None:
        start_ahead(self, *args)  # type: ignore[arg-type]
        handed.update(self._ahead)

    monkeypatch.setattr(TraceAnalysis, "start_ahead", spied)
    # WHEN a fresh bundle of it hands its analyses to the workers before anything is asked of it
    bundle = TraceAnalysis.of(trace)
    with FigureWorkers(2, ahead=True) as workers:
        workers.analyse_ahead(bundle)
        computed = set(bundle.__dict__)
        there = _page(bundle, workers)
    # THEN every group went to a worker, the others were computed here meanwhile, each handed one was taken from
    # its worker, and the page is the same
    assert handed == {name for group in AHEAD for name in group}
    assert set(MEANWHILE) <= computed
    assert not bundle._ahead
    assert there == here


def test_meanwhile_computes_only_beside_workers_and_leaves_a_failure_to_its_section(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    # nothing handed to a worker: nothing computed ahead of the sections' order
    bundle.meanwhile()
    assert not set(bundle.__dict__) & set(MEANWHILE)
    # handed: computed, one that raises passed over (raised again where asked for)
    _handed(bundle, "gaps", result=(True, None))
    bundle.meanwhile(("no_such_analysis", "kernels"))
    assert "kernels" in bundle.__dict__


def test_a_group_is_computed_on_one_bundle_and_a_failure_comes_back_as_a_value(tmp_path: Path) -> None:
    # GIVEN a trace WHEN a worker's group is computed: two analyses, then one that does not exist
    trace = load_events(tmp_path, gpu_doc())
    done = compute_group(trace, ("gaps", "steps", "no_such_analysis"))
    inline = TraceAnalysis.of(trace)
    # THEN each result is what the bundle computes here, and the failure is the exception, not raised
    assert done["gaps"][0] and done["steps"][0]
    assert done["gaps"][1].window_ns == inline.gaps.window_ns
    assert done["steps"][1].steps.equals(inline.steps.steps)
    ok, exc = done["no_such_analysis"]
    assert not ok and isinstance(exc, AttributeError)


def _handed(bundle: TraceAnalysis, name: str, *, result: object = None, error: BaseException | None = None) -> None:
    """`name` as if handed to a worker whose future holds `result` (for `name`) or `error`."""
    future: Future[dict[str, tuple[bool, object]]] = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result({name: result})  # type: ignore[dict-item]
    bundle._ahead[name] = future


def test_an_analysis_that_raised_in_a_worker_raises_the_same_here(tmp_path: Path) -> None:
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    _handed(bundle, "gaps", result=(False, ValueError("no window")))
    with pytest.raises(ValueError, match="no window"):
        _ = bundle.gaps


def test_an_analysis_whose_hand_over_failed_is_computed_here(tmp_path: Path) -> None:
    # GIVEN analyses handed to a worker that died, and one whose result could not be sent back
    trace = load_events(tmp_path, gpu_doc())
    bundle = TraceAnalysis.of(trace)
    _handed(bundle, "gaps", error=BrokenProcessPool("a worker died"))
    _handed(bundle, "overlap", error=TypeError("cannot pickle"))
    inline = TraceAnalysis.of(trace)
    # WHEN they are asked for THEN they are computed here, the same as ever
    assert bundle.gaps.idle_by_cause.equals(inline.gaps.idle_by_cause)
    assert bundle.overlap.launch_latency.equals(inline.overlap.launch_latency)
    assert bundle.overlap.gpu_busy_fraction == inline.overlap.gpu_busy_fraction


def test_a_run_report_with_analyses_ahead_is_the_same_report(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the 2-rank sample run, reported as on a machine of few cores (analyses in this process)
    if not LATE_RANK.is_dir():
        pytest.skip("sample_traces/late_rank is not present")

    def pages(out: Path) -> dict[str, str]:
        done = CliRunner().invoke(cli, ["report", str(LATE_RANK), "-o", str(out)])
        assert done.exit_code == 0, done.output
        return {str(p.relative_to(out)): re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "TIME", p.read_text())
                for p in sorted(out.rglob("index.html"))}

    monkeypatch.setattr(_render, "AHEAD_MIN_CORES", 10**6)
    here = pages(tmp_path / "here")
    # WHEN it is reported as on a machine with cores to spare (each rank's analyses handed to the workers)
    monkeypatch.setattr(_render, "AHEAD_MIN_CORES", 1)
    ahead = pages(tmp_path / "ahead")
    # THEN every page, the index and each rank's, is the same
    assert len(here) == 3
    assert ahead == here


def test_a_trace_goes_ahead_only_where_its_workers_fit_in_memory(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a machine of 16 GiB: a million events' workers (4 KiB an event, 3.8 GiB) fit in its quarter, two
    # million do not; past AHEAD_MAX_EVENTS none go ahead, nor where the machine's memory is unknown
    monkeypatch.setattr(_workers, "physical_memory", lambda: 16 * 2**30)
    assert ahead_fits(1_000_000) and not ahead_fits(1_100_000)
    monkeypatch.setattr(_workers, "physical_memory", lambda: 2**40)
    assert ahead_fits(2_000_000) and not ahead_fits(2_000_001)
    monkeypatch.setattr(_workers, "physical_memory", lambda: None)
    assert not ahead_fits(10)
    # WHEN a bundle is asked to hand its analyses on a machine too small for them THEN nothing is handed
    monkeypatch.setattr(_workers, "physical_memory", lambda: 2**12)
    bundle = TraceAnalysis.of(load_events(tmp_path, gpu_doc()))
    bundle.start_ahead(lambda *args: pytest.fail("handed on a machine too small"))
    assert not bundle._ahead


def test_the_memory_a_container_allows_is_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a container limited to 2 GiB (cgroup v2), then one with no limit ("max")
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(_workers, "CGROUP_MEMORY_LIMITS", (str(limit), str(tmp_path / "absent")))
    limit.write_text("2147483648\n")
    assert _workers.physical_memory() == min(2**31, _machine_memory())
    limit.write_text("max\n")
    assert _workers.physical_memory() == _machine_memory()
    # and where no limit file exists at all, the machine's memory
    monkeypatch.setattr(_workers, "CGROUP_MEMORY_LIMITS", (str(tmp_path / "absent"),))
    assert _workers.physical_memory() == _machine_memory()


def _machine_memory() -> int:
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
