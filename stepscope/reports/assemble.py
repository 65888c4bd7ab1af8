"""Pages for a collection of traces (a capture run's ranks, or a batch): each member's report, then an index
with one sortable row per member linking to its page. They render results only (`analyze.collection`);
writing the pages is the caller's.

    index.html            the run overview (the capture's facts, its memory files, ranks side by side) or
                          the batch index (the fleet: verdict counts, step time and GPU busy across traces,
                          the worst runs; then the traces side by side)
    <name>/index.html     one report per rank (runs) or per trace (batches), linked from the index
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stepscope.reports._render import INLINE, FigureRenderer
from stepscope.reports.html import (
    Cell,
    Figure,
    PerfettoLink,
    ReportContext,
    Section,
    Table,
    build_sections,
    memory_categories_section,
    render_page,
    snapshot_section,
    trace_report,
)
from stepscope.reports.units import human_bytes, human_fraction, human_ns

if TYPE_CHECKING:
    from stepscope.analyze.collection import FleetStats, Member, RunFacts, SideFile, Spread


def _idle_causes_text(shares: dict[str, float]) -> str:
    """{'data_loading': 0.33, 'launch_overhead': 0.07} -> 'data loading 33%, launch overhead 7%' (top 3)."""
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{c.replace('_', ' ')} {human_fraction(v)}" for c, v in top)


_INDEX_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("verdict", "verdict", lambda v: str(v).replace("_", " ")),
    ("rank", "rank", lambda v: "-" if v is None else str(v)),
    ("steps", "steps", lambda v: f"{v:,}"),
    ("median_step_ns", "step p50", human_ns),
    ("p95_step_ns", "step p95", human_ns),
    ("gpu_busy_fraction", "GPU busy (over the steps)", human_fraction),
    ("gpu_idle_ns", "GPU idle per step", human_ns),
    ("idle_causes", "GPU idle by cause (share of window)", _idle_causes_text),
    ("peak_memory_bytes", "peak memory", human_bytes),
    ("peak_device", "peak on", lambda v: v or "-"),
    ("warnings", "warnings", str),
]
_TEXT_COLUMNS = ("peak_device", "verdict", "idle_causes")
_WRAP_COLUMNS = ("idle_causes",)  # with the trace's name and the error: long text that may wrap


def _sort_key(value: Any) -> float | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):  # idle by cause: sort by the total idle share
        return float(sum(value.values()))
    return float(value)


def _index_table(rows: list[dict[str, Any]], title: str, *, mark: str | None = None) -> Table:
    cols = [c for c in _INDEX_COLUMNS if any(r.get(c[0]) is not None for r in rows)]
    cells: list[list[Cell]] = []
    for r in rows:
        name = r["trace"] + (f"  ({mark})" if mark and r.get("mark") else "")
        line = [Cell(text=name, sort=r["trace"], href=r.get("href"))]
        for key, _label, fmt in cols:
            v = r.get(key)
            line.append(Cell(text="-" if v is None else fmt(v), sort=_sort_key(v)))
        line.append(Cell(text=r.get("error") or "", sort=r.get("error")))
        cells.append(line)
    return Table(title=title, columns=["trace", *[c[1] for c in cols], "error"], rows=cells,
                 total_rows=len(rows),
                 numeric=[False, *[c[0] not in _TEXT_COLUMNS for c in cols], False],
                 wrap=[True, *[c[0] in _WRAP_COLUMNS for c in cols], True])


def _compare_png(rows: list[dict[str, Any]], labels: list[str], mark: int | None) -> bytes | None:
    from stepscope.reports.figures import compare_figure

    return compare_figure(labels, [r.get("median_step_ns") for r in rows], [r.get("p95_step_ns") for r in rows],
                          [r.get("window_busy_fraction") for r in rows], [r.get("idle_causes") for r in rows],
                          mark=mark)


def _run_section(facts: RunFacts, rows: Sequence[dict[str, Any]]) -> Section:
    """The capture run: command, device, status, and the baseline (unprofiled) step time vs the profiled one."""
    headline: list[tuple[str, str]] = []
    if facts.command:
        headline.append(("command", facts.command))
    if facts.device:
        headline.append(("device", facts.device))
    headline += [("status", str(facts.status)), ("ranks", str(facts.ranks))]
    profiled = sorted(r["median_step_ns"] for r in rows if r.get("median_step_ns") is not None)
    if facts.baseline_step_ns:
        headline.append(("baseline step (mean, unprofiled)", human_ns(facts.baseline_step_ns)))
    if profiled:
        headline.append(("profiled step (median)", human_ns(profiled[len(profiled) // 2])))
    if facts.overhead_ratio is not None:  # the capture's own ratio of means, the one `stepscope capture` printed
        headline.append(("profiled / baseline (means)", f"{facts.overhead_ratio:.2f}x"))
    notes = list(facts.notes) + ([f"capture error: {facts.error}"] if facts.error else [])
    return Section(id="run", title="Capture run", headline=headline, notes=notes)


def _side_sections(side: Sequence[SideFile], problems: list[str]) -> list[Section]:
    """A run's memory timelines and snapshots as sections; one that could not be read is a problem line."""
    from stepscope.analyze.snapshot import SnapshotResult  # (a type test only: snapshot is data, not code)

    sections = []
    for f in side:
        if f.result is None:
            problems.append(f.problem or f.path.name)
        elif isinstance(f.result, SnapshotResult):
            sections.append(snapshot_section(f.result))
        else:
            sections.append(memory_categories_section(f.result))
    return sections


