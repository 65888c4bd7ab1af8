"""A snapshot's device trace as columns, built as the stream reader reads its entries (`_snapshot_stream`).

Integer fields and stack ids go into growing numpy columns; a stack id numbers a distinct (user frame id,
forward frame id) pair, so a row stores one integer for its frames.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import polars as pl

INT_FIELDS: Final = ("addr", "size", "stream", "time_us", "device_free")
EVENT_COLUMNS: Final = ("action", "addr", "size", "stream", "time_us", "frame_id", "forward_frame_id", "device_free")
_ACTION_CHUNK: Final = 65_536  # actions are made categorical this many rows at a time

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
