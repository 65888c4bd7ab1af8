"""Stream a CUDA memory snapshot pickle into columns: no Python dict per device-trace entry.

`SnapshotUnpickler` is the plain-data interpreter (`_unpickle.py`) with one difference: the lists inside
the top-level dict's `device_traces` become `DeviceTrace` column builders. Each entry dict in them is
turned into one row of compact columns as soon as it is read, its memo slot keeps a placeholder, and a
frames list is reduced to its (user frame, forward frame) ids. What stays in memory per entry is a few
numeric values and a memo slot (8 bytes), not ~460 bytes of dicts and ints.

Fast path. After the first few entries, every entry in a protocol-4/5 trace has the same bytes around its
values: the keys are memo references (BINGET) in the same order. A compiled pattern per key order (a
*template*) matches a run of such entries at once; their values are decoded column by column (numpy for
the integers, dict lookups for actions and frames). Anything the template does not cover (the first
entries, new strings longer than 255 bytes, an entry cut by a protocol frame or a read piece, a fresh
frame dict, a float where an integer belongs) goes through the general interpreter, one entry at a time,
with the same result.

    } MEMOIZE ( h'action' h'alloc' h'addr' LONG1 ... h'frames' j<memo 4711> u
        -> row (action 'alloc', addr ..., frame_id/forward_frame_id of the frames list in memo slot 4711)
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import chain, repeat
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

from stepscope.analyze._unpickle import _MISSING, PIECE_BYTES, PlainUnpickler
from stepscope.errors import SnapshotFormatError

CHUNK_ROWS: Final = 65_536  # trace rows buffered before they become a polars chunk
INT_FIELDS: Final = ("addr", "size", "stream", "time_us", "device_free")
EVENT_COLUMNS: Final = ("action", "addr", "size", "stream", "time_us", "frame_id", "forward_frame_id", "device_free")
_MAX_PAIRS: Final = 16  # an entry with more keys than this takes the general path
_MAX_TEMPLATES: Final = 8
_UNFRAMED_REGION: Final = 1 << 20  # bytes one fast batch looks at outside protocol-4 frames

StackOf = Callable[[Any], "tuple[int | None, int | None]"]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


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
_NOT_FRESH: Final = object()  # "this value created no memo slot" while interleaving a batch's slots


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


def _int_token(value: int | None) -> bytes:
    """An Int64 cell written as the integer token the fast path reads (LONG1, 8 bytes; NONE for null)."""
    return b"N" if value is None else b"\x8a\x08" + value.to_bytes(8, "little", signed=True)


class _Growing:
    """A numpy column that grows to the trace's length without a second copy of it at the end.

    Capacity is reserved ahead (at least 32 MiB, which malloc maps on its own): pages become resident only
    when rows are written, and the finished column is handed to polars as it is (no concatenation).
    """

    def __init__(self, dtype: type[np.generic]) -> None:
        self._dtype = dtype
        self.data: npt.NDArray[Any] = np.empty((32 << 20) // np.dtype(dtype).itemsize, dtype=dtype)
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
    """One device's trace as columns: rows arrive one at a time (general path) or as batches (fast path).

    Integer fields are kept as their pickle tokens for up to CHUNK_ROWS rows, then decoded all at once
    (numpy works best on long arrays) into growing columns; entries from the general path are written as
    tokens too. Actions become categorical chunks.
    """

    def __init__(self, stacks: StackTable) -> None:
        self._stacks = stacks
        self.rows = 0
        self._action_chunks: list[pl.Series] = []
        self._values = {f: _Growing(np.int64) for f in INT_FIELDS}
        self._valid = {f: _Growing(np.bool_) for f in INT_FIELDS}
        self._stack_ids = _Growing(np.int64)
        self._actions: list[str | None] = []
        self._tokens: dict[str, list[bytes]] = {f: [] for f in INT_FIELDS}
        self._sids: list[int] = []

    def add_entry(self, entry: dict[Any, Any], sid: int) -> None:
        """One entry dict as a row (values converted as the non-strict polars columns of the old reader)."""
        get = entry.get
        action = get("action")
        self._actions.append(action if type(action) is str else _str_or_none(action))
        tokens = self._tokens
        for field in INT_FIELDS:
            value = get(field)
            tokens[field].append(_int_token(value if type(value) is int and _INT64_MIN <= value <= _INT64_MAX
                                            else _int64_or_none(value)))
        self._sids.append(sid)
        self._row_added(1)

    def add_batch(self, actions: list[str | None], tokens: dict[str, tuple[bytes, ...]], sids: list[int]) -> None:
        """Rows the fast path read: integer tokens for the fields the batch's entries have, stack ids."""
        n = len(sids)
        self._actions.extend(actions)
        for field in INT_FIELDS:
            column = tokens.get(field)
            self._tokens[field].extend(column if column is not None else repeat(b"N", n))
        self._sids.extend(sids)
        self._row_added(n)

    def _row_added(self, n: int) -> None:
        self.rows += n
        if len(self._sids) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        """Decode the buffered rows into the columns."""
        if not self._sids:
            return
        self._action_chunks.append(
            pl.Series("action", self._actions, dtype=pl.String, strict=False).cast(pl.Categorical))
        for field in INT_FIELDS:
            values, valid = _decode_ints(self._tokens[field])
            self._values[field].extend(values)
            self._valid[field].extend(valid)
            self._tokens[field] = []
        self._stack_ids.extend(np.array(self._sids, dtype=np.int64))
        self._actions = []
        self._sids = []

    def columns(self) -> dict[str, pl.Series]:
        """The trace's EVENT_COLUMNS (all but device and seq), once every row is in."""
        self.flush()
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
# One value token of the fast path, as protocol 4 writes it (after its first appearance every key is a
# memo reference). Lengths are spelled out per length byte: a regex cannot read a length prefix, so new
# strings are covered up to _MAX_NEW_STRING bytes ('N/A', action names); longer ones take the general path.
_MAX_NEW_STRING: Final = 32
_REF = rb"h.|j...."
_INT = rb"K.|M..|J....|\x8a(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(9)) + b")"
_STR = rb"\x8c(?:" + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(_MAX_NEW_STRING + 1)) + rb")\x94"
_LIST = rb"\]\x94(?:\((?:h.|j....)+e|(?:h.|j....)a)?"
_VALUE = b"(?:" + b"|".join((_REF, _INT, _STR, _LIST, rb"N|\x88|\x89|G.{8}")) + b")"
_ONE_KEY = re.compile(_REF, re.S)
_ONE_VALUE = re.compile(_VALUE, re.S)
_LIST_REFS = re.compile(rb"h(.)|j(....)", re.S)  # the memo references inside a new list

