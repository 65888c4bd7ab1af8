"""One-screen text for `stepscope summary`: the verdict, why, what to do, the evidence and where to look."""

from __future__ import annotations

import polars as pl

from stepscope.analyze.run_summary import RunSummaryResult
from stepscope.analyze.summary import SummaryResult
from stepscope.reports.text import render_frame
from stepscope.reports.units import human_fraction, human_ns, plural


def render_summary(result: SummaryResult) -> str:
    """Verdict block (verdict, margin, runner-up, advice), the trace's warnings (if any), evidence lines, per-step
    verdict counts and the closest per-step call, and the top places as a table."""
    lines = [
        f"verdict: {result.verdict.value}  ({result.reason})",
        *_close_call_lines(result),
        f"advice:  {result.advice}",
        "",
        *_warning_lines(result),
        (f"{result.steps_found} step{'' if result.steps_found == 1 else 's'}, {human_ns(result.wall_ns)} in all "
         f"(mean step {human_ns(result.wall_ns / result.steps_found)}); share of the step time:"
         if result.steps_found else
         f"no ProfilerStep in the trace: over the GPU span, {human_ns(result.wall_ns)}; share of that span:"
         if result.gpu_busy_fraction is not None else
         f"no ProfilerStep and no GPU work in the trace: over the trace (first event to last), "
         f"{human_ns(result.wall_ns)}; share of it:"),
        (f"  GPU busy                    {human_fraction(result.gpu_busy_fraction)}"
         if result.gpu_busy_fraction is not None else f"  GPU{'':25}none recorded (no kernel/memcpy/memset)"),
        f"  exposed data loading        {human_fraction(result.data_loading_fraction)}",
        f"  sync calls (CPU)            {human_fraction(result.sync_fraction)} ({result.sync_calls} "
        f"call{'' if result.sync_calls == 1 else 's'})",
    ]
    if result.gpu_busy_fraction is not None:
        lines += [
            f"  memcpy (GPU)                {human_fraction(result.memcpy_fraction)}"
            + (f" (pageable {human_fraction(result.pageable_memcpy_fraction)})"
               if result.pageable_memcpy_fraction is not None else " (pageable or pinned: not recorded)"),
            "  GPU idle, by cause:",
            f"    behind host syncs         {human_fraction(result.sync_idle_fraction)}",
            f"    waiting for copies        {human_fraction(result.memcpy_idle_fraction)}",
            f"    launch overhead           {human_fraction(result.launch_idle_fraction)}",
            *(f"    {label:<26}{human_fraction(value)}" for label, value in (
                ("waiting for data", result.data_loading_idle_fraction),
                ("before collectives", result.comm_idle_fraction)) if value),  # (shown where there is some)
            f"    no cause found            {human_fraction(result.other_idle_fraction)}"
            "  (every cause: `stepscope gaps`)",
            f"  kernels < 10 µs             {human_fraction(result.tiny_kernel_fraction)} of kernels",
        ]
    if result.comm_note is not None or (result.exposed_comm_fraction or 0) > 0:
        lines.append(f"  exposed communication       {human_fraction(result.exposed_comm_fraction)}"
                     "  (not overlapped by compute; `stepscope ranks` for every rank)")
    if result.mfu_fraction is not None:
        lines.append(f"  MFU (model FLOPs / peak)    {human_fraction(result.mfu_fraction)}  (`stepscope flops`)")
    shares = ((result.graph_replay_fraction, "replayed from graphs", "of kernel time, `stepscope graphs`"),
              (result.compiled_fraction, "compiled (Triton) kernels", "of kernel time"),
              (result.memory_bound_fraction, "memory-bound FLOP ops", "of their GPU time, roofline"))
    for value, label, where in shares:
        if value is not None and value >= 0.005:  # said where there is some: most traces hold no graphs or Triton
            lines.append(f"  {label:<27} {human_fraction(value)}  ({where})")
    if result.serving:  # an inference server's trace: its engine iterations by phase
        lines.append(f"serving: {result.serving}  (`stepscope serving`)")
    if result.per_step.height:
        counts = result.per_step.group_by("verdict").len().sort("len", "verdict", descending=[True, False])
        lines.append("per step: " + ", ".join(f"{v} ×{n}" for v, n in counts.iter_rows()))
        closest = result.per_step.drop_nulls("margin_fraction").sort("margin_fraction", "step").head(1)
        if closest.height:
            row = closest.row(0, named=True)
            lines.append(f"closest step: {row['step']} ({row['verdict']}), {row['margin']}")
    lines.append("")
    if result.places.height:
        lines.append(render_frame(result.places, title="where to look").rstrip("\n"))
    if result.predicted_savings is not None:
        lines += ["", _savings_text(result)]
    for note in (result.sync_note, result.idle_note, result.comm_note):
        if note:
            lines += ["", f"note: {note}"]
    if result.profile_next:
        lines += ["", f"profile next: {result.profile_next}"]
    return "\n".join(lines) + "\n"


