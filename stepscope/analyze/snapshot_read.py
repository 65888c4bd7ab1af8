"""Reading CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot` pickles) into tables.

Formats read: the legacy bare list of segments; dicts with `segments` and `device_traces` (one list of
actions per device), with or without `time_us`, `allocator_settings`, `external_annotations`, frames.
The pickle is read by a streaming plain-data interpreter (`_unpickle.py`, refusing anything that would run
code) that turns device-trace entries into columns as it reads them (`_snapshot_stream.py`): no Python dict
per entry is ever built, and frame text is interned (one row per distinct frame), so what stays in memory
is a few numeric columns plus the small rest of the snapshot (segments, blocks).

- **user frame**: the innermost stack frame of the user's own code (outside torch, Python's standard
  library, `<frozen …>`, C++ and site-packages), else the innermost library frame outside torch: where
  the user's code asked for the memory, e.g. `model.py:54 forward` rather than `einops/_backends.py`.

The analysis of these tables (peak, live blocks, timeline) is `snapshot.py`.
"""

from __future__ import annotations

import gc
import re
import sys
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze._snapshot_columns import EVENT_COLUMNS, DeviceTrace, ResolvedFrames
from stepscope.analyze._snapshot_stream import read_traces
from stepscope.analyze._unpickle import check_binary_pickle, open_pickle
from stepscope.errors import SnapshotFormatError

_NOT_USER = re.compile(
    r"([\\/]torch[\\/]|[\\/]stepscope[\\/]|^<frozen|^<string>|^\?\?$|\.(cpp|cc|h|hpp|cu)$|"
    r"[\\/]lib[\\/]python3\.\d+[\\/](?!site-packages|dist-packages)|[\\/]Lib[\\/](?!site-packages))",
)
_LIBRARY = re.compile(r"[\\/](site|dist)-packages[\\/]")
#: a torch module's own file (torch/nn/modules/linear.py): its forward stands for the layer where the user's
#: model has no forward of its own (nn.TransformerEncoder, nn.Sequential of torch layers)
TORCH_MODULE = re.compile(r"[\\/]torch[\\/]nn[\\/]")
_CHUNK = 65_536  # trace entries converted (and released) at a time
_STACK_CACHE_LIMIT = 200_000  # torch shares one frames list per distinct traceback; bound the cache anyway


_STDLIB_UNDER_LIB = re.compile(r"[\\/][Ll]ib[\\/]([A-Za-z_][A-Za-z0-9_]*)(?:\.py$|[\\/])")


def is_user_frame(filename: str) -> bool:
    """Whether a frame's file is the user's code (not torch, the stdlib, frozen modules or C++).

    The stdlib is recognised by its usual paths (`lib/python3.11/…`, `Lib\\…`) and, for interpreters laid
    out otherwise (uv's `…\\cpython-3.10.19-windows-x86_64-none\\lib\\copy.py`), by a standard module
    name right under a `lib` folder.
    """
    if not filename or _NOT_USER.search(filename) is not None:
        return False
    stdlib = _STDLIB_UNDER_LIB.search(filename)
    return stdlib is None or stdlib.group(1) not in sys.stdlib_module_names


def _frame_rank(filename: str) -> int:
    """2: the user's own code; 1: a library outside torch (site-packages); 0: not a user frame."""
    if not is_user_frame(filename):
        return 0
    return 1 if _LIBRARY.search(filename) else 2


@dataclass(frozen=True, kw_only=True)
class SnapshotTables:
    """A snapshot as tables. `frames` maps frame_id -> 'file:line function'; `events` has one row per trace
    entry in (device, seq) order (the analysis relies on it)."""

    source: str
    format: str
    events: pl.DataFrame
    blocks: pl.DataFrame
    segments: pl.DataFrame
    frames: pl.DataFrame
    allocator_settings: dict[str, Any]


