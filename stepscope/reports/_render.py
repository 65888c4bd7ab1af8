"""Where a report's figures are drawn: here, when asked (the default), or in worker processes while this
process goes on with the analyses and the tables.

Drawing is most of a report's single-threaded Python (text layout, ticks, Agg rasterizing, PNG encoding) and
needs none of what comes after it, so `FigureWorkers` sends each figure's result to a worker as soon as its
section has it; the worker has imported matplotlib (which this process then never imports) while the trace
was being analysed. pyplot's global state stays in the worker, one figure at a time.

A figure is named by its function in a figure module ('figures.gaps_figure'): the worker imports the module,
this process needs only the name. A PNG is the same bytes wherever it is drawn (same matplotlib, same Agg
settings), so the page does not depend on the workers. A figure that raises in a worker raises the same
exception where its `result()` is asked for; a worker that died (killed, out of memory) has its figures
drawn here instead.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analyze.bundle import TraceAnalysis

#: the modules a figure name may point into (stepscope.reports.<module>)
FIGURE_MODULES = ("figures", "memory_figures")

#: what the fork server imports before it forks the figure workers (where this report starts it): matplotlib
#: and the figure modules take longer to import than most figures take to draw, once instead of once a worker
PRELOAD = ("stepscope.analyze.bundle", *(f"stepscope.reports.{m}" for m in FIGURE_MODULES))
#: the same where the workers compute analyses ahead (`analyses_ahead`): the analyses only, so that the fork
#: server is ready as soon as this process has loaded the trace (matplotlib would take it about a second more,
#: which the analyses would wait for); each figure worker then imports matplotlib itself, on a core of its own
PRELOAD_AHEAD = ("stepscope.analyze.bundle",)


def draw(name: str, args: tuple[Any, ...]) -> bytes | None:
    """Draw the figure `name` ('figures.gaps_figure') of `args`: its PNG bytes, or None (nothing to draw)."""
    module, _, function = name.partition(".")
    if module not in FIGURE_MODULES:
        raise ValueError(f"{name!r} is not a figure (one of stepscope.reports.{', '.join(FIGURE_MODULES)})")
    fn: Callable[..., bytes | None] = getattr(importlib.import_module(f"stepscope.reports.{module}"), function)
    return fn(*args)


def warm_up() -> None:
    """What a worker does first, while the analyses run: import the figure modules and the results' classes
    (unpickling a result imports its module) and draw a throwaway figure with text (the font cache, the
    FreeType font and Agg's first-use set-up), so the first real figure pays none of it."""
    import stepscope.analyze.bundle  # noqa: F401 - every result class a figure receives
    from stepscope.reports import _plot, figures, memory_figures  # noqa: F401

    fig, ax = _plot.subplots(figsize=(1, 1))
    ax.set_title("warm-up")
    _plot.to_png(fig)


@dataclass(eq=False)
class PendingPng:
    """A figure being drawn: `result()` waits for its PNG bytes (None: nothing to draw)."""

    name: str
    args: tuple[Any, ...]
    future: Future[bytes | None] | None = field(default=None, repr=False)

    def result(self) -> bytes | None:
        """The PNG bytes; the figure function's own exception if it raised."""
        if self.future is not None:
            try:
                return self.future.result()
            except BrokenProcessPool:  # the worker died: draw it here (the same bytes)
                self.future = None
        return draw(self.name, self.args)


class FigureRenderer:
    """Draws figures in this process, each when its `result()` is asked for (the page order)."""

    def submit(self, name: str, *args: Any) -> PendingPng:
        """Start drawing the figure `name` of `args` (see `draw`)."""
        return PendingPng(name=name, args=args)

    def analyse_ahead(self, bundle: TraceAnalysis) -> None:
        """Nothing: here, the analyses are computed where they are asked for (`FigureWorkers` may hand them to
        its workers ahead)."""


INLINE = FigureRenderer()


def start_early() -> None:
    """Start the fork server the figure workers come from, with matplotlib and the figure modules, before this
    process loads the trace: about a second of imports that would else be waited for where the workers start
    (FigureWorkers' `__enter__`) runs meanwhile on another core."""
    from stepscope.analyze._workers import start_fork_server

    start_fork_server(PRELOAD_AHEAD if analyses_ahead() else PRELOAD)


#: the fewest cores on which a report hands analyses to its workers (`bundle.AHEAD`); below, each worker would
#: take a core from this process's own analyses and derive the trace's frames again besides
AHEAD_MIN_CORES = 4
#: the most figure workers a report starts: its figures are about a dozen, drawn as their sections are built
MAX_WORKERS = 6


def analyses_ahead() -> bool:
    """Whether this machine has the cores for a report's analyses to run in its workers (`AHEAD_MIN_CORES`)."""
    from stepscope.analyze._workers import usable_cores

    return usable_cores() >= AHEAD_MIN_CORES


def default_workers(ahead: bool = False) -> int:
    """Figure workers for this machine. Without analyses ahead, two where there are two cores or more, else one:
    drawing takes about as long as analysing, and most figures can only start near the end of the analyses; on
    two cores, two workers split what is left between the cores once this process is done, where one worker left
    a core idle (benchmarks/report_vs_json.py). With them, the cores this process and the analyses' workers
    leave, at least two and at most `MAX_WORKERS`."""
    from stepscope.analyze._workers import usable_cores

    cores = usable_cores()
    if not ahead:
        return 2 if cores >= 2 else 1
    from stepscope.analyze.bundle import AHEAD

    return max(2, min(MAX_WORKERS, cores - 1 - len(AHEAD)))


class FigureWorkers(FigureRenderer):
    """Draws figures in `workers` processes, each started as soon as it is submitted; a context manager. With
    `ahead` (default: where the machine has `AHEAD_MIN_CORES`), more workers, one for each group of analyses,
    compute a trace's analyses before this process asks for them (`analyse_ahead`).

    The workers start (and warm up: matplotlib imported) when this is entered, from the fork server (which
    has polars and the analyses' modules loaded already; matplotlib too, without `ahead`): enter it once the
    trace is loaded (an ingest on the fly runs its own worker pool first) and before the analyses start.
    Without `ahead` they are started by a thread of this process, so that the analyses go on while the fork
    server finishes its imports (on two cores, half a second this process would otherwise wait for). Workers
    that cannot be started at all leave every figure to be drawn here. The analyses' workers are a pool of
    their own, so that no figure waits for a worker that has not imported matplotlib. Leaving it normally waits
    for nothing (every figure's result was taken); leaving it on an error ends the workers at once, so a failed
    report exits without waiting for a figure nobody will read.
    """

    def __init__(self, workers: int | None = None, *, ahead: bool | None = None) -> None:
        self.ahead = ahead if ahead is not None else analyses_ahead()
        self.workers = workers if workers is not None else default_workers(self.ahead)
        self._pool: ProcessPoolExecutor | None = None
        self._analysts: ProcessPoolExecutor | None = None
        self._starting: threading.Thread | None = None
        self._unstarted = False  # the workers could not be started: every figure is drawn here

    def __enter__(self) -> FigureWorkers:
        from stepscope.analyze._workers import worker_pool
        from stepscope.analyze.bundle import AHEAD

        # from the fork server, never forked from here: by now this process may run threads other than its
        # imports' (a pool that ingested a trace, polars' own), and a child forked while one of them holds a
        # lock waits on it forever (a report in the test suite hung so)
        preload = PRELOAD_AHEAD if self.ahead else PRELOAD
        self._pool = worker_pool(self.workers, fork_if_fresh=False, preload=preload)
        if self.ahead:
            self._analysts = worker_pool(len(AHEAD), fork_if_fresh=False, preload=preload)
            self._start_workers()
        else:  # the fork server may still be importing matplotlib: the analyses need not wait for it
            self._starting = threading.Thread(target=self._start_workers, daemon=True, name="stepscope-figure-workers")
            self._starting.start()
        return self

    def _start_workers(self) -> None:
        """Start the figure workers, each warming up (`warm_up`). A pool that broke meanwhile is left to
        `submit`; workers that could not be started at all (the fork server failed) leave every figure to be
        drawn here."""
        assert self._pool is not None
        try:
            for _ in range(self.workers):
                self._pool.submit(warm_up)
        except BrokenProcessPool:
            pass
        except Exception:  # noqa: BLE001 - any failure to start a process: the figures are drawn here instead
            self._unstarted = True

    def analyse_ahead(self, bundle: TraceAnalysis) -> None:
        """With `ahead`, hand `bundle`'s analyses to the analyses' workers (`TraceAnalysis.start_ahead`) and
        compute the others here meanwhile (`TraceAnalysis.meanwhile`): call it before asking the bundle for
        anything. Nothing where that pool is closed or broken or its workers cannot be started (they are computed
        here when asked for)."""
        if self._analysts is None:
            return
        try:
            bundle.start_ahead(self._analysts.submit)
        except Exception:  # noqa: BLE001 - a broken pool, a worker that could not be started: computed here
            pass
        bundle.meanwhile()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        pools = [p for p in (self._pool, self._analysts) if p is not None]
        self._pool = self._analysts = None
        for pool in pools:
            if kind is not None:
                for process in list((getattr(pool, "_processes", None) or {}).values()):
                    process.terminate()  # (no public way before Python 3.14's terminate_workers)
            pool.shutdown(wait=kind is None, cancel_futures=True)

    def submit(self, name: str, *args: Any) -> PendingPng:
        """Send the figure to a worker; drawn here (on `result()`) when the pool is closed or broken, or its
        workers cannot be started."""
        pending = PendingPng(name=name, args=args)
        if self._pool is not None and not self._unstarted:
            try:
                pending.future = self._pool.submit(draw, name, args)
            except BrokenProcessPool:
                pass
            except Exception:  # noqa: BLE001 - a worker could not be started (as in `_start_workers`)
                self._unstarted = True
        return pending
