"""Profile an unmodified script: run it in this process (runpy, its own sys.argv) with the profiler armed.

What counts as a step:

    (default)                      each optimizer step, any optimizer (torch's global post-step hook)
    --step-on NAME                 each return from a Python function called NAME (sys.settrace on calls only)
    --step-on module:attr          each return from an importable function or method (`pkg.model:Model.generate`),
                                   wrapped before the script starts
    --step-on-annotation NAME      each exit of a `torch.profiler.record_function(NAME)` block or decorator

    stepscope capture -o runs/exp -- python train.py --epochs 1
    stepscope capture -o runs/exp --step-on generate -- python serve.py
    stepscope capture -o runs/exp --step-on mypkg.model:decode -- python -m mypkg.bench
    torchrun --nproc-per-node 2 -m stepscope capture -o runs/ddp -- train.py     # one trace per rank

A training script with several optimizers advances once per optimizer step (two per iteration for a GAN);
use --step-on there. If the script raises, what was recorded is exported, the manifest says "failed" and keeps
the script's traceback, and a ScriptFailed (a CaptureError) names the script's error and carries that traceback
as `python train.py` would print it: the frames of this runner and runpy left out.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from stepscope.capture.options import CaptureOptions
from stepscope.capture.session import ProfileSession, import_torch
from stepscope.errors import CaptureError, ScriptFailed

# interpreter flags that do not change what runs; anything else (-c, -X …) is refused with a clear message
_HARMLESS_PYTHON_FLAGS = {"-u", "-B", "-O", "-OO", "-E", "-s", "-I", "-q"}


@dataclass(frozen=True, kw_only=True)
class Target:
    """What to run: a script path or a module (-m), with the argv it sees."""

    script: Path | None
    module: str | None
    argv: tuple[str, ...]


def parse_target(args: Sequence[str]) -> Target:
    """`python train.py A`, `python -m pkg A`, `train.py A` -> Target (the interpreter word is optional).

    >>> parse_target(["python", "-m", "pkg.bench", "--n", "3"]).argv
    ('pkg.bench', '--n', '3')
    """
    rest = list(args)
    if not rest:
        raise CaptureError("nothing to run: give a script after --, e.g. `stepscope capture -o run -- python train.py`")
    first = Path(rest[0]).name
    if first in ("torchrun", "accelerate", "deepspeed") or first.startswith("torch.distributed"):
        raise CaptureError(f"put the launcher outside: `{first} … -m stepscope capture -o RUN_DIR -- train.py ARGS`")
    if first.startswith("python"):
        rest = rest[1:]
        while rest and rest[0] in _HARMLESS_PYTHON_FLAGS:
            rest = rest[1:]
    if not rest:
        raise CaptureError("nothing to run: give a script or -m module after python")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise CaptureError("-m needs a module name")
        return Target(script=None, module=rest[1], argv=(rest[1], *rest[2:]))
    if rest[0].startswith("-"):
        raise CaptureError(f"cannot run `python {rest[0]} …` in-process: give a script file or -m module")
    script = Path(rest[0])
    if not script.is_file():
        raise CaptureError("no such script", path=script)
    return Target(script=script, module=None, argv=(str(script), *rest[1:]))


@contextmanager
def _script_env(target: Target) -> Iterator[None]:
    """sys.argv and sys.path[0] as `python script.py` / `python -m module` would set them."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = list(target.argv)
    sys.path.insert(0, str(target.script.resolve().parent) if target.script else os.getcwd())
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


Undo = Callable[[], None]


def _on_optimizer_steps(on_step: Callable[[], None]) -> Undo:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda *_: on_step())
    undo: Undo = handle.remove  # typed here: without torch installed, mypy sees `handle` as Any
    return undo


def _on_returns_of(spec: str, on_step: Callable[[], None]) -> Undo:
    """Wrap `module:attr[.attr]` (a function or a method) so that each return counts as a step."""
    module_name, _, path = spec.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CaptureError(f"--step-on {spec}: cannot import {module_name} ({exc})") from None
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name, None)
    original = getattr(owner, attr, None) if owner is not None else None
    if not callable(original):
        raise CaptureError(f"--step-on {spec}: {module_name} has no function {path}")

    @wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            on_step()

    setattr(owner, attr, counted)
    return lambda: setattr(owner, attr, original)


