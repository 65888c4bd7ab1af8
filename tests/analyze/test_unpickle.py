"""The plain-data pickle interpreter: every opcode form plain data uses, read in any piece size; code refused."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.analyze._unpickle import PlainUnpickler
from stepscope.analyze.snapshot_read import read_snapshot
from stepscope.errors import InputError, SnapshotFormatError


def _load(data: bytes, piece_bytes: int = 1 << 20) -> Any:
    return PlainUnpickler(io.BytesIO(data), Path("x.pickle"), piece_bytes=piece_bytes).load()


def _plain(protocol: int) -> dict[Any, Any]:
    """Every kind of value plain data holds, as far as `protocol` pickles it without a global."""
    values: list[Any] = [0, 1, 255, 256, 65535, 65536, -1, -129, 2**31 - 1, -(2**31), 2**31, 2**63 - 1, -(2**63),
                         2**64, -(2**100), 1.5, -0.0, float("inf"), None, True, False, "", "x", "é ✓ \ud800",
                         "s" * 300, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], {}, [[1, [2]], {"k": (3,)}]]
    if protocol >= 3:
        values += [b"", b"bytes", b"b" * 300]
    if protocol >= 4:
        values += [{1, 2}, frozenset({"a"}), "t" * 70_000]
    if protocol >= 5:
        values += [bytearray(b"ba")]
    data: dict[Any, Any] = {"values": values, 7: "int key", (1, "t"): "tuple key", None: [None]}
    data["same list twice"] = [values, values]
    return data


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("piece_bytes", [1, 7, 4096, 1 << 20])
def test_every_protocol_reads_as_pickle_loads(protocol: int, piece_bytes: int) -> None:
    # GIVEN plain data pickled at each protocol, read one byte, 7 bytes, 4 KiB or 1 MiB at a time
    raw = pickle.dumps(_plain(protocol), protocol=protocol)
    got = _load(raw, piece_bytes)
    # THEN it equals what pickle.loads builds, and a shared object is still one object
    assert got == pickle.loads(raw)
    assert got["same list twice"][0] is got["same list twice"][1] is got["values"]


@pytest.mark.parametrize("raw", [
    b"S'abc'\np0\ng0\n\x86.",  # STRING (a Python 2 str), PUT and GET by text line
    b"(I01\nI00\nI42\nL7L\nF2.5\nU\x03abcVd\\u00e9\nt.",  # INT bools, LONG with its L, FLOAT, SHORT_BINSTRING, UNICODE
    b"T\x02\x00\x00\x00hi0(lp0\nI1\na(dp1\nS'k'\nI2\ns\x85.",  # BINSTRING, POP, LIST, APPEND, DICT, SETITEM
    b"I1\n2\x86\x8f\x94(K\x02\x90(K\x03\x91\x86\x86.",  # DUP, EMPTY_SET, ADDITEMS, FROZENSET
    b"(K\x01(K\x021N\x86.",  # POP_MARK
])
def test_hand_written_opcode_forms_read_as_pickle_loads(raw: bytes) -> None:
    assert _load(raw) == pickle.loads(raw)


plain = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=False)
    | st.text(max_size=40) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(value=plain, protocol=st.integers(min_value=3, max_value=5), piece_bytes=st.sampled_from([1, 3, 64, 1 << 20]))
def test_random_plain_data_reads_as_pickle_loads(value: Any, protocol: int, piece_bytes: int) -> None:
    raw = pickle.dumps(value, protocol=protocol)
    assert _load(raw, piece_bytes) == pickle.loads(raw)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_a_pickle_that_would_run_code_is_refused_before_anything_runs(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    raw = pickle.dumps({"a": [1, _Evil(marker)]}, protocol=protocol)
    with pytest.raises(SnapshotFormatError, match=r"refusing to load (os|posix)\.system: .*asks to run code"):
        _load(raw)
    assert not marker.exists()


@pytest.mark.parametrize("raw", [
    b"\x80\x04N\x85R.",  # REDUCE without any global on the stack
    b"\x80\x04}\x94N\x85b.",  # BUILD
    b"\x80\x04K\x01Q.",  # BINPERSID
    b"\x80\x02\x82\x01.",  # EXT1
    b"\x80\x04\x8c\x01a\x8c\x01b\x93.",  # STACK_GLOBAL a.b
])
def test_every_code_opcode_is_refused(raw: bytes) -> None:
    with pytest.raises(SnapshotFormatError, match="refusing to load .*asks to run code"):
        _load(raw)


@pytest.mark.parametrize(("raw", "needle"), [
    (b"\x80\x04\xff.", "unknown opcode 0xff"),
    (b"\x80\x04e.", "corrupt pickle"),  # APPENDS without a MARK
    (b"\x80\x04j\x05\x00\x00\x00.", "corrupt pickle"),  # a memo index never stored
    (b"\x80\x09N.", "unsupported pickle protocol"),
    (b"\x80\x04(K\x01u.", "corrupt pickle"),  # SETITEMS onto nothing
    (b"\x80\x04\x8c\x01\xff\x94.", "corrupt pickle"),  # a string that is not UTF-8
    (b"\x80\x05\x97.", "out-of-band"),
])
def test_corruption_is_one_line_naming_the_file(raw: bytes, needle: str) -> None:
    with pytest.raises(SnapshotFormatError) as info:
        _load(raw)
    assert needle in str(info.value) and "x.pickle" in str(info.value) and "\n" not in str(info.value)


def test_truncated_at_every_offset_says_so() -> None:
    raw = pickle.dumps(_plain(4), protocol=4)
    for cut in range(1, len(raw), 7):
        with pytest.raises(SnapshotFormatError, match="truncated pickle"):
            _load(raw[:cut], 64)


def test_opening_a_snapshot_names_a_missing_file_a_directory_and_a_text_pickle(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_snapshot(tmp_path / "missing.pickle")
    with pytest.raises(InputError, match="is a directory"):
        read_snapshot(tmp_path)
    path = tmp_path / "p.pickle"
    path.write_bytes(b"(lp0\n.")  # protocol 0: not what torch writes
    with pytest.raises(SnapshotFormatError, match="not a pickle file"):
        read_snapshot(path)
