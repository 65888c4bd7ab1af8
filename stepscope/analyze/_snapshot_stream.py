"""Stream a CUDA memory snapshot pickle into columns: no Python dict per device-trace entry.

`SnapshotUnpickler` is the plain-data interpreter (`_unpickle.py`) with one difference: the lists inside
the top-level dict's `device_traces` become `DeviceTrace` column builders (`_snapshot_columns`). Each entry
dict in them becomes one row of numeric columns as soon as it is read, its memo slot keeps a placeholder, and
a frames list is reduced to its (user frame, forward frame) ids (snapshot_read's _Interner). What stays in
memory per entry is a row of columns and a memo slot (8 bytes), not the dicts and ints of a full unpickle.

Fast path. After the first few entries, every entry of a protocol-4/5 trace has the same bytes around its
values: its keys are memo references (BINGET) in the same order. One compiled pattern per key order (a
*template*) finds a run of such entries in one call; a numpy walk over their bytes (`_snapshot_walk`) then
finds each value (its opcode fixes its length) and decodes the columns at once: integers, memo references to actions and
frames lists, new strings and lists (which fill memo slots, counted in order). Anything a template does
not cover goes through the general interpreter, one entry at a time, with the same result: the first
entries (their keys are new strings), an entry cut by a protocol frame or a read piece, a new frame dict
(`--unshared-frames`), a new string over 32 bytes, a float or a string where an integer belongs.

    } MEMOIZE ( h'action' h'alloc' h'addr' LONG1 … h'frames' j<memo 4711> u
        -> row (action 'alloc', addr …, frame ids of the frames list in memo slot 4711)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import numpy as np

from stepscope.analyze._snapshot_columns import (
    INT_FIELDS,
    BoolArray,
    DeviceTrace,
    Int64Array,
    ResolvedFrames,
    StackTable,
)
from stepscope.analyze._snapshot_walk import (
    BINGET,
    EMPTY_LIST,
    ENTRY_SLOT,
    LONG_BINGET,
    ROLES,
    SHORT_BINUNICODE,
    Batch,
    ObjectArray,
    Template,
    UInt8Array,
    Walk,
    decode_ints,
    entry_keys,
    list_refs,
    make_template,
    object_array,
    ref_index,
    ref_indices,
    walk_entries,
)
from stepscope.analyze._unpickle import _MISSING, PIECE_BYTES, PlainUnpickler
from stepscope.errors import SnapshotFormatError

_MAX_TEMPLATES: Final = 8
_UNFRAMED_REGION: Final = 1 << 20  # bytes one fast batch looks at outside protocol-4 frames

StackOf = Callable[[Any], "tuple[int | None, int | None]"]


class _Placeholder:
    """The memo slot of a trace entry dict that was turned into a row (nothing reads it back).

    Unhashable like the dict it stands for: a pickle that uses an entry as a dict key or set member is refused
    (as a full unpickle refuses it), whether the entry was read on the fast path or the general one."""

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<trace entry>"


_ENTRY_SEEN: Final = _Placeholder()
_FINISHED: Final = -1  # an _Entry's memo_end once it is a row


class _Entry(dict[Any, Any]):
    """An entry dict the general interpreter is filling; `memo_start`/`memo_end`: the slots it created."""

    __slots__ = ("memo_start", "memo_end")

    def __init__(self, memo_start: int) -> None:
        super().__init__()
        self.memo_start = memo_start
        self.memo_end: int | None = None


class _TraceList(list[Any]):
    """The top-level `device_traces` list: its inner lists stream into DeviceTrace builders."""



class SnapshotUnpickler(PlainUnpickler):
    """Reads a snapshot pickle; `device_traces` comes back as a list of DeviceTrace builders.

    `stack_of(frames)` -> (user frame id, forward frame id) interns a frames list (snapshot_read's _Interner).
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
        self._templates: dict[tuple[bytes, ...], Template] = {}  # by key tokens, oldest first
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
        if type(entry) is not _Entry or entry.memo_end == _FINISHED:  # (an entry appended twice in one APPENDS)
            what = ("an entry twice" if entry is _ENTRY_SEEN or type(entry) is _Entry
                    else f"a {type(entry).__name__}, not an entry dict")
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
        entry.memo_end = _FINISHED

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

    def _template_at(self, region: bytes) -> Template | None:
        """The template for the entry the region starts with (made from it when its keys are new), if any."""
        keys = entry_keys(region, 0, len(region))
        if keys is None or keys in self._no_template:
            return None
        template = self._templates.get(keys)
        if template is not None:
            return template
        memo = self.memo
        names = [memo[i] if i < len(memo) else _MISSING for i in map(ref_index, keys)]
        roles = tuple(n if type(n) is str and n in ROLES else "" for n in names)
        fields = [r for r in roles if r]
        if len(set(fields)) < len(fields) or any(type(n) is not str for n in names):
            # a key twice, a dangling reference, or a key not a string (an entry's placeholder, which a dict
            # cannot hold as a key): the general path decides
            self._no_template.add(keys)
            return None
        if len(self._templates) >= _MAX_TEMPLATES:
            del self._templates[next(iter(self._templates))]
        template = self._templates[keys] = make_template(keys, roles)
        return template

    def _decode(self, template: Template, entries: tuple[bytes, ...]) -> Batch | int:
        """Decode a batch of entries, or say how many leading ones the fast path can take."""
        walk = walk_entries(entries, template.keys)
        if walk is None:
            return 0
        n = len(entries)
        memo_len = len(self.memo)
        ops = walk.ops
        fresh = (ops == SHORT_BINUNICODE) | (ops == EMPTY_LIST)  # values that fill a memo slot
        is_ref = (ops == BINGET) | (ops == LONG_BINGET)
        refs = ref_indices(walk)
        # The batch's memo slots, in order: each entry dict's own, then its new strings and lists left to right.
        slots_per_row = 1 + fresh.sum(axis=1)
        first_slot = memo_len + np.cumsum(slots_per_row) - slots_per_row
        into_batch = bool(is_ref.any() and refs[is_ref].max() >= memo_len)
        bad = np.zeros(n, dtype=np.bool_)
        if into_batch:  # a reference must name a slot made before it: below the batch, or earlier in it
            made_before = first_slot[:, None] + 1 + np.cumsum(fresh, axis=1) - fresh
            bad |= (is_ref & (refs >= made_before)).any(axis=1)
        slot_ops = np.concatenate([np.full((n, 1), ENTRY_SLOT, dtype=np.uint8), ops], axis=1)[
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
                new_objects[j] = object_array(lists)
        ints = {}
        columns = [j for j, role in enumerate(roles) if role in INT_FIELDS]
        if columns:
            values, valid = decode_ints(walk, columns)
            ints = {roles[j]: (values[:, i], valid[:, i]) for i, j in enumerate(columns)}
        return Batch(size=walk.size, new_slots=self._slots(fresh, new_objects), actions=actions, ints=ints,
                      sids=sids)

    def _new_objects(self, walk: Walk, j: int, memo_len: int) -> tuple[ObjectArray, BoolArray]:
        """What each row's new string or (non-frames) list in column j puts in the memo; rows that fit."""
        n = len(walk.ops)
        objects = np.full(n, None, dtype=object)
        fits = np.ones(n, dtype=np.bool_)
        rows = np.flatnonzero(walk.ops[:, j] == SHORT_BINUNICODE)
        if len(rows):
            tokens, which = walk.distinct_tokens(rows, j)
            objects[rows] = object_array([self._string(token) for token in tokens])[which]
        for r in np.flatnonzero(walk.ops[:, j] == EMPTY_LIST).tolist():
            indices = list_refs(walk.token(r, j))
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

    def _actions(self, walk: Walk, j: int, refs: Int64Array, memo_len: int, slot_ops: UInt8Array,
                 new: ObjectArray | None) -> tuple[list[str | None], BoolArray]:
        """Each row's action (a memo reference or a new string); rows that fit (a reference to something other
        than a string is left to the general path, which converts it as the old reader did)."""
        n = len(refs)
        is_ref = (walk.ops[:, j] == BINGET) | (walk.ops[:, j] == LONG_BINGET)
        indices, inverse = np.unique(refs[is_ref], return_inverse=True)
        targets: list[Any] = []
        for index in indices.tolist():
            if index < memo_len:
                targets.append(self.memo[index])
            elif slot_ops[index - memo_len] == SHORT_BINUNICODE:  # a string this batch makes
                targets.append(self._batch_string(walk, slot_ops, index - memo_len))
            else:
                targets.append(None)
        fit_index = np.array([type(t) is str for t in targets], dtype=np.bool_)
        fits = np.ones(n, dtype=np.bool_)
        fits[is_ref] = fit_index[inverse]
        actions = np.empty(n, dtype=object)
        actions[is_ref] = object_array(targets)[inverse]
        if new is not None:
            new_rows = walk.ops[:, j] == SHORT_BINUNICODE
            actions[new_rows] = new[new_rows]
        return actions.tolist(), fits

    def _batch_string(self, walk: Walk, slot_ops: UInt8Array, slot: int) -> str:
        """The string a batch's new-string slot holds (slot counted from the batch's first)."""
        per_row = 1 + ((walk.ops == SHORT_BINUNICODE) | (walk.ops == EMPTY_LIST)).sum(axis=1)
        row = int(np.searchsorted(np.cumsum(per_row), slot, side="right"))
        within = slot - int(np.cumsum(per_row)[row] - per_row[row]) - 1
        column = np.flatnonzero((walk.ops[row] == SHORT_BINUNICODE) | (walk.ops[row] == EMPTY_LIST))[within]
        return self._string(walk.token(row, int(column)))

    def _frames(self, walk: Walk, j: int, refs: Int64Array, memo_len: int,
                slot_ops: UInt8Array) -> tuple[Int64Array, list[Any] | None, int]:
        """Stack ids of each row's frames, the ResolvedFrames of each new frames list (memo objects), and the
        rows that fit. Frames are interned in the order rows first show them, as the old reader did."""
        n = len(refs)
        op = walk.ops[:, j]
        known = self._frames_of
        sids = np.zeros(n, dtype=np.int64)
        is_ref = (op == BINGET) | (op == LONG_BINGET)
        if not (op == EMPTY_LIST).any():
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
        fresh = (walk.ops == SHORT_BINUNICODE) | (walk.ops == EMPTY_LIST)
        per_row = 1 + fresh.sum(axis=1)
        frames_slots = (memo_len + np.cumsum(per_row) - per_row + 1 + fresh[:, :j].sum(axis=1)).tolist()
        for r in range(n):
            if op[r] == EMPTY_LIST:
                token = walk.token(r, j)
                resolved = self._lists_of.get(token)
                if resolved is None:
                    listed = list_refs(token)
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
