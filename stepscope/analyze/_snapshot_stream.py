"""Stream a CUDA memory snapshot pickle into columns: no Python dict per device-trace entry.

`SnapshotUnpickler` is the plain-data interpreter (`_unpickle.py`) with one difference: the lists inside
the top-level dict's `device_traces` become `DeviceTrace` column builders. Each entry dict in them becomes
one row of numeric columns as soon as it is read, its memo slot keeps a placeholder, and a frames list is
reduced to its (user frame, forward frame) ids (snapshot.py's _Interner). What stays in memory per entry is
~60 bytes of columns and a memo slot (8 bytes), not ~460 bytes of dicts and ints.

Fast path. After the first few entries, every entry of a protocol-4/5 trace has the same bytes around its
values: its keys are memo references (BINGET) in the same order. One compiled pattern per key order (a
*template*) finds a run of such entries in one call; a numpy walk over their bytes then finds each value
(its opcode fixes its length) and decodes the columns at once: integers, memo references to actions and
frames lists, new strings and lists (which fill memo slots, counted in order). Anything a template does
not cover goes through the general interpreter, one entry at a time, with the same result: the first
entries (their keys are new strings), an entry cut by a protocol frame or a read piece, a new frame dict
(`--unshared-frames`), a new string over 32 bytes, a float or a string where an integer belongs.

    } MEMOIZE ( h'action' h'alloc' h'addr' LONG1 … h'frames' j<memo 4711> u
        -> row (action 'alloc', addr …, frame ids of the frames list in memo slot 4711)
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from stepscope.analyze._unpickle import _MISSING, PIECE_BYTES, PlainUnpickler
from stepscope.errors import SnapshotFormatError

INT_FIELDS: Final = ("addr", "size", "stream", "time_us", "device_free")
EVENT_COLUMNS: Final = ("action", "addr", "size", "stream", "time_us", "frame_id", "forward_frame_id", "device_free")
_ACTION_CHUNK: Final = 65_536  # actions are made categorical this many rows at a time
_MAX_PAIRS: Final = 16  # an entry with more keys than this takes the general path
_MAX_TEMPLATES: Final = 8
_UNFRAMED_REGION: Final = 1 << 20  # bytes one fast batch looks at outside protocol-4 frames

StackOf = Callable[[Any], "tuple[int | None, int | None]"]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
UInt8Array = npt.NDArray[np.uint8]
ObjectArray = npt.NDArray[np.object_]


@dataclass(frozen=True, slots=True)
class ResolvedFrames:
    """A frames list already reduced to its user frame id and forward frame id; stands in for it in the memo.

    Falsy when the list was empty, like the list itself.
    """

    user: int | None
    forward: int | None
    empty: bool

    def __bool__(self) -> bool:
        return not self.empty


class _Placeholder:
    """The memo slot of a trace entry dict that was turned into a row (nothing reads it back)."""

    def __repr__(self) -> str:
        return "<trace entry>"


_ENTRY_SEEN: Final = _Placeholder()


class _Entry(dict[Any, Any]):
    """An entry dict the general interpreter is filling; `memo_start`/`memo_end`: the slots it created."""

    __slots__ = ("memo_start", "memo_end")

    def __init__(self, memo_start: int) -> None:
        super().__init__()
        self.memo_start = memo_start
        self.memo_end: int | None = None


class _TraceList(list[Any]):
    """The top-level `device_traces` list: its inner lists stream into DeviceTrace builders."""


class StackTable:
    """Distinct (user frame id, forward frame id) pairs, numbered: trace rows store the number (a stack id)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int | None, int | None], int] = {(None, None): 0}
        self._resolved: dict[tuple[int | None, int | None, bool], ResolvedFrames] = {}
        self._arrays: tuple[Int64Array, BoolArray, Int64Array, BoolArray] | None = None

    def sid(self, user: int | None, forward: int | None) -> int:
        found = self._ids.get((user, forward))
        if found is None:
            found = self._ids[(user, forward)] = len(self._ids)
            self._arrays = None
        return found

    def resolved(self, user: int | None, forward: int | None, empty: bool) -> ResolvedFrames:
        key = (user, forward, empty)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = ResolvedFrames(user, forward, empty)
        return found

    def arrays(self) -> tuple[Int64Array, BoolArray, Int64Array, BoolArray]:
        """user ids, user valid, forward ids, forward valid, indexed by stack id."""
        if self._arrays is None:
            pairs = sorted(self._ids.items(), key=operator.itemgetter(1))
            user = np.array([u if u is not None else 0 for (u, _), _ in pairs], dtype=np.int64)
            forward = np.array([f if f is not None else 0 for (_, f), _ in pairs], dtype=np.int64)
            self._arrays = (user, np.array([u is not None for (u, _), _ in pairs]),
                            forward, np.array([f is not None for (_, f), _ in pairs]))
        return self._arrays


_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


def _int64_or_none(value: Any) -> int | None:
    """A trace value as an Int64 cell, as polars' non-strict conversion reads it (True -> 1, 'x' -> null)."""
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    if value is None:
        return None
    cell: int | None = pl.Series([value], dtype=pl.Int64, strict=False)[0]
    return cell


