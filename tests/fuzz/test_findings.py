"""Bugs the fuzz targets (fuzz/) found, each pinned by the smallest input that showed it."""

from __future__ import annotations

import io
import pickle
import pickletools
import sys
from pathlib import Path

import pytest

from stepscope.analyze._unpickle import PlainUnpickler
from stepscope.analyze.snapshot_read import read_snapshot
from stepscope.errors import SnapshotFormatError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analyze"))
from snapshot_builder import entry  # noqa: E402


@pytest.mark.parametrize("piece_bytes", [1 << 20, 3, 7])
def test_a_corrupt_string_is_named_at_its_opcode_whatever_the_read_pieces(piece_bytes: int) -> None:
    # GIVEN a pickle whose BINUNICODE string (at byte 7) is not UTF-8, read in pieces that end inside it
    # (fuzz_unpickle: the offset was the opcode's plus the bytes read before the refill)
    data = b"\x80\x04N0NN0" + b"X\x05\x00\x00\x00ab\xffcd" + b"."
    # WHEN it is read THEN the error names the opcode's offset
    with pytest.raises(SnapshotFormatError, match=r"\(byte 7\): corrupt pickle \(UnicodeDecodeError"):
        PlainUnpickler(io.BytesIO(data), Path("x.pickle"), piece_bytes=piece_bytes).load()


def _memo_of(data: bytes) -> tuple[list[int], dict[str, int]]:
    """The memo indices of the pickle's dicts, and of its strings (each as first memoized)."""
    dicts: list[int] = []
    strings: dict[str, int] = {}
    memo = 0
    before = None
    for op, arg, _ in pickletools.genops(data):
        if op.name == "MEMOIZE" and before is not None:
            if before[0] == "EMPTY_DICT":
                dicts.append(memo)
            elif before[0] == "SHORT_BINUNICODE":
                strings.setdefault(str(before[1]), memo)
            memo += 1
        before = (op.name, arg)
    return dicts, strings


def test_an_entry_used_as_a_dict_key_is_refused_as_a_full_unpickle_refuses_it(tmp_path: Path) -> None:
    # GIVEN a device trace whose last entry has, for its time_us key, a reference to an earlier entry (a dict:
    # unhashable, so pickle refuses the file); the earlier entries are of the shape the fast path reads
    # (fuzz_snapshot: the fast path read the file, the general path and pickle refused it)
    entries = [entry("alloc", 64 * i, 64, t=i) for i in range(8)]
    data = pickle.dumps({"device_traces": [entries]}, protocol=4)
    dicts, strings = _memo_of(data)
    key = bytes([0x68, strings["time_us"]])  # BINGET of the key
    last = data.rindex(key)
    path = tmp_path / "s.pickle"
    path.write_bytes(data[:last] + bytes([0x68, dicts[-2]]) + data[last + 2:])
    with pytest.raises(TypeError):
        pickle.loads(path.read_bytes())
    # WHEN the reader reads it THEN it refuses it too
    with pytest.raises(SnapshotFormatError, match="unhashable"):
        read_snapshot(path)


def test_an_entry_appended_twice_is_refused_not_read_as_a_row_of_nulls(tmp_path: Path) -> None:
    # GIVEN a device trace holding one entry dict twice (a memo reference in the same APPENDS)
    # (fuzz_snapshot: the second was read as a row of nulls, where a full unpickle reads the entry twice)
    e = entry("alloc", 64, 64, t=1)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[e, e]]}, protocol=4))
    # WHEN it is read THEN it is refused, as an entry appended twice across APPENDS already was
    with pytest.raises(SnapshotFormatError, match="a device trace holds an entry twice"):
        read_snapshot(path)