def _on_returns_named(name: str, on_step: Callable[[], None]) -> Undo:
    """Count returns of any Python function called `name`.

    sys.settrace, not sys.setprofile: torch's Python stack recorder (with_stack) takes the profile hook
    over while the profiler runs. Only frames of that name get a local tracer, with line events off.
    """

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            on_step()
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_name == name:
            frame.f_trace_lines = False
            return local
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    threading.settrace(tracer)

    def undo() -> None:
        sys.settrace(previous)
        threading.settrace(previous)

    return undo


def _on_annotation(name: str, on_step: Callable[[], None]) -> Undo:
    """Count exits of `torch.profiler.record_function(name)` (as a `with` block or a decorator)."""
    from torch.autograd.profiler import record_function

    original = record_function.__exit__

    def __exit__(self: Any, *exc_info: Any) -> Any:
        result = original(self, *exc_info)
        if self.name == name:
            on_step()
        return result

    # (unused-ignore: without torch installed, mypy sees record_function as Any and needs no ignore)
    record_function.__exit__ = __exit__  # type: ignore[method-assign, unused-ignore]
    return lambda: setattr(record_function, "__exit__", original)


def _run(target: Target) -> None:
    with _script_env(target):
        if target.module:
            runpy.run_module(target.module, run_name="__main__", alter_sys=True)
        elif target.script is not None:
            runpy.run_path(str(target.script), run_name="__main__")


def _script_traceback(exc: BaseException) -> str:
    """`exc` formatted as `python script.py` prints it: the leading frames (run_script, _run, runpy) dropped.

    Traceback (most recent call last):               Traceback (most recent call last):
      File ".../stepscope/capture/runner.py", …         File "train.py", line 9, in <module>
      File "<frozen runpy>", line 291, in run_path  ->  File "train.py", line 3, in step
      File "train.py", line 9, in <module>            RuntimeError: boom
      File "train.py", line 3, in step
    RuntimeError: boom
    """
    machinery = {_run.__code__.co_filename, runpy.run_path.__code__.co_filename}
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in machinery:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run_script(target: Target, out_dir: Path, options: CaptureOptions, *, step_on: str | None = None,
               step_on_annotation: str | None = None, command: list[str] | None = None,
               overwrite: bool = False) -> ProfileSession:
    """Run `target` under a profiling session and return it (files, manifest).

    Raises ScriptFailed (a CaptureError), after exporting what was recorded and writing the manifest, when the
    script fails (an exception, or SystemExit with a non-zero code); CaptureError when no step reached the
    profiler's active phase.
    """
    if step_on and step_on_annotation:
        raise CaptureError("--step-on and --step-on-annotation cannot be combined: choose one")
    import_torch()
    session = ProfileSession(out_dir, options, command=command, overwrite=overwrite)
    failure: BaseException | None = None
    with session:  # never sees an exception: the script's error is handed to finish() below
        if step_on_annotation:
            undo = _on_annotation(step_on_annotation, session.step)
        elif step_on and ":" in step_on:
            undo = _on_returns_of(step_on, session.step)
        elif step_on:
            undo = _on_returns_named(step_on, session.step)
        else:
            undo = _on_optimizer_steps(session.step)
        try:
            _run(target)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                failure = exc
                session.error = f"SystemExit: {exc.code}"
        except BaseException as exc:  # noqa: BLE001 - reported below, after the trace and manifest are written
            failure = exc
            session.error_traceback = _script_traceback(exc)
        finally:
            undo()
        first_active = options.profiler_start + options.wait + options.warmup
        if failure is None and session.steps_seen <= first_active:
            what = ("optimizer steps" if not (step_on or step_on_annotation)
                    else f"calls of {step_on or step_on_annotation}")
            session.error = (f"nothing was profiled: the script made {session.steps_seen} {what}, the first "
                             f"recorded step is number {first_active + 1} (skip_first {options.skip_first} + "
                             f"baseline {options.baseline} + wait {options.wait} + warmup {options.warmup} + 1)")
        session.finish(failure)
    if failure is not None:
        raise ScriptFailed(f"the script failed ({session.error}); what was recorded is in {out_dir}",
                           script_traceback=session.error_traceback) from failure
    if session.error:
        hint = "" if step_on or step_on_annotation else "; for inference loops use --step-on FUNCTION"
        raise CaptureError(f"{session.error}: lower --skip-first/--baseline/--wait/--warmup{hint}")
    return session
