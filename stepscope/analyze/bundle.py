"""The per-trace analysis bundle: every single-trace analysis of one trace, each computed once, on demand.

`TraceAnalysis` holds a trace's derived frames (`TraceFrames`: launches, steps, windows) and hands them to
every analysis it runs, and hands one analysis's result to the next that needs it (gaps to steps, gaps and
steps and kernels to the verdict), so a report or a batch computes each thing once. The CLI, the reports
and the run/batch analyses all read results from here; nothing above this module calls an analysis.

    >>> bundle = TraceAnalysis.of(load("worker0.pt.trace.json.gz"))
    >>> bundle.verdict.verdict, bundle.steps.mean_wall_ns     # gaps computed once, shared by both
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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


@dataclass(frozen=True, eq=False)
class TraceAnalysis:
    """Every single-trace analysis of `frames.trace`, each computed on first access and kept."""

    frames: TraceFrames

    @classmethod
    def of(cls, source: Source) -> TraceAnalysis:
        """The bundle of a trace (or of frames already derived)."""
        return cls(frames_of(source))

    @property
    def trace(self) -> Trace:
        """The trace analysed."""
        return self.frames.trace

    @cached_property
    def info(self) -> TraceInfo:
        """`stepscope info`: metadata, counts, devices, warnings."""
        return trace_info(self.frames)

    @cached_property
    def gaps(self) -> GapsResult:
        """`stepscope gaps` over the default window, every gap kept."""
        return gpu_gaps(self.frames)

    @cached_property
    def steps(self) -> StepsResult:
        """`stepscope steps`, sharing this bundle's gaps."""
        return step_breakdown(self.frames, gaps=self.gaps)

    @cached_property
    def kernels(self) -> KernelsResult:
        """`stepscope kernels`: every kernel name and category."""
        return kernel_summary(self.frames)

    @cached_property
    def overlap(self) -> OverlapResult:
        """`stepscope overlap`."""
        return cpu_gpu_overlap(self.frames)

    @cached_property
    def transfers(self) -> TransfersResult:
        """`stepscope transfers`."""
        return transfers(self.frames)

    @cached_property
    def ops(self) -> OpTable:
        """`stepscope ops` (grouped by name, default sort)."""
        return op_table(self.frames)

    @cached_property
    def memory(self) -> MemoryTimeline:
        """`stepscope memory`, at MEMORY_BUCKETS points."""
        return memory_timeline(self.frames, buckets=MEMORY_BUCKETS)

    @cached_property
    def activations(self) -> ActivationMemory:
        """`stepscope memory --activations`: activations by layer at the memory peak."""
        return activation_memory(self.frames, timeline=self.memory)

    @cached_property
    def roofline(self) -> RooflineResult:
        """`stepscope flops`: FLOPs per op, achieved TFLOP/s and GB/s against the device table's peaks, MFU."""
        return roofline(self.frames)

    @cached_property
    def serving(self) -> ServingResult:
        """`stepscope serving`: engine iterations (prefill, decode, mixed), per-phase latency, GPU busy, tokens/s."""
        return serving_iterations(self.frames)

    @cached_property
    def verdict(self) -> SummaryResult:
        """`stepscope summary`, from this bundle's gaps, steps, kernels, roofline, serving iterations and the
        trace's warnings (`info`'s)."""
        return verdict(self.frames, gaps=self.gaps, steps=self.steps, kernels=self.kernels, limits=self.roofline,
                       serving=self.serving, warnings=self.info.warnings)

    @cached_property
    def graph(self) -> DependencyGraph:
        """The dependency graph of the steps (`depgraph.build_graph`), which the critical path and what-if walk."""
        return build_graph(self.frames)

    @cached_property
    def critical_path(self) -> CriticalPathResult:
        """`stepscope critical-path`: every step's critical path on this bundle's graph."""
        return critical_path(self.frames, graph=self.graph)

    def timeline(self, step: int | None = None) -> GpuTimeline | None:
        """The GPU timeline of `step` (default: the median step), idle gaps from this bundle's gaps, the step's
        critical path from this bundle's."""
        return gpu_timeline(self.frames, step=step, gaps=self.gaps, segments=lambda: self.critical_path.segments)
