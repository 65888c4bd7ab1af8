"""What fixing each verdict would buy: the dependency-graph replay (`whatif`) of the change its advice asks for.

`summary --predict` puts this under the verdict, so the answer says not only what bounds the step but how much
shorter the step gets once that is fixed, and what the runner-up fix would give:

    verdict              the change replayed                  (what the advice asks for)
    data_loading_bound   --no-data-loading                    the data is ready when the step asks for it
    sync_bound           --no-sync                            no host sync in the loop
    transfer_bound       --pinned                             pinned memory, asynchronous copies
    launch_bound         --launch-overhead 0us                launches as cheap as a CUDA graph replay
    communication_bound  --overlap-comm                       collectives hidden behind compute (nothing waits
                                                              for one but the step's end)
    gpu_bound            --speedup CATEGORY=2                 the compute category with most kernel time, 2x
    no_gpu: no row (no GPU work to replay); communication_bound has none in a trace without a communication kernel

Every change is replayed on one graph, built once (`depgraph.build_graph`), and is only ever as good as the
replay: a no-change replay must give the measured steps back, and its residual is kept with the rows. The
graph costs more than the rest of a summary on a large trace, so it is asked for, not always built.

    resnet50 num_workers=0: data_loading_bound 177.6 ms -> 118.6 ms (-33.2%); gpu_bound (convolution x2) -11.0%
    df_index_resolver: communication_bound (exposed 20.6% of the step), yet --overlap-comm saves 0.0%: the CPU
    launching the work is the longer chain (launch_bound's fix: 11.2%)
"""

from __future__ import annotations

import polars as pl

from stepscope.analyze.depgraph import build_graph
from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.kernels import KernelCategory, category_expr
from stepscope.analyze.schema import Kind
from stepscope.analyze.summary import RULES, Verdict
from stepscope.analyze.whatif import WhatIf, what_if

#: a gpu_bound fix: the compute category with most kernel time made this many times faster
GPU_SPEEDUP = 2.0

#: categories that are not compute a faster kernel would speed up
_NOT_COMPUTE = (KernelCategory.COMMUNICATION.value, KernelCategory.MEMCPY.value, KernelCategory.MEMSET.value)

SAVINGS_SCHEMA: dict[str, pl.DataType] = {
    "verdict": pl.String(), "change": pl.String(), "measured_ns": pl.Float64(), "predicted_ns": pl.Float64(),
    "saving_ns": pl.Float64(), "saving_fraction": pl.Float64(), "replay_residual_fraction": pl.Float64(),
}


def top_compute_category(source: Source) -> str | None:
    """The kernel category with most GPU time, communication and copies left out (None without kernels)."""
    kernels = frames_of(source).launches.filter(
        (pl.col("kind") == Kind.KERNEL.value) & pl.col("dur_ns").is_not_null())
    by = (kernels.with_columns(category=category_expr()).filter(~pl.col("category").is_in(_NOT_COMPUTE))
          .group_by("category").agg(ns=pl.col("dur_ns").sum()).sort(["ns", "category"], descending=[True, False]))
    return str(by["category"][0]) if by.height else None


def communicates(source: Source) -> bool:
    """Whether the trace holds a communication kernel (NCCL/RCCL: what `--overlap-comm` hides in one trace)."""
    kernels = frames_of(source).launches.filter(pl.col("kind") == Kind.KERNEL.value)
    return bool(kernels.select((category_expr() == KernelCategory.COMMUNICATION.value).any()).item())


def fix_for(verdict: Verdict, source: Source) -> WhatIf | None:
    """The change that fixing `verdict` amounts to (module docstring), None where the replay cannot say."""
    if verdict is Verdict.DATA_LOADING_BOUND:
        return WhatIf(no_data_loading=True)
    if verdict is Verdict.SYNC_BOUND:
        return WhatIf(no_sync=True)
    if verdict is Verdict.TRANSFER_BOUND:
        return WhatIf(pinned=True)
    if verdict is Verdict.LAUNCH_BOUND:
        return WhatIf(launch_overhead_ns=0)
    if verdict is Verdict.COMMUNICATION_BOUND:
        return WhatIf(overlap_comm=True) if communicates(source) else None
    if verdict is Verdict.GPU_BOUND:
        category = top_compute_category(source)
        return WhatIf(speedups=((category, GPU_SPEEDUP),)) if category is not None else None
    return None


def predicted_savings(source: Source) -> pl.DataFrame:
    """One row per verdict of the rule table that has a fix (SAVINGS_SCHEMA, in the rule table's order): the
    change, the measured and predicted mean step and the saving, from one dependency graph of `source`."""
    frames = frames_of(source)
    graph = build_graph(frames)
    rows = []
    seen: set[Verdict] = set()
    for rule in RULES:
        if rule.verdict in seen:
            continue
        seen.add(rule.verdict)
        change = fix_for(rule.verdict, frames)
        if change is None:
            continue
        result = what_if(frames, change, graph=graph)
        rows.append({"verdict": rule.verdict.value, "change": " ".join(change.describe()),
                     "measured_ns": result.measured_mean_ns, "predicted_ns": result.predicted_mean_ns,
                     "saving_ns": result.saving_ns, "saving_fraction": result.saving_fraction,
                     "replay_residual_fraction": result.replay_residual_fraction})
    return pl.DataFrame(rows, schema=SAVINGS_SCHEMA)


__all__ = ["GPU_SPEEDUP", "SAVINGS_SCHEMA", "communicates", "fix_for", "predicted_savings", "top_compute_category"]
