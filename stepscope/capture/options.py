"""What a capture records and when: one frozen, keyword-only dataclass (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepscope.errors import CaptureError

Phase = Literal["skip", "baseline", "wait", "warmup", "active", "done"]
Device = Literal["cuda", "cpu"]


@dataclass(frozen=True, kw_only=True)
class CaptureOptions:
    """What to record and when. The defaults suit a training loop of a dozen steps or more.

    The steps of a run, in order (a "step" is one `ProfileSession.step()` call):

        skip_first  run untimed and unprofiled (lazy CUDA init, cuDNN autotuning, compilation)
        baseline    run unprofiled and timed: the profiler-free step time in the manifest
        wait        profiler armed, idle
        warmup      recorded, then discarded: the profiler's own start-up cost stays out of the trace
        active      recorded and exported, one gzip Chrome trace per cycle
        (wait, warmup, active) x repeat

    For example skip_first=1, baseline=5, wait=1, warmup=2, active=3 profiles steps 10, 11 and 12
    (1-based) and times steps 2 to 6 without the profiler.
    """

    skip_first: int = 1
    baseline: int = 5
    wait: int = 1
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    with_modules: bool = True
    with_flops: bool = False
    memory_snapshot: bool = True  # CUDA only: allocator history over the profiled window, dumped at its end
    snapshot_max_entries: int = 100_000  # caps the snapshot's history (and so its size)
    memory_timeline: bool = True  # export_memory_timeline raw data; needs record_shapes, profile_memory, with_stack
    batch_size: int | None = None  # samples per step, for samples/s in the manifest
    device: Device | None = None  # None: cuda when torch sees a GPU

    def __post_init__(self) -> None:
        for name in ("skip_first", "baseline", "wait", "warmup"):
            if getattr(self, name) < 0:
                raise CaptureError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("active", "repeat", "snapshot_max_entries"):
            if getattr(self, name) < 1:
                raise CaptureError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise CaptureError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.device not in (None, "cuda", "cpu"):
            raise CaptureError(f"device must be 'cuda' or 'cpu', got {self.device!r}")

    @property
    def profiler_start(self) -> int:
        """Steps completed before the profiler is armed (skip_first + baseline)."""
        return self.skip_first + self.baseline

    @property
    def cycle_steps(self) -> int:
        """Steps in one wait/warmup/active cycle."""
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int:
        """Steps the whole run needs: skip_first + baseline + the profiler's schedule."""
        return self.profiler_start + self.cycle_steps * self.repeat

    @property
    def timeline_wanted(self) -> bool:
        """Whether the memory timeline can be exported (torch needs shapes, memory and stacks for it)."""
        return self.memory_timeline and self.record_shapes and self.profile_memory and self.with_stack

    def phase(self, step: int) -> Phase:
        """The phase of 0-based step `step` (the step that runs after `step` calls to `step()`).

        >>> o = CaptureOptions(skip_first=1, baseline=2, wait=1, warmup=1, active=2)
        >>> [o.phase(i) for i in range(8)]
        ['skip', 'baseline', 'baseline', 'wait', 'warmup', 'active', 'active', 'done']
        """
        if step < self.skip_first:
            return "skip"
        if step < self.profiler_start:
            return "baseline"
        if step >= self.total_steps:
            return "done"
        pos = (step - self.profiler_start) % self.cycle_steps
        return "wait" if pos < self.wait else "warmup" if pos < self.wait + self.warmup else "active"
