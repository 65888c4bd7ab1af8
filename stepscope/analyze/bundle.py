"""The per-trace analysis bundle: every single-trace analysis of one trace, each computed once, on demand.

`TraceAnalysis` holds a trace's derived frames (`TraceFrames`: launches, steps, windows) and hands them to
every analysis it runs, and hands one analysis's result to the next that needs it (gaps to steps, gaps and
steps and kernels to the verdict), so a report or a batch computes each thing once. The CLI, the reports
and the run/batch analyses all read results from here; nothing above this module calls an analysis.

    >>> bundle = TraceAnalysis.of(load("worker0.pt.trace.json.gz"))
    >>> bundle.verdict.verdict, bundle.steps.mean_wall_ns     # gaps computed once, shared by both

On a machine with cores to spare, a report also hands groups of analyses to worker processes before it asks for
any (`start_ahead`, `AHEAD`): each worker opens the same ingested trace, computes its group and sends the results
back, and the bundle takes them from there when they are first asked for, as if computed here (the same results:
the same code over the same Parquet; an analysis that raised there raises the same exception here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from stepscope.analyze.counters import CountersResult, counter_ranges
from stepscope.analyze.critical_path import CriticalPathResult, critical_path
from stepscope.analyze.depgraph import DependencyGraph, build_graph
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.gaps import GapsResult, gpu_gaps
from stepscope.analyze.info import TraceInfo, trace_info
from stepscope.analyze.kernels import KernelsResult, kernel_summary
from stepscope.analyze.memory import ActivationMemory, MemoryTimeline, activation_memory, memory_timeline
from stepscope.analyze.ops import OpTable, op_table
from stepscope.analyze.overlap import OverlapResult, cpu_gpu_overlap
from stepscope.analyze.roofline import RooflineResult, roofline
from stepscope.analyze.serving import ServingResult, serving_iterations
from stepscope.analyze.steps import StepsResult, step_breakdown
from stepscope.analyze.summary import SummaryResult, verdict
from stepscope.analyze.timeline import GpuTimeline, gpu_timeline
from stepscope.analyze.trace import Trace
from stepscope.analyze.transfers import TransfersResult, transfers

#: memory timeline resolution in a bundle (the points a report's memory figure draws)
MEMORY_BUCKETS = 200

#: the analyses a report hands to worker processes (`TraceAnalysis.start_ahead`), one group per worker: the
#: longest (the dependency graph and its critical path; gaps and the steps that share them) each alone, and the
#: others that no analysis here waits on; the bundle's own process meanwhile computes the kernels, roofline,
#: serving iterations and info, then the verdict from all of them. Each worker first derives the trace's frames
#: again (about a fifth of a second on a 54 MB trace): worth it only where the workers have cores of their own.
AHEAD: tuple[tuple[str, ...], ...] = (("critical_path",), ("gaps", "steps"),
                                      ("overlap", "ops", "memory", "transfers"))
#: the largest trace (in events) whose analyses go ahead: each worker holds the trace's frames of its own
AHEAD_MAX_EVENTS = 2_000_000
#: the memory the three workers take together per event of the trace, beyond their imports (measured on df_index,
#: 151k events: 282 MiB for the critical path's, 108 MiB for gaps and steps, 144 MiB for the rest; rounded up).
#: A trace goes ahead only where this fits in a quarter of the machine's memory (`ahead_fits`)
AHEAD_BYTES_PER_EVENT = 4096
#: what a report's own process computes while its workers compute `AHEAD` (`TraceAnalysis.meanwhile`): the rest
#: of what the verdict reads, then the verdict (as soon as the gaps and steps come back, while the critical path
#: is still being found), before the report's sections wait for the workers
MEANWHILE = ("kernels", "roofline", "serving", "info", "verdict")

T = TypeVar("T")
#: what a worker sends back for each analysis of its group: (True, the result) or (False, the exception it raised)
Outcome = tuple[bool, Any]


def _analysis(compute: Callable[[TraceAnalysis], T]) -> cached_property[T]:
    """A bundle analysis: computed on first access and kept, taken from the worker it was handed to where it was
    (`start_ahead`); computed here instead where the hand-over failed (the worker died, the pool was closed, a
    result could not be sent back). The analysis's own exception comes back as a value and is raised here."""

    def get(self: TraceAnalysis) -> T:
        pending = self._ahead.pop(compute.__name__, None)
        if pending is not None:
            try:
                ok, value = pending.result()[compute.__name__]
            except (Exception, CancelledError):  # noqa: BLE001 - the hand-over, not the analysis: compute it here
                return compute(self)
            if not ok:
                raise value
            return value  # type: ignore[no-any-return]
        return compute(self)

    get.__name__, get.__doc__ = compute.__name__, compute.__doc__
    return cached_property(get)


def ahead_fits(events: int) -> bool:
    """Whether a trace of `events` may hand its analyses to workers: at most `AHEAD_MAX_EVENTS`, and the workers'
    memory (`AHEAD_BYTES_PER_EVENT` each event) within a quarter of this machine's (known: else not)."""
    from stepscope.analyze._workers import physical_memory

    memory = physical_memory()
    return events <= AHEAD_MAX_EVENTS and memory is not None and events * AHEAD_BYTES_PER_EVENT <= memory // 4


