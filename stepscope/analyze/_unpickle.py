"""A restricted unpickler: snapshots are data, never code.

A CUDA allocator snapshot is a pickle of plain dicts, lists, tuples, strings and numbers. Any pickle that
asks for a global (a class, a function such as os.system) is refused before anything is built.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, NoReturn

from stepscope.errors import InputError, SnapshotFormatError


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedReader, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> NoReturn:
        raise SnapshotFormatError(
            f"refusing to load {module}.{name}: a memory snapshot holds only plain data, and this pickle "
            "asks to run code", path=self._path)


def load_plain_pickle(path: Path) -> Any:
    """Unpickle a file that may hold only containers and scalars; anything else is a clear error."""
    try:
        with open(path, "rb") as fh:
            if fh.read(1) != b"\x80":
                raise SnapshotFormatError("not a pickle file (expected a torch.cuda.memory._dump_snapshot pickle)",
                                          path=path)
            fh.seek(0)
            return _RestrictedUnpickler(fh, path).load()
    except SnapshotFormatError:
        raise
    except IsADirectoryError:
        raise InputError("is a directory, expected a snapshot pickle", path=path) from None
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except EOFError:
        raise SnapshotFormatError("truncated pickle (the file ends early)", path=path) from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise SnapshotFormatError("truncated pickle (the file ends early)", path=path) from None
        raise SnapshotFormatError(f"corrupt pickle (UnpicklingError: {exc})", path=path) from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError,
            UnicodeDecodeError, OverflowError, MemoryError) as exc:
        raise SnapshotFormatError(f"corrupt pickle ({type(exc).__name__}: {exc})", path=path) from None
