"""Imported last by the fork server the worker processes come from (`_workers.worker_context` preloads it):
the fork server's own exit skips Python's shutdown.

The fork server exits once the process that started it has exited (the command), and it holds that command's
stdout and stderr until it does: a pipe reading the command's output (`stepscope report ... | tee log`, a
subprocess with its output captured) ends only then. Its Python shutdown, with polars and matplotlib loaded,
took a quarter to half a second, which such a pipe waited for after the command was done. The fork server has
nothing of its own to flush or clean up (its listening socket's file belongs to the command, which removes it),
so it ends at once instead. Its workers are forked from it and end through `os._exit` already.
"""

from __future__ import annotations

import atexit
import os
import sys


def _in_fork_server() -> bool:
    """Whether this module is being imported by `multiprocessing.forkserver.main` (the fork server's preload)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    main = getattr(forkserver, "main", None)
    code = getattr(main, "__code__", None)
    if code is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _exit_now(pid: int) -> None:
    if os.getpid() != pid:  # a worker forked from the fork server: never here (they end through os._exit)
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if _in_fork_server():
    atexit.register(_exit_now, os.getpid())
