"""The normalized event table: the `kind` vocabulary, the declarative args table and the Parquet schema.

Everything downstream of ingest reads these column names; README.md documents each one.

Kind normalization (three generations of Kineto category names -> one vocabulary):

    cat (2021)   cat (today)                         kind
    ----------   ---------------------------------   -------------------
    Operator     cpu_op                              cpu_op
    -            python_function                     python_function
    -            user_annotation                     user_annotation
    -            gpu_user_annotation                 gpu_user_annotation
    Kernel       kernel                              kernel
    Memcpy       gpu_memcpy                          memcpy
    Memset       gpu_memset                          memset
    Runtime      cuda_runtime (also on ROCm)         runtime
    -            cuda_driver                         driver
    -            cuda_sync                           sync
    (no cat)     cpu_instant_event, name [memory]    memory
    anything else (Trace, overhead, cuda_profiler_range, …)   other
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from stepscope.analyze.vocab import Kind as Kind  # re-exported: analyses import Kind from here

INGEST_SCHEMA_VERSION = 4  # 2: concrete_inputs column; 3: invalid UTF-8 inside strings read as U+FFFD and counted;
#                            4: input_strides column


# Kind lives in vocab (no pyarrow there), so the CLI can offer kinds without importing the schema
KIND_BY_CATEGORY: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "Operator": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "python_function": Kind.PYTHON_FUNCTION,
    "user_annotation": Kind.USER_ANNOTATION,
    "gpu_user_annotation": Kind.GPU_USER_ANNOTATION,
    "kernel": Kind.KERNEL,
    "Kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "Memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "Memset": Kind.MEMSET,
    "cuda_runtime": Kind.RUNTIME,
    "Runtime": Kind.RUNTIME,
    "hip_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "hip_driver": Kind.DRIVER,
    "cuda_sync": Kind.SYNC,
}

MEMORY_EVENT_NAME = "[memory]"

#: kinds that run on a GPU timeline (device + stream)
GPU_KINDS: tuple[Kind, ...] = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
#: kinds that occupy a CPU thread
CPU_KINDS: tuple[Kind, ...] = (Kind.CPU_OP, Kind.PYTHON_FUNCTION, Kind.USER_ANNOTATION)

ArgType = Literal["int", "float", "str", "json"]
# Which kinds of event carry an argument; extraction runs per group, so an event pays only for its keys.
ArgGroup = Literal["gpu", "cpu", "python", "runtime", "memory"]

GROUP_OF_KIND: dict[Kind, ArgGroup] = {
    Kind.KERNEL: "gpu",
    Kind.MEMCPY: "gpu",
    Kind.MEMSET: "gpu",
    Kind.GPU_USER_ANNOTATION: "gpu",
    Kind.SYNC: "gpu",
    Kind.CPU_OP: "cpu",
    Kind.PYTHON_FUNCTION: "python",
    Kind.USER_ANNOTATION: "cpu",
    Kind.OTHER: "cpu",
    Kind.RUNTIME: "runtime",
    Kind.DRIVER: "runtime",
    Kind.MEMORY: "memory",
}


@dataclass(frozen=True, kw_only=True)
class ArgColumn:
    """One typed column pulled from `args`: the first present raw key wins; wrong types become null."""

    column: str
    keys: tuple[str, ...]
    type: ArgType
    groups: tuple[ArgGroup, ...]
    doc: str
    folded_into: str | None = None  # read at ingest, then merged into a base column instead of stored


#: The declarative args table (raw key -> column, type). `json` columns keep the value's JSON text.
ARG_COLUMNS: tuple[ArgColumn, ...] = (
    ArgColumn(column="correlation", keys=("correlation",), type="int", groups=("gpu", "runtime"),
              doc="CUPTI/roctracer correlation id linking a runtime call to the GPU work it launched"),
    ArgColumn(column="external_id", keys=("External id", "external id"), type="int", groups=("gpu", "cpu", "runtime"),
              doc="id linking a CPU op (its own id) and the runtime calls/GPU work it issued"),
    ArgColumn(column="arg_device", keys=("device",), type="int", groups=("gpu",),
              doc="GPU index of a GPU event", folded_into="device"),
    ArgColumn(column="arg_stream", keys=("stream",), type="int", groups=("gpu", "runtime", "cpu"),
              doc="stream of a GPU event; runtime/triton launches carry it too", folded_into="stream"),
    ArgColumn(column="bytes", keys=("bytes",), type="int", groups=("gpu", "runtime"),
              doc="bytes moved by a memcpy / set by a memset"),
    ArgColumn(column="memory_bandwidth_gbps", keys=("memory bandwidth (GB/s)",), type="float", groups=("gpu",),
              doc="bandwidth the profiler computed for a memcpy/memset, GB/s"),
    ArgColumn(column="alloc_bytes", keys=("Bytes",), type="int", groups=("memory",),
              doc="[memory] event: bytes allocated (+) or freed (-)"),
    ArgColumn(column="total_allocated_bytes", keys=("Total Allocated",), type="int", groups=("memory",),
              doc="[memory] event: allocator's allocated bytes after this event (absent in 2021 traces)"),
    ArgColumn(column="total_reserved_bytes", keys=("Total Reserved",), type="int", groups=("memory",),
              doc="[memory] event: allocator's reserved bytes after this event"),
    ArgColumn(column="addr", keys=("Addr",), type="int", groups=("memory",), doc="[memory] event: block address"),
    ArgColumn(column="device_id", keys=("Device Id",), type="int", groups=("memory",),
              doc="[memory] event: device index as written (-1 for CPU)", folded_into="device"),
    ArgColumn(column="device_type", keys=("Device Type",), type="int", groups=("memory",),
              doc="[memory] event: c10 DeviceType code (0 CPU, 1 CUDA/ROCm, …)"),
    ArgColumn(column="input_dims", keys=("Input Dims",), type="json", groups=("cpu",),
              doc="op input shapes as JSON text, e.g. [[32, 3, 224, 224], []] (record_shapes)"),
    ArgColumn(column="input_types", keys=("Input type",), type="json", groups=("cpu",),
              doc="op input dtypes as JSON text (record_shapes)"),
    ArgColumn(column="concrete_inputs", keys=("Concrete Inputs",), type="json", groups=("cpu",),
              doc="op scalar/list argument values as JSON text, e.g. [\"\", \"[2, 2]\", \"False\"] (record_shapes)"),
    ArgColumn(column="input_strides", keys=("Input Strides",), type="json", groups=("cpu",),
              doc="op input strides as JSON text, e.g. [[2048, 1, 0, 0], []]: 0 where a dim is broadcast "
                  "(record_shapes, in the torch releases that record them)"),
    ArgColumn(column="sequence_number", keys=("Sequence number",), type="int", groups=("cpu",),
              doc="autograd sequence number (links forward op and its backward)"),
    ArgColumn(column="fwd_thread_id", keys=("Fwd thread id",), type="int", groups=("cpu",),
              doc="thread of the forward op for a backward op"),
    ArgColumn(column="record_function_id", keys=("Record function id",), type="int", groups=("cpu",),
              doc="record_function id"),
    ArgColumn(column="ev_idx", keys=("Ev Idx",), type="int", groups=("cpu", "python", "memory"),
              doc="profiler event index"),
    ArgColumn(column="python_id", keys=("Python id",), type="int", groups=("python",),
              doc="python_function frame id (with_stack)"),
    ArgColumn(column="python_parent_id", keys=("Python parent id",), type="int", groups=("python",),
              doc="python_function parent frame id"),
    ArgColumn(column="call_stack", keys=("Call stack",), type="str", groups=("cpu",),
              doc="Python stack of an op, ';'-separated (older with_stack format)"),
    ArgColumn(column="module_hierarchy", keys=("Module Hierarchy",), type="str", groups=("cpu",),
              doc="nn.Module path of an op (with_modules, some versions)"),
    ArgColumn(column="flops", keys=("flops",), type="float", groups=("cpu",), doc="estimated FLOPs (with_flops)"),
    ArgColumn(column="grid", keys=("grid",), type="json", groups=("gpu", "runtime", "cpu"),
              doc="launch grid as JSON text, e.g. [864, 1, 1]"),
    ArgColumn(column="block", keys=("block",), type="json", groups=("gpu", "runtime"),
              doc="launch block as JSON text, e.g. [256, 1, 1]"),
    ArgColumn(column="registers_per_thread", keys=("registers per thread",), type="int", groups=("gpu",),
              doc="registers per thread of a kernel"),
    ArgColumn(column="shared_memory_bytes", keys=("shared memory",), type="int", groups=("gpu", "runtime"),
              doc="shared memory of a kernel launch, bytes"),
    ArgColumn(column="est_occupancy_pct", keys=("est. achieved occupancy %",), type="float", groups=("gpu",),
              doc="estimated achieved occupancy, percent"),
    ArgColumn(column="blocks_per_sm", keys=("blocks per SM",), type="float", groups=("gpu",), doc="blocks per SM"),
    ArgColumn(column="warps_per_sm", keys=("warps per SM",), type="float", groups=("gpu",), doc="warps per SM"),
    ArgColumn(column="collective_name", keys=("Collective name",), type="str", groups=("gpu", "cpu"),
              doc="collective (allreduce, allgather, …) of a communication op/kernel"),
    ArgColumn(column="in_msg_nelems", keys=("In msg nelems",), type="int", groups=("gpu", "cpu"),
              doc="collective input elements"),
    ArgColumn(column="out_msg_nelems", keys=("Out msg nelems",), type="int", groups=("gpu", "cpu"),
              doc="collective output elements"),
    ArgColumn(column="dtype", keys=("dtype",), type="str", groups=("gpu", "cpu"), doc="collective element type"),
    ArgColumn(column="process_group_name", keys=("Process Group Name",), type="str", groups=("gpu", "cpu"),
              doc="process group of a collective"),
    ArgColumn(column="process_group_desc", keys=("Process Group Description",), type="str", groups=("gpu", "cpu"),
              doc="process group description (e.g. default_pg)"),
    ArgColumn(column="process_group_ranks", keys=("Process Group Ranks",), type="json", groups=("gpu", "cpu"),
              doc="ranks of the process group as JSON text"),
    ArgColumn(column="group_size", keys=("Group size",), type="int", groups=("gpu", "cpu"),
              doc="process group size"),
    ArgColumn(column="kernel_backend", keys=("kernel_backend",), type="str", groups=("cpu",),
              doc="backend of a compiled kernel launch op (triton)"),
    ArgColumn(column="cbid", keys=("cbid",), type="int", groups=("runtime",),
              doc="CUPTI callback id of a runtime call"),
)

ARG_TYPE_TO_ARROW: dict[ArgType, pa.DataType] = {
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "json": pa.string(),
}

#: Columns every event row has, before the typed args. `device`/`stream` are derived (see ingest).
BASE_FIELDS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("event_id", pa.int64(), "position of the event in the file's traceEvents (0-based)"),
    ("kind", pa.string(), "normalized kind (see Kind)"),
    ("ph", pa.string(), "Chrome trace phase: X complete, i/I instant, others kept as written"),
    ("cat", pa.string(), "category as written (null when absent)"),
    ("name", pa.string(), "event name"),
    ("pid", pa.string(), "process id as written (text: some traces use names)"),
    ("tid", pa.string(), "thread id as written (text)"),
    ("ts_ns", pa.int64(), "start, integer ns on the trace's clock (ts µs × 1000, exact)"),
    ("dur_ns", pa.int64(), "duration, integer ns (null for instants)"),
    ("device", pa.int64(), "GPU index: args.device, else numeric pid, for GPU events; Device Id >= 0 for [memory]"),
    ("stream", pa.int64(), "stream of a GPU event: args.stream, else numeric tid"),
)

EVENT_SCHEMA: pa.Schema = pa.schema(
    [pa.field(name, dtype) for name, dtype, _ in BASE_FIELDS]
    + [pa.field(c.column, ARG_TYPE_TO_ARROW[c.type]) for c in ARG_COLUMNS if c.folded_into is None]
    + [pa.field("args", pa.string())]
)

FLOW_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("event_id", pa.int64()),
        pa.field("flow_id", pa.string()),
        pa.field("ph", pa.string()),
        pa.field("cat", pa.string()),
        pa.field("name", pa.string()),
        pa.field("pid", pa.string()),
        pa.field("tid", pa.string()),
        pa.field("ts_ns", pa.int64()),
        pa.field("binding_point", pa.string()),
    ]
)