def member_row(m: Member, *, run: bool) -> dict[str, Any]:
    """A member's row of the index: its figures, the link to its page, in a run the rank in its name."""
    row = dict(m.row, page=m.name)
    if m.bundle is not None:
        if run and m.bundle.trace.rank is not None:
            row["trace"] = f"rank {m.bundle.trace.rank}: {row['trace']}"
        row["href"] = f"{m.name}/index.html"
    return row


def member_page(m: Member, *, step: int | None, renderer: FigureRenderer = INLINE,
                perfetto: PerfettoLink | None = None) -> str:
    """A member's own report, linking back to the index; `renderer` draws its figures (as in `trace_report`);
    `perfetto`: the exported trace to link (`report --perfetto`)."""
    if m.bundle is None:
        raise ValueError(f"{m.path}: a failed member has no page")
    return trace_report(m.bundle, source=str(m.path), step=step, back_link="../index.html", renderer=renderer,
                        perfetto=perfetto)


def index_page(rows: list[dict[str, Any]], *, run: bool, lead: Member | None, straggler: str | None,
               facts: RunFacts | None, side: Sequence[SideFile], problems: Sequence[str], step: int | None,
               title: str, subtitle: str, reproduce: str, first: Sequence[Section] = (),
               perfetto: PerfettoLink | None = None, source: str | None = None, worst: int = 10) -> str:
    """The index: in a run the capture's facts, its memory files and the ranks side by side (`straggler`: the
    page name of the rank to mark); a batch's fleet (`fleet_section`: `worst` runs listed; `source`, the input
    as the user named it, for the `stepscope fleet` line) and its traces side by side. `lead` (a run of one rank)
    puts that rank's whole report first instead of a one-row table; `first`: sections before all (a run's verdict
    and ranks, `run_page.run_section`); `perfetto`: the run's exported trace to link."""
    from stepscope.analyze.collection import fleet_stats, reported

    sections: list[Section] = list(first)
    problems = list(problems)
    if run and facts is not None and facts.status == "failed":  # first: whatever else the page says, it ended so
        oom = [f.path.name for f in side if ".oom." in f.path.name]
        problems.insert(0, f"the capture failed: {(facts.error or 'see its manifest').splitlines()[0]}"
                           + (f" (the allocator's state then: {oom[0]}, in its section below)" if oom else ""))
    if not run and sum(map(reported, rows)) >= 2:
        sections.append(fleet_section(fleet_stats(rows, worst=worst), rows, source=source))
    if lead is not None and lead.bundle is not None:
        trace_sections, trace_problems = build_sections(ReportContext(bundle=lead.bundle, source=str(lead.path),
                                                                      step=step))
        sections += trace_sections
        problems += trace_problems
    if run:
        rows.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
        if facts is not None:
            sections.append(_run_section(facts, rows))
        sections += _side_sections(side, problems)
    for r in rows:
        r["mark"] = r.get("page") == straggler
    if lead is None:
        sections.append(_index_section(rows, run=run))
    return render_page(title=title, subtitle=subtitle, sections=sections, problems=problems, reproduce=[reproduce],
                       perfetto=perfetto)


def _index_section(rows: list[dict[str, Any]], *, run: bool) -> Section:
    """Ranks (a run) or traces (a batch) side by side: the index table and the comparison figure."""
    ok = [r for r in rows if "href" in r]  # reported (a failed trace has no page)
    if run:
        table = _index_table(rows, "Ranks side by side (click a rank for its report)", mark="straggler")
        marked = next((i for i, r in enumerate(ok) if r.get("mark")), None)
        labels = [f"rank {r['rank']}" if r.get("rank") is not None else r["trace"] for r in ok]
        png = _compare_png(ok, labels, marked)
        return Section(id="ranks", title="Ranks", tables=[table],
                       figures=[Figure(title="Ranks side by side", png=png)] if png else [])
    png = _compare_png(ok, [r["trace"] for r in ok], None)
    return Section(id="traces", title="Traces", tables=[
        _index_table(rows, "One row per trace (click a header to sort, a name for its report)")],
        figures=[Figure(title="Traces side by side", png=png)] if png else [])