_ROLES: Final = frozenset((*INT_FIELDS, "action", "frames"))
_REF_OPS: Final = (0x68, 0x6A)  # BINGET, LONG_BINGET
_FRESH_OPS: Final = (0x8C, 0x5D)  # SHORT_BINUNICODE, EMPTY_LIST: tokens that fill a memo slot


@dataclass(frozen=True, slots=True)
class _Template:
    """Entries whose keys are these memo references, in this order; `roles[i]`: the field of value i or ''.

    `pattern` matches one entry (after an optional "e(": the end of one APPENDS batch and the MARK of the
    next) with a group per value, or else the rest of the region in its last group.
    """

    pattern: re.Pattern[bytes]
    keys: tuple[bytes, ...]
    roles: tuple[str, ...]


_ROLE_VALUE: Final = {**{f: _INT + rb"|N" for f in INT_FIELDS}, "action": _REF + b"|" + _STR,
                      "frames": b"|".join((_REF, _LIST, b"N"))}  # what each field takes on the fast path


def _template(keys: tuple[bytes, ...], roles: tuple[str, ...]) -> _Template:
    body = b"".join(re.escape(key) + b"(" + _ROLE_VALUE.get(role, _VALUE) + b")"
                    for key, role in zip(keys, roles, strict=True))
    return _Template(pattern=re.compile(rb"(?:(e\()?\}\x94\(" + body + rb"u)|(.+)", re.S), keys=keys, roles=roles)


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
    return token[1] if token[0] == 0x68 else int.from_bytes(token[1:5], "little")


