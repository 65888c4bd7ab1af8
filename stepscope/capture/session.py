"""Profile a training or inference loop with the hygiene the analysis needs.

    from stepscope.capture import profile_steps

    with profile_steps("runs/exp1", baseline=5, wait=1, warmup=2, active=3) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Step by step: the first `baseline` steps run without the profiler and are timed (CUDA events on a GPU,
perf counters on CPU) to give the unprofiled step time; then torch.profiler's schedule runs `wait`
idle steps, `warmup` steps (recorded, then discarded: the profiler's own start-up cost stays out of the
trace), and `active` recorded steps, `repeat` times. The device is synchronized before each export, one
gzip Chrome trace per active cycle and rank (`<worker>.<time_ns>.pt.trace.json.gz`, the names
tensorboard_trace_handler writes, so HTA and TensorBoard read them too). On CUDA the allocator's history
is recorded over the profiled window and dumped as a snapshot pickle at its end (or on an OOM, before the
error propagates). With shapes, memory and stacks on, the profiler's memory timeline is exported too.
`manifest.json` describes the run (see stepscope.capture.manifest).

torch is imported only when a session starts, so `import stepscope.capture` works without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from stepscope.capture.manifest import distributed_env, write_manifest
from stepscope.errors import CaptureError


@dataclass(frozen=True, kw_only=True)
class CaptureOptions:
    """What to record and when. The defaults suit a training loop of more than a dozen steps."""

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
    memory_snapshot: bool = True
    snapshot_max_entries: int = 100_000
    memory_timeline: bool = True
    batch_size: int | None = None
    device: str | None = None  # "cuda" / "cpu"; None: cuda when available

    def __post_init__(self) -> None:
        for name in ("baseline", "wait", "warmup"):
            if getattr(self, name) < 0:
                raise CaptureError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.active < 1 or self.repeat < 1:
            raise CaptureError("active and repeat must be >= 1")

    @property
    def profiled_steps(self) -> int:
        """Steps the schedule consumes after the baseline."""
        return (self.wait + self.warmup + self.active) * self.repeat


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CaptureError("capture needs torch: pip install 'stepscope[capture]'") from None
    return torch


@dataclass
class ProfileSession:
    """The object `profile_steps` yields: call `step()` once per iteration."""

    out_dir: Path
    options: CaptureOptions
    command: list[str] | None = None
    steps_seen: int = 0
    files: list[Path] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    error: str | None = None
    _torch: Any = None
    _profiler: Any = None
    _cuda: bool = False
    _last_ns: int = 0
    _events: list[Any] = field(default_factory=list)
    _recording_history: bool = False
    _done: bool = False
    _started_at: str = ""
    _cycles: int = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ProfileSession:
        self._torch = _import_torch()
        torch = self._torch
        self.out_dir.mkdir(parents=True, exist_ok=True)
        wanted = self.options.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if wanted == "cuda" and not torch.cuda.is_available():
            raise CaptureError("--device cuda was asked for but torch sees no CUDA device")
        self._cuda = wanted == "cuda"
        self._started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._mark_baseline_start()
        if self.options.baseline == 0:
            self._start_profiler()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        torch = self._torch
        if exc is not None:
            self.error = f"{type(exc).__name__}: {exc}"
        oom = exc is not None and self._cuda and isinstance(exc, torch.cuda.OutOfMemoryError)
        try:
            self._stop_profiler(oom=oom)
        finally:
            write_manifest(self)

    # ------------------------------------------------------------------ stepping
    def step(self) -> None:
        """Mark the end of one iteration."""
        self.steps_seen += 1
        if self._done:
            return
        if self.steps_seen <= self.options.baseline:
            self._record_baseline_step()
            if self.steps_seen == self.options.baseline:
                self._start_profiler()
            return
        if self._profiler is not None:
            self._profiler.step()
            if self.steps_seen >= self.options.baseline + self.options.profiled_steps:
                self._stop_profiler(oom=False)

    @property
    def profiling(self) -> bool:
        """Whether the profiler is armed (between the baseline and the end of the schedule)."""
        return self._profiler is not None

    # ------------------------------------------------------------------ internals
    def _now_event(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _mark_baseline_start(self) -> None:
        if self._cuda:
            self._events = [self._now_event()]
        self._last_ns = time.perf_counter_ns()

    def _record_baseline_step(self) -> None:
        if self._cuda:
            self._events.append(self._now_event())
            self._events[-1].synchronize()
            elapsed_ms = self._events[-2].elapsed_time(self._events[-1])
            self.baseline_ns.append(int(elapsed_ms * 1e6))
        else:
            now = time.perf_counter_ns()
            self.baseline_ns.append(now - self._last_ns)
            self._last_ns = now

    def _worker_name(self) -> str:
        env = distributed_env()
        if env["rank"] is not None:
            return f"rank{env['rank']}"
        import os
        import socket

        return f"{socket.gethostname()}_{os.getpid()}"

    def _on_trace_ready(self, prof: Any) -> None:
        torch = self._torch
        if self._cuda:
            torch.cuda.synchronize()
        before = set(self.out_dir.glob("*.pt.trace.json.gz"))
        torch.profiler.tensorboard_trace_handler(str(self.out_dir), worker_name=self._worker_name(),
                                                 use_gzip=True)(prof)
        self.files.extend(sorted(set(self.out_dir.glob("*.pt.trace.json.gz")) - before))
        self._cycles += 1

    def _start_profiler(self) -> None:
        torch = self._torch
        o = self.options
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            if o.memory_snapshot:
                torch.cuda.memory._record_memory_history(max_entries=o.snapshot_max_entries)
                self._recording_history = True
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=o.wait, warmup=o.warmup, active=o.active, repeat=o.repeat),
            on_trace_ready=self._on_trace_ready,
            record_shapes=o.record_shapes,
            profile_memory=o.profile_memory,
            with_stack=o.with_stack,
            with_modules=o.with_modules,
            with_flops=o.with_flops,
        )
        self._profiler.__enter__()

    def _stop_profiler(self, *, oom: bool) -> None:
        if self._profiler is None:
            return
        torch = self._torch
        profiler, self._profiler = self._profiler, None
        self._done = True
        if self._cuda:
            torch.cuda.synchronize()
        profiler.__exit__(None, None, None)  # exports a cycle cut short, so a failure still leaves a trace
        o = self.options
        if o.memory_timeline and o.record_shapes and o.profile_memory and o.with_stack:
            path = self.out_dir / f"{self._worker_name()}.memory_timeline.raw.json.gz"
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    profiler.export_memory_timeline(str(path), device="cuda:0" if self._cuda else "cpu")
                self.files.append(path)
            except Exception as exc:  # noqa: BLE001 - optional extra; a note beside the traces says why
                (self.out_dir / f"{self._worker_name()}.memory_timeline.error.txt").write_text(f"{exc}\n")
        if self._recording_history:
            path = self.out_dir / f"{self._worker_name()}{'.oom' if oom else ''}.memory_snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording_history = False
            self.files.append(path)


def profile_steps(out_dir: str | Path, *, command: list[str] | None = None, **options: Any) -> ProfileSession:
    """A context manager that profiles a loop; call `.step()` once per iteration. Options: CaptureOptions."""
    return ProfileSession(out_dir=Path(out_dir), options=CaptureOptions(**options), command=command)
