"""Who was on the CPU at a moment: the helpers that gaps, overlap, transfers and summary share.

`innermost` finds the innermost CPU op / Python frame / runtime call enclosing given points on given threads
(in the frames `nested` nests once per trace, or in any lazy frame);
`source_frames` keeps the Python frames that name a source line, and `python_lines` picks the user's line
among them (`is_library_frame`), or, in a trace of the older format without Python frames, among the frames of
the enclosing op's `Call stack` (`stack_lines`); `is_sync_runtime` tells a runtime call that blocks the host;
`short_name` trims a kernel name for tables.
"""

from __future__ import annotations

import sys
from typing import Literal

import polars as pl

from stepscope.analyze.nesting import Nested
from stepscope.analyze.trace import Trace


def is_sync_runtime(name: pl.Expr) -> pl.Expr:
    """True for a runtime/driver call that blocks the host until the GPU catches up.

        cudaStreamSynchronize, hipDeviceSynchronize, cuCtxSynchronize, cudaMemcpy, hipMemcpyWithStream -> True
        cudaMemcpyAsync, cudaStreamWaitEvent (a GPU-side wait), cudaLaunchKernel                          -> False
    """
    name = name.fill_null("")
    return name.str.contains("(?i)synchronize") | (
        name.str.contains("(?i)^(cuda|hip|cu)memcpy") & ~name.str.contains("(?i)async"))


#: a copy between device memories (its direction in its name): no host memory, so never pageable or pinned
DEVICE_COPY = r"DtoD|PtoP|DtoA|AtoD"


def host_memory_unsaid(name: pl.Expr) -> pl.Expr:
    """True for a copy to or from host memory whose name does not say whether that memory was pageable or pinned,
    so that no pageable figure over it is exact.

        Memcpy HtoD (Pageable -> Device), Memcpy DtoH (Device -> Pinned), Memcpy DtoD (Device -> Device) -> False
        Memcpy HtoD (Host -> Device), Memcpy DtoH (Device -> Host)   (AMD's names)                     -> True
    """
    name = name.fill_null("")
    return ~name.str.contains("Pageable|Pinned") & ~name.str.contains(DEVICE_COPY)


#: the one row of every `ProfilerStep#N` in a table summed over steps (torch's `_rewrite_name` with its wildcard)
STEP_ROW = "ProfilerStep*"


def step_row_name(name: pl.Expr) -> pl.Expr:
    """`name` as a table summed over steps shows it: every `ProfilerStep#N` is `ProfilerStep*` (torch's
    key_averages() does the same), so the steps' own time is one row and not one small row per step."""
    return pl.when(name.str.starts_with("ProfilerStep#")).then(pl.lit(STEP_ROW)).otherwise(name)


def short_name(name: pl.Expr) -> pl.Expr:
    """A kernel's name without return type, template arguments and parameter list, for tables (`cpp_function_name`
    of each distinct C++ name; other names as they are).

        void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, …>(int, …)
        -> at::native::vectorized_elementwise_kernel
        void at::native::(anonymous namespace)::CatArrayBatchedCopy<…>(…)  -> at::native::CatArrayBatchedCopy
        std::enable_if<…, void>::type vllm::fused_add_rms_norm_kernel<…>(…)  -> vllm::fused_add_rms_norm_kernel
    """
    return name.map_batches(_short_names, return_dtype=pl.String)


def _short_names(names: pl.Series) -> pl.Series:
    distinct = names.unique().drop_nulls()
    short = [cpp_function_name(n) if "::" in n or n.startswith("void ") else n for n in distinct.to_list()]
    return names.replace_strict(distinct, pl.Series(short, dtype=pl.String), default=None, return_dtype=pl.String)


def cpp_function_name(name: str) -> str:
    """The qualified name of the function a demangled C++ signature names: the last word before the parameter list
    (what precedes it is the return type) without its template arguments; `(anonymous namespace)::` left out.
    Parentheses inside template arguments (`enable_if<(8)>(0)>`) are no parameter list, and a `>` inside them
    closes no template. The name itself where none is found."""
    bare = name.replace("(anonymous namespace)::", "")
    angle = paren = start = 0
    end = len(bare)
    for i, ch in enumerate(bare):
        if ch == "(":
            if angle == 0 and paren == 0:
                end = i
                break
            paren += 1
        elif ch == ")":
            paren -= 1
        elif paren == 0 and ch in "<>":
            angle += 1 if ch == "<" else -1
        elif ch == " " and angle == 0 and paren == 0:
            start = i + 1
    function = bare[start:end]
    cut = function.find("<")
    return (function[:cut] if cut > 0 else function) or name


#: what `innermost` reads of the events that span time
_COLUMNS = ("pid", "tid", "ts_ns", "dur_ns", "name", "event_id")