_LOW_BYTES: Final = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_SIGN_BIT: Final = np.array([0] + [1 << (8 * n - 1) for n in range(1, 9)], dtype=np.uint64)


def _decode_ints(tokens: list[bytes]) -> tuple[Int64Array, BoolArray]:
    """Integer tokens (BININT1/2, BININT, LONG1 up to 8 bytes, or NONE) as int64 values and a valid mask.

        K\x05, M\x00\x01, J\xff\xff\xff\xff, \x8a\x02\x00\x80, N  ->  5, 256, -1, -32768, null

    Each token's payload is read as one unaligned little-endian 8-byte word, cut to its width and
    sign-extended: a few passes over the column, no Python per token beyond its length.
    """
    data = np.frombuffer(b"".join(tokens) + bytes(10), dtype=np.uint8)
    lengths = np.frombuffer(bytes(map(len, tokens)), dtype=np.uint8).astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    op = data[starts]
    is_long = op == 0x8A
    width = np.where(is_long, data[starts + 1], lengths - 1)  # payload bytes (NONE: 0)
    words = np.lib.stride_tricks.as_strided(data, shape=(len(data) - 7, 8), strides=(1, 1))
    raw = np.ascontiguousarray(words[starts + 1 + is_long]).view("<u8").ravel() & _LOW_BYTES[width]
    sign = _SIGN_BIT[width]
    negative = ((op == 0x4A) | is_long) & (raw & sign != 0)
    values = np.where(negative, raw | ~_LOW_BYTES[width], raw).view(np.int64)
    return values, op != ord("N")


