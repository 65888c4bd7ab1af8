"""Reports for one trace, a capture run (manifest + one trace per rank) or a batch (a dataset from
`stepscope ingest`, or a directory of raw traces): HTML pages written atomically under one directory.

    OUT/index.html            the report (one trace), the run overview, or the batch index
    OUT/<name>/index.html     one report per rank (runs) or per trace (batches), linked from the index
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import polars as pl

from stepscope._io import atomic_dir
from stepscope.analyze import Trace, load
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.inputs import (
    Dataset,
    Input,
    MemoryTimeline,
    RunDir,
    Snapshot,
    TraceBatch,
    describe,
    resolve,
    traces_of,
)
from stepscope.errors import UsageError, failure_line
from stepscope.reports.html import (
    Cell,
    Figure,
    ReportContext,
    Section,
    Table,
    build_sections,
    render_page,
    trace_report,
)
from stepscope.reports.units import human_bytes, human_fraction, human_ns


@dataclass(frozen=True, kw_only=True)
class ReportOutcome:
    """What `build_report` wrote: the mode, the main page, and each input that failed (path, one line naming
    it: errors.failure_line)."""

    mode: str  # "trace", "run" or "batch"
    index: Path
    reports: int
    failed: list[tuple[str, str]] = field(default_factory=list)


def detect_mode(inp: Input) -> str:
    """"run" for a capture run, "batch" for a dataset or a directory of traces, "trace" for one trace."""
    if isinstance(inp, RunDir):
        return "run"
    if isinstance(inp, Dataset | TraceBatch):
        return "batch"
    return "trace"


def _report_inputs(inp: Input) -> list[tuple[Path, str]]:
    """Each trace of a run or batch, with the name of its page: rank<N> (rank<N>_w<k> for a rank's k-th
    profiler window) in a run, the trace's own name in a batch."""
    if isinstance(inp, RunDir):
        if len(inp.traces) == 1:
            return [(inp.traces[0], "trace")]
        named = []
        for i, rank in enumerate(inp.ranks):
            label = f"rank{rank.rank if rank.rank is not None else i}"
            named += [(w, label if len(rank.windows) == 1 else f"{label}_w{k}") for k, w in enumerate(rank.windows, 1)]
        return named
    if isinstance(inp, Dataset):
        return [(t.path, _slug(f"{t.trace_id}_rank={t.rank}")) for t in inp.traces]
    return [(p, _slug(p.name.removesuffix(".gz").removesuffix(".json"))) for p in traces_of(inp)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "trace"


def _progress(items: list[Any], label: str, show: bool) -> Iterator[Any]:
    if not show or len(items) < 2:
        yield from items
        return
    with click.progressbar(items, label=label, file=sys.stderr) as bar:
        yield from bar


def trace_row(trace: Trace, ctx: ReportContext | None = None) -> dict[str, Any]:
    """The index figures of one trace, from the analyses that exist (None where a trace has none).

    Step times are steps.py's wall times (p50, p95); `idle_shares` maps each gaps.py cause to its share of
    the analysis window, `window_busy_fraction` is gaps.py's busy share of the same window.
    """
    ctx = ctx if ctx is not None else ReportContext(bundle=TraceAnalysis.of(trace), source="")
    b = ctx.bundle
    try:
        verdict: str | None = str(b.verdict.verdict.value)
        problem = None
    except Exception as exc:  # noqa: BLE001 - a failing verdict must not drop the trace's other figures
        verdict, problem = None, f"verdict could not be computed: {type(exc).__name__}: {exc}"
    steps = b.steps.steps
    memory = b.memory
    info = b.info
    wall = steps["wall_ns"] if steps.height else None
    gaps = b.gaps
    shares: dict[str, float] = {}
    if gaps.window_ns > 0 and gaps.idle_by_cause.height:
        by = gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum()).sort("idle_ns", descending=True)
        shares = {str(c): float(v) / gaps.window_ns for c, v in by.iter_rows()}
    return {
        "trace": trace.source_name,
        "rank": trace.rank,
        "verdict": verdict,
        "steps": steps.height,
        "median_step_ns": wall.median() if wall is not None else None,
        "p95_step_ns": wall.quantile(0.95, "linear") if wall is not None else None,
        "gpu_busy_fraction": b.steps.mean_gpu_busy_fraction,
        "gpu_idle_ns": steps["gpu_idle_ns"].mean() if steps.height else None,
        "idle_causes": shares or None,
        "window_busy_fraction": gaps.busy_fraction,
        "peak_memory_bytes": memory.peak_allocated_bytes,
        "peak_device": memory.peak_device,
        "warnings": info.warnings.height,
        "error": problem,
    }


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
    ("gpu_busy_fraction", "GPU busy (mean of steps)", human_fraction),
    ("gpu_idle_ns", "GPU idle per step", human_ns),
    ("idle_causes", "GPU idle by cause (share of window)", _idle_causes_text),
    ("peak_memory_bytes", "peak memory", human_bytes),
    ("peak_device", "peak on", lambda v: v or "-"),
    ("warnings", "warnings", str),
]
_TEXT_COLUMNS = ("peak_device", "verdict", "idle_causes")


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
                 numeric=[False, *[c[0] not in _TEXT_COLUMNS for c in cols], False])


