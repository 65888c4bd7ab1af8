"""Arrow tables and arrays handed between polars and pyarrow without importing pyarrow.compute.

pyarrow.compute is slow to import (and with a Python scalar imports pandas when it is installed), and ingest
would pay for it under the GIL while the file is being gunzipped: every handover here goes through Arrow's
C data interface or its C++ reader instead.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table with every column of `schema`, in its order: the columns it lacks are all null, each type's
    from one shared array (Arrow arrays are immutable). A span of CPU ops lacks some thirty columns, whose
    buffers of zeros, one each, cost more to allocate and fault in than the rest of conforming the span."""
    nulls: dict[pa.DataType, pa.Array] = {}

    def null_column(dtype: pa.DataType) -> pa.Array:
        if dtype not in nulls:
            nulls[dtype] = pa.nulls(table.num_rows, dtype)
        return nulls[dtype]

    present = set(table.column_names)
    columns = [table.column(f.name) if f.name in present else null_column(f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def to_arrow(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """The frame as an Arrow table of `schema`: large_string -> string is an offsets-only cast (polars'
    default export, string views, would copy every value). Cast by Arrow's C++ reader, not Table.cast, which
    imports pyarrow.compute."""
    table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches()).cast(schema).read_all()


class _ArrowArray:
    """An Arrow array seen only through the Arrow PyCapsule interface."""

    __slots__ = ("_array",)

    def __init__(self, array: pa.Array) -> None:
        self._array = array

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]:
        return self._array.__arrow_c_array__(requested_schema)  # type: ignore[no-any-return]


def to_series(array: pa.Array | pa.ChunkedArray) -> pl.Series:
    """An Arrow array as a polars Series, handed over through the Arrow C data interface: `pl.Series` given a
    pyarrow array imports pyarrow.compute (see the module docstring)."""
    if isinstance(array, pa.ChunkedArray):  # (combine_chunks imports pyarrow.compute, and pandas with it)
        array = pa.concat_arrays(array.chunks) if array.num_chunks else pa.nulls(0, array.type)
    return pl.Series(_ArrowArray(array))


def to_frame(table: pa.Table) -> pl.DataFrame:
    """An Arrow table as a polars DataFrame, column by column through `to_series` (`pl.from_arrow` imports
    pyarrow.compute)."""
    return pl.DataFrame([to_series(table.column(name)).alias(name) for name in table.column_names])