@dataclass(slots=True)
class _Batch:
    """A fast batch decoded and checked, ready to commit: memo slots, actions, ints, stack ids."""

    rows: int
    new_slots: list[Any]
    actions: list[str | None]
    tokens: dict[str, tuple[bytes, ...]]
    sids: list[int]

    @staticmethod
    def cut(rows: int) -> _Batch:
        """Only the first `rows` rows fit: decode them again on their own."""
        return _Batch(rows, [], [], {}, [])


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
        self._fresh: dict[bytes, Any] = {}  # new-string token -> the string
        self._action_of: dict[bytes, str] = {}  # action token (reference or new string) -> the string
        self._sids: dict[bytes, int] = {}  # frames token naming existing slots -> stack id
        self._resolved_lists: dict[bytes, ResolvedFrames] = {}  # new frames list token -> its memo object
        self._valid_refs: set[bytes] = set()  # memo-reference tokens known to name an existing slot
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
        for cache in (self._templates, self._no_template, self._fresh, self._action_of, self._sids,
                      self._resolved_lists, self._valid_refs):
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
        frame_end = None if self.frame_end is None else self.frame_end - self.base
        end = min(self.data_end, frame_end if frame_end is not None and frame_end > start
                  else start + _UNFRAMED_REGION)
        template = self._template_at(start, end)
        if template is None:
            return start
        rows = template.pattern.findall(self.buf, start, end)
        consumed_end = end - len(rows.pop()[-1]) if rows[-1][-1] else end  # the last "row" is the unmatched rest
        whole = len(rows)
        batch = self._decode(template, rows)
        while batch.rows < len(rows):  # cut before the first row the fast path cannot take, and decode again
            rows = rows[:batch.rows]
            if not rows:
                return start
            batch = self._decode(template, rows)
        if len(rows) < whole:
            keys = sum(map(len, template.keys))
            consumed_end = start + sum(4 + keys + sum(map(len, row[:-1])) for row in rows)
        self.memo.extend(batch.new_slots)
        trace.add_batch(batch.actions, batch.tokens, batch.sids)
        return consumed_end

    def _template_at(self, start: int, end: int) -> _Template | None:
        """The template for the entry at `start` (made from it when its keys are new), if it has the shape."""
        keys = _entry_keys(self.buf, start, end)
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

    def _decode(self, template: _Template, rows: list[tuple[bytes, ...]]) -> _Batch:
        """A batch's columns checked and decoded; `rows` of the result: how many leading rows it may take."""
        n = len(rows)
        cols = list(zip(*rows, strict=True))[1:-1]  # without the optional "e(" and the rest-of-region group
        roles = template.roles
        memo_len = len(self.memo)
        kept = n
        # Frames first and in row order: the interner numbers frames as it first sees them, like the old reader.
        frames_at = roles.index("frames") if "frames" in roles else None
        frames_fresh: list[Any] | None = None
        if frames_at is not None:
            frames_fresh, kept = self._resolve_frames(cols[frames_at], kept, memo_len)
        # The memo slots this batch creates, in order: each entry dict's, then its new strings and lists.
        fresh = [False] * len(cols)
        fresh_columns: list[list[Any]] = []
        for j, (role, col) in enumerate(zip(roles, cols, strict=True)):
            objects = frames_fresh if j == frames_at else None if role in INT_FIELDS else None
            if j != frames_at and role not in INT_FIELDS:
                objects, kept = self._fresh_objects(col, kept, memo_len)
            if objects is not None:
                fresh[j] = True
                fresh_columns.append(objects)
        for role, col in zip(roles, cols, strict=True):
            if role not in INT_FIELDS:
                kept = min(kept, self._refs_exist(col, kept, memo_len, cols, fresh))
        if kept < n:
            return _Batch.cut(kept)
        new_slots = (list(filter(partial(operator.is_not, _NOT_FRESH),
                                 chain.from_iterable(zip(repeat(_ENTRY_SEEN, n), *fresh_columns, strict=True))))
                     if fresh_columns else [_ENTRY_SEEN] * n)

        def lookup(index: int) -> Any:
            return self.memo[index] if index < memo_len else new_slots[index - memo_len]

        actions: list[str | None] = [None] * n
        tokens: dict[str, tuple[bytes, ...]] = {}
        sids: list[int] = [0] * n
        for role, col in zip(roles, cols, strict=True):
            if role == "action":
                values, fit = self._actions(col, lookup, memo_len)
                if fit < n:
                    return _Batch.cut(fit)
                actions = values
            elif role == "frames":
                found, fit = self._frame_sids(col, lookup)
                if fit < n:
                    return _Batch.cut(fit)
                sids = found
            elif role:
                tokens[role] = col  # decoded when the trace cuts a chunk
        return _Batch(n, new_slots, actions, tokens, sids)

    def _resolve_frames(self, col: tuple[bytes, ...], kept: int, memo_len: int) -> tuple[list[Any] | None, int]:
        """Intern each new frames value among the kept rows, in the order rows first show it.

        Returns, per row, the ResolvedFrames a new frames list puts in the memo (None when no row has a new
        list), and the rows kept (fewer when a new list names a slot of this batch).
        """
        known = self._sids
        lists = self._resolved_lists
        memo = self.memo
        rows = col[:kept] if kept < len(col) else col
        any_list = False
        for token in [t for t in dict.fromkeys(rows) if t not in known or t[0] == 0x5D]:
            first = token[0]
            if first == 0x4E:  # None
                known[token] = 0
            elif first == 0x5D:  # a new list of references: the same references are the same frames
                any_list = True
                if token in known:
                    continue
                indices = _list_refs(token)
                if indices and max(indices) >= memo_len:
                    kept = rows.index(token)
                    break
                items = [memo[i] for i in indices]
                user, forward = self._stack_of_checked(items)
                known[token] = self.stacks.sid(user, forward)
                lists[token] = self.stacks.resolved(user, forward, not items)
            elif _ref_index(token) < memo_len:  # a reference into this batch is resolved after the batch's slots
                known[token] = self.stacks.sid(*self._stack_of_checked(memo[_ref_index(token)]))
        if not any_list:
            return None, kept
        return list(map(lists.get, col[:kept], repeat(_NOT_FRESH))), kept

    def _frame_sids(self, col: tuple[bytes, ...], lookup: Callable[[int], Any]) -> tuple[list[int], int]:
        """The stack id of each row's frames; the rows that fit (a reference into this batch must name a new
        frames list: anything else is left to the general path)."""
        known = self._sids
        batch_only: dict[bytes, int] = {}
        for token in set(col).difference(known):
            target = lookup(_ref_index(token))
            if type(target) is not ResolvedFrames:
                return [], col.index(token)
            batch_only[token] = self.stacks.sid(target.user, target.forward)
        get = {**known, **batch_only}.__getitem__ if batch_only else known.__getitem__
        return list(map(get, col)), len(col)

    def _fresh_objects(self, col: tuple[bytes, ...], kept: int, memo_len: int) -> tuple[list[Any] | None, int]:
        """Per row, what a new string or list token puts in the memo (else _NOT_FRESH), or None when no kept
        row has one; and the rows kept."""
        known = self._fresh
        rows = col[:kept] if kept < len(col) else col
        new = [t for t in set(rows) if t[0] == 0x8C or t[0] == 0x5D]
        if not new:
            return None, kept
        lists = False
        for token in new:
            if token[0] == 0x5D:
                lists = True
                if any(i >= memo_len for i in _list_refs(token)):
                    kept = min(kept, rows.index(token))  # names a slot of this batch: the general path does it
            elif token not in known:
                text = token[2:-1].decode("utf-8", "surrogatepass")
                known[token] = self._strings.setdefault(text, text)
        objects = list(map(known.get, col[:kept], repeat(_NOT_FRESH)))
        if lists:  # one list object per slot, as unpickling makes
            for i in range(kept):
                if col[i][0] == 0x5D:
                    objects[i] = [self.memo[j] for j in _list_refs(col[i])]
        return objects, kept

    def _refs_exist(self, col: tuple[bytes, ...], kept: int, memo_len: int, cols: list[tuple[bytes, ...]],
                    fresh: list[bool]) -> int:
        """Rows kept so that each memo reference in `col` names a slot created before it."""
        valid = self._valid_refs
        rows = col[:kept] if kept < len(col) else col
        new = [t for t in set(rows).difference(valid) if t[0] == 0x68 or t[0] == 0x6A]
        if all(_ref_index(t) < memo_len for t in new):
            valid.update(new)
            return kept
        # Rare: a reference to a slot this batch creates. Count the slots row by row to see which are fine.
        slot = memo_len
        for r in range(kept):
            slot += 1  # the entry dict
            for other, has in zip(cols, fresh, strict=True):
                token = other[r]
                if other is col and (token[0] == 0x68 or token[0] == 0x6A) and _ref_index(token) >= slot:
                    return r
                if has and (token[0] == 0x8C or token[0] == 0x5D):
                    slot += 1
        return kept

    def _actions(self, col: tuple[bytes, ...], lookup: Callable[[int], Any],
                 memo_len: int) -> tuple[list[str | None], int]:
        """Each row's action (a memo reference or a new string); the rows that fit (a reference to something
        other than a string is left to the general path, which converts it as the old reader did)."""
        known = self._action_of
        batch_only: dict[bytes, str] = {}
        for token in set(col).difference(known):
            if token[0] == 0x8C:
                text = token[2:-1].decode("utf-8", "surrogatepass")
                known[token] = self._strings.setdefault(text, text)
                continue
            index = _ref_index(token)
            value = lookup(index)
            if type(value) is not str:
                return [], col.index(token)
            (known if index < memo_len else batch_only)[token] = value
        get = {**known, **batch_only}.__getitem__ if batch_only else known.__getitem__
        return list(map(get, col)), len(col)

    def _stack_of_checked(self, frames: Any) -> tuple[int | None, int | None]:
        try:
            return self._stack_of(frames)
        except (AttributeError, TypeError) as exc:
            raise SnapshotFormatError(f"malformed snapshot entry ({exc})", path=self.path) from None


def _list_refs(token: bytes) -> list[int]:
    """The memo indices a new list token appends: `]\x94` (empty), `]\x94 ref a`, `]\x94 ( ref… e`."""
    if len(token) <= 2:
        return []
    body = token[3:-1] if token[2] == 0x28 else token[2:-1]
    return [ord(short) if short else int.from_bytes(long, "little") for short, long in _LIST_REFS.findall(body)]


def read_traces(fh: IO[bytes], path: Path, stack_of: StackOf, *, piece_bytes: int = PIECE_BYTES,
                fast: bool = True) -> Any:
    """The snapshot's top-level object, with each streamed device trace as a DeviceTrace."""
    return SnapshotUnpickler(fh, path, stack_of, piece_bytes=piece_bytes, fast=fast).load()
