"""The one exception hierarchy; `stepscope.cli.main` maps each class to a one-line message and an exit code."""

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


class SnapshotFormatError(InputError):
    """A CUDA memory snapshot pickle that is malformed or holds something other than plain data."""


class UsageError(StepscopeError):
    """Options that cannot be honoured together, or a request the input cannot answer."""

    exit_code = 2


class CaptureError(StepscopeError):
    """Capture could not run (torch missing, the user's script failed, the output directory is unusable)."""

    exit_code = 3
