"""The multi-rank section of a run's report (`stepscope report RUN`): the run's verdict (`run_summary`), the
straggler line, each rank's mean step as stacked bars, who waits in which collective, busbw by message size, and
one row per rank linking to its own page. It renders results only (`run_summary.RunAnalysis`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stepscope.reports.html import Cell, Figure, Section, Table, frame_table, path_parts
from stepscope.reports.units import human_fraction, human_ns

if TYPE_CHECKING:
    from stepscope.analyze.run_graph import RunCriticalPathResult
    from stepscope.analyze.run_summary import RunAnalysis, RunSummaryResult


def straggler_line(summary: RunSummaryResult) -> str | None:
    """One sentence on the straggler: who, what it costs the others, why (None without one)."""
    if summary.straggler is None:
        return None
    cost = ("" if summary.straggler_wait_cost_per_step_ns is None else
            f": the others wait {human_ns(summary.straggler_wait_cost_per_step_ns)} per step for it "
            f"({human_fraction(summary.straggler_wait_fraction)} of their step), more than for any other rank")
    cause = summary.straggler_cause.value.replace("_", " ") if summary.straggler_cause else None
    where = summary.straggler_host_line or summary.straggler_host_op
    why = f"; cause: {cause}" + (f" at {where}" if where else "") if cause else ""
    return f"Straggler: rank {summary.straggler}, late at the collectives{cost}{why}."


def _rank_table(summary: RunSummaryResult, pages: Mapping[int, str]) -> Table:
    """One row per rank, its name linking to its own page: its verdict and the figures behind it."""
    cols: list[tuple[str, Callable[[Any], str]]] = [
        ("verdict", str), ("runner_up", str), ("gpu_busy_fraction", human_fraction),
        ("exposed_comm_fraction", human_fraction), ("data_loading_fraction", human_fraction),
        ("mean_step_ns", human_ns), ("wait_ns", human_ns), ("last_arrivals", str)]
    rows: list[list[Cell]] = []
    for r in summary.per_rank.iter_rows(named=True):
        mark = "  (straggler)" if r["rank"] == summary.straggler else ""
        line = [Cell(text=f"rank {r['rank']}{mark}", sort=r["rank"], href=pages.get(r["rank"]))]
        for key, fmt in cols:
            v = r[key]
            text = "-" if v is None else fmt(v)
            line.append(Cell(text=text.replace("_", " ") if key in ("verdict", "runner_up") else text, sort=v))
        rows.append(line)
    return Table(title="Each rank's own verdict (click a rank for its report)",
                 columns=["rank", "verdict", "runner-up", "GPU busy", "exposed comm", "data loading", "mean step",
                          "wait in collectives", "last arrivals"],
                 rows=rows, total_rows=len(rows), numeric=[False, False, False, *[True] * 6])


def run_section(analysis: RunAnalysis, pages: Mapping[int, str], source: str) -> Section:
    """The run's verdict and its ranks side by side (see the module docstring); `pages` maps a rank to the link
    of its own page."""
    from stepscope.reports import run_figures

    s = analysis.summary
    figures = []
    for png, title in ((run_figures.rank_steps_figure(analysis.ranks),
                        "Each rank's mean step: compute alone, compute with communication under it, exposed "
                        "communication, memcpy alone, GPU idle; data loading (CPU) under each"),
                       (run_figures.skew_heatmap(analysis.collectives),
                        "Rank x collective: each rank's wait in each matched call (duration minus latency)"),
                       (run_figures.busbw_figure(analysis.collectives),
                        "Collective bus bandwidth vs message size (log-log)")):
        if png is not None:
            figures.append(Figure(title=title, png=png))
    lead = [f"{s.verdict.value.replace('_', ' ')}: {s.reason}", s.advice]
    headline = [("ranks", str(s.rank_count)), ("steps", str(s.step_count) if s.step_count else "none"),
                ("rank verdicts", ", ".join(f"{v.replace('_', ' ')} ×{n}" for v, n in s.rank_verdicts.items()))]
    notes = [line for line in (straggler_line(s), s.note) if line] + [f"warning: {w}" for w in s.warnings]
    tables = [_rank_table(s, pages)]
    if s.places.height:
        tables.append(frame_table(s.places, "Where to look first"))
    if analysis.collectives.groups.height:
        tables.append(frame_table(analysis.collectives.groups, "Collectives by type x message size x dtype x group"))
    return Section(id="run-verdict", title="Run verdict and ranks", lead=lead, headline=headline, notes=notes,
                   figures=[*figures], tables=tables,
                   commands=[shlex.join(["stepscope", cmd, source]) for cmd in ("summary", "ranks", "comm")])


def run_path_section(result: RunCriticalPathResult, source: str) -> Section:
    """The run's critical path across ranks (`run_graph.run_critical_path`): what kind of work and which ranks set
    each step's time, the top contributors with their ranks ("wait for rank N (…)" where the path crosses to the
    rank that arrived last), each step's split and the notes."""
    ranks = list(result.rank_path_share.items())
    on_ranks = ", ".join(f"rank {r} {human_fraction(v)}" for r, v in ranks[:5]) + (
        f", {len(ranks) - 5} more" if len(ranks) > 5 else "")
    headline, tables = path_parts(result, top_title="Top contributors (all steps, every rank)",
                                  also=[("path on", on_ranks)], skip=("source", "rank_count"))
    notes = [*result.notes, "What a fix would buy across the ranks: stepscope whatif RUN (e.g. --overlap-comm, or "
             "--rank N with a change on that rank only)."]
    return Section(id="run-path", title="Run critical path (across ranks)", headline=headline, tables=tables,
                   notes=notes, commands=[shlex.join(["stepscope", "critical-path", source])])
