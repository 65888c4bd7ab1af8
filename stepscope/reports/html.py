"""The HTML report: analysis results rendered into one self-contained page (inline CSS, PNGs as data URIs,
a small inline table sorter; readable with JavaScript off). Nothing here computes an analysis.

A report is a list of sections. Each section comes from one small builder function registered in
`SECTIONS` (in page order): it takes a `ReportContext` and returns a `Section`, or None when the trace has
nothing for it. Adding a section is one function and one line; a builder that raises turns into a warning
on the page, the rest of the report still renders.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import polars as pl

from stepscope import __version__
from stepscope.analyze._text import NO_STEPS, STEPS_ADVICE
from stepscope.reports._render import INLINE, FigureRenderer, PendingPng
from stepscope.reports.text import cell_texts, format_value, rate_unit, result_headline, whole_text_column
from stepscope.reports.units import human_bytes, human_fraction, human_ns, plural

if TYPE_CHECKING:
    from stepscope.analyze.bundle import TraceAnalysis
    from stepscope.analyze.critical_path import CriticalPathResult
    from stepscope.analyze.diff import TraceDiff
    from stepscope.analyze.memory_categories import MemoryCategoriesResult
    from stepscope.analyze.run_graph import RunCriticalPathResult
    from stepscope.analyze.snapshot import SnapshotResult

MAX_TABLE_ROWS = 50


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One PNG figure with its caption."""

    title: str
    png: bytes

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


@dataclass(frozen=True, kw_only=True)
class PendingFigure:
    """A figure still being drawn (`ReportContext.figure`): `build_sections` waits for it and keeps it as a
    `Figure`, or leaves it out when there was nothing to draw."""

    title: str
    png: PendingPng


@dataclass(frozen=True, kw_only=True)
class Cell:
    """A table cell: the text shown and the raw value the sorter orders by (None sorts last)."""

    text: str
    sort: float | str | None = None
    href: str | None = None


@dataclass(frozen=True, kw_only=True)
class Table:
    """A sortable table. `numeric` columns are right-aligned; `wrap` columns (long names) wrap where the page is
    too narrow, the others stay on one line and the table scrolls sideways in its box."""

    title: str
    columns: list[str]
    rows: list[list[Cell]]
    total_rows: int = 0
    numeric: list[bool] = field(default_factory=list)
    wrap: list[bool] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Section:
    """One section of the page: headline figures, PNG figures, tables and plain-text notes."""

    id: str
    title: str
    lead: list[str] = field(default_factory=list)  # prominent sentences (the verdict, its advice)
    headline: list[tuple[str, str]] = field(default_factory=list)
    figures: list[Figure | PendingFigure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


def display_name(name: str) -> str:
    """Column name without its unit suffix, underscores as spaces: self_cpu_ns -> self cpu."""
    for suffix in ("_ns", "_bytes", "_fraction", "_share"):
        if name.endswith(suffix):
            name = name[: -len(suffix)] + (" %" if suffix in ("_fraction", "_share") else "")
            break
    return rate_unit(name).replace("_", " ")


def _sort_value(value: Any) -> float | str | None:
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, (int, float)):
        return None if value != value else float(value)  # NaN sorts last
    return str(value)


def frame_table(frame: pl.DataFrame, title: str, *, max_rows: int | None = MAX_TABLE_ROWS,
                columns: Sequence[str] | None = None) -> Table:
    """A DataFrame as a Table: cells formatted by the unit their column name carries, raw values to sort."""
    cols = [c for c in (columns or frame.columns) if c in frame.columns]
    shown = frame.select(cols)
    if max_rows is not None:
        shown = shown.head(max_rows)
    # text in the last column shown whole, wrapping (a warning's detail); a cell cut elsewhere keeps its full text
    # in its tooltip (report.html.j2)
    last = whole_text_column(shown)
    rows = [[Cell(text=text, sort=_sort_value(v)) for text, v in zip(texts, r, strict=True)]
            for texts, r in zip(cell_texts(shown), shown.iter_rows(), strict=True)]
    numeric = [frame.schema[c].is_numeric() for c in cols]
    return Table(title=title, columns=[display_name(c) for c in cols], rows=rows, total_rows=frame.height,
                 numeric=numeric, wrap=[i == last for i in range(len(cols))])


