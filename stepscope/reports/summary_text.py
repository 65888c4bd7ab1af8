"""One-screen text for `stepscope summary`: the verdict, why, what to do, the evidence and where to look."""

from __future__ import annotations

from stepscope.analyze.summary import SummaryResult
from stepscope.reports.text import render_frame
from stepscope.reports.units import human_fraction, human_ns


def render_summary(result: SummaryResult) -> str:
    """Verdict block, evidence lines, per-step verdict counts, and the top places as a table."""
    lines = [
        f"verdict: {result.verdict.value}  ({result.reason})",
        f"advice:  {result.advice}",
        "",
        (f"{result.steps_found} steps, {human_ns(result.wall_ns)} in all "
         f"(mean step {human_ns(result.wall_ns / result.steps_found)}); share of the step time:"
         if result.steps_found else
         f"no ProfilerStep in the trace: over the GPU span, {human_ns(result.wall_ns)}; share of that span:"),
        f"  GPU busy              {human_fraction(result.gpu_busy_fraction)}",
        f"  exposed data loading  {human_fraction(result.data_loading_fraction)}",
        f"  sync calls            {human_fraction(result.sync_fraction)} ({result.sync_calls} calls)",
        f"  memcpy                {human_fraction(result.memcpy_fraction)}"
        f" (pageable {human_fraction(result.pageable_memcpy_fraction)})",
        f"  kernels < 10 µs       {human_fraction(result.tiny_kernel_fraction)} of kernels",
    ]
    if result.per_step.height:
        counts = result.per_step.group_by("verdict").len().sort("len", descending=True)
        lines.append("per step: " + ", ".join(f"{v} ×{n}" for v, n in counts.iter_rows()))
    lines.append("")
    if result.places.height:
        lines.append(render_frame(result.places, title="where to look").rstrip("\n"))
    return "\n".join(lines) + "\n"
