"""A streaming interpreter for plain-data pickles: snapshots are data, never code.

A CUDA allocator snapshot is a pickle of plain dicts, lists, tuples, strings and numbers. `PlainUnpickler`
runs the opcodes such pickles use (protocols 0-5: containers, ints, floats, str, bytes, None/bools, the
memo, frames) over the file read in bounded pieces. Any opcode that would import or call something (a
global such as os.system, REDUCE, BUILD, persistent ids, extension codes) is refused before anything is
built; truncation and corruption are one-line `SnapshotFormatError`s naming the file.

Subclasses decide what an empty list or dict becomes and what appending to it does (`_new_list`,
`_on_empty_dict`, `_extend`): the snapshot reader uses that to stream device-trace entries into columns
instead of building a dict per entry.

    \\x80\\x04 ] ( K\\x01 K\\x02 e .   (PROTO 4, EMPTY_LIST, MARK, BININT1 1, BININT1 2, APPENDS, STOP)  ->  [1, 2]
"""

from __future__ import annotations

import codecs
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final, NoReturn

from stepscope.errors import InputError, SnapshotFormatError

PIECE_BYTES: Final = 1 << 20  # the file is read this much at a time (never whole, never mapped)
_MAX_READ: Final = 1 << 26  # one read never asks for more than this, whatever length a corrupt opcode claims
_SLACK: Final = 16  # bytes every opcode's fixed-size argument fits in
_MEMO_GAP_LIMIT: Final = 1 << 20  # a PUT this far past the memo's end is corruption, not a pickle

# Opcodes that import or call: refused with the same message wherever they appear.
_CODE_OPCODES: Final = {
    ord("R"): "REDUCE", ord("b"): "BUILD", ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX",
    ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
}
# Bytes of fixed-size argument after each opcode (for telling truncation from corruption at the file's end).
_ARG_BYTES: Final = {ord("J"): 4, ord("K"): 1, ord("M"): 2, ord("h"): 1, ord("j"): 4, ord("q"): 1, ord("r"): 4,
                     ord("G"): 8, 0x80: 1, 0x95: 8, 0x8a: 1, 0x8b: 4, 0x8c: 1, ord("X"): 4, 0x8d: 8, ord("B"): 4,
                     ord("C"): 1, 0x8e: 8, 0x96: 8, ord("T"): 4, ord("U"): 1}


class _Missing:
    """A memo slot that no PUT filled (the memo had a gap): reading it is corruption."""


_MISSING: Final = _Missing()


class _Truncated(Exception):
    """The file ended inside an opcode."""


