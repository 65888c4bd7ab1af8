"""The collectives of one rank's trace, one row each: what it is, its group, its size and when it ran.

Where the time is: a rank's communication kernels when it has any (NCCL / RCCL: `ncclKernel_*`,
`ncclDevKernel_*`, `rcclKernel_*`), else its CPU-side collectives (`gloo:all_reduce` and the other
`<backend>:<op>` annotations a CPU backend runs on its worker threads), else `record_param_comms` ops.

What it is, first answer wins (so an all-to-all that NCCL runs as grouped send/recv reads all_to_all):

    the call's `Collective name` (kernel args, else the record_param_comms op that launched it)
    the enclosing `nccl:<op>` / `gloo:<op>` annotation's name
    the kernel's name

    ncclDevKernel_AllReduce_Sum_f32_RING_LL (Collective name "allreduce")   -> all_reduce
    ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t inside nccl:all_to_all       -> all_to_all
    ncclDevKernel_SendRecv (Collective name "send")                         -> send_recv
    gloo:all_reduce                                                         -> all_reduce

Sizes: `In msg nelems` / `Out msg nelems` / `dtype` (the call's args, else its record_param_comms op), else
the recorded shapes (record_shapes). The message size is nccl-tests' "size": max(in, out) elements x the
element size (the whole output of an all_gather, the whole input of a reduce_scatter). Without the counts:

    the enclosing annotation's input, summed over its tensors: in (and out, but for an all_gather or a
        reduce_scatter, whose output differs from the input)
    the innermost `c10d::` op enclosing the call (its launch, or the annotation itself), of the call's
    collective, for an all_gather / reduce_scatter: its largest tensor of the call's dtype where it records two
    or more (one alone may be the input): the output of an all_gather, the input of a reduce_scatter; with
    exactly two, largest / smallest (where exact) is the group size, `shape_group_size`

    c10d::_allgather_base_ [[1073741824], [16777216], []] + nccl:_all_gather_base [[16777216]], int8
        -> in 16777216, out 1073741824, message 1 GiB, shape_group_size 64

An all_gather's annotation holds only this rank's input: with no such op, its output is in x the group size
where the call states that size (`Group size`, else the ranks its group lists), else unknown, and so is its
message size (null), never the input. (`gloo:all_gather` records its input only, on a worker thread that no
c10d op encloses.)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze.blame import innermost
from stepscope.analyze.kernels import KernelCategory, category_expr
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import with_step

#: the communication kernels: the kernel table's communication category (`kernels.CATEGORY_RULES`: NCCL/RCCL, and
#: torch's symmetric-memory collectives, `multimem_all_reduce_kernel`), so `kernels`, `summary`, `ranks` and the
#: what-if agree on what is communication (b200's 73 multimem all-reduces: 2.1 ms `kernels` called communication
#: were once compute in `summary`'s exposed communication, 0.0%)


def comm_kernel() -> pl.Expr:
    """Whether a GPU event (its name and kind) is a communication kernel (the kernel table's category)."""
    return category_expr() == KernelCategory.COMMUNICATION.value


#: CPU-side collective annotations: the backend, a colon, the op (gloo:all_reduce, nccl:all_to_all)
COMM_ANNOTATION = r"^(nccl|rccl|gloo|mpi|ucc|xccl|hccl):[a-z_]+$"
PARAM_COMMS = "record_param_comms"

#: normalized collective <- name prefixes (lower case, letters only), first match wins
_TYPE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"), ("allgather", "all_gather"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
    ("send", "send_recv"), ("recv", "send_recv"), ("gather", "gather"), ("scatter", "scatter"),
    ("reduce", "reduce"),
)

