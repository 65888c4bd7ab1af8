"""The names the CLI offers as choices, importable without polars or pyarrow (so a command's `--help` and
option parsing load nothing heavy): event kinds, the op table's row kinds and sort columns, dtypes.

`schema`, `ops` and `peaks` take these from here, so each list is written once.
"""

from __future__ import annotations

import enum
from typing import Literal, get_args


class Kind(str, enum.Enum):
    """What an event is, whatever its trace generation called it."""

    CPU_OP = "cpu_op"
    PYTHON_FUNCTION = "python_function"
    USER_ANNOTATION = "user_annotation"
    GPU_USER_ANNOTATION = "gpu_user_annotation"
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    RUNTIME = "runtime"
    DRIVER = "driver"
    MEMORY = "memory"
    SYNC = "sync"
    OTHER = "other"


#: the op table's rows (`ops.op_table`): CPU-side kinds, then device-side kinds
CPU_ROW_KINDS: tuple[Kind, ...] = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER)
DEVICE_ROW_KINDS: tuple[Kind, ...] = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_USER_ANNOTATION)
#: every kind a row can have ("memory": [memory] instants outside any CPU event)
ROW_KINDS: tuple[str, ...] = tuple(k.value for k in (*CPU_ROW_KINDS, *DEVICE_ROW_KINDS, Kind.MEMORY))

SortColumn = Literal[
    "calls", "self_cpu_ns", "cpu_total_ns", "cpu_avg_ns", "self_device_ns", "device_total_ns", "device_avg_ns",
    "cpu_mem_bytes", "self_cpu_mem_bytes", "device_mem_bytes", "self_device_mem_bytes", "flops",
]
SORT_COLUMNS: tuple[str, ...] = get_args(SortColumn)

#: the dtypes the device peak table (`peaks`) has a figure for
Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
