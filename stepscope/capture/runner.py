"""Profile an unmodified script: run it in this process with the profiler armed.

The schedule advances on each optimizer step (torch's global optimizer step hook), or, for inference
loops, after each call of a named function:

    stepscope capture -o runs/exp -- python train.py --epochs 1        # training: optimizer steps
    stepscope capture -o runs/exp --step-on generate -- python serve.py # inference: calls of generate()
    stepscope capture -o runs/exp --step-on mypkg.model:decode -- python -m mypkg.bench

`--step-on NAME` matches a function of that name defined anywhere in the script or its modules;
`module:function` patches an importable function before the script starts.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from types import FrameType
from typing import Any

from stepscope.capture.session import CaptureOptions, ProfileSession
from stepscope.errors import CaptureError


@dataclass(frozen=True, kw_only=True)
class Target:
    """What to run: a script path or a module (-m), with its own argv."""

    script: Path | None
    module: str | None
    argv: tuple[str, ...]


def parse_target(args: Sequence[str]) -> Target:
    """`python train.py A`, `python -m pkg A`, `train.py A` -> Target. The interpreter word is optional."""
    rest = list(args)
    if rest and Path(rest[0]).name.startswith("python"):
        rest = rest[1:]
    if not rest:
        raise CaptureError("nothing to run: give a script after --, e.g. `stepscope capture -- python train.py`")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise CaptureError("-m needs a module name")
        return Target(script=None, module=rest[1], argv=(rest[1], *rest[2:]))
    script = Path(rest[0])
    if not script.is_file():
        raise CaptureError(f"no such script: {script}")
    return Target(script=script, module=None, argv=(str(script), *rest[1:]))


@contextmanager
def _argv(argv: Sequence[str], script: Path | None) -> Iterator[None]:
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = list(argv)
    sys.path.insert(0, str(script.resolve().parent) if script else os.getcwd())
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _patch_function(spec: str, on_return: Callable[[], None]) -> Callable[[], None]:
    """Wrap module:function so each return counts as a step; returns the undo."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CaptureError(f"--step-on {spec}: cannot import {module_name} ({exc})") from None
    original = getattr(module, attr, None)
    if not callable(original):
        raise CaptureError(f"--step-on {spec}: {module_name} has no function {attr}")

    @wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            on_return()

    setattr(module, attr, counted)
    return lambda: setattr(module, attr, original)


def _profile_function_returns(name: str, on_return: Callable[[], None]) -> Callable[[], None]:
    """Count returns of any Python function called `name` (sys.setprofile); returns the undo."""

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == name:
            on_return()

    previous = sys.getprofile()
    sys.setprofile(hook)
    return lambda: sys.setprofile(previous)


def run_script(target: Target, out_dir: Path, options: CaptureOptions, *, step_on: str | None = None,
               command: list[str] | None = None) -> ProfileSession:
    """Run the target under a profiling session; raise CaptureError (after writing what was recorded) if it fails."""
    import torch  # noqa: F401 - fail early with the session's clear message if torch is missing

    session = ProfileSession(out_dir=out_dir, options=options, command=command)
    undo: Callable[[], None] = lambda: None  # noqa: E731
    handle = None
    failure: BaseException | None = None
    with session:
        if step_on is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            handle = register_optimizer_step_post_hook(lambda *_: session.step())
        elif ":" in step_on:
            undo = _patch_function(step_on, session.step)
        else:
            undo = _profile_function_returns(step_on, session.step)
        try:
            with _argv(target.argv, target.script):
                if target.module:
                    runpy.run_module(target.module, run_name="__main__", alter_sys=True)
                else:
                    assert target.script is not None
                    runpy.run_path(str(target.script), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                failure = exc
                session.error = f"SystemExit: {exc.code}"
        except BaseException as exc:  # noqa: BLE001 - reported below, after the trace and manifest are written
            failure = exc
            session.error = f"{type(exc).__name__}: {exc}"
        finally:
            undo()
            if handle is not None:
                handle.remove()
    if failure is not None:
        raise CaptureError(f"the script failed ({session.error}); what was recorded is in {out_dir}") from failure
    if session.steps_seen == 0:
        how = "no optimizer step ran" if step_on is None else f"{step_on} was never called"
        raise CaptureError(f"nothing was profiled: {how}; for inference loops use --step-on FUNCTION")
    return session