class _Interner:
    """One id per distinct (file, line, function), so frames shared by thousands of entries are stored once.

    `stack(frames)` returns (user frame id, forward frame id) for one stack, cached by the identity of the
    frames list: torch writes one shared list per distinct traceback, so most lookups are cache hits.
    """

    def __init__(self) -> None:
        self.ids: dict[tuple[str, int, str], int] = {}
        self._rank: dict[str, int] = {}
        self._stacks: dict[int, tuple[Any, int | None, int | None]] = {}

    def stack(self, frames: Any) -> tuple[int | None, int | None]:
        if isinstance(frames, ResolvedFrames):  # a frames list the stream reader already interned
            return frames.user, frames.forward
        if not frames:
            return None, None
        hit = self._stacks.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1], hit[2]
        user, forward = self._scan(frames)
        if len(self._stacks) >= _STACK_CACHE_LIMIT:
            self._stacks.clear()
        self._stacks[id(frames)] = (frames, user, forward)  # holding `frames` keeps its id from being reused
        return user, forward

    def resolve(self, frames: Any) -> tuple[int | None, int | None]:
        """`stack` without remembering the list: for the stream reader, which keeps each result itself (and
        would otherwise keep every traceback written out in full alive here)."""
        if isinstance(frames, ResolvedFrames):
            return frames.user, frames.forward
        if not frames:
            return None, None
        return self._scan(frames)

    def _scan(self, frames: Any) -> tuple[int | None, int | None]:
        """The user frame (own code first, else the innermost library frame) and the innermost forward outside
        torch, else the innermost forward of torch's own modules (`TORCH_MODULE`)."""
        own: int | None = None
        library: int | None = None
        forward: int | None = None
        torch_forward: int | None = None  # a model built of torch's own modules has no forward of its own
        for f in frames:
            filename = str(f.get("filename", ""))
            rank = self._rank.get(filename)
            if rank is None:
                rank = self._rank[filename] = _frame_rank(filename)
            if rank == 0:
                if torch_forward is None and f.get("name") == "forward" and TORCH_MODULE.search(filename):
                    torch_forward = self._id(filename, f.get("line"), "forward")
                continue
            if forward is None and f.get("name") == "forward":
                forward = self._id(filename, f.get("line"), "forward")
            if rank == 2 and own is None:
                own = self._id(filename, f.get("line"), f.get("name"))
            elif rank == 1 and library is None:
                library = self._id(filename, f.get("line"), f.get("name"))
            if own is not None and forward is not None:
                break
        return (own if own is not None else library), (forward if forward is not None else torch_forward)

    def _id(self, filename: str, line: Any, name: Any) -> int:
        key = (filename, int(line) if isinstance(line, int) else 0, str(name))
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.ids)
        return found

    def table(self) -> pl.DataFrame:
        rows = [(i, f"{Path(f.replace(chr(92), '/')).name}:{line} {name}", f, line, name)
                for (f, line, name), i in self.ids.items()]
        return pl.DataFrame(rows, schema={"frame_id": pl.Int64, "frame": pl.String, "file": pl.String,
                                          "line": pl.Int64, "function": pl.String}, orient="row")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_snapshot(path: str | Path) -> SnapshotTables:
    """Load a snapshot pickle safely and convert it to tables, streaming the device traces into columns.

    Peak memory is about the final tables plus a memo slot (8 bytes) per pickled object, not the Python
    objects a full unpickle would build (hundreds of bytes per trace entry).
    """
    path = Path(path)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # many fresh acyclic objects (segments, blocks, frames): the cyclic collector would only rescan them
    try:
        return _read_snapshot(path)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read_snapshot(path: Path) -> SnapshotTables:
    interner = _Interner()
    with open_pickle(path) as fh:
        check_binary_pickle(fh, path)
        data = read_traces(fh, path, interner.resolve)
    traces: Any
    settings: Any
    if isinstance(data, list):
        fmt, segments, traces, settings = "legacy segment list", data, [], {}
    elif isinstance(data, dict) and ("segments" in data or "device_traces" in data):
        fmt = "snapshot dict"
        segments = data.get("segments") or []
        traces = data.get("device_traces") or []
        settings = data.get("allocator_settings") or {}
    else:
        raise SnapshotFormatError("not a CUDA memory snapshot (expected segments / device_traces)", path=path)
    if not isinstance(segments, list) or not isinstance(traces, list) or \
            not all(isinstance(t, (list, DeviceTrace)) or t is None for t in traces):
        raise SnapshotFormatError("malformed snapshot: segments and device_traces must be lists", path=path)
    del data  # the lists below are now the only references: emptying them frees the entries
    try:
        events = _events_table(traces, interner)
        blocks, segs = _segment_tables(segments, interner)
    except (AttributeError, TypeError) as exc:
        raise SnapshotFormatError(f"malformed snapshot entry ({exc})", path=path) from None
    del segments, traces
    return SnapshotTables(source=str(path), format=fmt, events=events, blocks=blocks, segments=segs,
                          frames=interner.table(),
                          allocator_settings={k: v for k, v in settings.items() if isinstance(v, (int, float, str,
                                                                                                   bool))}
                          if isinstance(settings, dict) else {})


_EVENT_SCHEMA = {"device": pl.Int64, "seq": pl.Int64, "action": pl.Categorical, "addr": pl.Int64, "size": pl.Int64,
                 "stream": pl.Int64, "time_us": pl.Int64, "frame_id": pl.Int64, "forward_frame_id": pl.Int64,
                 "device_free": pl.Int64}


