"""The stream reader's fast path over bytes: templates that match a run of trace entries, and a numpy walk
that decodes their values at once (see `_snapshot_stream` for when it applies).

After the first few entries, every entry of a protocol-4/5 trace has the same bytes around its values: its
keys are memo references (BINGET) in the same order. One compiled pattern per key order (a *template*) finds
a run of such entries in one call; a walk over their bytes then finds each value (its opcode fixes its
length) and decodes the columns at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from stepscope.analyze._snapshot_columns import INT_FIELDS, BoolArray, Int64Array

_MAX_PAIRS: Final = 16  # an entry with more keys than this takes the general path
UInt8Array = npt.NDArray[np.uint8]
ObjectArray = npt.NDArray[np.object_]


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
ROLES: Final = frozenset((*INT_FIELDS, "action", "frames"))
_ROLE_VALUE: Final = {**{f: _INT + rb"|N" for f in INT_FIELDS}, "action": _REF + b"|" + _STR,
                      "frames": b"|".join((_REF, _LIST, b"N"))}  # what each field takes on the fast path
_ONE_KEY = re.compile(_REF, re.S)
_ONE_VALUE = re.compile(_VALUE, re.S)
_LIST_REFS = re.compile(rb"h(.)|j(....)", re.S)  # the memo references inside a new list

# opcodes
BINGET, LONG_BINGET, SHORT_BINUNICODE, EMPTY_LIST, _NONE, _BININT, _LONG1 = 0x68, 0x6A, 0x8C, 0x5D, 0x4E, 0x4A, 0x8A
ENTRY_SLOT: Final = 0x7D  # EMPTY_DICT: the entry's own memo slot in a batch's slot table
# bytes a value takes, by its opcode (0: read from the value: LONG1, SHORT_BINUNICODE, EMPTY_LIST)
_WIDTH: Final = np.zeros(256, dtype=np.int64)
for _op, _width in {0x68: 2, 0x6A: 5, 0x4B: 2, 0x4D: 3, 0x4A: 5, 0x4E: 1, 0x88: 1, 0x89: 1, 0x47: 9}.items():
    _WIDTH[_op] = _width
_LOW_BYTES: Final = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
_SIGN_BIT: Final = np.array([0] + [1 << (8 * n - 1) for n in range(1, 9)], dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class Template:
    """Entries whose keys are these memo references, in this order; `roles[i]`: the field of value i or ''.

    `pattern` matches one whole entry (first group), after an "e(" where one APPENDS batch of the trace
    ends and the next one's MARK begins, or else the rest of the region (second group).
    """

    pattern: re.Pattern[bytes]
    keys: tuple[bytes, ...]
    roles: tuple[str, ...]


def make_template(keys: tuple[bytes, ...], roles: tuple[str, ...]) -> Template:
    body = b"".join(re.escape(key) + b"(?:" + _ROLE_VALUE.get(role, _VALUE) + b")"
                    for key, role in zip(keys, roles, strict=True))
    return Template(pattern=re.compile(rb"((?:e\()?\}\x94\(" + body + rb"u)|(.+)", re.S), keys=keys, roles=roles)


def entry_keys(buf: bytes, start: int, end: int) -> tuple[bytes, ...] | None:
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


def ref_index(token: bytes) -> int:
    return token[1] if token[0] == BINGET else int.from_bytes(token[1:5], "little")


def list_refs(token: bytes) -> list[int]:
    """The memo indices a new list token appends: `]\x94` (empty), `]\x94 ref a`, `]\x94 ( ref… e`."""
    if len(token) <= 2:
        return []
    body = token[3:-1] if token[2] == 0x28 else token[2:-1]
    return [ord(short) if short else int.from_bytes(long, "little") for short, long in _LIST_REFS.findall(body)]


# ------------------------------------------------------------------------------------------ batch walk

@dataclass(frozen=True, slots=True)
class Walk:
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


def walk_entries(entries: tuple[bytes, ...], keys: tuple[bytes, ...]) -> Walk | None:
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
        text = op == SHORT_BINUNICODE
        size[text] = 3 + data[cursor[text] + 1]
        lists = op == EMPTY_LIST
        if lists.any():
            size[lists] = _list_widths(data, cursor[lists])
        ops[:, j], at[:, j], width[:, j] = op, cursor, size
        cursor = cursor + size
    if not np.array_equal(cursor + 1, ends):  # each entry ends with SETITEMS after its last value
        return None
    return Walk(raw=raw, data=data, ops=ops, at=at, width=width, size=int(ends[-1]))


def _list_widths(data: UInt8Array, at: Int64Array) -> Int64Array:
    """Bytes of each new-list value: `]\x94` alone, `]\x94 ref a`, or `]\x94 ( ref… e`."""
    after = data[at + 2]
    ref_width = np.where(after == BINGET, 2, 5)
    single = ((after == BINGET) | (after == LONG_BINGET)) & (data[at + 2 + ref_width] == 0x61)  # APPEND
    width = np.where(single, 3 + ref_width, 2)
    marked = after == 0x28  # MARK: references up to APPENDS
    pos = at[marked] + 3
    while True:
        step = np.where(data[pos] == BINGET, 2, np.where(data[pos] == LONG_BINGET, 5, 0))
        if not step.any():
            break
        pos = pos + step
    width[marked] = pos + 1 - at[marked]
    return width


def ref_indices(walk: Walk) -> Int64Array:
    """The memo index of each BINGET / LONG_BINGET value (0 elsewhere)."""
    refs = np.zeros(walk.ops.shape, dtype=np.int64)
    short = walk.ops == BINGET
    refs[short] = walk.data[walk.at[short] + 1]
    long = walk.ops == LONG_BINGET
    refs[long] = (walk.words(walk.at[long] + 1) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return refs


def decode_ints(walk: Walk, columns: list[int]) -> tuple[Int64Array, BoolArray]:
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


def object_array(items: list[Any]) -> npt.NDArray[np.object_]:
    """A 1-d object array of these items (np.array would turn lists among them into a second dimension)."""
    return np.fromiter(items, dtype=object, count=len(items))


@dataclass(frozen=True, slots=True)
class Batch:
    """A fast batch decoded and checked: its bytes, the memo slots it makes, actions, integer fields, stack ids."""

    size: int
    new_slots: list[Any]
    actions: list[str | None]
    ints: dict[str, tuple[Int64Array, BoolArray]]
    sids: Int64Array