#: element size in bytes by dtype, under its canonical name
ELEMENT_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complex64": 8, "complex128": 16,
}
_DTYPE_ALIASES: dict[str, str] = {
    "float": "float32", "double": "float64", "half": "float16", "long": "int64", "longint": "int64",
    "int": "int32", "short": "int16", "shortint": "int16", "char": "int8", "signedchar": "int8", "byte": "uint8",
    "unsignedchar": "uint8", "complexfloat": "complex64", "complexdouble": "complex128",
}


#: one rank's collectives (`rank_calls`), one row each
CALL_SCHEMA: dict[str, pl.DataType] = {
    "source": pl.String(), "name": pl.String(), "collective": pl.String(), "process_group": pl.String(),
    "group_ranks": pl.String(), "group_size": pl.Int64(), "shape_group_size": pl.Int64(), "seq": pl.Int64(),
    "in_nelems": pl.Int64(), "out_nelems": pl.Int64(), "dtype": pl.String(), "message_bytes": pl.Int64(),
    "ts_ns": pl.Int64(), "dur_ns": pl.Int64(), "device": pl.Int64(), "stream": pl.Int64(), "step": pl.Int64(),
}
#: a collective's dispatcher op (c10d::_allgather_base_, c10d::allreduce_), whose recorded shapes hold its output
C10D_OP = "c10d::"