def innermost(frame: pl.LazyFrame | Nested, points: pl.DataFrame) -> pl.DataFrame:
    """name, event_id of the innermost event of `frame` enclosing each point (pid, tid, ts_ns); nulls where none.

    One row per point, in the points' order. `frame` nested already (`nested`: a trace's frames that many
    lookups read) is looked up as it is. Of a lazy frame, only the events that enclose some point take part (found
    by an as-of join: the first point at or after an event's start lies before its end); an enclosing event's
    ancestors enclose the point too, so the nesting among those is the full nesting, and the answer the same. The
    nesting walk is nesting.py's (one place, measured there).
    """
    def empty() -> pl.DataFrame:
        return pl.DataFrame({"name": [None] * points.height, "event_id": [None] * points.height},
                            schema={"name": pl.String, "event_id": pl.Int64})

    if points.height == 0:
        return empty()
    if isinstance(frame, Nested):
        found = frame
    else:
        marks = points.select("pid", "tid", p_ts="ts_ns").drop_nulls().sort("p_ts")
        found = Nested.of(
            frame.filter(pl.col("dur_ns").is_not_null()).select(*_COLUMNS).sort("ts_ns")
            .join_asof(marks.lazy(), left_on="ts_ns", right_on="p_ts", by=["pid", "tid"], strategy="forward",
                       check_sortedness=False)
            .filter(pl.col("p_ts") <= pl.col("ts_ns") + pl.col("dur_ns")).drop("p_ts").collect(engine="in-memory"),
            keep=("name", "event_id"))
    if found.height == 0:
        return empty()
    rows = found.enclosing(points)
    return found.rows.select(pl.col("name").gather(rows).cast(pl.String), pl.col("event_id").gather(rows))


#: the frames of a trace that `nested` nests once and keeps on the trace: those looked up by every idle gap,
#: sync call and copy (gaps, overlap, transfers, the critical path and the launches' ops all look up the same
#: ones), where scanning, sorting and nesting a frame again for each analysis's points cost more than the lookups
NestedFrame = Literal["cpu_ops", "runtime", "python", "user_python", "stacked_ops"]


def nested(trace: Trace, frame: NestedFrame) -> Nested:
    """The events of `trace`'s `frame` nested (`nesting.Nested`): built on first use, then kept on the trace.

        cpu_ops      trace.cpu_ops
        runtime      trace.runtime
        python       source_frames(trace): the Python frames that name a source line
        user_python  those of them not in a library (`is_library_frame`)
        stacked_ops  the CPU ops that carry a `Call stack` (the older with_stack format), kept with it
    """
    found = trace.nestings.get(frame)
    if found is None:
        if frame in ("cpu_ops", "runtime"):
            lazy = trace.cpu_ops if frame == "cpu_ops" else trace.runtime
        elif frame == "stacked_ops":
            lazy = trace.cpu_ops.filter(pl.col("call_stack").fill_null("") != "")
        else:
            lazy = source_frames(trace)
            lazy = lazy if frame == "python" else lazy.filter(~is_library_frame(pl.col("name")))
        keep = ("name", "event_id", "call_stack") if frame == "stacked_ops" else ("name", "event_id")
        # (the nesting order sorts them: no sort by start first; the strings as categories, kept for the trace's life)
        found = trace.nestings[frame] = Nested.of(
            lazy.filter(pl.col("dur_ns").is_not_null()).select(*_COLUMNS, *keep[2:])
            .with_columns(pl.col("name", *keep[2:]).cast(pl.Categorical)).collect(engine="in-memory"), keep=keep)
    return found


#: a Python frame that names a source line: `path(N): function`
SOURCE_LINE = r"\(\d+\): "


def source_frames(trace: Trace) -> pl.LazyFrame:
    """Python frames that name a source line (``model.py(42): forward``), not C builtins.

        <built-in method copy_ of Tensor object at 0x7f…>   -> skipped (it says nothing about where)
        train.py(88): train_step                            -> kept
    """
    return trace.python.filter(pl.col("name").str.contains(SOURCE_LINE))


#: top-level packages whose frames are not where a user looks: torch's own stack, the compilers under it,
#: the standard library, and this package's capture runner. A frame in one of them is shown as the context of
#: the user's line that called into it, never instead of it.
LIBRARY_PACKAGES: frozenset[str] = frozenset(
    {"torch", "torchvision", "torchaudio", "functorch", "triton", "numpy", "tqdm", "stepscope"}
    | set(sys.stdlib_module_names))


#: absolute paths of installed packages, the standard library, and this package's capture runner
_LIBRARY_PATH = r"(site|dist)-packages[/\\]|[/\\]lib[/\\]python3\.\d+[/\\]|[/\\]stepscope[/\\]capture[/\\]"