def _str_or_none(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    cell: str | None = pl.Series([value], dtype=pl.String, strict=False)[0]
    return cell


class _Growing:
    """A numpy column that grows to the trace's length without a second copy of it at the end.

    Room for 4M rows is reserved up front (32 MiB of int64, which malloc maps on its own): pages become
    resident only as rows are written, and the finished column goes to polars as it is (no concatenation).
    """

    def __init__(self, dtype: type[np.generic]) -> None:
        self._dtype = dtype
        self.data: npt.NDArray[Any] = np.empty(1 << 22, dtype=dtype)
        self.rows = 0

    def extend(self, values: npt.NDArray[Any]) -> None:
        end = self.rows + len(values)
        if end > len(self.data):  # rare: more rows than reserved; grow by doubling (one copy of this column)
            grown = np.empty(max(end, 2 * len(self.data)), dtype=self._dtype)
            grown[:self.rows] = self.data[:self.rows]
            self.data = grown
        self.data[self.rows:end] = values
        self.rows = end

    def values(self) -> npt.NDArray[Any]:
        return self.data[:self.rows]


class DeviceTrace:
    """One device's trace as columns: rows arrive one at a time (general path) or in batches (fast path).

    Integer fields and stack ids go straight into growing numpy columns; actions become categorical
    chunks. Rows from the general path wait in small lists until the next batch (or the end) so that the
    order of rows is kept.
    """

    def __init__(self, stacks: StackTable) -> None:
        self._stacks = stacks
        self.rows = 0
        self._values = {f: _Growing(np.int64) for f in INT_FIELDS}
        self._valid = {f: _Growing(np.bool_) for f in INT_FIELDS}
        self._stack_ids = _Growing(np.int64)
        self._action_chunks: list[pl.Series] = []
        self._actions: list[str | None] = []
        self._slow: dict[str, list[int | None]] = {f: [] for f in INT_FIELDS}
        self._slow_sids: list[int] = []

    def add_entry(self, entry: dict[Any, Any], sid: int) -> None:
        """One entry dict as a row (values converted as the non-strict polars columns of the old reader)."""
        get = entry.get
        action = get("action")
        self._actions.append(action if type(action) is str else _str_or_none(action))
        for field in INT_FIELDS:
            value = get(field)
            self._slow[field].append(value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX
                                     else _int64_or_none(value))
        self._slow_sids.append(sid)
        self.rows += 1
        self._chunk_actions()

    def add_batch(self, actions: list[str | None], ints: dict[str, tuple[Int64Array, BoolArray]],
                  sids: Int64Array) -> None:
        """Rows the fast path read: `ints` holds the fields its entries have (the others are null)."""
        self._seal_slow()
        n = len(sids)
        for field in INT_FIELDS:
            values, valid = ints.get(field) or (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_))
            self._values[field].extend(values)
            self._valid[field].extend(valid)
        self._stack_ids.extend(sids)
        self._actions.extend(actions)
        self.rows += n
        self._chunk_actions()

    def _seal_slow(self) -> None:
        if not self._slow_sids:
            return
        for field in INT_FIELDS:
            cells = self._slow[field]
            self._values[field].extend(np.array([0 if c is None else c for c in cells], dtype=np.int64))
            self._valid[field].extend(np.array([c is not None for c in cells], dtype=np.bool_))
            cells.clear()
        self._stack_ids.extend(np.array(self._slow_sids, dtype=np.int64))
        self._slow_sids.clear()

    def _chunk_actions(self, *, last: bool = False) -> None:
        if len(self._actions) >= _ACTION_CHUNK or (last and self._actions):
            self._action_chunks.append(
                pl.Series("action", self._actions, dtype=pl.String, strict=False).cast(pl.Categorical))
            self._actions = []

    def columns(self) -> dict[str, pl.Series]:
        """The trace's EVENT_COLUMNS (all but device and seq), once every row is in."""
        self._seal_slow()
        self._chunk_actions(last=True)
        user, user_valid, forward, forward_valid = self._stacks.arrays()
        sids = self._stack_ids.values()
        columns = {f: _with_nulls(f, self._values[f].values(), self._valid[f].values()) for f in INT_FIELDS}
        columns["frame_id"] = _with_nulls("frame_id", user[sids], user_valid[sids])
        columns["forward_frame_id"] = _with_nulls("forward_frame_id", forward[sids], forward_valid[sids])
        columns["action"] = (pl.concat(self._action_chunks, rechunk=True) if self._action_chunks
                             else pl.Series("action", [], dtype=pl.Categorical))
        return {c: columns[c] for c in EVENT_COLUMNS}


def _with_nulls(name: str, values: Int64Array, valid: BoolArray) -> pl.Series:
    """An Int64 column over `values` (no copy), null where not `valid`."""
    series = pl.Series(name, values, dtype=pl.Int64)
    return series if valid.all() else pl.select(pl.when(pl.Series(valid)).then(series)).to_series().alias(name)


