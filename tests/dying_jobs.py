"""Jobs for tests of worker processes that die (`_workers.surviving_map`): module-level, so a worker process can
import them by name."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def square_or_die(x: int, die_on: int) -> int:
    """x * x, except that the process running it kills itself with SIGKILL (as the out-of-memory killer would)
    when x is `die_on`, and exits with status 3 when x is -die_on."""
    if x == die_on:
        os.kill(os.getpid(), signal.SIGKILL)
    if x == -die_on:
        os._exit(3)
    return x * x


def die_on_seven(x: int) -> int:
    """x * x, except that the process running it kills itself with SIGKILL when x is 7."""
    return square_or_die(x, 7)


_KILLER = """
import functools, importlib, multiprocessing, os, signal
_module = importlib.import_module({module!r})
_real = getattr(_module, {function!r})


@functools.wraps(_real)  # (the same name: a worker process finds it as {module}.{function})
def _killer(path, *args, **kwargs):
    if "kill-me" in str(path) and multiprocessing.parent_process() is not None:  # in a worker process only
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    return _real(path, *args, **kwargs)


setattr(_module, {function!r}, _killer)
"""


def killer_env(site: Path, module: str, function: str) -> dict[str, str]:
    """The environment of a command whose every process (the command, its workers) imports a sitecustomize from
    `site` that replaces `module.function(path, …)` by one that, in a worker process, kills that process with
    SIGKILL when the path holds "kill-me"."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(_KILLER.format(module=module, function=function))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