def render_run_summary(result: RunSummaryResult) -> str:
    """The run's verdict, why and what to do; the straggler's cost and cause; each rank's own verdict; where to
    look."""
    lines = [f"verdict: {result.verdict.value}  ({result.reason})", f"advice:  {result.advice}", ""]
    lines += [f"warning: {w}" for w in result.warnings] + ([f"note: {result.note}"] if result.note else [])
    steps = plural(result.step_count, 'step') if result.step_count else "no steps"
    lines.append(f"{plural(result.rank_count, 'rank')}, {steps}; "
                 "rank verdicts: " + ", ".join(f"{v} ×{n}" for v, n in result.rank_verdicts.items()))
    if result.straggler is not None:
        cost = (f"the others wait {human_ns(result.straggler_wait_cost_per_step_ns)} per step in all, "
                f"{human_fraction(result.straggler_wait_fraction)} of each one's step"
                if result.straggler_wait_cost_per_step_ns is not None else "no wait measured")
        cause = result.straggler_cause.value if result.straggler_cause else "no cause above 0"
        lines.append(f"straggler: rank {result.straggler} ({cost}); cause: {cause}")
    lines += ["", render_frame(result.per_rank, title="per rank (its own verdict, `stepscope summary RANK_TRACE`):",
                               max_rows=None).rstrip("\n"), ""]
    if result.places.height:
        lines.append(render_frame(result.places, title="where to look").rstrip("\n"))
    return "\n".join(lines) + "\n"


def _savings_text(result: SummaryResult) -> str:
    """What each fix would buy (`savings.predicted_savings`), the verdict's own row marked."""
    table = result.predicted_savings
    if table is None or table.height == 0:
        return "what a fix would buy: nothing to replay (no steps or no GPU work in the dependency graph)"
    marked = table.with_columns(
        verdict=pl.when(pl.col("verdict") == result.verdict.value).then(pl.format("{} (this)", "verdict"))
        .otherwise("verdict"))
    residual = table["replay_residual_fraction"].max()
    title = ("what a fix would buy (the dependency graph replayed with each change, `stepscope whatif`; "
             f"no-change replay residual {human_fraction(residual if isinstance(residual, float) else None)}):")
    return render_frame(marked.drop("replay_residual_fraction"), title=title).rstrip("\n")


def _close_call_lines(result: SummaryResult) -> list[str]:
    """How close the call was and the rule that would decide next, under the verdict they qualify."""
    lines = []
    if result.margin is not None:
        lines.append(f"margin:  {result.margin.text}")
    if result.runner_up is not None:
        lines.append(f"runner-up: {result.runner_up.value}  ({result.runner_up_reason})")
    return lines


def _warning_lines(result: SummaryResult) -> list[str]:
    """The trace's warnings before the evidence, so a damaged trace's numbers are read with them in mind."""
    if not result.warnings.height:
        return []
    table = render_frame(result.warnings, title="warnings: the trace is odd here; read the numbers below with care",
                         max_rows=None)
    return [table, ""]