def _compare_png(rows: list[dict[str, Any]], labels: list[str], mark: int | None) -> bytes | None:
    from stepscope.reports.figures import compare_figure

    return compare_figure(labels, [r.get("median_step_ns") for r in rows], [r.get("p95_step_ns") for r in rows],
                          [r.get("window_busy_fraction") for r in rows], [r.get("idle_causes") for r in rows],
                          mark=mark)


def _report_one(path: Path, out: Path, name: str, *, source: str, step: int | None, cache_dir: Path | None,
                back_link: str | None) -> tuple[Trace, dict[str, Any], ReportContext]:
    trace = load(path, cache_dir=cache_dir)
    ctx = ReportContext(bundle=TraceAnalysis.of(trace), source=source, step=step)  # one bundle: page and row
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "index.html").write_text(trace_report(ctx.bundle, source=source, step=step, back_link=back_link),
                                           encoding="utf-8")
    return trace, trace_row(trace, ctx), ctx


def _manifest_section(manifests: Sequence[Path], rows: list[dict[str, Any]]) -> Section:
    """The capture run: command, device, profiler settings, and baseline (unprofiled) step time vs profiled."""
    headline: list[tuple[str, str]] = []
    notes: list[str] = []
    first = json.loads(manifests[0].read_text())
    cmd = first.get("command", {})
    if cmd.get("argv"):
        headline.append(("command", " ".join(map(str, cmd["argv"]))))
    device = first.get("device") or {}
    if device:
        headline.append(("device", f"{device.get('type', '?')} {device.get('name', '')}".strip()))
    headline.append(("status", str(first.get("status"))))
    headline.append(("ranks", str(len(manifests))))
    baseline = (first.get("baseline") or {}).get("mean_ns")
    profiled = [r["median_step_ns"] for r in rows if r.get("median_step_ns") is not None]
    if baseline:
        headline.append(("baseline step (mean, unprofiled)", human_ns(baseline)))
    if profiled:
        med = sorted(profiled)[len(profiled) // 2]
        headline.append(("profiled step (median)", human_ns(med)))
        if baseline:
            headline.append(("profiled / baseline", f"{med / baseline:.2f}x"))
    notes.extend(str(n) for n in first.get("notes") or [])
    if first.get("error"):
        notes.append(f"capture error: {first['error']}")
    return Section(id="run", title="Capture run", headline=headline, notes=notes)


def _run_file_sections(run: RunDir, problems: list[str]) -> list[Section]:
    """Sections for a run's other files: memory timelines by category and CUDA memory snapshots."""
    from stepscope.reports.html import memory_categories_section, snapshot_section

    sections: list[Section] = []
    from stepscope.analyze.memory_categories import memory_categories
    from stepscope.analyze.snapshot import analyze_snapshot
    from stepscope.analyze.snapshot_read import read_snapshot

    files: list[tuple[Path, Callable[[Path], Section]]] = [
        (p, lambda q: memory_categories_section(memory_categories(q)))
        for p in run.memory_timelines]
    files += [(p, lambda q: snapshot_section(analyze_snapshot(read_snapshot(q))))
              for p in run.snapshots]
    for p, builder in files:
        try:
            sections.append(builder(p))
        except Exception as exc:  # noqa: BLE001 - a bad side file must not lose the run's report
            problems.append(f"{p.name}: {type(exc).__name__}: {exc}")
    return sections


def build_report(path: Path, out: Path, *, batch: bool = False, step: int | None = None,
                 cache_dir: Path | None = None, progress: bool = True) -> ReportOutcome:
    """Write the report(s) for PATH under OUT (replaced atomically); see the module docstring for the layout.

    One bad trace in a run or batch becomes an error row; the others are still reported.
    """
    path = Path(path)
    inp = resolve(path, batch=batch)
    if isinstance(inp, Snapshot | MemoryTimeline):
        raise UsageError(f"is {describe(inp)}, not a trace: use `stepscope "
                         f"{'snapshot' if isinstance(inp, Snapshot) else 'memory-timeline'}`", path=path)
    if isinstance(inp, TraceBatch) and not batch:
        raise UsageError("holds several traces: add --batch for one report per trace and an index", path=path)
    mode = detect_mode(inp)
    with atomic_dir(Path(out)) as tmp:
        if mode == "trace":
            trace = load(inp, cache_dir=cache_dir)
            (tmp / "index.html").write_text(trace_report(TraceAnalysis.of(trace), source=str(path), step=step),
                                            encoding="utf-8")
            return ReportOutcome(mode=mode, index=Path(out) / "index.html", reports=1)
        inputs = _report_inputs(inp)
        rows: list[dict[str, Any]] = []
        failed: list[tuple[str, str]] = []
        problems_extra: list[str] = []
        seen: set[str] = set()
        single: ReportContext | None = None
        for p, name in _progress(inputs, "reporting", progress):
            while name in seen:
                name += "_"
            seen.add(name)
            try:
                trace, row, ctx = _report_one(p, tmp, name, source=str(p), step=step, cache_dir=cache_dir,
                                         back_link="../index.html")
                if mode == "run" and trace.rank is not None:
                    row["trace"] = f"rank {trace.rank}: {row['trace']}"
                if mode == "run" and len(inputs) == 1:
                    single = ctx
                row["href"] = f"{name}/index.html"
            except Exception as exc:  # noqa: BLE001 - one bad trace is reported; the rest go on
                row = {"trace": p.name, "error": f"{type(exc).__name__}: {exc}"}
                failed.append((str(p), failure_line(exc, p)))
            rows.append(row)
        sections: list[Section] = []
        if isinstance(inp, RunDir) and single is not None:
            # one rank: its whole report leads the page (verdict first), then the capture's own facts
            trace_sections, trace_problems = build_sections(single)  # analyses already computed for its page
            sections.extend(trace_sections)
            problems_extra.extend(trace_problems)
            if inp.manifests:
                sections.append(_manifest_section(inp.manifests, rows))
            sections.extend(_run_file_sections(inp, problems_extra))
            title = f"stepscope run report: {path.name}"
        elif isinstance(inp, RunDir):
            rows.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0))
            medians = [r["median_step_ns"] for r in rows if r.get("median_step_ns") is not None]
            if len(medians) > 1:
                slow = max(medians)
                for r in rows:
                    r["mark"] = r.get("median_step_ns") == slow
            if inp.manifests:
                sections.append(_manifest_section(inp.manifests, rows))
            sections.extend(_run_file_sections(inp, problems_extra))
            table = _index_table(rows, "Ranks side by side (click a rank for its report)", mark="straggler")
            ok = [r for r in rows if "href" in r]  # reported (a failed trace has no page)
            marked = next((i for i, r in enumerate(ok) if r.get("mark")), None)
            png = _compare_png(ok, [f"rank {r['rank']}" if r.get("rank") is not None else r["trace"] for r in ok],
                               marked)
            sections.append(Section(id="ranks", title="Ranks", tables=[table],
                                    figures=[Figure(title="Ranks side by side", png=png)] if png else []))
            title = f"stepscope run report: {path.name}"
        else:
            ok = [r for r in rows if "href" in r]  # reported (a failed trace has no page)
            png = _compare_png(ok, [r["trace"] for r in ok], None)
            sections.append(Section(id="traces", title="Traces", tables=[
                _index_table(rows, "One row per trace (click a header to sort, a name for its report)")],
                figures=[Figure(title="Traces side by side", png=png)] if png else []))
            title = f"stepscope batch report: {path.name}"
        problems = [line for _, line in failed] + problems_extra  # (each line names its file)
        html = render_page(title=title, subtitle=f"{len(rows)} traces from {path}", sections=sections,
                           problems=problems, reproduce=[f"stepscope report {path} -o OUT/" +
                                                         (" --batch" if batch else "")])
        (tmp / "index.html").write_text(html, encoding="utf-8")
        return ReportOutcome(mode=mode, index=Path(out) / "index.html", reports=len(rows) - len(failed),
                             failed=failed)


__all__ = ["ReportOutcome", "build_report", "detect_mode", "trace_row"]