class PlainUnpickler:
    """Interprets one plain-data pickle from an open binary file, `piece_bytes` at a time.

    State a subclass may read: `stack`, `marks` (stack heights at each MARK), `memo` (a list; MEMOIZE
    appends), `buf` (the bytes in hand, `data_end` of them real), `base` (file offset of `buf[0]`) and
    `frame_end` (file offset where the current protocol-4 frame ends, None outside frames).
    """

    def __init__(self, fh: IO[bytes], path: Path, *, piece_bytes: int = PIECE_BYTES) -> None:
        self.path = path
        self._fh = fh
        self._piece = max(piece_bytes, 1)
        self.buf = b""
        self.data_end = 0
        self.base = 0
        self.eof = False
        self.frame_end: int | None = None
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: list[Any] = []
        self._strings: dict[str, str] = {}  # one object per distinct string: repeated texts share it
        try:
            self._size: int | None = os.fstat(fh.fileno()).st_size
        except (AttributeError, OSError, ValueError):  # not a real file (BytesIO in tests): lengths checked as read
            self._size = None

    # ------------------------------------------------------------------------------------------ hooks

    def _new_list(self) -> Any:
        """The object EMPTY_LIST pushes."""
        return []

    def _extend(self, target: Any, items: list[Any]) -> None:
        """APPEND(S) onto something that is not a plain list (a list subclass, or a subclass's builder)."""
        extend = getattr(target, "extend", None)
        if extend is None:
            raise TypeError(f"APPENDS on a {type(target).__name__}")
        extend(items)

    _dict_hooks: tuple[type, ...] = ()  # EMPTY_DICT going into a container of these types calls _on_empty_dict

    def _on_empty_dict(self, pos: int) -> int:
        """Run EMPTY_DICT (its opcode byte is at `pos - 1`) going into a `_dict_hooks` container; returns where
        interpretation goes on."""
        self.stack.append({})
        return pos

    def _memo_overwritten(self) -> None:
        """A PUT replaced a memo slot that was already filled (never in pickles Python writes)."""

    # ------------------------------------------------------------------------------------------ reading

    def _refill(self, pos: int, need: int) -> tuple[bytes, int]:
        """Drop what is consumed and read on until `need` bytes from `pos` are in hand (or the file ends)."""
        rest = self.buf[pos:self.data_end]
        self.base += pos
        if self._size is not None and self.base + need > self._size:
            raise _Truncated
        parts = [rest]
        have = len(rest)
        while have < need + _SLACK and not self.eof:
            chunk = self._fh.read(min(max(self._piece, need + _SLACK - have), _MAX_READ))
            if not chunk:
                self.eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self.data_end = len(data)
        self.buf = data + bytes(_SLACK) if self.eof else data  # zero padding: fixed-size reads never fail
        if have < need:
            raise _Truncated
        return self.buf, 0

    def _limit(self) -> int:
        """The last position from which an opcode and its fixed-size argument are surely in hand."""
        return self.data_end - 1 if self.eof else self.data_end - _SLACK

    def _readline(self, pos: int) -> tuple[bytes, int, bytes]:
        """A protocol-0 argument line (without its newline), and the buffer and position after it."""
        buf = self.buf
        while True:
            nl = buf.find(b"\n", pos, self.data_end)
            if nl >= 0:
                return buf[pos:nl], nl + 1, buf
            if self.eof:
                raise _Truncated
            buf, pos = self._refill(pos, self.data_end - pos + 1)

    # ------------------------------------------------------------------------------------------ refusals

    def _refuse(self, what: str) -> NoReturn:
        raise SnapshotFormatError(
            f"refusing to load {what}: a memory snapshot holds only plain data, and this pickle asks to run code",
            path=self.path)

    # ------------------------------------------------------------------------------------------ the loop

    def load(self) -> Any:
        """Interpret the pickle and return its top-level object."""
        try:
            return self._run()
        except _Truncated:
            raise SnapshotFormatError("truncated pickle (the file ends early)", path=self.path) from None
        except (IndexError, KeyError, ValueError, TypeError, AttributeError, OverflowError, struct.error,
                MemoryError) as exc:
            op, op_pos = self._last_op
            if self.eof and op_pos + 1 + _ARG_BYTES.get(op, 0) > self.data_end:
                raise SnapshotFormatError("truncated pickle (the file ends early)", path=self.path) from None
            raise SnapshotFormatError(f"corrupt pickle ({type(exc).__name__}: {exc})", path=self.path,
                                      offset=self.base + op_pos) from None

    _last_op: tuple[int, int] = (0, 0)

    # Long on purpose: one loop over the opcodes with one flat if/elif dispatch, its state in locals. It runs
    # once per opcode (millions per snapshot), and splitting it into handler methods would add a call and
    # attribute lookups to each; the refusals of code-running opcodes sit in the same chain, so every opcode
    # is checked in one place.
    def _run(self) -> Any:
        stack = self.stack
        marks = self.marks
        memo = self.memo
        append = stack.append
        strings = self._strings
        hooked = self._dict_hooks
        buf, pos = self._refill(0, 0)
        limit = self._limit()
        from_bytes = int.from_bytes
        op_pos = 0
        op = 0
        try:
            while True:
                if pos > limit:
                    if self.eof and pos >= self.data_end:
                        raise _Truncated
                    buf, pos = self._refill(pos, 1)
                    limit = self._limit()
                op_pos = pos
                op = buf[pos]
                pos += 1
                if op == 0x94:  # MEMOIZE
                    memo.append(stack[-1])
                elif op == 0x68:  # BINGET
                    value = memo[buf[pos]]
                    if value is _MISSING:
                        raise KeyError(f"memo value not found at index {buf[pos]}")
                    append(value)
                    pos += 1
                elif op == 0x6A:  # LONG_BINGET
                    index = from_bytes(buf[pos:pos + 4], "little")
                    value = memo[index]
                    if value is _MISSING:
                        raise KeyError(f"memo value not found at index {index}")
                    append(value)
                    pos += 4
                elif op == 0x8C:  # SHORT_BINUNICODE
                    end = pos + 1 + buf[pos]
                    if end > self.data_end:
                        op_pos -= pos  # op_pos stays relative to buf, which now starts at pos (errors name it)
                        buf, pos = self._refill(pos, end - pos)
                        limit = self._limit()
                        end = pos + 1 + buf[pos]
                    text = buf[pos + 1:end].decode("utf-8", "surrogatepass")
                    append(strings.setdefault(text, text))
                    pos = end
                elif op == 0x4B:  # BININT1
                    append(buf[pos])
                    pos += 1
                elif op == 0x4D:  # BININT2
                    append(buf[pos] | buf[pos + 1] << 8)
                    pos += 2
                elif op == 0x4A:  # BININT
                    append(from_bytes(buf[pos:pos + 4], "little", signed=True))
                    pos += 4
                elif op == 0x8A:  # LONG1
                    end = pos + 1 + buf[pos]
                    if end > self.data_end:
                        op_pos -= pos  # op_pos stays relative to buf, which now starts at pos (errors name it)
                        buf, pos = self._refill(pos, end - pos)
                        limit = self._limit()
                        end = pos + 1 + buf[pos]
                    append(from_bytes(buf[pos + 1:end], "little", signed=True))
                    pos = end
                elif op == 0x28:  # MARK
                    marks.append(len(stack))
                elif op == 0x75:  # SETITEMS
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    if len(items) % 2:
                        raise ValueError("odd number of items for SETITEMS")
                    target = stack[-1]
                    if not isinstance(target, dict):
                        raise TypeError(f"SETITEMS on a {type(target).__name__}")
                    target.update(zip(items[::2], items[1::2], strict=True))
                elif op == 0x7D:  # EMPTY_DICT
                    if hooked and ((marks and marks[-1] and type(stack[marks[-1] - 1]) in hooked)
                                   or (stack and type(stack[-1]) in hooked)):
                        pos = self._on_empty_dict(pos)
                    else:
                        append({})
                elif op == 0x5D:  # EMPTY_LIST
                    append(self._new_list())
                elif op == 0x65:  # APPENDS
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    target = stack[-1]
                    if type(target) is list:
                        target.extend(items)
                    else:
                        self._extend(target, items)
                elif op == 0x4E:  # NONE
                    append(None)
                elif op == 0x88:  # NEWTRUE
                    append(True)
                elif op == 0x89:  # NEWFALSE
                    append(False)
                elif op == 0x73:  # SETITEM
                    value = stack.pop()
                    key = stack.pop()
                    target = stack[-1]
                    if not isinstance(target, dict):
                        raise TypeError(f"SETITEM on a {type(target).__name__}")
                    target[key] = value
                elif op == 0x61:  # APPEND
                    value = stack.pop()
                    target = stack[-1]
                    if type(target) is list:
                        target.append(value)
                    else:
                        self._extend(target, [value])
                elif op == 0x95:  # FRAME
                    self.frame_end = self.base + pos + 8 + from_bytes(buf[pos:pos + 8], "little")
                    pos += 8
                elif op == 0x29:  # EMPTY_TUPLE
                    append(())
                elif op == 0x85:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif op == 0x86:  # TUPLE2
                    second = stack.pop()
                    stack[-1] = (stack[-1], second)
                elif op == 0x87:  # TUPLE3
                    third = stack.pop()
                    second = stack.pop()
                    stack[-1] = (stack[-1], second, third)
                elif op == 0x74:  # TUPLE
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    append(tuple(items))
                elif op == 0x47:  # BINFLOAT
                    append(struct.unpack(">d", buf[pos:pos + 8])[0])
                    pos += 8
                elif op == 0x2E:  # STOP
                    if not stack:
                        raise IndexError("STOP with an empty stack")
                    return stack.pop()
                elif op == 0x80:  # PROTO
                    if buf[pos] > 5:
                        raise ValueError(f"unsupported pickle protocol: {buf[pos]}")
                    pos += 1
                elif op in (0x71, 0x72, 0x70):  # BINPUT, LONG_BINPUT, PUT
                    if op == 0x71:
                        index = buf[pos]
                        pos += 1
                    elif op == 0x72:
                        index = from_bytes(buf[pos:pos + 4], "little")
                        pos += 4
                    else:
                        base = self.base
                        line, pos, buf = self._readline(pos)
                        op_pos -= self.base - base  # a refill moved buf on
                        limit = self._limit()
                        index = _memo_index(line)
                    self._put(index, stack[-1])
                elif op == 0x67:  # GET
                    base = self.base
                    line, pos, buf = self._readline(pos)
                    op_pos -= self.base - base  # a refill moved buf on
                    limit = self._limit()
                    index = _memo_index(line)
                    value = memo[index]
                    if value is _MISSING:
                        raise KeyError(f"memo value not found at index {index}")
                    append(value)
                elif op in _VARIABLE_PAYLOAD:
                    width, signed, make = _VARIABLE_PAYLOAD[op]
                    size = from_bytes(buf[pos:pos + width], "little", signed=signed)
                    if size < 0:
                        raise ValueError("negative byte count")
                    pos += width
                    if pos + size > self.data_end:
                        op_pos -= pos  # as above
                        buf, pos = self._refill(pos, size)
                        limit = self._limit()
                    value = make(buf[pos:pos + size])
                    append(strings.setdefault(value, value) if type(value) is str else value)
                    pos += size
                elif op == 0x8F:  # EMPTY_SET
                    append(set())
                elif op == 0x90:  # ADDITEMS
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    target = stack[-1]
                    if not isinstance(target, set):
                        raise TypeError(f"ADDITEMS on a {type(target).__name__}")
                    target.update(items)
                elif op == 0x91:  # FROZENSET
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    append(frozenset(items))
                elif op == 0x30:  # POP
                    if marks and marks[-1] == len(stack):
                        marks.pop()
                    else:
                        stack.pop()
                elif op == 0x31:  # POP_MARK
                    del stack[marks.pop():]
                elif op == 0x32:  # DUP
                    append(stack[-1])
                elif op == 0x6C:  # LIST
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    append(items)
                elif op == 0x64:  # DICT
                    mark = marks.pop()
                    items = stack[mark:]
                    del stack[mark:]
                    if len(items) % 2:
                        raise ValueError("odd number of items for DICT")
                    append(dict(zip(items[::2], items[1::2], strict=True)))
                elif op in _TEXT_VALUES:
                    base = self.base
                    line, pos, buf = self._readline(pos)
                    op_pos -= self.base - base  # a refill moved buf on
                    limit = self._limit()
                    value = _TEXT_VALUES[op](line)
                    append(strings.setdefault(value, value) if type(value) is str else value)
                elif op == 0x63 or op == 0x69:  # GLOBAL, INST: "module\nname\n"
                    module_line, pos, buf = self._readline(pos)
                    name_line, pos, buf = self._readline(pos)
                    self._refuse(f"{module_line.decode('utf-8', 'replace')}.{name_line.decode('utf-8', 'replace')}")
                elif op == 0x93:  # STACK_GLOBAL
                    name = stack.pop() if stack else "?"
                    module = stack.pop() if stack else "?"
                    self._refuse(f"{module}.{name}")
                elif op in _CODE_OPCODES:
                    self._refuse(f"an object built by code ({_CODE_OPCODES[op]})")
                elif op == 0x97 or op == 0x98:  # NEXT_BUFFER, READONLY_BUFFER
                    raise ValueError("the pickle refers to out-of-band buffers, which a file cannot hold")
                else:
                    raise ValueError(f"unknown opcode 0x{op:02x}")
        finally:
            self._last_op = (op, op_pos)

    def _put(self, index: int, value: Any) -> None:
        memo = self.memo
        if index == len(memo):
            memo.append(value)
        elif index < len(memo):
            if memo[index] is not _MISSING:
                self._memo_overwritten()
            memo[index] = value
        elif index - len(memo) > _MEMO_GAP_LIMIT:
            raise ValueError(f"memo index {index} far past the memo's end ({len(memo)})")
        else:
            memo.extend([_MISSING] * (index - len(memo)))
            memo.append(value)