def collective_type(name: str | None) -> str | None:
    """The normalized collective of a kernel, op or annotation name; None when it names none.

        ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL -> reduce_scatter     _allgather_base -> all_gather
        gloo:all_reduce -> all_reduce                                       alltoall_base   -> all_to_all
        void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(…) -> all_reduce
    """
    if not name:
        return None
    low = name.lower()
    m = re.search(r"(?:nccl|rccl)(?:dev)?kernel_([a-z]+)", low)
    token = m.group(1) if m else re.sub(r"[^a-z]", "", low.split(":", 1)[-1])
    found = next((label for prefix, label in _TYPE_PREFIXES if token.startswith(prefix)), None)
    if found is None and not m:  # a collective kernel of another library: multimem_all_reduce_kernel<…>
        word = re.search(r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all", low.split("<", 1)[0])
        found = collective_type(word.group(0)) if word else None
    return found


def canonical_dtype(dtype: str | None) -> str | None:
    """Float / float / c10::Half / long int -> float32 / float32 / float16 / int64; None stays None."""
    if not dtype:
        return None
    key = re.sub(r"[\s_]", "", dtype.lower().removeprefix("c10::"))
    name = _DTYPE_ALIASES.get(key, key)
    return next((c for c in ELEMENT_BYTES if c.replace("_", "") == name), name)


def _mapped(frame: pl.DataFrame, col: str, fn: Callable[[str | None], str | None]) -> pl.Expr:
    """`fn` applied to each distinct value of a string column (a handful per trace), as an expression."""
    table = {v: fn(v) for v in frame[col].cast(pl.String).unique().drop_nulls().to_list()}
    return pl.col(col).cast(pl.String).replace_strict(table, default=None, return_dtype=pl.String)


def rank_calls(trace: Trace, *, pg_config: Mapping[str, Any] | None = None,
               launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every collective of one trace (see the module docstring), sorted by start: the CALL_SCHEMA columns.

    `pg_config` (distributedInfo's, by pg_name) fills the ranks of a group that the call does not list;
    `launches` (`Trace.launches()`, collected) saves recomputing the launch links where the caller has them.
    """
    kernels = trace.kernels.filter(comm_kernel()).collect(engine="in-memory")
    if kernels.height:
        calls = _kernel_calls(trace, kernels, launches)
    else:
        cpu = _with_seq(trace.cpu.filter(pl.col("dur_ns").is_not_null()))
        calls = cpu.filter(pl.col("name").str.contains(COMM_ANNOTATION)).collect(engine="in-memory")
        if calls.height == 0:
            calls = cpu.filter((pl.col("name") == PARAM_COMMS) & pl.col("collective_name").is_not_null()).collect(
                engine="in-memory")
        calls = calls.with_columns(source=pl.lit("cpu"), ann_name=pl.col("name"))
        calls = _with_sizes(_with_c10d(trace, calls, calls.select("pid", "tid", "ts_ns")))
        calls = calls.with_columns(step=_steps_at(trace, calls["ts_ns"]))
    return _finish(calls, pg_config or {})


def _steps_at(trace: Trace, at: pl.Series) -> pl.Series:
    """The ProfilerStep#N whose CPU span holds each time of `at` (a call's launch, on whichever thread: DDP
    launches its all-reduces from autograd's), in `at`'s order; null outside every step or where `at` is."""
    spans = trace.steps.select("step", start_ns="ts_ns", end_ns="end_ns").collect(engine="in-memory")
    points = pl.DataFrame({"_i": pl.int_range(at.len(), eager=True), "at": at})
    known = with_step(points.filter(pl.col("at").is_not_null()), spans, at="at")
    return points.join(known.select("_i", "step"), on="_i", how="left").sort("_i")["step"]


def _kernel_calls(trace: Trace, kernels: pl.DataFrame, launches: pl.DataFrame | None) -> pl.DataFrame:
    """Kernels with their launching record_param_comms op's args and the enclosing `nccl:<op>` annotation."""
    cols = ("gpu_event_id", "launch_pid", "launch_tid", "launch_ts_ns")
    launches = trace.launches().select(cols).collect(engine="in-memory") if launches is None else launches.select(cols)
    linked = kernels.join(launches, left_on="event_id", right_on="gpu_event_id", how="left", maintain_order="left")
    points = linked.select(pid="launch_pid", tid="launch_tid", ts_ns="launch_ts_ns")
    cpu = trace.cpu.filter(pl.col("dur_ns").is_not_null())
    op = innermost(cpu.filter(pl.col("name") == PARAM_COMMS), points)["event_id"]
    ann = innermost(cpu.filter(pl.col("name").str.contains(COMM_ANNOTATION)), points)["event_id"]
    arg_cols = ["collective_name", "in_msg_nelems", "out_msg_nelems", "dtype", "process_group_name",
                "process_group_ranks", "group_size", "seq"]
    ops = _with_seq(trace.cpu_ops.filter(pl.col("name") == PARAM_COMMS)).select("event_id", *arg_cols).collect(
        engine="in-memory")
    anns = trace.cpu.filter(pl.col("name").str.contains(COMM_ANNOTATION)).select(
        "event_id", ann_name="name", input_dims="input_dims", input_types="input_types").collect(engine="in-memory")
    linked = (
        _with_seq(linked.lazy()).collect(engine="in-memory")
        .drop("input_dims", "input_types")
        .with_columns(op_event_id=op, ann_event_id=ann)
        .join(ops.rename({c: f"op_{c}" for c in arg_cols}), left_on="op_event_id", right_on="event_id", how="left",
              maintain_order="left")
        .join(anns, left_on="ann_event_id", right_on="event_id", how="left", maintain_order="left")
        .with_columns([pl.coalesce(c, f"op_{c}").alias(c) for c in arg_cols])
        .with_columns(source=pl.lit("kernel"))
    )
    return _with_sizes(_with_c10d(trace, linked, points)).with_columns(step=_steps_at(trace, points["ts_ns"]))


def _with_c10d(trace: Trace, calls: pl.DataFrame, points: pl.DataFrame) -> pl.DataFrame:
    """`calls` with the innermost `c10d::` op enclosing each of `points` (pid, tid, ts_ns; one per call, in order):
    c10d_name, c10d_dims, c10d_types (its recorded Input Dims / Input type), nulls where none encloses it."""
    ops = (trace.cpu_ops.filter(pl.col("name").str.starts_with(C10D_OP))
           .select("pid", "tid", "ts_ns", "dur_ns", "name", "event_id", "input_dims", "input_types")
           .collect(engine="in-memory"))  # one scan: a trace has a few c10d ops per collective
    shapes = ops.select("event_id", c10d_name="name", c10d_dims="input_dims", c10d_types="input_types")
    return (calls.with_columns(c10d_event_id=innermost(ops.lazy(), points)["event_id"])
            .join(shapes, left_on="c10d_event_id", right_on="event_id", how="left", maintain_order="left"))


def _with_seq(frame: pl.LazyFrame) -> pl.LazyFrame:
    """`seq`: the c10d sequence number Kineto writes as args `Seq` (newer torch), else null."""
    return frame.with_columns(seq=pl.col("args").str.json_path_match("$.Seq").cast(pl.Int64, strict=False))


def _with_sizes(calls: pl.DataFrame) -> pl.DataFrame:
    """Fill nelems and dtype from the annotation's recorded shapes where the args give none."""
    for col in ("collective_name", "in_msg_nelems", "out_msg_nelems", "dtype", "process_group_name",
                "process_group_ranks", "group_size", "seq", "ann_name", "input_dims", "input_types", "c10d_name",
                "c10d_dims", "c10d_types"):
        if col not in calls.columns:
            calls = calls.with_columns(pl.lit(None).alias(col))
    shapes = [_shape_size(d, t) for d, t in zip(calls["input_dims"].to_list(), calls["input_types"].to_list(),
                                                strict=True)]
    return calls.with_columns(
        shape_nelems=pl.Series([s[0] for s in shapes], dtype=pl.Int64),
        shape_dtype=pl.Series([s[1] for s in shapes], dtype=pl.String),
    )


def _tensors(dims: str | None, types: str | None) -> list[tuple[int, str]]:
    """(elements, recorded type) of each single tensor of an op's Input Dims / Input type, in order; scalars,
    empty shapes and tensor lists left out; none where the text is not JSON.

        [[65536, 64], [8192, 64], []], ["float", "float", ""]  ->  [(4194304, "float"), (524288, "float")]
    """
    try:
        shapes = json.loads(dims) if dims else []
        kinds = json.loads(types) if types else []
    except ValueError:
        return []
    return [(math.prod(shape), str(kind)) for shape, kind in zip(shapes, kinds, strict=False)
            if isinstance(shape, list) and shape and all(isinstance(x, int) for x in shape)]


def _shape_size(dims: str | None, types: str | None) -> tuple[int | None, str | None]:
    """Elements and dtype of an annotation's tensors: Input Dims [[64, 64]], Input type ["float"] -> 4096, float.

    Tensors of the first tensor's dtype are summed (a coalesced call lists several); none -> (None, None).
    """
    tensors = _tensors(dims, types)
    if not tensors:
        return None, None
    dtype = tensors[0][1]
    return sum(n for n, kind in tensors if kind == dtype), dtype


def _c10d_shapes(dims: str | None, types: str | None, dtype: str | None) -> tuple[int | None, int | None]:
    """(largest, group size) of a c10d op's single tensors of `dtype` (canonical; the first tensor's where None):
    the largest where it records two or more, largest / smallest where exactly two and it divides; else None.

        [[65536, 64], [8192, 64], []], ["float", "float", ""], float32  ->  4194304, 8
        [[[256, 256]], [], []], ["TensorList", "", ""]                   ->  None, None (a list: no single tensor)
    """
    tensors = _tensors(dims, types)
    dtype = dtype or (canonical_dtype(tensors[0][1]) if tensors else None)
    sizes = [n for n, kind in tensors if canonical_dtype(kind) == dtype]
    if len(sizes) < 2:
        return None, None
    big, small = max(sizes), min(sizes)
    return big, big // small if len(sizes) == 2 and small > 0 and big % small == 0 else None


def _with_c10d_sizes(calls: pl.DataFrame) -> pl.DataFrame:
    """c10d_nelems and shape_group_size (`_c10d_shapes`) of the all_gathers and reduce_scatters whose c10d op is of
    their collective; null for other calls. Per call, not per event: a trace's collectives, parsed once per shape."""
    mine = (pl.col("collective").is_in(["all_gather", "reduce_scatter"])
            & (_mapped(calls, "c10d_name", collective_type) == pl.col("collective")))
    keys = calls.select(pl.when(mine).then(pl.struct(d="c10d_dims", t="c10d_types", x="dtype")).alias("k"))["k"]
    memo: dict[tuple[str | None, str | None, str | None], tuple[int | None, int | None]] = {}
    found = [None if k is None else memo.setdefault((k["d"], k["t"], k["x"]), _c10d_shapes(k["d"], k["t"], k["x"]))
             for k in keys.to_list()]
    return calls.with_columns(
        c10d_nelems=pl.Series([f[0] if f else None for f in found], dtype=pl.Int64),
        shape_group_size=pl.Series([f[1] if f else None for f in found], dtype=pl.Int64))


def listed_ranks(text: str | None) -> list[int] | None:
    """The ranks a group lists (args `Process Group Ranks`, or pg_config's as text): "[0, 1, 2]" -> [0, 1, 2];
    None where it lists none: null, empty, not JSON or not integers (a truncated list: "[0, 1, ...]")."""
    try:
        listed = json.loads(text) if text else None
    except ValueError:
        return None
    if isinstance(listed, list) and listed and all(isinstance(r, int) for r in listed):
        return listed
    return None


def _finish(calls: pl.DataFrame, pg_config: Mapping[str, Any]) -> pl.DataFrame:
    """The CALL_SCHEMA columns of `rank_calls`, sorted by start; the sizes as the module docstring says."""
    if calls.height == 0:
        return pl.DataFrame(schema=CALL_SCHEMA)
    calls = calls.with_columns(dtype=pl.coalesce(pl.col("dtype").cast(pl.String), "shape_dtype"))
    collective = pl.coalesce(*(_mapped(calls, c, collective_type) for c in ("collective_name", "ann_name", "name")))
    group = pl.col("process_group_name").cast(pl.String)
    ranks_of = {str(k): v for k, v in pg_config.items()}
    out = calls.with_columns(
        collective=collective.fill_null("unknown"),
        process_group=group if len(ranks_of) != 1 else group.fill_null(next(iter(ranks_of))),
        dtype=_mapped(calls, "dtype", canonical_dtype),
    ).with_columns(
        group_ranks=pl.coalesce(
            pl.col("process_group_ranks").cast(pl.String),
            pl.col("process_group").replace_strict({k: str(v) for k, v in ranks_of.items()}, default=None,
                                                   return_dtype=pl.String)),
    )
    out = _with_c10d_sizes(out)
    counts = {g: len(r) for g in out["group_ranks"].unique().drop_nulls().to_list() if (r := listed_ranks(g))}
    # the group size the call states: its `Group size`, else the ranks its group lists
    stated = pl.coalesce(pl.col("group_size").cast(pl.Int64),
                         pl.col("group_ranks").replace_strict(counts, default=None, return_dtype=pl.Int64))
    gather, scatter = pl.col("collective") == "all_gather", pl.col("collective") == "reduce_scatter"
    out = out.with_columns(
        in_nelems=pl.coalesce("in_msg_nelems", pl.when(scatter).then("c10d_nelems"), "shape_nelems").cast(pl.Int64),
    ).with_columns(
        out_nelems=pl.coalesce(
            "out_msg_nelems",
            pl.when(gather).then(pl.coalesce("c10d_nelems", pl.col("in_nelems") * stated))
            .when(~scatter).then("shape_nelems")).cast(pl.Int64),
    ).with_columns(
        message_bytes=pl.when(gather).then("out_nelems").otherwise(pl.max_horizontal("in_nelems", "out_nelems"))
        * pl.col("dtype").replace_strict(ELEMENT_BYTES, default=None, return_dtype=pl.Int64),
    )
    return out.select(pl.col(c).cast(t) for c, t in CALL_SCHEMA.items()).sort("ts_ns")


def pg_config_of(distributed: Mapping[str, Any] | None) -> dict[str, list[int]]:
    """distributedInfo's pg_config as pg_name -> ranks (empty when the trace has none)."""
    out: dict[str, list[int]] = {}
    for entry in (distributed or {}).get("pg_config") or []:
        if isinstance(entry, Mapping) and isinstance(entry.get("ranks"), list):
            out[str(entry.get("pg_name"))] = [int(r) for r in entry["ranks"] if isinstance(r, int)]
    return out



@dataclass(frozen=True)
class CommSplit:
    """A rank's GPU time split for communication (DESIGN.md, "Distributed runs"), disjoint (device, start_ns,
    end_ns) intervals per device:

        compute   union of the kernels that are not communication kernels (`comm_kernel`); memcpy/memset are not
        comm      union of the collectives (`rank_calls`: NCCL/RCCL kernels, or a CPU backend's collective ops)
        exposed   comm not covered by compute on the same device (a CPU backend's collectives, device null,
                  are all exposed)
        busy      union of all GPU work (kernels, memcpy, memset)

        compute [0,60) [80,90), comm [50,100)  ->  exposed [60,80) [90,100): 30 of comm's 50
    """

    compute: pl.LazyFrame
    comm: pl.LazyFrame
    exposed: pl.LazyFrame
    busy: pl.LazyFrame


def gpu_work(gpu: pl.LazyFrame) -> pl.LazyFrame:
    """device, start_ns, end_ns, compute (a kernel that is not a communication kernel) of GPU events (a trace's
    `gpu` frame: kind, name, ts_ns, dur_ns, device), those with a duration and a device."""
    kernel = pl.col("kind") == Kind.KERNEL.value
    return (gpu.filter(pl.col("dur_ns").is_not_null() & pl.col("device").is_not_null())
            .select(pl.col("device").cast(pl.Int64), start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                    compute=kernel & ~comm_kernel().fill_null(False)))


def comm_split(gpu: pl.LazyFrame, calls: pl.LazyFrame) -> CommSplit:
    """`CommSplit` of GPU work (`gpu_work`) and collectives (CALL_SCHEMA rows: device, ts_ns, dur_ns): the one
    definition of compute, communication and exposed communication that `ranks` and `summary` share."""
    by = ["device"]
    compute = intervals.union(gpu.filter(pl.col("compute")), by=by, start="start_ns", end="end_ns")
    comm = intervals.union(calls.select(pl.col("device").cast(pl.Int64), start_ns="ts_ns",
                                        end_ns=pl.col("ts_ns") + pl.col("dur_ns")),
                           by=by, start="start_ns", end="end_ns")
    return CommSplit(compute=compute, comm=comm, exposed=intervals.subtract(comm, compute, by=by),
                     busy=intervals.union(gpu, by=by, start="start_ns", end="end_ns"))


def per_window(pieces: pl.LazyFrame, windows: pl.DataFrame, name: str) -> pl.DataFrame:
    """step, `name`: the length of `pieces` (start_ns, end_ns; disjoint per device) inside each window, summed
    over devices.

        pieces [0,12) [20,25); windows step 1 [0,10), step 2 [10,22)  ->  step 1: 10, step 2: 4
    """
    w = windows.lazy().select("step", w_start="start_ns", w_end="end_ns")
    inside = pl.min_horizontal("end_ns", "w_end") - pl.max_horizontal("start_ns", "w_start")
    return (pieces.select("start_ns", "end_ns")
            .join_where(w, pl.col("start_ns") < pl.col("w_end"), pl.col("end_ns") > pl.col("w_start"))
            .group_by("step").agg(inside.sum().alias(name)).collect(engine="in-memory"))