def _events_table(traces: list[Any], interner: _Interner) -> pl.DataFrame:
    """All devices' trace rows in one table. A streamed trace's columns are used as they are; only several
    devices (or a trace the reader did not stream) cost a copy, one column at a time."""
    parts: list[dict[str, pl.Series]] = []
    rows: list[tuple[int, int]] = []  # (device, entries)
    streamed: set[int] = set()
    for device, trace in enumerate(traces):
        if isinstance(trace, DeviceTrace):
            if id(trace) in streamed:  # the same list twice: the second holds nothing, as when lists were emptied
                continue
            streamed.add(id(trace))
            parts.append(trace.columns())
            rows.append((device, trace.rows))
            continue
        count = 0
        while trace:  # a plain list (a trace the reader did not stream, e.g. one shared by reference)
            chunk = trace[:_CHUNK]
            parts.append(dict(zip(EVENT_COLUMNS, _entries_frame(chunk, interner).get_columns(), strict=True)))
            count += len(chunk)
            del chunk, trace[:_CHUNK]  # release these entries before converting the next chunk
        rows.append((device, count))
    columns = [
        pl.concat([pl.repeat(d, n, dtype=pl.Int64, eager=True) for d, n in rows if n]
                  or [pl.Series([], dtype=pl.Int64)]).alias("device"),
        pl.concat([pl.int_range(0, n, dtype=pl.Int64, eager=True) for _, n in rows if n]
                  or [pl.Series([], dtype=pl.Int64)]).alias("seq"),
    ]
    for name in EVENT_COLUMNS:
        pieces = [part.pop(name) for part in parts]
        columns.append(pieces[0] if len(pieces) == 1 else pl.concat(pieces, rechunk=True) if pieces
                       else pl.Series(name, [], dtype=_EVENT_SCHEMA[name]))
        del pieces
    return pl.DataFrame(columns).select(list(_EVENT_SCHEMA))


def _entries_frame(chunk: list[Any], interner: _Interner) -> pl.DataFrame:
    """One chunk of a device trace as columns (one pass per column: cheaper than one loop of appends)."""
    n = len(chunk)

    def values(key: str) -> list[Any]:  # map(dict.get, …) runs in C: no bytecode per entry
        return list(map(dict.get, chunk, repeat(key, n)))

    def ints(key: str) -> pl.Series:  # strict=False: a value that is not an integer becomes null
        return pl.Series(key, values(key), dtype=pl.Int64, strict=False)

    stacks = list(map(interner.stack, values("frames")))

    return pl.DataFrame({
        "action": pl.Series("action", values("action"), dtype=pl.String, strict=False).cast(pl.Categorical),
        "addr": ints("addr"), "size": ints("size"), "stream": ints("stream"), "time_us": ints("time_us"),
        "frame_id": pl.Series("frame_id", [s[0] for s in stacks], dtype=pl.Int64),
        "forward_frame_id": pl.Series("forward_frame_id", [s[1] for s in stacks], dtype=pl.Int64),
        "device_free": ints("device_free"),
    })


def _segment_tables(segments: list[Any], interner: _Interner) -> tuple[pl.DataFrame, pl.DataFrame]:
    seg_rows: list[tuple[Any, ...]] = []
    block_rows: list[tuple[Any, ...]] = []
    for s in segments:
        device = _int(s.get("device")) or 0
        address = _int(s.get("address"))
        seg_rows.append((device, address, _int(s.get("total_size")), _int(s.get("allocated_size")),
                         _int(s.get("active_size")), _int(s.get("stream")), str(s.get("segment_type", "")),
                         bool(s.get("is_expandable", False))))
        offset = address or 0
        for b in s.get("blocks") or []:
            frames = b.get("frames")
            if not frames and b.get("history"):  # older snapshots keep the allocation stack in history
                frames = (b["history"][-1] or {}).get("frames")
            size = _int(b.get("size")) or 0
            user, forward = interner.stack(frames)
            block_rows.append((device, address, _int(b.get("address")) or offset, size,
                               _int(b.get("requested_size")), str(b.get("state", "")), user, forward))
            offset += size
    segs = pl.DataFrame(seg_rows, schema={"device": pl.Int64, "address": pl.Int64, "total_bytes": pl.Int64,
                                          "allocated_bytes": pl.Int64, "active_bytes": pl.Int64,
                                          "stream": pl.Int64, "segment_type": pl.String,
                                          "is_expandable": pl.Boolean}, orient="row")
    blocks = pl.DataFrame(block_rows, schema={"device": pl.Int64, "segment_address": pl.Int64, "address": pl.Int64,
                                              "size": pl.Int64, "requested_size": pl.Int64, "state": pl.String,
                                              "frame_id": pl.Int64, "forward_frame_id": pl.Int64}, orient="row")
    return blocks, segs