def _memo_index(line: bytes) -> int:
    index = int(line)
    if index < 0:
        raise ValueError(f"negative memo index {index}")
    return index


def _decode_str(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")


def _decode_ascii(data: bytes) -> str:
    # Python 2 str (BINSTRING, SHORT_BINSTRING, STRING): pickle's default encoding='ASCII'
    return data.decode("ascii")


# opcode -> (bytes of length, length signed, constructor)
_VARIABLE_PAYLOAD: Final[dict[int, tuple[int, bool, Callable[[bytes], Any]]]] = {
    ord("X"): (4, False, _decode_str), 0x8D: (8, False, _decode_str),
    ord("C"): (1, False, bytes), ord("B"): (4, False, bytes), 0x8E: (8, False, bytes),
    0x96: (8, False, bytearray), 0x8B: (4, True, lambda data: int.from_bytes(data, "little", signed=True)),
    ord("T"): (4, True, _decode_ascii), ord("U"): (1, False, _decode_ascii),
}


def _text_int(line: bytes) -> int | bool:
    if line == b"00":
        return False
    if line == b"01":
        return True
    return int(line, 0)


def _text_long(line: bytes) -> int:
    return int(line[:-1] if line.endswith(b"L") else line, 0)


def _text_string(line: bytes) -> str:
    if len(line) < 2 or line[0] != line[-1] or line[0] not in b"\"'":
        raise ValueError("the STRING opcode argument must be quoted")
    return _decode_ascii(codecs.escape_decode(line[1:-1])[0])


# protocol 0 opcodes whose argument is one text line
_TEXT_VALUES: Final[dict[int, Callable[[bytes], Any]]] = {
    ord("I"): _text_int, ord("L"): _text_long, ord("F"): lambda line: float(line),
    ord("S"): _text_string, ord("V"): lambda line: line.decode("raw-unicode-escape"),
}


def open_pickle(path: Path) -> IO[bytes]:
    """Open a snapshot pickle for reading; a missing file or a directory is an InputError."""
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise InputError("is a directory, expected a snapshot pickle", path=path) from None
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None


def check_binary_pickle(fh: IO[bytes], path: Path) -> None:
    """Torch writes binary pickles (protocol 2 or later): anything else is not a snapshot."""
    if fh.read(1) != b"\x80":
        raise SnapshotFormatError("not a pickle file (expected a torch.cuda.memory._dump_snapshot pickle)",
                                  path=path)
    fh.seek(0)
