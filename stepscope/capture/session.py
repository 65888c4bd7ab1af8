"""Profile a training or inference loop with the hygiene the analysis needs.

    from stepscope.capture import profile_steps

    with profile_steps("runs/exp1", baseline=5, wait=1, warmup=2, active=3) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

The phases (see CaptureOptions): `skip_first` steps run untouched, `baseline` steps run without the
profiler and are timed (CUDA events on a GPU, perf counters on CPU), then torch.profiler's schedule runs
`wait`, `warmup` (recorded, discarded) and `active` steps, `repeat` times. Before each export the device is
synchronized; each active cycle becomes one gzip Chrome trace named as tensorboard_trace_handler names them,
`<worker>.<time_ns>.pt.trace.json.gz` (worker `rank<N>` under a launcher, else `<host>_<pid>`), so
TensorBoard and HTA read the directory too (a step number in the name would make TensorBoard see one worker
per cycle; the manifest lists the steps in each file instead). On CUDA the allocator's history is recorded
over the profiled window and dumped as `<worker>.memory_snapshot.pickle` at its end, or as
`<worker>.oom.memory_snapshot.pickle` when torch.cuda.OutOfMemoryError escapes the loop (the error is then
re-raised). With shapes, memory and stacks on, `<worker>.memory_timeline.raw.json.gz` is exported too (CPU
and CUDA). `manifest.json` describes the run (stepscope.capture.manifest).

When the loop raises, what was recorded is exported, the manifest says "failed" (with the error's traceback),
and the error propagates.
torch is imported only when a session starts, so `import stepscope.capture` works without it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from stepscope.capture.manifest import (
    MANIFEST_VERSION,
    device_info,
    distributed_env,
    file_kind,
    manifest_name,
    versions,
    worker_name,
)
from stepscope.capture.manifest import write_manifest as _write_manifest
from stepscope.capture.options import CaptureOptions, Device
from stepscope.capture.timing import StepClock, step_stats
from stepscope.errors import CaptureError


def import_torch() -> Any:
    """torch, or a CaptureError that says how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise CaptureError(f"capture needs torch ({exc}): pip install 'stepscope[capture]'") from None
    return torch


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class ProfileSession:
    """A capture in progress; `profile_steps` returns one. Use it as a context manager, call `step()` per
    iteration. After the block: `files` (what was written), `manifest_path`, `manifest` (the dict)."""

    def __init__(self, out_dir: str | Path, options: CaptureOptions, *, command: list[str] | None = None,
                 notes: Iterable[str] = (), overwrite: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.options = options
        self.command = list(command) if command is not None else list(sys.argv)
        self.notes = list(notes)
        self.overwrite = overwrite
        self.steps_seen = 0
        self.files: list[Path] = []
        self.file_info: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []
        self.error: str | None = None
        self.error_traceback: str | None = None
        self.manifest: dict[str, Any] = {}
        self.manifest_path: Path | None = None
        self._torch: Any = None
        self._cuda = False
        self._clock: StepClock | None = None
        self._profiler: Any = None
        self._history = False
        self._finished = False
        self._cycles = 0
        self._in_step = False
        self._started_at = ""
        self._env: dict[str, Any] = {}
        self._worker = ""

    # ------------------------------------------------------------------ public
    def __enter__(self) -> ProfileSession:
        torch = self._torch = import_torch()
        wanted: Device = self.options.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if wanted == "cuda" and not torch.cuda.is_available():
            raise CaptureError("device cuda was asked for but torch sees no CUDA device")
        self._cuda = wanted == "cuda"
        self._env = distributed_env()
        self._worker = worker_name(self._env)
        self._prepare_dir()
        self._started_at = _now()
        self._clock = StepClock(torch, self._cuda)
        self._boundary(0)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(exc)

    def step(self) -> None:
        """Mark the end of one iteration: advances the baseline timer and the profiler's schedule."""
        if self._finished or self._torch is None:
            return
        self.steps_seen += 1
        self._boundary(self.steps_seen)

    def finish(self, exc: BaseException | None = None) -> None:
        """Stop, export what was recorded and write the manifest; `exc` is the loop's error, if any.

        Called by `__exit__`; call it yourself only when not using the `with` block. Idempotent.
        """
        if self._finished or self._torch is None:
            return
        self._finished = True
        if exc is not None and self.error is None:
            self.error = f"{type(exc).__name__}: {exc}".strip()
        if exc is not None and self.error_traceback is None and not isinstance(exc, SystemExit):
            self.error_traceback = "".join(traceback.format_exception(exc))
        oom = exc is not None and isinstance(exc, self._torch.cuda.OutOfMemoryError)
        try:
            self._stop_profiler(oom=oom)
        finally:
            self._write_manifest()

    # ------------------------------------------------------------------ steps
    def _boundary(self, k: int) -> None:
        """Boundary k: `k` steps done. Take a timing mark where a timed step starts or ends; drive the profiler."""
        o = self.options
        timed = ("baseline", "active")
        if self._clock is not None and k <= o.total_steps and (o.phase(k) in timed or (k and o.phase(k - 1) in timed)):
            self._clock.mark(k)
        if k == o.profiler_start:
            self._start_profiler()
        elif self._profiler is not None:
            self._in_step = True
            try:
                self._profiler.step()
            finally:
                self._in_step = False
            if k >= o.total_steps:
                self._stop_profiler(oom=False)

    # ------------------------------------------------------------------ profiler
    def _start_profiler(self) -> None:
        torch = self._torch
        o = self.options
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            if o.memory_snapshot:
                torch.cuda.memory._record_memory_history(max_entries=o.snapshot_max_entries)
                self._history = True
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

    def _on_trace_ready(self, prof: Any) -> None:
        torch = self._torch
        if self._cuda:
            torch.cuda.synchronize()
        o = self.options
        cycle = self._cycles
        self._cycles += 1
        first = cycle * o.cycle_steps + o.wait + o.warmup
        # From step(), step_num already points past the cycle; from stop(), the step in progress was recorded.
        end = prof.step_num if self._in_step else prof.step_num + 1
        steps = list(range(first, min(end, (cycle + 1) * o.cycle_steps)))
        path = self.out_dir / f"{self._worker}.{time.time_ns()}.pt.trace.json.gz"
        prof.export_chrome_trace(str(path))
        self.files.append(path)
        self.file_info[path.name] = {"cycle": cycle, "profiler_steps": steps, "complete": len(steps) == o.active}

    def _stop_profiler(self, *, oom: bool) -> None:
        if self._profiler is None:
            return
        torch = self._torch
        profiler, self._profiler = self._profiler, None
        try:
            if self._cuda:
                torch.cuda.synchronize()
            profiler.__exit__(None, None, None)  # exports a cycle cut short, so a failure still leaves a trace
            if self.options.timeline_wanted and self._cycles:
                self._export_memory_timeline(profiler)
        finally:
            if self._history:
                self._dump_snapshot(oom=oom)

    def _export_memory_timeline(self, profiler: Any) -> None:
        path = self.out_dir / f"{self._worker}.memory_timeline.raw.json.gz"
        device = f"cuda:{self._torch.cuda.current_device()}" if self._cuda else "cpu"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # export_memory_timeline is marked deprecated; it still works
                profiler.export_memory_timeline(str(path), device=device)
            self.files.append(path)
        except Exception as exc:  # noqa: BLE001 - optional extra: noted in the manifest, the run goes on
            self.problems.append(f"memory timeline not exported: {type(exc).__name__}: {exc}")

    def _dump_snapshot(self, *, oom: bool) -> None:
        memory = self._torch.cuda.memory
        path = self.out_dir / f"{self._worker}{'.oom' if oom else ''}.memory_snapshot.pickle"
        try:
            memory._dump_snapshot(str(path))
            self.files.append(path)
        except Exception as exc:  # noqa: BLE001 - optional extra: noted in the manifest, the run goes on
            self.problems.append(f"memory snapshot not written: {type(exc).__name__}: {exc}")
        finally:
            memory._record_memory_history(enabled=None)
            self._history = False

    # ------------------------------------------------------------------ files
    def _prepare_dir(self) -> None:
        """Refuse to mix two runs of the same rank in one directory, unless told to replace the old one."""
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise CaptureError("is not a directory", path=self.out_dir)
        old = self.out_dir / manifest_name(self._env)
        if old.exists():
            if not self.overwrite:
                raise CaptureError(f"already holds a capture ({old.name}): choose a new output directory or "
                                   "pass overwrite=True (--overwrite)", path=self.out_dir)
            import json

            try:
                names = [f["name"] for f in json.loads(old.read_text()).get("files", [])]
            except (OSError, ValueError, TypeError, KeyError):
                names = []
            for name in names:
                if Path(name).name == name:  # only plain names inside the run directory
                    (self.out_dir / name).unlink(missing_ok=True)
            old.unlink()
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CaptureError(f"cannot create the output directory ({exc.strerror})", path=self.out_dir) from None

    def _write_manifest(self) -> None:
        torch, o = self._torch, self.options
        clock = self._clock
        baseline_steps = [k for k in range(o.total_steps) if o.phase(k) == "baseline"]
        active_steps = [k for k in range(o.total_steps) if o.phase(k) == "active"]
        baseline = step_stats(clock.durations_ns(baseline_steps) if clock else [], o.batch_size)
        profiled = step_stats(clock.durations_ns(active_steps) if clock else [], o.batch_size)
        ratio = (profiled["mean_ns"] / baseline["mean_ns"]
                 if profiled["mean_ns"] and baseline["mean_ns"] else None)
        files = []
        for path in self.files:
            if path.exists():
                files.append({"name": path.name, "kind": file_kind(path), "bytes": path.stat().st_size,
                              **self.file_info.get(path.name, {})})
        notes = list(self.notes)
        if not self._cuda:
            notes.append("CPU capture: no GPU timeline, no host-to-device copies, no CUDA memory snapshot")
        if self.steps_seen < o.total_steps and self.error is None:
            notes.append(f"the loop ended after {self.steps_seen} steps; the schedule needs {o.total_steps} "
                         f"(skip_first {o.skip_first} + baseline {o.baseline} + (wait {o.wait} + warmup "
                         f"{o.warmup} + active {o.active}) x repeat {o.repeat})")
        self.manifest = {
            "manifest_version": MANIFEST_VERSION,
            "status": "failed" if self.error else "ok",
            "error": self.error,
            "error_traceback": self.error_traceback,
            "command": {"argv": self.command, "launcher_argv": list(sys.argv), "cwd": os.getcwd(),
                        "host": socket.gethostname(), "pid": os.getpid(), "started_at": self._started_at,
                        "ended_at": _now()},
            "distributed": self._env,
            "versions": versions(torch, self._cuda),
            "device": device_info(torch, self._cuda),
            "profiler": {**dataclasses.asdict(o), "activities": ["cpu", "cuda"] if self._cuda else ["cpu"],
                         "profiler_step_offset": o.profiler_start},
            "timing_method": clock.method if clock else None,
            "baseline": baseline,
            "profiled": profiled,
            "overhead_ratio": ratio,
            "steps_seen": self.steps_seen,
            "schedule_complete": self.steps_seen >= o.total_steps,
            "files": files,
            "notes": notes,
            "problems": self.problems,
        }
        self.manifest_path = _write_manifest(self.out_dir / manifest_name(self._env), self.manifest)


def profile_steps(out_dir: str | Path, *, options: CaptureOptions | None = None, command: list[str] | None = None,
                  notes: Iterable[str] = (), overwrite: bool = False, **option_values: Any) -> ProfileSession:
    """Profile a loop into the run directory `out_dir`; call `.step()` on the result once per iteration.

    Options are CaptureOptions fields as keywords (`baseline=5, wait=1, warmup=2, active=3, repeat=1,
    record_shapes=True, profile_memory=True, with_stack=True, with_modules=True, with_flops=False, …`), or a
    CaptureOptions as `options=` (keywords then override its fields). `command` is recorded in the manifest
    (default: sys.argv), `notes` are added to it. A directory that already holds this rank's capture is an
    error unless `overwrite=True`, which removes the old run's files first.
    """
    try:
        base = options or CaptureOptions()
        resolved = dataclasses.replace(base, **option_values) if option_values else base
    except TypeError as exc:
        raise CaptureError(f"unknown capture option: {exc}") from None
    return ProfileSession(out_dir, resolved, command=command, notes=notes, overwrite=overwrite)