def headline_items(result: Any, skip: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The non-table fields of a result, formatted by their units (dicts and empty values left out)."""
    out = []
    for name, value in result_headline(result).items():
        if name in skip or isinstance(value, dict) or value is None or value == "" or value == []:
            continue
        out.append((display_name(name), format_value(name, value, whole=True)))  # (a card wraps a sentence)
    return out


@dataclass(frozen=True, kw_only=True)
class PerfettoLink:
    """The trace file `report --perfetto` wrote beside the page (`stepscope export`'s file): `href` relative to
    the page and its size as text; or, where it could not be written, `error` (the page says why)."""

    href: str | None = None
    size: str | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class ReportContext:
    """What section builders share: the trace's analysis bundle (results, computed once), the step the
    timeline shows, the input as the user named it (for the commands that reproduce a section), and what
    draws the figures (here, or worker processes that draw while the next sections are built)."""

    bundle: TraceAnalysis
    source: str
    step: int | None = None
    renderer: FigureRenderer = INLINE

    def command(self, *args: str) -> str:
        return shlex.join(["stepscope", *args])

    def figure(self, title: str, draw: str, *args: Any) -> PendingFigure:
        """The figure `draw` of `args` ('figures.gaps_figure', see `_render.draw`), started now; on the page
        only if it has something to draw."""
        return PendingFigure(title=title, png=self.renderer.submit(draw, *args))


SectionBuilder = Callable[[ReportContext], Section | None]


# ---------------------------------------------------------------------------------------------- sections
def verdict_section(ctx: ReportContext) -> Section | None:
    """The verdict first (summary.py): what bounds the step, why, how close the call was and the runner-up (first
    in the headline), what to do, where to look; the trace's warnings (missing timestamps, negative durations …)
    first of all where there are any."""
    result = ctx.bundle.verdict
    name = str(result.verdict.value).replace("_", " ")
    close = [("margin", result.margin.text)] if result.margin else []
    if result.runner_up is not None:
        close.append(("runner-up", f"{result.runner_up.value}: {result.runner_up_reason}"))
    headline = close + headline_items(result, skip=("verdict", "reason", "advice", "margin", "runner_up",
                                                    "runner_up_reason", "comm_note", "sync_note", "idle_note",
                                                    "profile_next"))
    tables = []
    if result.warnings.height:
        tables.append(frame_table(result.warnings, "Warnings: the trace is odd here; read the verdict with care"))
    if result.places.height:
        tables.append(frame_table(result.places, "Where to look first"))
    if result.per_step.height:
        tables.append(frame_table(result.per_step, "Verdict per step"))
    if result.rules.height:
        tables.append(frame_table(result.rules, "Rules, in order (the first that holds decides)"))
    notes = [n for n in (result.sync_note, result.idle_note, result.comm_note) if n]
    if result.profile_next:  # a command: a note of its own, where the headline's narrow cells would break it up
        notes.append(f"Profile next, where this verdict points: {result.profile_next}")
    return Section(id="verdict", title="Verdict", lead=[f"{name}: {result.reason}", result.advice],
                   headline=headline, tables=tables, notes=notes,
                   commands=[ctx.command("summary", ctx.source)])


def steps_section(ctx: ReportContext) -> Section | None:
    """Per-step breakdown (steps.py): wall time, GPU busy/idle, CPU phases; and the GPU timeline of one step."""
    result = ctx.bundle.steps
    figs: list[Figure | PendingFigure] = []
    if result.steps_found:  # started before the timeline's critical path is found: a worker draws it meanwhile
        figs.append(ctx.figure("Each step: CPU time by phase; GPU time as compute, memcpy and idle by cause",
                               "figures.step_breakdown_figure", result))
    timeline = ctx.bundle.timeline(ctx.step)
    if result.steps_found == 0 and timeline is None:
        return None
    notes = []
    if result.steps_found:
        if result.outlier_steps:
            notes.append(f"Outlier steps (wall time far from the median): {', '.join(map(str, result.outlier_steps))}.")
        if result.left_out:
            notes.append(f"Left out: {result.left_out}.")
    else:
        notes.append(f"{NO_STEPS[0].upper()}{NO_STEPS[1:]}: the timeline shows the whole trace ({STEPS_ADVICE}).")
    if timeline is not None:
        which = ("the whole trace" if timeline.step is None else f"step {ctx.step}" if ctx.step is not None
                 else "the median-duration step (--step N for another)")
        path = ("; the top row is the step's critical path, the chain of dependent work that set its time "
                "(stepscope critical-path): kernels by category, CPU, launch, sync and idle time by kind"
                if timeline.path is not None else "")
        figs.append(ctx.figure(f"GPU timeline of {which}: one row per device and stream, kernels by category, "
                               f"idle shaded by cause, copies marked{path}", "figures.timeline_figure", timeline))
        if timeline.path_note:
            notes.append(f"GPU timeline: {timeline.path_note}.")
    cols = [c for c in result.steps.columns if c not in ("start_ns", "cpu_start_ns", "cpu_end_ns", "end_ns")]
    tables = [frame_table(result.steps, "Steps", columns=cols)] if result.steps.height else []
    if result.idle_by_cause.height:
        idle = result.idle_by_cause
        keep = ["step", *[c for c in idle.columns if c != "step" and idle[c].sum() > 0]]
        tables.append(frame_table(idle, "GPU idle by cause, per step", columns=keep))
    if result.stats.height:
        tables.append(frame_table(result.stats, "Across steps"))
    if result.modules.height:
        tables.append(frame_table(result.modules, "Time per nn.Module", max_rows=20))
    return Section(id="steps", title="Steps", headline=headline_items(result, skip=("left_out",)), figures=figs,
                   tables=tables, notes=notes, commands=[ctx.command("steps", ctx.source),
                                          ctx.command("plot", "timeline", ctx.source, "-o", "timeline.png")])


def path_parts(result: CriticalPathResult | RunCriticalPathResult, *, top_title: str,
               also: Sequence[tuple[str, str]] = (), skip: Sequence[str] = ()
               ) -> tuple[list[tuple[str, str]], list[Table]]:
    """The headline and tables of a critical-path result (one trace's or a run's): bound by, the path's split,
    `also`, its other fields but `skip`; its split by kind, its top contributors (`top_title`) and, for several
    steps, each step's split."""
    path = ", ".join(f"{kind.replace('_', ' ')} {human_fraction(share)}" for kind, share in result.path_share.items())
    headline = [("bound by", str(result.bound_by).replace("_", " ")), ("path", path), *also] + headline_items(
        result, skip=("window_kind", "bound_by", "notes", "graph_nodes", "dropped_edges", *skip))
    if result.dropped_edges:
        headline.append(("dropped edges", f"{result.dropped_edges:,} (ran backwards in time: clock skew)"))
    tables = [frame_table(result.attribution, "Critical path by kind (mean per step)"),
              frame_table(result.top, top_title)]
    if result.steps.height > 1:
        tables.append(frame_table(result.steps, "Per step"))
    return headline, tables


def critical_path_section(ctx: ReportContext) -> Section | None:
    """The critical path of every step (critical_path.py): what kind of work set the step's time, its top
    contributors with their Python lines, each step's split, and the notes on launch latency and held starts."""
    result = ctx.bundle.critical_path
    if not result.steps_found:
        return None
    headline, tables = path_parts(result, top_title="Top contributors (all steps)")
    notes = [*result.notes, "What a fix would buy: the same graph replayed with the change (stepscope whatif, or "
             "summary --predict for each verdict's fix)."]
    return Section(id="critical_path", title="Critical path", headline=headline, tables=tables, notes=notes,
                   commands=[ctx.command("critical-path", ctx.source), ctx.command("summary", ctx.source, "--predict")])


def gaps_section(ctx: ReportContext) -> Section | None:
    """GPU idle gaps (gaps.py): utilization per device, idle by cause, histogram, the longest gaps and blame."""
    result = ctx.bundle.gaps
    if result.devices_with_gpu_work == 0:
        return None
    cols = ["device", "step", "dur_ns", "cause", "blamed_op", "blamed_python", "blamed_runtime", "prev_kernel",
            "next_kernel"]
    longest = result.gaps.sort("dur_ns", descending=True, maintain_order=True)
    return Section(id="gaps", title="GPU idle gaps", headline=headline_items(result),
                   figures=[ctx.figure("Idle by cause and gap lengths", "figures.gaps_figure", result)],
                   tables=[frame_table(result.devices, "Per device"),
                           frame_table(result.idle_by_cause, "Idle by cause"),
                           frame_table(longest, "Longest gaps (what the CPU was doing)", max_rows=25, columns=cols),
                           frame_table(result.histogram, "Gap lengths")],
                   commands=[ctx.command("gaps", ctx.source)])


def overlap_section(ctx: ReportContext) -> Section | None:
    """CPU/GPU overlap (overlap.py): shares of the step windows, launch latency, queue depth, sync sources."""
    result = ctx.bundle.overlap
    if result.gpu_busy_fraction is None or ctx.bundle.kernels.gpu_events == 0:
        return None  # CPU-only trace: the verdict section already says there is no GPU work
    tables = [frame_table(getattr(result, name), title) for name, title in (
        ("launch_latency", "Launch latency (runtime call to kernel start)"),
        ("queue_depth", "Queue depth (kernels launched, not yet finished)"),
        ("sync_sources", "Synchronizing calls and the ops that made them")) if getattr(result, name).height]
    return Section(id="overlap", title="CPU/GPU overlap", headline=headline_items(result),
                   figures=[ctx.figure("Overlap", "figures.overlap_figure", result)], tables=tables,
                   commands=[ctx.command("overlap", ctx.source)])


def transfers_section(ctx: ReportContext) -> Section | None:
    """Host/device copies (transfers.py): per direction and step, pageable/sync copies, the worst ones."""
    result = ctx.bundle.transfers
    if result.copies_total == 0:
        return None
    tables = [frame_table(result.by_direction, "By direction"), frame_table(result.by_step, "By step")]
    if result.worst.height:
        tables.append(frame_table(result.worst, "Worst copies (exposed time first)", max_rows=15))
    return Section(id="transfers", title="Transfers", headline=headline_items(result),
                   figures=[ctx.figure("Copies per step", "figures.transfers_figure", result)], tables=tables,
                   commands=[ctx.command("transfers", ctx.source)])


def kernels_section(ctx: ReportContext) -> Section | None:
    """GPU time by kernel category and by kernel name (kernels.py)."""
    from stepscope.reports.labels import top_kernels

    result = ctx.bundle.kernels
    if result.gpu_events == 0:
        return None
    tables = [frame_table(result.by_category, "By category"),
              frame_table(result.by_name, "By kernel name", max_rows=30)]
    if result.by_category.height:  # the figure draws exactly then
        tables.insert(0, _kernel_labels_table(top_kernels(result)))
    return Section(id="kernels", title="Kernels", headline=headline_items(result),
                   figures=[ctx.figure("GPU time by category and top kernels", "figures.kernels_figure", result)],
                   tables=tables, commands=[ctx.command("kernels", ctx.source)])


def _kernel_labels_table(top: pl.DataFrame) -> Table:
    """The figure's top kernels: each bar's label beside the kernel's full name (not cut, it wraps)."""
    rows = [[Cell(text=r["label"], sort=r["label"]), Cell(text=r["name"], sort=r["name"]),
             Cell(text=human_ns(r["total_ns"]), sort=r["total_ns"]), Cell(text=r["category"], sort=r["category"])]
            for r in top.iter_rows(named=True)]
    return Table(title="Top kernels in the figure: bar label and full name", columns=[
        "label in the figure", "kernel (full name)", "total", "category"], rows=rows, total_rows=len(rows),
        numeric=[False, False, True, False], wrap=[True, True, False, False])


def roofline_section(ctx: ReportContext) -> Section | None:
    """How far from the hardware limit (roofline.py): FLOPs per op, achieved TFLOP/s and GB/s against the
    device's roofline, MFU per step, and the kernels to hand to the vendor's kernel profiler."""
    from stepscope.analyze.roofline import KERNEL_PROFILER

    result = ctx.bundle.roofline
    if ctx.bundle.kernels.gpu_events == 0:
        return None
    if not result.shapes_recorded:
        return Section(id="roofline", title="Hardware limits", notes=[result.note])
    tables = [frame_table(result.families, "By op family")]
    if result.ops.height:
        tables.append(frame_table(result.ops, "Per op (most GPU time first)", max_rows=25))
    if result.steps.height:
        tables.append(frame_table(result.steps, "MFU per step"))
    if result.unmodelled.height:
        tables.append(frame_table(result.unmodelled, "Kernel time no FLOP model covers, by the outermost op around "
                                  "its launch"))
    if result.handoff.height:
        tables.append(frame_table(result.handoff, "Far below the roofline: profile the kernel with "
                                  + KERNEL_PROFILER[result.vendor or "NVIDIA"]))
    return Section(id="roofline", title="Hardware limits", headline=headline_items(result, skip=("note",)),
                   notes=[result.note] if result.note else [],
                   figures=[ctx.figure("Roofline", "figures.roofline_figure", result)], tables=tables,
                   commands=[ctx.command("flops", ctx.source)])


def counters_section(ctx: ReportContext) -> Section | None:
    """The CUPTI range profiler's counters (counters.py), only in a trace it recorded: per op, per kernel name and
    per kernel measured, with the FLOPs of the instruction counters."""
    from stepscope.reports.counters_text import counter_columns
    from stepscope.reports.labels import metric_labels

    result = ctx.bundle.counters
    if not result.ranges_found:
        return None
    names = result.counters
    tables = [frame_table(counter_columns(result.by_op, names), "By op (innermost under outermost), most FLOPs first")
              ] if result.by_op.height else []
    tables += [frame_table(counter_columns(result.by_kernel, names), "By kernel, most FLOPs first"),
               frame_table(counter_columns(result.ranges, names), "Each kernel measured, in order")]
    _, pattern = metric_labels(names)
    notes = [result.note] if result.note else []
    if pattern:
        notes.append(f"Counter columns are named by their part of {pattern}.")
    return Section(id="counters", title="Hardware counters (CUPTI range profiler)",
                   headline=headline_items(result, skip=("note", "counters")), notes=notes, tables=tables,
                   commands=[ctx.command("counters", ctx.source)])


def ops_section(ctx: ReportContext) -> Section | None:
    """key_averages()-style op table, sortable, and the top ops as bars."""
    table = ctx.bundle.ops
    if table.ops.height == 0:
        return None
    cols = [c for c in ("name", "kind", "calls", "self_cpu_ns", "self_cpu_fraction", "cpu_total_ns",
                        "self_device_ns", "self_device_fraction", "device_total_ns", "self_device_mem_bytes",
                        "flops") if c in table.ops.columns]
    if table.self_device_total_ns == 0:
        cols = [c for c in cols if "device" not in c]
    if not table.has_flops:
        cols = [c for c in cols if c != "flops"]
    return Section(
        id="ops", title="Operators",
        headline=headline_items(table, skip=("sort_by", "group_by_shape")),
        figures=[ctx.figure("Top ops", "figures.ops_figure", table)],
        tables=[frame_table(table.ops, f"Ops (top {MAX_TABLE_ROWS} by {table.sort_by}; click a header to sort)",
                            columns=cols)],
        commands=[ctx.command("ops", ctx.source)],
    )


def memory_section(ctx: ReportContext) -> Section | None:
    """Allocated/reserved over time per device, the peak with its op and step, bytes per op, never freed."""
    result = ctx.bundle.memory
    if result.memory_events == 0:
        return Section(id="memory", title="Memory", notes=[
            "No [memory] events in this trace: capture with torch.profiler.profile(profile_memory=True) to "
            "see memory over time."])
    tables = [frame_table(result.devices, "Per device")]
    if result.mem_ops.height:
        tables.append(frame_table(result.mem_ops, "Allocated per op (MiB; frees not subtracted)", max_rows=20))
    if result.never_freed.height:
        tables.append(frame_table(result.never_freed, "Allocations never freed in the trace (largest)",
                                  max_rows=20))
    return Section(id="memory", title="Memory", headline=headline_items(result), tables=tables,
                   figures=[ctx.figure("Allocated and reserved over time", "memory_figures.memory_figure", result)],
                   commands=[ctx.command("memory", ctx.source)])


def info_section(ctx: ReportContext) -> Section | None:
    """Trace metadata, event counts, devices and the trace's warnings."""
    info = ctx.bundle.info
    tables = [frame_table(info.devices, "Devices"), frame_table(info.counts_by_kind, "Events by kind")]
    notes = []
    if info.warnings.height:
        tables.insert(0, frame_table(info.warnings, "Warnings"))
    else:
        notes.append("No warnings.")
    options = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in info.profiler_options.items())
    headline = headline_items(info) + ([("profiler options", options)] if options else [])
    versions = ", ".join(f"{k} {v}" for k, v in info.versions.items())
    if versions:
        headline.append(("versions", versions))
    return Section(id="info", title="Trace info and warnings", headline=headline, tables=tables, notes=notes,
                   commands=[ctx.command("info", ctx.source)])


def memory_categories_section(result: MemoryCategoriesResult) -> Section:
    """Memory by category (parameters, activations, gradients, …) from an export_memory_timeline file."""
    from stepscope.reports import memory_figures

    path = Path(result.source)
    png = memory_figures.memory_categories_figure(result)
    return Section(id="memory-categories", title=f"Memory by category ({path.name})",
                   headline=headline_items(result, skip=("source",)),
                   figures=[Figure(title="Bytes per category over time", png=png)] if png else [],
                   tables=[frame_table(result.at_peak, "At the peak")],
                   commands=[shlex.join(["stepscope", "memory", str(path)])])


def snapshot_section(result: SnapshotResult) -> Section:
    """A CUDA memory snapshot (torch.cuda.memory._dump_snapshot): peak, live blocks at the peak by frame,
    largest allocations, segments, OOMs."""
    from stepscope.reports import memory_figures

    path = Path(result.source)
    png = memory_figures.snapshot_figure(result)
    tables = [frame_table(getattr(result, name), title, max_rows=20) for name, title in (
        ("devices", "Per device"), ("live_at_peak", "Live at the peak, by user frame"),
        ("largest_allocations", "Largest allocations"), ("ooms", "Out-of-memory events"))
        if getattr(result, name).height]
    return Section(id="snapshot", title=f"Memory snapshot ({path.name})",
                   headline=headline_items(result, skip=("source",)), notes=[result.note] if result.note else [],
                   figures=[Figure(title="Allocated and reserved over time", png=png)] if png else [],
                   tables=tables, commands=[shlex.join(["stepscope", "snapshot", str(path)])])


def serving_section(ctx: ReportContext) -> Section | None:
    """An inference server's engine iterations (serving.py): per phase (prefill, decode, mixed) the latency
    percentiles, GPU busy and tokens/s, then each iteration; only where the trace names engine iterations."""
    result = ctx.bundle.serving
    if not result.iterations_found:
        return None
    return Section(id="serving", title="Serving iterations", headline=headline_items(result, skip=("note",)),
                   notes=[result.note] if result.note else [],
                   tables=[frame_table(result.phases, "Per phase (latency = each iteration's wall)"),
                           frame_table(result.iterations, "Engine iterations")],
                   commands=[ctx.command("serving", ctx.source)])


# page order; register a new section with one line here
SECTIONS: list[tuple[str, SectionBuilder]] = [
    ("verdict", verdict_section),
    ("steps", steps_section),
    ("serving", serving_section),
    ("critical_path", critical_path_section),
    ("gaps", gaps_section),
    ("overlap", overlap_section),
    ("transfers", transfers_section),
    ("kernels", kernels_section),
    ("roofline", roofline_section),
    ("counters", counters_section),
    ("ops", ops_section),
    ("memory", memory_section),
    ("info", info_section),
]


#: sections built after the others (still shown in page order): the verdict reads the results of most
#: sections but draws no figure, so building it last lets their figures be drawn while it is computed
BUILT_LAST = ("verdict",)


def build_sections(ctx: ReportContext) -> tuple[list[Section], list[str]]:
    """Run every registered builder; one that raises becomes a problem line, the others still render.

    Builders only start their figures (`ReportContext.figure`): with worker processes the figures are drawn
    while the next builders run. Then each section's figures are waited for in page order, a figure that
    raised losing its section as a builder that raised does, so the page and its problem lines are the
    same however the figures were drawn."""
    built: dict[str, Section | Exception] = {}
    for name, builder in sorted(SECTIONS, key=lambda s: s[0] in BUILT_LAST):
        try:
            section = builder(ctx)
        except Exception as exc:  # noqa: BLE001 - a broken section must not lose the rest of the report
            built[name] = exc
            continue
        if section is not None:
            built[name] = section
    sections: list[Section] = []
    problems: list[str] = []
    for name, item in sorted(built.items(), key=lambda kv: [s[0] for s in SECTIONS].index(kv[0])):
        try:
            if isinstance(item, Exception):
                raise item
            sections.append(_drawn(item))
        except Exception as exc:  # noqa: BLE001 - as above
            problems.append(f"section {name!r} could not be built: {type(exc).__name__}: {exc}")
    return sections, problems


def _drawn(section: Section) -> Section:
    """The section with its figures drawn: each pending figure waited for, those with nothing to draw left out."""
    figures: list[Figure | PendingFigure] = []
    for f in section.figures:
        png = f.png.result() if isinstance(f, PendingFigure) else f.png
        if png is not None:
            figures.append(Figure(title=f.title, png=png))
    return dataclasses.replace(section, figures=figures)


# ---------------------------------------------------------------------------------------------- rendering
_ENV: jinja2.Environment | None = None


def environment() -> jinja2.Environment:
    """The jinja2 environment (autoescape on for every template)."""
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(
            loader=jinja2.PackageLoader("stepscope.reports", "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        )
        _ENV.filters["plural"] = plural
    return _ENV


def render_page(*, title: str, subtitle: str, sections: Sequence[Section], problems: Sequence[str] = (),
                reproduce: Sequence[str] = (), back_link: str | None = None,
                perfetto: PerfettoLink | None = None) -> str:
    """One self-contained HTML page; `perfetto`: the exported trace to link (`report --perfetto`)."""
    return environment().get_template("report.html.j2").render(
        title=title, subtitle=subtitle, sections=sections, problems=problems, reproduce=reproduce,
        back_link=back_link, perfetto=perfetto, version=__version__,
        generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def trace_report(bundle: TraceAnalysis, *, source: str, step: int | None = None, back_link: str | None = None,
                 renderer: FigureRenderer = INLINE, perfetto: PerfettoLink | None = None,
                 capture: str | None = None, options: Sequence[str] = ()) -> str:
    """The full HTML report of one trace, from its analysis bundle; `renderer` draws its figures (default:
    here, one after another; `_render.FigureWorkers`: in worker processes while the sections are built);
    `perfetto`: the exported trace written beside it, to link; `capture`: the line saying which graph capture
    profile mapped its replayed kernels (`graphs.capture_line`); `options`: more of the report's command line."""
    ctx = ReportContext(bundle=bundle, source=source, step=step, renderer=renderer)
    trace = bundle.trace
    sections, problems = build_sections(ctx)
    reproduce = [ctx.command("report", source, "-o", "OUT/", *options,
                             *(["--perfetto"] if perfetto is not None else []))]
    for s in sections:
        reproduce.extend(s.commands)
    name = trace.source_name
    rank = f", rank {trace.rank}" if trace.rank is not None else ""
    mapped = f" · {capture}" if capture else ""
    return render_page(title=f"stepscope report: {name}", subtitle=f"trace {trace.trace_id}{rank}{mapped}",
                       sections=sections, problems=problems, reproduce=reproduce, back_link=back_link,
                       perfetto=perfetto)


def _delta_cell(before: float | None, after: float | None, fmt: Callable[[Any], str], relative: bool) -> Cell:
    """after - before: '-50.7 ms (-28.6%)' with relative, shares as points ('+16.0 points')."""
    if before is None or after is None:
        return Cell(text="-")
    delta = after - before
    if fmt is human_fraction:
        return Cell(text=f"{100 * delta:+.1f} points", sort=float(delta))
    pct = 100 * delta / before if relative and before else None
    # (a change that rounds to 0.0% but is not 0 keeps two significant digits: -128 KiB of 2.6 GiB is -0.0047%)
    rel = "" if pct is None else f" ({pct:+.2g}%)" if delta and abs(pct) < 0.05 else f" ({pct:+.1f}%)"
    return Cell(text=f"{'+' if delta > 0 else ''}{fmt(delta)}{rel}", sort=float(delta))


def diff_report(result: TraceDiff, *, reproduce: Sequence[str] = ()) -> str:
    """The HTML page of `stepscope diff`: the answer first (step time and verdict, before -> after), a
    before/after table of the headline figures, the figure, then the ops, kernels and idle-by-cause deltas."""
    from stepscope.reports import figures

    r = result
    lead = []
    if r.before_median_step_ns is not None and r.after_median_step_ns is not None:
        change = r.step_time_change_fraction or 0.0
        word = "faster" if change < -0.02 else "slower" if change > 0.02 else "about the same"
        lead.append(f"Median step {human_ns(r.before_median_step_ns)} → {human_ns(r.after_median_step_ns)} "
                    f"({100 * change:+.1f}%): {word}.")
    else:
        lead.append("One of the traces has no ProfilerStep#N spans: no step time to compare.")
    lead.append(f"What bounds the step: {r.before_verdict.replace('_', ' ')} → {r.after_verdict.replace('_', ' ')}.")
    if r.note:
        lead.append(r.note[0].upper() + r.note[1:] + ".")
    rows: list[tuple[str, Any, Any, Callable[[Any], str], bool]] = [
        ("steps", r.before_steps, r.after_steps, lambda v: f"{v:,}", False),
        ("median step (wall)", r.before_median_step_ns, r.after_median_step_ns, human_ns, True),
        ("GPU busy over the steps", r.before_step_gpu_busy_fraction, r.after_step_gpu_busy_fraction,
         human_fraction, False),
        ("GPU busy over the GPU span", r.before_trace_gpu_busy_fraction, r.after_trace_gpu_busy_fraction,
         human_fraction, False),
        ("self device time (all ops)", r.before_self_device_total_ns, r.after_self_device_total_ns, human_ns, True),
        ("peak memory (allocated)", r.before_peak_memory_bytes, r.after_peak_memory_bytes, human_bytes, True),
    ]
    cells: list[list[Cell]] = [[Cell(text="verdict"), Cell(text=r.before_verdict), Cell(text=r.after_verdict),
                                Cell(text="")]]
    for label, before, after, fmt, relative in rows:
        cells.append([Cell(text=label), Cell(text="-" if before is None else fmt(before), sort=before),
                      Cell(text="-" if after is None else fmt(after), sort=after),
                      _delta_cell(before, after, fmt, relative)])
    summary = Table(title="Before and after", columns=["", "before", "after", "change"], rows=cells,
                    total_rows=len(cells), numeric=[False, True, True, True])
    png = figures.diff_figure(r)
    tables = [summary]
    for name, title in (("idle_by_cause", "GPU idle by cause (gaps in the step windows, all devices)"),
                        ("ops", "Ops whose self time changed most (CPU ops and runtime calls)"),
                        ("kernels", "GPU kernels and copies whose time changed most")):
        frame = getattr(r, name)
        if frame.height:
            tables.append(frame_table(frame, title))
    section = Section(id="diff", title="What changed", lead=lead, tables=tables,
                      figures=[Figure(title="Before vs after", png=png)] if png else [],
                      notes=[f"before: {r.before}", f"after: {r.after}",
                             "Deltas are after minus before: negative is less time (faster) or less memory."])
    return render_page(title=f"stepscope diff: {r.before} → {r.after}", subtitle="after minus before",
                       sections=[section], reproduce=reproduce)