def compute_group(trace: Trace, names: tuple[str, ...]) -> dict[str, Outcome]:
    """In a worker: the analyses `names` of `trace` (opened from its ingested directory), in order, on one bundle
    (a later one reuses an earlier one's results, as steps reuses gaps); each result or the exception it raised."""
    bundle = TraceAnalysis.of(trace)
    done: dict[str, Outcome] = {}
    for name in names:
        try:
            done[name] = (True, getattr(bundle, name))
        except Exception as exc:  # noqa: BLE001 - raised again where the analysis is asked for
            done[name] = (False, exc)
    return done


@dataclass(frozen=True, eq=False)
class TraceAnalysis:
    """Every single-trace analysis of `frames.trace`, each computed on first access and kept."""

    frames: TraceFrames
    #: analyses handed to worker processes and not yet taken (`start_ahead`): name -> its group's future
    _ahead: dict[str, Future[dict[str, Outcome]]] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(cls, source: Source) -> TraceAnalysis:
        """The bundle of a trace (or of frames already derived)."""
        return cls(frames_of(source))

    @property
    def trace(self) -> Trace:
        """The trace analysed."""
        return self.frames.trace

    def start_ahead(self, submit: Callable[..., Future[dict[str, Outcome]]],
                    groups: tuple[tuple[str, ...], ...] = AHEAD) -> None:
        """Hand each group of analyses to a worker (`submit(compute_group, trace, names)`: a process pool's
        submit); each is then taken from there when first asked for. Only a trace's own frames (a graph capture's
        mapped frames stay here), of a size whose workers fit this machine's memory (`ahead_fits`), and only
        analyses not yet computed or handed out."""
        if type(self.frames) is not TraceFrames or not ahead_fits(self.trace.meta.counts.events):
            return
        trace = dataclasses.replace(self.trace, lease=None)  # (this process holds the cache entry meanwhile)
        for names in groups:
            names = tuple(n for n in names if n not in self.__dict__ and n not in self._ahead)
            if names:
                future = submit(compute_group, trace, names)
                self._ahead.update(dict.fromkeys(names, future))

    def meanwhile(self, names: tuple[str, ...] = MEANWHILE) -> None:
        """Where analyses were handed to workers (`start_ahead`), compute `names` here while they run, so that
        what waits for the workers comes last. One that raises is left: it raises again where it is asked for."""
        if not self._ahead:
            return
        for name in names:
            try:
                getattr(self, name)
            except Exception:  # noqa: BLE001, S112 - raised again, in its section, where it is asked for
                continue

    @_analysis
    def info(self) -> TraceInfo:
        """`stepscope info`: metadata, counts, devices, warnings."""
        return trace_info(self.frames)

    @_analysis
    def gaps(self) -> GapsResult:
        """`stepscope gaps` over the default window, every gap kept."""
        return gpu_gaps(self.frames)

    @_analysis
    def steps(self) -> StepsResult:
        """`stepscope steps`, sharing this bundle's gaps."""
        return step_breakdown(self.frames, gaps=self.gaps)

    @_analysis
    def kernels(self) -> KernelsResult:
        """`stepscope kernels`: every kernel name and category."""
        return kernel_summary(self.frames)

    @_analysis
    def overlap(self) -> OverlapResult:
        """`stepscope overlap`."""
        return cpu_gpu_overlap(self.frames)

    @_analysis
    def transfers(self) -> TransfersResult:
        """`stepscope transfers`."""
        return transfers(self.frames)

    @_analysis
    def ops(self) -> OpTable:
        """`stepscope ops` (grouped by name, default sort)."""
        return op_table(self.frames)

    @_analysis
    def memory(self) -> MemoryTimeline:
        """`stepscope memory`, at MEMORY_BUCKETS points."""
        return memory_timeline(self.frames, buckets=MEMORY_BUCKETS)

    @_analysis
    def activations(self) -> ActivationMemory:
        """`stepscope memory --activations`: activations by layer at the memory peak."""
        return activation_memory(self.frames, timeline=self.memory)

    @_analysis
    def roofline(self) -> RooflineResult:
        """`stepscope flops`: FLOPs per op, achieved TFLOP/s and GB/s against the device table's peaks, MFU."""
        return roofline(self.frames)

    @_analysis
    def counters(self) -> CountersResult:
        """`stepscope counters`: the CUPTI range profiler's counters per kernel (none in any other trace)."""
        return counter_ranges(self.frames)

    @_analysis
    def serving(self) -> ServingResult:
        """`stepscope serving`: engine iterations (prefill, decode, mixed), per-phase latency, GPU busy, tokens/s."""
        return serving_iterations(self.frames)

    @_analysis
    def verdict(self) -> SummaryResult:
        """`stepscope summary`, from this bundle's gaps, steps, kernels, roofline, serving iterations and the
        trace's warnings (`info`'s)."""
        return verdict(self.frames, gaps=self.gaps, steps=self.steps, kernels=self.kernels, limits=self.roofline,
                       serving=self.serving, warnings=self.info.warnings)

    @_analysis
    def graph(self) -> DependencyGraph:
        """The dependency graph of the steps (`depgraph.build_graph`), which the critical path and what-if walk."""
        return build_graph(self.frames)

    @_analysis
    def critical_path(self) -> CriticalPathResult:
        """`stepscope critical-path`: every step's critical path on this bundle's graph."""
        return critical_path(self.frames, graph=self.graph)

    def timeline(self, step: int | None = None) -> GpuTimeline | None:
        """The GPU timeline of `step` (default: the median step), idle gaps from this bundle's gaps, the step's
        critical path from this bundle's."""
        return gpu_timeline(self.frames, step=step, gaps=self.gaps, segments=lambda: self.critical_path.segments)