def is_library_frame(name: pl.Expr) -> pl.Expr:
    """True for a Python frame (`path(N): function`) in a library rather than the user's code: generated code
    (`<frozen os>`, `<string>`, `<eval_with_key>.3`), anything under site-packages / dist-packages or the
    interpreter's lib/python3.X, and a path (as the profiler writes it, relative to its sys.path entry)
    whose first component is one of LIBRARY_PACKAGES.

        torch/utils/_device.py(99): __torch_function__        -> True
        typing.py(1737): __instancecheck__                    -> True (standard library)
        sglang/srt/model_executor/model_runner.py(12): run    -> False
        train.py(88): train_step                              -> False
    """
    path = name.str.extract(r"^(.*?)\(\d+\): ", 1).fill_null("")
    top = path.str.extract(r"^([^/\\]+?)(?:\.py)?(?:[/\\]|$)", 1)
    return (path.str.starts_with("<") | path.str.contains(_LIBRARY_PATH)
            | top.is_in(list(LIBRARY_PACKAGES)).fill_null(False))


#: the install prefixes that the older `Call stack` writes before a package's or the standard library's path and
#: today's Python frames leave out (torch writes those relative to their sys.path entry)
_SITE_PREFIX = r"^.*[/\\](?:site|dist)-packages[/\\]"
_STDLIB_PREFIX = r"^.*[/\\]lib[/\\]python3\.\d+[/\\]"


def stack_lines(stacks: pl.Series) -> pl.DataFrame:
    """For each op's `Call stack` (the older with_stack format: its Python frames, innermost first, ';'-separated),
    what `python_lines` says of Python frames: the user's line (`python`: the innermost frame not a library's, by
    `is_library_frame` on the frame as written; the innermost frame where all are a library's) and, as context,
    the innermost frame when that one is a library's (`library`). A library's frame is shown as today's frames
    name it, its install prefix left out. One row per stack, in order; nulls for a null or empty stack. The frames
    are split once per distinct stack.

        /…/site-packages/torchvision/transforms/functional.py(136): to_tensor;…;resnet50_profiler_api.py(44): <module>
        -> python  resnet50_profiler_api.py(44): <module>
           library torchvision/transforms/functional.py(136): to_tensor
        /…/lib/python3.7/site-packages/torch/optim/optimizer.py(216): zero_grad
        -> python  torch/optim/optimizer.py(216): zero_grad
           library the same
    """
    stacks = stacks.cast(pl.String)
    lines = (
        pl.LazyFrame({"stack": stacks.unique().drop_nulls()})
        .with_columns(frame=pl.col("stack").str.split(";")).explode("frame")
        .filter(pl.col("frame").str.contains(SOURCE_LINE))
        .with_columns(library=is_library_frame(pl.col("frame")),
                      frame=pl.col("frame").str.replace(_SITE_PREFIX, "").str.replace(_STDLIB_PREFIX, ""))
        .group_by("stack", maintain_order=True)  # (each stack's frames stay in their order: innermost first)
        .agg(inner=pl.col("frame").first(), inner_library=pl.col("library").first(),
             user=pl.col("frame").filter(~pl.col("library")).first())
        .select("stack", python=pl.coalesce("user", "inner"),
                library=pl.when(pl.col("inner_library")).then(pl.col("inner")))
    )
    return (pl.LazyFrame({"stack": stacks}).join(lines, on="stack", how="left", maintain_order="left")
            .select("python", "library").collect(engine="in-memory"))


def python_lines(trace: Trace, points: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """For each point (pid, tid, ts_ns): the user's line (the innermost frame enclosing it that is not a
    library frame; the innermost frame of all where every frame is a library's) and, as context, the
    innermost frame when that one is a library's (None otherwise).

        train.py(88): step > torch/nn/modules/module.py(1501): _call_impl > point
        -> ("train.py(88): step", "torch/nn/modules/module.py(1501): _call_impl")

    A point no Python frame encloses takes the lines of the `Call stack` of the innermost op enclosing it that
    carries one (`stack_lines`): the older with_stack format writes no Python frames, only those stacks.

        aten::to [Call stack "/…/site-packages/torch/nn/modules/module.py(889): _call_impl;train.py(44): <module>"]
          > aten::copy_ > point
        -> ("train.py(44): <module>", "torch/nn/modules/module.py(889): _call_impl")
    """
    if points.height == 0:
        return pl.Series("python", [], dtype=pl.String), pl.Series("library", [], dtype=pl.String)
    inner = innermost(nested(trace, "python"), points)["name"]
    user = innermost(nested(trace, "user_python"), points)["name"]
    library = pl.select(pl.when(is_library_frame(pl.lit(inner))).then(pl.lit(inner))).to_series()
    python = user.fill_null(inner)
    if inner.null_count():
        ops = nested(trace, "stacked_ops")
        if ops.height:
            rows = ops.enclosing(points)
            stacked = stack_lines(ops.rows.select(pl.col("call_stack").gather(rows))["call_stack"])
            framed = inner.is_not_null()
            python, library = python.zip_with(framed, stacked["python"]), library.zip_with(framed, stacked["library"])
    return python.alias("python"), library.alias("library")