# --------------------------------------------------------------------------------------------------- fleet
_WORST_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("verdict", "verdict", lambda v: str(v).replace("_", " ")),
    ("summary_gpu_busy_fraction", "GPU busy", human_fraction),
    ("median_step_ns", "step p50", human_ns),
    ("p95_step_ns", "step p95", human_ns),
    ("idle_causes", "GPU idle by cause (share of window)", _idle_causes_text),
]


def _worst_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The worst runs, one row each in the given order, the name linking to the trace's page."""
    cells = [[Cell(text=str(r["trace"]), sort=str(r["trace"]), href=r.get("href")),
              *[Cell(text="-" if r.get(k) is None else fmt(r[k]), sort=_sort_key(r.get(k)))
                for k, _label, fmt in _WORST_COLUMNS]] for r in rows]
    return Table(title=title, columns=["trace", *[c[1] for c in _WORST_COLUMNS]], rows=cells, total_rows=len(rows),
                 numeric=[False, False, True, True, True, False], wrap=[True, False, False, False, False, True])


def _spread_table(stats: FleetStats) -> Table:
    """min, p50, p90 and max across traces of each figure, in its unit."""
    lines: list[tuple[str, Spread | None, Callable[[Any], str]]] = [
        ("median step", stats.step_p50, human_ns), ("p95 step", stats.step_p95, human_ns),
        ("GPU busy", stats.gpu_busy, human_fraction)]
    cells = [[Cell(text=name), Cell(text=f"{s.traces:,}", sort=s.traces),
              *[Cell(text=fmt(v), sort=v) for v in (s.min, s.p50, s.p90, s.max)]]
             for name, s, fmt in lines if s is not None]
    return Table(title="Spread across traces (each trace's figure; p50, p90: of the traces)",
                 columns=["figure", "traces", "min", "p50", "p90", "max"], rows=cells, total_rows=len(cells),
                 numeric=[False, True, True, True, True, True])


def _verdict_table(stats: FleetStats) -> Table:
    total = sum(stats.verdicts.values())
    cells = [[Cell(text=v.replace("_", " "), sort=v), Cell(text=f"{n:,}", sort=n),
              Cell(text=human_fraction(n / total), sort=n / total)] for v, n in stats.verdicts.items()]
    if stats.failed:
        cells.append([Cell(text="(failed: no page)", sort=""), Cell(text=f"{stats.failed:,}", sort=stats.failed),
                      Cell(text="-")])
    return Table(title="Verdict counts", columns=["verdict", "traces", "share of reported"], rows=cells,
                 total_rows=len(cells), numeric=[False, True, True])


def fleet_section(stats: FleetStats, rows: list[dict[str, Any]], *, source: str | None = None) -> Section:
    """A batch taken together: verdict counts, the spread of step time and GPU busy across traces (figures and a
    min/p50/p90/max table), and the worst runs by GPU busy and by p95 step, each linking to its page. GPU busy
    is the verdict's (`stepscope summary`, `stepscope fleet`), so the lists are `stepscope fleet`'s sorted."""
    from stepscope.analyze.collection import reported
    from stepscope.reports.fleet_figures import busy_figure, step_spread_figure, verdicts_figure

    ok = [r for r in rows if reported(r)]
    verdicts = [r.get("verdict") for r in ok]
    pngs = [("Traces by verdict", verdicts_figure(stats.verdicts)),
            ("Step time across traces", step_spread_figure([r.get("median_step_ns") for r in ok],
                                                           [r.get("p95_step_ns") for r in ok], verdicts)),
            ("GPU busy across traces", busy_figure([r.get("summary_gpu_busy_fraction") for r in ok], verdicts))]
    top = next(iter(stats.verdicts.items()), None)
    headline = [("traces", f"{stats.traces:,}"), ("failed", f"{stats.failed:,}")]
    if top is not None:
        headline.append(("most common verdict", f"{top[0].replace('_', ' ')} ({top[1]:,})"))
    if stats.step_p50 is not None:
        headline.append(("median step, p50 of traces", human_ns(stats.step_p50.p50)))
    if stats.gpu_busy is not None:
        headline.append(("GPU busy, p50 of traces", human_fraction(stats.gpu_busy.p50)))
    notes = ["GPU busy here and in the table below is the verdict's: busy time over all the steps' wall time."]
    if source is not None:
        notes.append(f"The same rows as a table: stepscope fleet {source} --sort gpu_busy  (or --sort step_p95 "
                     "--desc; --json, --csv).")
    return Section(
        id="fleet", title="Fleet", headline=headline, notes=notes,
        figures=[Figure(title=t, png=png) for t, png in pngs if png is not None],
        tables=[_verdict_table(stats), _spread_table(stats),
                _worst_table(stats.lowest_busy,
                             f"Worst traces: the {len(stats.lowest_busy)} with the lowest GPU busy"),
                _worst_table(stats.longest_p95,
                             f"Worst traces: the {len(stats.longest_p95)} with the longest p95 step")],
    )


__all__ = ["fleet_section", "index_page", "member_page", "member_row", "trace_report"]
