"""The one exception hierarchy; `stepscope.cli.main` maps each class to a one-line message and an exit code.

Exit codes, the same in every command (each class below carries its own as `exit_code`):

    0    done
    1    BatchFailed: a command over many files (ingest, report of a batch, a run's ranks, a dataset) could not
         do some of them; each was reported on stderr in one line (`stepscope: error: PATH: reason`) as it
         failed, the others were done, and the command ends with this code
    2    InputError / UsageError: the command's one input is missing, empty, of no known kind, unreadable
         or of the wrong kind, or options conflict (click's own usage errors are 2 as well); nothing is done
    3    CaptureError
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

from pathlib import Path


class StepscopeError(Exception):
    """Base of every error stepscope reports to a user. The message says what went wrong and what to do."""

    exit_code = 1

    def __init__(self, message: str, *, path: str | Path | None = None, offset: int | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.offset = offset
        self.detail = message
        where = ""
        if self.path is not None:
            where = f"{self.path}"
            if offset is not None:
                where += f" (byte {offset})"
            where += ": "
        super().__init__(where + message)


class InputError(StepscopeError):
    """A file that cannot be read as what it should be (not found, wrong type, corrupt, truncated, empty)."""

    exit_code = 2


class TraceFormatError(InputError):
    """A Chrome trace that is malformed or holds no events."""


class FileChanged(TraceFormatError):
    """The file changed while it was being read: cut short (truncated or rewritten) by another process."""


class SnapshotFormatError(InputError):
    """A CUDA memory snapshot pickle that is malformed or holds something other than plain data."""


class UsageError(StepscopeError):
    """Options that cannot be honoured together, or a request the input cannot answer."""

    exit_code = 2


class BatchFailed(StepscopeError):
    """Some files of a batch failed (each already reported on stderr, one line each); the rest were done."""

    exit_code = 1

    def __init__(self, failed: int, total: int) -> None:
        self.failed = failed
        self.total = total
        super().__init__(f"{failed:,} of {total:,} input{'' if total == 1 else 's'} failed (reported above)")


def failure_line(exc: BaseException, path: str | Path) -> str:
    """The one line a batch prints for a file that failed: the error's own message where it names a file,
    else `path: ExceptionType: message` (first line only)."""
    named = isinstance(exc, StepscopeError) and exc.path is not None
    text = str(exc) if named else f"{path}: {type(exc).__name__}: {exc}"
    return (text.splitlines() or [str(path)])[0]


class CaptureError(StepscopeError):
    """Capture could not run (torch missing, the user's script failed, the output directory is unusable)."""

    exit_code = 3


class ScriptFailed(CaptureError):
    """The profiled script raised, or exited with a non-zero code; exit code 3 like every CaptureError.

    `script_traceback` is the script's error as Python prints it (None for SystemExit, which prints none);
    the capture command writes it to stderr above its one-line message.
    """

    def __init__(self, message: str, *, script_traceback: str | None) -> None:
        super().__init__(message)
        self.script_traceback = script_traceback