# ------------------------------------------------------------------------------------------ byte patterns
# One value of a fast-path entry, as protocol 4 writes it. A regex cannot read a length prefix, so lengths
# are spelled out per length byte: new strings up to _MAX_NEW_STRING bytes ('N/A', action names), longer
# ones take the general path.
_MAX_NEW_STRING: Final = 32
_REF = rb"h.|j...."
_INT = rb"K.|M..|J....|\x8a(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(9)) + b")"
_STR = rb"\x8c(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(_MAX_NEW_STRING + 1)) + rb")\x94"
_LIST = rb"\]\x94(?:\((?:h.|j....)+e|(?:h.|j....)a)?"
_VALUE = b"(?:" + b"|".join((_REF, _INT, _STR, _LIST, rb"N|\x88|\x89|G.{8}")) + b")"
_ROLES: Final = frozenset((*INT_FIELDS, "action", "frames"))
_ROLE_VALUE: Final = {**{f: _INT + rb"|N" for f in INT_FIELDS}, "action": _REF + b"|" + _STR,
                      "frames": b"|".join((_REF, _LIST, b"N"))}  # what each field takes on the fast path
_ONE_KEY = re.compile(_REF, re.S)
_ONE_VALUE = re.compile(_VALUE, re.S)
_LIST_REFS = re.compile(rb"h(.)|j(....)", re.S)  # the memo references inside a new list

# opcodes
_BINGET, _LONG_BINGET, _SHORT_BINUNICODE, _EMPTY_LIST, _NONE, _BININT, _LONG1 = 0x68, 0x6A, 0x8C, 0x5D, 0x4E, 0x4A, 0x8A
_ENTRY_SLOT: Final = 0x7D  # EMPTY_DICT: the entry's own memo slot in a batch's slot table
# bytes a value takes, by its opcode (0: read from the value: LONG1, SHORT_BINUNICODE, EMPTY_LIST)
_WIDTH: Final = np.zeros(256, dtype=np.int64)
for _op, _width in {0x68: 2, 0x6A: 5, 0x4B: 2, 0x4D: 3, 0x4A: 5, 0x4E: 1, 0x88: 1, 0x89: 1, 0x47: 9}.items():
    _WIDTH[_op] = _width
_LOW_BYTES: Final = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_SIGN_BIT: Final = np.array([0] + [1 << (8 * n - 1) for n in range(1, 9)], dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class _Template:
    """Entries whose keys are these memo references, in this order; `roles[i]`: the field of value i or ''.

    `pattern` matches one whole entry (first group), after an "e(" where one APPENDS batch of the trace
    ends and the next one's MARK begins, or else the rest of the region (second group).
    """

    pattern: re.Pattern[bytes]
    keys: tuple[bytes, ...]
    roles: tuple[str, ...]


def _template(keys: tuple[bytes, ...], roles: tuple[str, ...]) -> _Template:
    body = b"".join(re.escape(key) + b"(?:" + _ROLE_VALUE.get(role, _VALUE) + b")"
                    for key, role in zip(keys, roles, strict=True))
    return _Template(pattern=re.compile(rb"((?:e\()?\}\x94\(" + body + rb"u)|(.+)", re.S), keys=keys, roles=roles)


def _entry_keys(buf: bytes, start: int, end: int) -> tuple[bytes, ...] | None:
    """The key tokens of the entry dict at `start` when it has the fast path's shape, else None.

        } MEMOIZE ( h\x10 K\x05 j\x00\x01\x00\x00 N u  ->  (b"h\x10", b"j\x00\x01\x00\x00")
    """
    if buf[start:start + 3] != b"}\x94(":
        return None
    pos = start + 3
    keys: list[bytes] = []
    while pos < end and len(keys) <= _MAX_PAIRS:
        if buf[pos] == 0x75:  # SETITEMS
            return tuple(keys) or None
        key = _ONE_KEY.match(buf, pos, end)
        value = key and _ONE_VALUE.match(buf, key.end(), end)
        if not key or not value:
            return None
        keys.append(key.group())
        pos = value.end()
    return None


def _ref_index(token: bytes) -> int:
    return token[1] if token[0] == _BINGET else int.from_bytes(token[1:5], "little")


def _list_refs(token: bytes) -> list[int]:
    """The memo indices a new list token appends: `]\x94` (empty), `]\x94 ref a`, `]\x94 ( ref… e`."""
    if len(token) <= 2:
        return []
    body = token[3:-1] if token[2] == 0x28 else token[2:-1]
    return [ord(short) if short else int.from_bytes(long, "little") for short, long in _LIST_REFS.findall(body)]


# ------------------------------------------------------------------------------------------ batch walk

@dataclass(frozen=True, slots=True)
class _Walk:
    """Where each value of each entry of a batch lies: `ops`, `at` (offset in `raw`), `width` are rows x values.

        entries  } MEMOIZE ( h\x05 K\x07 h\x06 M\x00\x01 u | } MEMOIZE ( h\x05 N h\x06 K\x02 u
            -> ops [[K, M], [N, K]], at [[5, 9], [19, 22]], width [[2, 3], [1, 2]]
    """

    raw: bytes
    data: UInt8Array
    ops: UInt8Array
    at: Int64Array
    width: Int64Array
    size: int  # bytes of all the entries

    def words(self, at: Int64Array) -> npt.NDArray[np.uint64]:
        """The little-endian 8-byte word starting at each offset (unaligned reads)."""
        windows = np.lib.stride_tricks.as_strided(self.data, shape=(len(self.data) - 7, 8), strides=(1, 1))
        return np.ascontiguousarray(windows[at]).view("<u8").reshape(at.shape)

    def token(self, row: int, value: int) -> bytes:
        start = int(self.at[row, value])
        return self.raw[start:start + int(self.width[row, value])]

    def distinct_tokens(self, rows: Int64Array, value: int) -> tuple[list[bytes], Int64Array]:
        """The distinct tokens of value column `value` at `rows`, and which one each row holds.

        Cheap when many rows repeat one token (torch writes a new 'N/A' string in every entry).
        """
        at, width = self.at[rows, value], self.width[rows, value]
        which = np.empty(len(rows), dtype=np.int64)
        tokens: list[bytes] = []
        for size in np.unique(width).tolist():
            same = np.flatnonzero(width == size)
            block = self.data[at[same][:, None] + np.arange(size)]
            if (block == block[0]).all():
                distinct, inverse = block[:1], np.zeros(len(same), dtype=np.int64)
            else:
                distinct, inverse = np.unique(block, axis=0, return_inverse=True)
            which[same] = len(tokens) + inverse.ravel()
            tokens.extend(row.tobytes() for row in distinct)
        return tokens, which


def _walk(entries: tuple[bytes, ...], keys: tuple[bytes, ...]) -> _Walk | None:
    """Find every value of every entry: each value's opcode fixes its width (or says where to read it)."""
    n = len(entries)
    raw = b"".join(entries) + bytes(16)
    data = np.frombuffer(raw, dtype=np.uint8)
    lengths = np.fromiter(map(len, entries), dtype=np.int64, count=n)
    ends = np.cumsum(lengths)
    cursor = ends - lengths + 3  # after EMPTY_DICT MEMOIZE MARK
    cursor += 2 * (data[ends - lengths] == 0x65)  # after APPENDS MARK, where a batch of the list ends
    ops = np.empty((n, len(keys)), dtype=np.uint8)
    at = np.empty((n, len(keys)), dtype=np.int64)
    width = np.empty((n, len(keys)), dtype=np.int64)
    for j, key in enumerate(keys):
        cursor = cursor + len(key)
        op = data[cursor]
        size = _WIDTH[op]
        long1 = op == _LONG1
        size[long1] = 2 + data[cursor[long1] + 1]
        text = op == _SHORT_BINUNICODE
        size[text] = 3 + data[cursor[text] + 1]
        lists = op == _EMPTY_LIST
        if lists.any():
            size[lists] = _list_widths(data, cursor[lists])
        ops[:, j], at[:, j], width[:, j] = op, cursor, size
        cursor = cursor + size
    if not np.array_equal(cursor + 1, ends):  # each entry ends with SETITEMS after its last value
        return None
    return _Walk(raw=raw, data=data, ops=ops, at=at, width=width, size=int(ends[-1]))


def _list_widths(data: UInt8Array, at: Int64Array) -> Int64Array:
    """Bytes of each new-list value: `]\x94` alone, `]\x94 ref a`, or `]\x94 ( ref… e`."""
    after = data[at + 2]
    ref_width = np.where(after == _BINGET, 2, 5)
    single = ((after == _BINGET) | (after == _LONG_BINGET)) & (data[at + 2 + ref_width] == 0x61)  # APPEND
    width = np.where(single, 3 + ref_width, 2)
    marked = after == 0x28  # MARK: references up to APPENDS
    pos = at[marked] + 3
    while True:
        step = np.where(data[pos] == _BINGET, 2, np.where(data[pos] == _LONG_BINGET, 5, 0))
        if not step.any():
            break
        pos = pos + step
    width[marked] = pos + 1 - at[marked]
    return width


def _ref_indices(walk: _Walk) -> Int64Array:
    """The memo index of each BINGET / LONG_BINGET value (0 elsewhere)."""
    refs = np.zeros(walk.ops.shape, dtype=np.int64)
    short = walk.ops == _BINGET
    refs[short] = walk.data[walk.at[short] + 1]
    long = walk.ops == _LONG_BINGET
    refs[long] = (walk.words(walk.at[long] + 1) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return refs


def _decode_ints(walk: _Walk, columns: list[int]) -> tuple[Int64Array, BoolArray]:
    """Integer values (BININT1/2, BININT, LONG1 up to 8 bytes, or NONE) of these value columns, and valid.

        K\x05, M\x00\x01, J\xff\xff\xff\xff, \x8a\x02\x00\x80, N  ->  5, 256, -1, -32768, null

    Each payload is read as one unaligned 8-byte word, cut to its width and sign-extended.
    """
    op, at = walk.ops[:, columns], walk.at[:, columns]
    long1 = op == _LONG1
    width = np.where(long1, walk.data[at + 1], walk.width[:, columns] - 1)  # payload bytes (NONE: 0)
    raw = walk.words(at + 1 + long1) & _LOW_BYTES[width]
    negative = ((op == _BININT) | long1) & (raw & _SIGN_BIT[width] != 0)
    return np.where(negative, raw | ~_LOW_BYTES[width], raw).view(np.int64), op != _NONE


def _objects(items: list[Any]) -> npt.NDArray[np.object_]:
    """A 1-d object array of these items (np.array would turn lists among them into a second dimension)."""
    return np.fromiter(items, dtype=object, count=len(items))


@dataclass(frozen=True, slots=True)
class _Batch:
    """A fast batch decoded and checked: its bytes, the memo slots it makes, actions, integer fields, stack ids."""

    size: int
    new_slots: list[Any]
    actions: list[str | None]
    ints: dict[str, tuple[Int64Array, BoolArray]]
    sids: Int64Array


class SnapshotUnpickler(PlainUnpickler):
    """Reads a snapshot pickle; `device_traces` comes back as a list of DeviceTrace builders.

    `stack_of(frames)` -> (user frame id, forward frame id) interns a frames list (snapshot.py's _Interner).
    """

    def __init__(self, fh: IO[bytes], path: Path, stack_of: StackOf, *, piece_bytes: int = PIECE_BYTES,
                 fast: bool = True) -> None:
        super().__init__(fh, path, piece_bytes=piece_bytes)
        self._stack_of = stack_of
        self.stacks = StackTable()
        self._fast_enabled = fast
        self._open: _Entry | None = None  # the last entry dict the general path started
        self._fast_misses = 0  # fast-path attempts in a row that took no entry
        self._skip_fast = 0  # entries to read by the general path before trying the fast path again
        self._templates: dict[tuple[bytes, ...], _Template] = {}  # by key tokens, oldest first
        self._no_template: set[tuple[bytes, ...]] = set()
        self._strings_of: dict[bytes, str] = {}  # new-string token -> the string
        self._frames_of: dict[int, int] = {}  # memo index of a frames value -> stack id
        self._lists_of: dict[bytes, ResolvedFrames] = {}  # new frames-list token -> what its memo slot holds
        self._frames_seen: dict[tuple[Any, ...], dict[Any, Any]] = {}

    # ------------------------------------------------------------------------------------------ recognition

    def _new_list(self) -> Any:
        stack = self.stack
        if len(stack) >= 2 and type(stack[-1]) is str and stack[-1] == "device_traces" and self._at_root_key():
            return _TraceList()
        if self._enclosing(_TraceList) is not None:
            return DeviceTrace(self.stacks)  # APPEND(S) onto it go to _extend
        return []

    def _at_root_key(self) -> bool:
        """Whether the stack top is a key of the pickle's top-level dict (the value comes next)."""
        stack, marks = self.stack, self.marks
        if type(stack[0]) is not dict:
            return False
        return (marks == [1] and len(stack) % 2 == 0) or (not marks and len(stack) == 2)

    def _enclosing(self, kind: type) -> Any:
        """The container of `kind` the next pushed object will go into (after MARK, or by APPEND), if any."""
        stack, marks = self.stack, self.marks
        if marks and marks[-1] > 0 and type(stack[marks[-1] - 1]) is kind:
            return stack[marks[-1] - 1]
        if stack and type(stack[-1]) is kind:
            return stack[-1]
        return None

    _dict_hooks = (DeviceTrace,)

    def _on_empty_dict(self, pos: int) -> int:
        """A trace entry starts: read it, and the ones after it, by the fast path if it can, else as an _Entry."""
        stack, marks = self.stack, self.marks
        trace = self._enclosing(DeviceTrace)
        if self._open is not None and self._open.memo_end is None:
            self._open.memo_end = len(self.memo)
        if self._skip_fast:
            self._skip_fast -= 1
        elif self._fast_enabled and marks and marks[-1] > 0 and stack[marks[-1] - 1] is trace \
                and all(type(e) is _Entry for e in stack[marks[-1]:]):
            for entry in stack[marks[-1]:]:
                self._finish_entry(trace, entry)
            del stack[marks[-1]:]
            after = self._fast(trace, pos - 1)
            if after != pos - 1:
                self._fast_misses = 0
                return after
            # Back off while entries keep missing (a trace of shapes the fast path does not cover): 0, 1, 3, 7 …
            self._skip_fast = min((1 << self._fast_misses) - 1, 255)
            self._fast_misses += 1
        self._open = _Entry(len(self.memo))
        stack.append(self._open)
        return pos

    def _extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is not DeviceTrace:
            super()._extend(target, items)
            return
        for entry in items:
            self._finish_entry(target, entry)

    def _memo_overwritten(self) -> None:
        for cache in (self._templates, self._no_template, self._strings_of, self._frames_of, self._lists_of):
            cache.clear()

    # ------------------------------------------------------------------------------------------ general path

    def _finish_entry(self, trace: DeviceTrace, entry: Any) -> None:
        """An entry the general interpreter built becomes a row; its memo slots shrink to what later reads need."""
        if type(entry) is not _Entry:
            what = "an entry twice" if entry is _ENTRY_SEEN else f"a {type(entry).__name__}, not an entry dict"
            raise SnapshotFormatError(f"malformed snapshot entry (a device trace holds {what})", path=self.path)
        frames = entry.get("frames")
        try:
            user, forward = self._stack_of(frames)
        except (AttributeError, TypeError) as exc:
            raise SnapshotFormatError(f"malformed snapshot entry ({exc})", path=self.path) from None
        trace.add_entry(entry, self.stacks.sid(user, forward))
        memo = self.memo
        end = entry.memo_end if entry.memo_end is not None else len(memo)
        frame_dicts = {id(f) for f in frames if type(f) is dict} if type(frames) is list else set()
        for i in range(entry.memo_start, min(end, len(memo))):
            obj = memo[i]
            if obj is entry:
                memo[i] = _ENTRY_SEEN
            elif obj is frames and type(obj) is list:
                memo[i] = self.stacks.resolved(user, forward, not frames)
            elif type(obj) is dict and id(obj) in frame_dicts:
                memo[i] = self._canonical_frame(obj)
        entry.clear()

    def _canonical_frame(self, frame: dict[Any, Any]) -> dict[Any, Any]:
        """One dict per distinct frame: tracebacks written out in full repeat the same frames."""
        try:
            return self._frames_seen.setdefault(tuple(frame.items()), frame)
        except TypeError:  # an unhashable value: keep this dict as it is
            return frame

    # ------------------------------------------------------------------------------------------ fast path

    def _fast(self, trace: DeviceTrace, start: int) -> int:
        """Entries from `start` (an EMPTY_DICT inside a trace's MARK) that a template matches; returns the end."""
        region, pieces = self._region(start)
        template = self._template_at(region)
        if template is None:
            return start
        entries: tuple[bytes, ...] = next(zip(*template.pattern.findall(region), strict=True))
        if not entries[-1]:  # the rest of the region, after the last entry that matched
            entries = entries[:-1]
        if not entries:  # the keys fit, a value does not (a string where an integer belongs …)
            return start
        batch = self._decode(template, entries)
        while isinstance(batch, int):  # only the first `batch` entries fit: decode them on their own
            if not batch:
                return start
            entries = entries[:batch]
            batch = self._decode(template, entries)
        self.memo.extend(batch.new_slots)
        trace.add_batch(batch.actions, batch.ints, batch.sids)
        return self._resume(pieces, batch.size)

    def _region(self, start: int) -> tuple[bytes, list[tuple[int, int, int | None]]]:
        """The bytes a fast batch may match from `start`: the rest of the current protocol-4 frame and the
        frames right after it, their FRAME headers left out (an entry split by a header is whole again), up
        to _UNFRAMED_REGION bytes; outside frames, that many bytes. Also (offset in the region, offset in
        `buf`, file offset where that frame ends) for each piece."""
        buf, data_end, base = self.buf, self.data_end, self.base
        if self.frame_end is None or self.frame_end - base <= start:
            return buf[start:min(data_end, start + _UNFRAMED_REGION)], [(0, start, None)]
        end = min(self.frame_end - base, data_end)
        pieces: list[tuple[int, int, int | None]] = [(0, start, self.frame_end)]
        parts = [buf[start:end]]
        size = end - start
        while size < _UNFRAMED_REGION and end + 9 <= data_end and buf[end] == 0x95:  # the next FRAME header
            frame_end = end + 9 + int.from_bytes(buf[end + 1:end + 9], "little")
            pieces.append((size, end + 9, base + frame_end))
            parts.append(buf[end + 9:min(frame_end, data_end)])
            size += len(parts[-1])
            end = frame_end
            if end > data_end:
                break
        return b"".join(parts), pieces

    def _resume(self, pieces: list[tuple[int, int, int | None]], consumed: int) -> int:
        """Where in `buf` interpretation goes on after `consumed` bytes of a region (and the frame it is in)."""
        for offset, start, frame_end in reversed(pieces):
            if consumed > offset or offset == 0:
                if offset:  # past FRAME headers the fast path skipped: now inside that frame
                    self.frame_end = frame_end
                return start + consumed - offset
        raise AssertionError("unreachable: the first piece starts at offset 0")

    def _template_at(self, region: bytes) -> _Template | None:
        """The template for the entry the region starts with (made from it when its keys are new), if any."""
        keys = _entry_keys(region, 0, len(region))
        if keys is None or keys in self._no_template:
            return None
        template = self._templates.get(keys)
        if template is not None:
            return template
        memo = self.memo
        names = [memo[i] if i < len(memo) else _MISSING for i in map(_ref_index, keys)]
        roles = tuple(n if type(n) is str and n in _ROLES else "" for n in names)
        fields = [r for r in roles if r]
        if len(set(fields)) < len(fields) or any(n is _MISSING for n in names):
            self._no_template.add(keys)  # a key twice, or a dangling reference: the general path decides
            return None
        if len(self._templates) >= _MAX_TEMPLATES:
            del self._templates[next(iter(self._templates))]
        template = self._templates[keys] = _template(keys, roles)
        return template

    def _decode(self, template: _Template, entries: tuple[bytes, ...]) -> _Batch | int:
        """Decode a batch of entries, or say how many leading ones the fast path can take."""
        walk = _walk(entries, template.keys)
        if walk is None:
            return 0
        n = len(entries)
        memo_len = len(self.memo)
        ops = walk.ops
        fresh = (ops == _SHORT_BINUNICODE) | (ops == _EMPTY_LIST)  # values that fill a memo slot
        is_ref = (ops == _BINGET) | (ops == _LONG_BINGET)
        refs = _ref_indices(walk)
        # The batch's memo slots, in order: each entry dict's own, then its new strings and lists left to right.
        slots_per_row = 1 + fresh.sum(axis=1)
        first_slot = memo_len + np.cumsum(slots_per_row) - slots_per_row
        into_batch = bool(is_ref.any() and refs[is_ref].max() >= memo_len)
        bad = np.zeros(n, dtype=np.bool_)
        if into_batch:  # a reference must name a slot made before it: below the batch, or earlier in it
            made_before = first_slot[:, None] + 1 + np.cumsum(fresh, axis=1) - fresh
            bad |= (is_ref & (refs >= made_before)).any(axis=1)
        slot_ops = np.concatenate([np.full((n, 1), _ENTRY_SLOT, dtype=np.uint8), ops], axis=1)[
            np.concatenate([np.ones((n, 1), dtype=np.bool_), fresh], axis=1)]  # opcode per new slot

        roles = template.roles
        new_objects: dict[int, ObjectArray] = {}  # value column -> the memo object of each row's new value
        for j, role in enumerate(roles):
            if role != "frames" and fresh[:, j].any():
                objects, fits = self._new_objects(walk, j, memo_len)
                new_objects[j] = objects
                bad |= ~fits
        actions: list[str | None] = [None] * n
        if "action" in roles:
            j = roles.index("action")
            actions, fits = self._actions(walk, j, refs[:, j], memo_len, slot_ops, new_objects.get(j))
            bad |= ~fits
        if bad.any():
            return int(np.argmax(bad))
        sids = np.zeros(n, dtype=np.int64)
        if "frames" in roles:  # after every other check: resolving frames interns them, in row order
            j = roles.index("frames")
            sids, lists, fit = self._frames(walk, j, refs[:, j], memo_len, slot_ops)
            if fit < n:
                return fit
            if lists is not None:
                new_objects[j] = _objects(lists)
        ints = {}
        columns = [j for j, role in enumerate(roles) if role in INT_FIELDS]
        if columns:
            values, valid = _decode_ints(walk, columns)
            ints = {roles[j]: (values[:, i], valid[:, i]) for i, j in enumerate(columns)}
        return _Batch(size=walk.size, new_slots=self._slots(fresh, new_objects), actions=actions, ints=ints,
                      sids=sids)

    def _new_objects(self, walk: _Walk, j: int, memo_len: int) -> tuple[ObjectArray, BoolArray]:
        """What each row's new string or (non-frames) list in column j puts in the memo; rows that fit."""
        n = len(walk.ops)
        objects = np.full(n, None, dtype=object)
        fits = np.ones(n, dtype=np.bool_)
        rows = np.flatnonzero(walk.ops[:, j] == _SHORT_BINUNICODE)
        if len(rows):
            tokens, which = walk.distinct_tokens(rows, j)
            objects[rows] = _objects([self._string(token) for token in tokens])[which]
        for r in np.flatnonzero(walk.ops[:, j] == _EMPTY_LIST).tolist():
            indices = _list_refs(walk.token(r, j))
            if indices and max(indices) >= memo_len:  # names a slot of this batch: the general path does it
                fits[r] = False
            else:
                objects[r] = [self.memo[i] for i in indices]  # one list per slot, as unpickling makes
        return objects, fits

    def _string(self, token: bytes) -> str:
        """The string a SHORT_BINUNICODE token holds (one object per distinct text)."""
        found = self._strings_of.get(token)
        if found is None:
            text = token[2:-1].decode("utf-8", "surrogatepass")
            found = self._strings_of[token] = self._strings.setdefault(text, text)
        return found

    def _actions(self, walk: _Walk, j: int, refs: Int64Array, memo_len: int, slot_ops: UInt8Array,
                 new: ObjectArray | None) -> tuple[list[str | None], BoolArray]:
        """Each row's action (a memo reference or a new string); rows that fit (a reference to something other
        than a string is left to the general path, which converts it as the old reader did)."""
        n = len(refs)
        is_ref = (walk.ops[:, j] == _BINGET) | (walk.ops[:, j] == _LONG_BINGET)
        indices, inverse = np.unique(refs[is_ref], return_inverse=True)
        targets: list[Any] = []
        for index in indices.tolist():
            if index < memo_len:
                targets.append(self.memo[index])
            elif slot_ops[index - memo_len] == _SHORT_BINUNICODE:  # a string this batch makes
                targets.append(self._batch_string(walk, slot_ops, index - memo_len))
            else:
                targets.append(None)
        fit_index = np.array([type(t) is str for t in targets], dtype=np.bool_)
        fits = np.ones(n, dtype=np.bool_)
        fits[is_ref] = fit_index[inverse]
        actions = np.empty(n, dtype=object)
        actions[is_ref] = _objects(targets)[inverse]
        if new is not None:
            new_rows = walk.ops[:, j] == _SHORT_BINUNICODE
            actions[new_rows] = new[new_rows]
        return actions.tolist(), fits

    def _batch_string(self, walk: _Walk, slot_ops: UInt8Array, slot: int) -> str:
        """The string a batch's new-string slot holds (slot counted from the batch's first)."""
        per_row = 1 + ((walk.ops == _SHORT_BINUNICODE) | (walk.ops == _EMPTY_LIST)).sum(axis=1)
        row = int(np.searchsorted(np.cumsum(per_row), slot, side="right"))
        within = slot - int(np.cumsum(per_row)[row] - per_row[row]) - 1
        column = np.flatnonzero((walk.ops[row] == _SHORT_BINUNICODE) | (walk.ops[row] == _EMPTY_LIST))[within]
        return self._string(walk.token(row, int(column)))

    def _frames(self, walk: _Walk, j: int, refs: Int64Array, memo_len: int,
                slot_ops: UInt8Array) -> tuple[Int64Array, list[Any] | None, int]:
        """Stack ids of each row's frames, the ResolvedFrames of each new frames list (memo objects), and the
        rows that fit. Frames are interned in the order rows first show them, as the old reader did."""
        n = len(refs)
        op = walk.ops[:, j]
        known = self._frames_of
        sids = np.zeros(n, dtype=np.int64)
        is_ref = (op == _BINGET) | (op == _LONG_BINGET)
        if not (op == _EMPTY_LIST).any():
            indices, first, inverse = np.unique(refs[is_ref], return_index=True, return_inverse=True)
            for index in indices[np.argsort(first)].tolist():
                if index not in known:
                    if index >= memo_len:  # a reference into this batch: only new frames lists (none here)
                        return sids, None, int(np.flatnonzero(is_ref & (refs == index))[0])
                    known[index] = self.stacks.sid(*self._stack_of_checked(self.memo[index]))
            found = [known[index] for index in indices.tolist()]
            sids[is_ref] = np.array(found, dtype=np.int64)[inverse] if found else []
            return sids, None, n
        # New lists among them: walk the rows in order (a reference may name a list an earlier row made).
        lists: list[Any] = [None] * n
        made: dict[int, ResolvedFrames] = {}  # memo index of a list this batch makes -> its ResolvedFrames
        fresh = (walk.ops == _SHORT_BINUNICODE) | (walk.ops == _EMPTY_LIST)
        per_row = 1 + fresh.sum(axis=1)
        frames_slots = (memo_len + np.cumsum(per_row) - per_row + 1 + fresh[:, :j].sum(axis=1)).tolist()
        for r in range(n):
            if op[r] == _EMPTY_LIST:
                token = walk.token(r, j)
                resolved = self._lists_of.get(token)
                if resolved is None:
                    listed = _list_refs(token)
                    if listed and max(listed) >= memo_len:
                        return sids, None, r
                    items = [self.memo[i] for i in listed]
                    user, forward = self._stack_of_checked(items)
                    resolved = self._lists_of[token] = self.stacks.resolved(user, forward, not items)
                lists[r] = made[frames_slots[r]] = resolved
                sids[r] = self.stacks.sid(resolved.user, resolved.forward)
            elif is_ref[r]:
                index = int(refs[r])
                if index >= memo_len:
                    target = made.get(index)
                    if target is None:
                        return sids, None, r
                    sids[r] = self.stacks.sid(target.user, target.forward)
                    continue
                if index not in known:
                    known[index] = self.stacks.sid(*self._stack_of_checked(self.memo[index]))
                sids[r] = known[index]
        return sids, lists, n

    def _slots(self, fresh: BoolArray, new_objects: dict[int, ObjectArray]) -> list[Any]:
        """The batch's new memo slots in order: per row the entry's placeholder, then its new values."""
        n = len(fresh)
        if not new_objects:
            return [_ENTRY_SEEN] * n
        columns = sorted(new_objects)
        table = np.empty((n, 1 + len(columns)), dtype=object)
        table[:, 0] = _ENTRY_SEEN
        for i, column in enumerate(columns):
            table[:, 1 + i] = new_objects[column]
        made = np.concatenate([np.ones((n, 1), dtype=np.bool_), fresh[:, columns]], axis=1)
        return list(table[made])  # row by row, left to right: the order the memo fills in

    def _stack_of_checked(self, frames: Any) -> tuple[int | None, int | None]:
        try:
            return self._stack_of(frames)
        except (AttributeError, TypeError) as exc:
            raise SnapshotFormatError(f"malformed snapshot entry ({exc})", path=self.path) from None


def read_traces(fh: IO[bytes], path: Path, stack_of: StackOf, *, piece_bytes: int = PIECE_BYTES,
                fast: bool = True) -> Any:
    """The snapshot's top-level object, with each streamed device trace as a DeviceTrace."""
    return SnapshotUnpickler(fh, path, stack_of, piece_bytes=piece_bytes, fast=fast).load()
