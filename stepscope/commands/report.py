"""`stepscope report INPUT -o OUT/`: a self-contained HTML report (OUT/index.html) of one trace, a capture
run (all ranks) or a batch (a dataset from `stepscope ingest`, or a directory of traces: where they are the ranks
of one job, the index is the run's page, as `summary` and `critical-path` read such a directory)."""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from stepscope.analyze._text import plural
from stepscope.commands._engine import check_engine, engine_options
from stepscope.commands._options import echo_failure, end_batch, graph_capture_option
from stepscope.errors import UsageError

#: the file `report --perfetto` writes beside a trace's page, and beside a capture run's index
TRACE_FILE, RUN_FILE = "trace.perfetto.json.gz", "run.perfetto.json.gz"

if TYPE_CHECKING:  # the analyses and the report writer load polars and matplotlib: imported when a report runs
    from stepscope.analyze.bundle import TraceAnalysis
    from stepscope.analyze.collection import Collection, Member
    from stepscope.analyze.run_summary import RunAnalysis
    from stepscope.analyze.summary import SummaryResult
    from stepscope.reports._render import FigureRenderer
    from stepscope.reports.html import PerfettoLink, Section
    from stepscope.reports.perfetto import ExportResult

T = TypeVar("T")


@click.command("report")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory: new, empty, or an earlier report (which is replaced whole); the main page "
                   "is OUT/index.html.")
@click.option("--batch", is_flag=True,
              help="INPUT is a directory of traces even where it holds one: one report each and an index (a "
                   "directory of several traces is one without it).")
@click.option("--step", type=int, default=None,
              help="Step shown in the GPU timeline (default: the median-duration step).")
@click.option("--perfetto", is_flag=True,
              help=f"Also write the trace with the report's answers as tracks (as `stepscope export` does) beside the "
                   f"page, OUT/{TRACE_FILE} (a capture run: all ranks in one file, OUT/{RUN_FILE}), and link it.")
@graph_capture_option
@engine_options
def command(input_path: Path, out: Path, batch: bool, step: int | None, perfetto: bool,
            graph_capture: Path | None, engine: str, address: str | None) -> None:
    """HTML report: steps and GPU timeline, ops, memory, trace info and warnings, how to reproduce; for a
    run or a batch, an index with one sortable row per rank or trace linking to each report. A trace of CUDA/HIP
    graph replays with a profile of the graph capture (--graph-capture, or found in its run directory) has its
    replayed kernels attributed to the ops that launched them (op table, FLOPs, blame).

    A trace that fails in a run or batch is reported in one line and the rest go on; the exit code is 1 if
    any failed. With --perfetto, a trace file that cannot be written is said on its page, and the report is
    still written. With --engine ray, each trace of a batch is analysed and its page written by a Ray task (the
    output directory must be on storage the workers see); the index is built here."""
    from stepscope.reports._render import start_early

    if engine != "ray":  # (a batch on Ray draws its figures on the cluster)
        start_early()  # the figure workers' fork server imports matplotlib while this process loads the trace
    from stepscope._io import atomic_output_dir, check_output_dir
    from stepscope.analyze.bundle import TraceAnalysis
    from stepscope.analyze.graphs import capture_line, load_replayed, locate_capture
    from stepscope.analyze.inputs import Dataset, MemoryTimeline, RunDir, Snapshot, TraceBatch, describe, resolve
    from stepscope.reports._render import FigureWorkers
    from stepscope.reports.assemble import trace_report
    from stepscope.reports.perfetto import ExportOptions, export_trace

    start = time.perf_counter()
    check_engine(engine, address)
    if batch and graph_capture is not None:
        raise UsageError("--graph-capture maps one trace's replayed kernels: leave out --batch", path=input_path)
    captures = _run_captures(input_path) if not batch and graph_capture is None else {}
    with_capture = not batch and not captures and (graph_capture is not None
                                                   or locate_capture(input_path).capture is not None)
    inp = resolve(input_path, batch=batch) if not with_capture else None
    if isinstance(inp, Snapshot | MemoryTimeline):
        raise UsageError(f"is {describe(inp)}, not a trace: use `stepscope "
                         f"{'snapshot' if isinstance(inp, Snapshot) else 'memory-timeline'}`", path=input_path)
    check_output_dir(out, "report")
    if isinstance(inp, RunDir | Dataset | TraceBatch):
        with atomic_output_dir(out, kind="report") as tmp:
            kind, failed, total = _write_collection(inp, tmp, input_path, batch=batch, step=step, perfetto=perfetto,
                                                    engine=engine, address=address, captures=captures)
    else:
        if engine == "ray":
            click.echo("note: one trace is reported here; --engine ray maps the traces of a batch", err=True)
        frames, choice = load_replayed(input_path, graph_capture)  # (no capture given or found: the trace itself)
        with FigureWorkers() as renderer:  # they warm up while the trace is analysed
            bundle = TraceAnalysis.of(frames)
            if step is not None:
                _check_step(bundle, step)  # (before the analyses start: a wrong step is said at once)
            renderer.analyse_ahead(bundle)  # (on a machine with the cores: see FigureWorkers)
            with atomic_output_dir(out, kind="report") as tmp:
                link = _export(lambda target: export_trace(choice.trace, target, ExportOptions(), bundle=bundle),
                               tmp, TRACE_FILE) if perfetto else None
                page = trace_report(bundle, source=str(input_path), step=step, renderer=renderer, perfetto=link,
                                    capture=capture_line(choice, frames),
                                    options=["--graph-capture", str(graph_capture)] if graph_capture else [])
                (tmp / "index.html").write_text(page, encoding="utf-8")
        kind, failed, total = "trace", [], 1
    for line in failed:
        echo_failure(line)
    click.echo(f"wrote {out / 'index.html'} ({kind}, {plural(total - len(failed), 'report')}, {len(failed):,} failed) "
               f"in {time.perf_counter() - start:.1f} s")
    end_batch(failed, total)


def _run_captures(input_path: Path) -> dict[Path, Path]:
    """A capture run of one trace whose directory also holds a graph-capture profile: {trace: profile}, so the
    run's report (its facts, snapshot and memory files) maps the replayed kernels too; else {}."""
    from stepscope.analyze.inputs import RunDir, resolve
    from stepscope.errors import StepscopeError

    if not input_path.is_dir():
        return {}
    try:
        run = resolve(input_path)
    except StepscopeError:
        return {}  # (said again, properly, where the input is resolved for the report)
    if not isinstance(run, RunDir) or len(run.traces) != 1 or not run.graph_captures:
        return {}
    return {run.traces[0]: sorted(run.graph_captures)[0]}


def _check_step(bundle: TraceAnalysis, step: int) -> None:
    """--step of a single trace must be one of its steps (as `stepscope plot timeline --step` says), checked
    before anything is written: the report's sections would only note the problem. In a run or a batch, a
    member without the step says so on its page, and a step no member has is the same error."""
    from stepscope.analyze._text import numbers

    steps = bundle.frames.step_windows["step"].to_list()
    if step not in steps:
        raise UsageError(f"no step {step} in this trace (steps: {numbers(steps) or 'none'})")


def _export(write: Callable[[Path], ExportResult], directory: Path, name: str, href: str = "") -> PerfettoLink:
    """`report --perfetto`: the exported trace written to directory/name by `write`, as the page links it
    (`href`: the path from the page to `directory`); where it cannot be written, the reason, for the page."""
    from stepscope.errors import StepscopeError
    from stepscope.reports.html import PerfettoLink
    from stepscope.reports.units import human_bytes

    try:
        result = write(directory / name)
    except StepscopeError as exc:
        return PerfettoLink(error=exc.detail)
    return PerfettoLink(href=href + name, size=human_bytes(result.size_bytes))


def _write_collection(inp: Collection, tmp: Path, input_path: Path, *, batch: bool, step: int | None,
                      perfetto: bool, engine: str = "local", address: str | None = None,
                      captures: dict[Path, Path] | None = None) -> tuple[str, list[str], int]:
    """Each member's page as it is analysed (one bundle alive at a time; with `engine` ray, a batch's members each
    in a Ray task at `address`), then the index; returns the mode, the failed files' lines and the number of traces.
    With `perfetto`, a capture run's ranks in one exported file that the index and every rank's page link; in a
    batch, each trace's own beside its page. A capture run stays here (its ranks are read together for its
    verdict): with --engine ray it says so in one line."""
    from stepscope.analyze.collection import page_names, relative_name, run_facts, side_files, straggler
    from stepscope.analyze.inputs import RunDir, TraceBatch
    from stepscope.reports.assemble import index_page
    from stepscope.reports.perfetto import ExportOptions, export_run
    from stepscope.reports.units import plural

    run = isinstance(inp, RunDir)
    run_link = _export(lambda target: export_run([input_path], target, ExportOptions()), tmp, RUN_FILE) \
        if perfetto and run else None
    named = page_names(inp)
    if engine == "ray" and run:
        click.echo("note: a capture run's ranks are reported here; --engine ray maps the traces of a batch", err=True)
    verdicts: dict[Path, SummaryResult] = {}  # each member's verdict from its page, for the run's verdict
    if engine == "ray" and not run:
        written = _members_on_ray(named, tmp, step=step, perfetto=perfetto, address=address)
    else:
        written = _members_here(named, tmp, run=run, step=step, perfetto=perfetto, run_link=run_link,
                                verdicts=verdicts, captures=captures)
    order = {name: i for i, (_path, name) in enumerate(named)}
    results = sorted(_progress(written, len(named)), key=lambda w: order[w[0].name])  # (Ray's come as they finish)
    done = [m for m, _row, _steps in results]
    # a directory's traces by their path under it: two files of one name in different folders read apart
    rows = [{**row, "trace": relative_name(m.path, input_path)} if isinstance(inp, TraceBatch) else row
            for m, row, _steps in results]
    seen = {s for _m, _row, steps in results for s in steps}  # every member's steps, for --step
    lead = done[0] if run and len(named) == 1 and done[0].bundle is not None else None
    failed = [m.failure for m in done if m.failure]
    if step is not None and step not in seen and len(failed) < len(done):
        listed = ", ".join(map(str, sorted(seen)[:20])) + (", …" if len(seen) > 20 else "")
        raise UsageError(f"no step {step} in {'this run' if run else 'these traces'} (steps: {listed or 'none'})",
                         path=input_path)
    # a capture run, or a directory whose traces are the distinct ranks of one job (distributedInfo)
    ranked = [r.get("rank") for r in rows if "href" in r]
    of_ranks = len(ranked) > 1 and None not in ranked and len(set(ranked)) == len(ranked)
    first, mark, problems = (_run_verdict(input_path, rows, verdicts) if (run and len(named) > 1) or of_ranks
                             else ([], None, []))
    page = index_page(rows, run=run, lead=lead, straggler=mark or (straggler(done) if run else None),
                      facts=run_facts(inp.manifests) if isinstance(inp, RunDir) else None,
                      side=side_files(inp) if isinstance(inp, RunDir) else [], problems=failed + problems, step=step,
                      title=f"stepscope {'run' if run else 'batch'} report: {input_path.name}",
                      subtitle=f"{plural(len(rows), 'trace')} from {input_path}",
                      reproduce=f"stepscope report {input_path} -o OUT/" + (" --batch" if batch else "")
                      + (" --perfetto" if perfetto else ""),
                      first=first, perfetto=run_link, source=str(input_path))
    (tmp / "index.html").write_text(page, encoding="utf-8")
    return ("run" if run else "batch"), failed, len(rows)


#: what a member's page writer hands back: the member (its bundle let go), its index row, its steps
Written = tuple["Member", dict[str, Any], list[int]]


def _members_here(named: list[tuple[Path, str]], tmp: Path, *, run: bool, step: int | None, perfetto: bool,
                  run_link: PerfettoLink | None, verdicts: dict[Path, SummaryResult],
                  captures: dict[Path, Path] | None = None) -> Iterator[Written]:
    """Each member analysed and its page written in this process, in order, its figures drawn by workers; each
    verdict its page computed goes into `verdicts` by the trace's ingested directory (the run's verdict reads the
    ranks' own, not computed twice)."""
    from stepscope.analyze.collection import members
    from stepscope.reports._render import FigureWorkers

    with FigureWorkers() as renderer:  # a member's figures are drawn while its sections are built
        for m in members(named, captures=captures, start=renderer.analyse_ahead):
            if m.bundle is not None and "verdict" in m.bundle.__dict__:  # (computed, not raised: cached_property)
                verdicts[m.bundle.trace.directory] = m.bundle.verdict
            yield _write_member(m, tmp, run=run, step=step, perfetto=perfetto, run_link=run_link, renderer=renderer,
                                keep=run and len(named) == 1)


def _write_member(m: Member, tmp: Path, *, run: bool, step: int | None, perfetto: bool,
                  run_link: PerfettoLink | None, renderer: FigureRenderer, read_from: Path | None = None,
                  keep: bool = False) -> Written:
    """A member's page (and with `perfetto` in a batch its exported trace) written to tmp/<name>/; a failed member
    has none. `read_from`: where the trace file is when `m.path` names it as the user gave it; `keep`: hand the
    member back with its bundle and write no page of its own (a run of one rank, whose index is that rank's
    report: a page of its own would be a copy the index never links)."""
    from stepscope.reports.assemble import member_page, member_row
    from stepscope.reports.perfetto import ExportOptions, export_trace

    row = member_row(m, run=run)
    if m.bundle is None:
        return m, row, []
    steps = m.bundle.frames.step_windows["step"].to_list()
    if keep:
        return m, row, steps
    (tmp / m.name).mkdir(parents=True, exist_ok=True)
    link = run_link
    if run_link is not None and run_link.href is not None:
        link = dataclasses.replace(run_link, href=f"../{run_link.href}")
    elif perfetto and not run:
        link = _export(functools.partial(export_trace, read_from or m.path, options=ExportOptions(), bundle=m.bundle),
                       tmp / m.name, TRACE_FILE)
    page = member_page(m, step=step, renderer=renderer, perfetto=link)
    (tmp / m.name / "index.html").write_text(page, encoding="utf-8")
    return dataclasses.replace(m, bundle=None), row, steps  # page written: let its frames go


def report_member(path: str, given: str, name: str, out: str, step: int | None, perfetto: bool,
                  cache_dir: str) -> Written:
    """A Ray task: the trace at `path` (absolute) analysed and its page written to out/<name>/ (absolute), as
    `_write_member` writes it here; the page and the failure line name the trace as the user gave it (`given`)."""
    from stepscope.analyze.collection import members
    from stepscope.reports._render import INLINE

    m = next(members([(Path(path), name)], cache_dir=Path(cache_dir)))
    m = _as_given(m, path, given)
    return _write_member(m, Path(out), run=False, step=step, perfetto=perfetto, run_link=None, renderer=INLINE,
                         read_from=Path(path))


def _as_given(m: Member, path: str, given: str) -> Member:
    """The member as the user named its trace: `path` (absolute, for a worker) back to `given` in its path,
    its failure line and its row's error."""
    row = dict(m.row)
    if isinstance(row.get("error"), str):
        row["error"] = row["error"].replace(path, given)
    return dataclasses.replace(m, path=Path(given), row=row,
                               failure=m.failure.replace(path, given) if m.failure is not None else None)


def _members_on_ray(named: list[tuple[Path, str]], tmp: Path, *, step: int | None, perfetto: bool,
                    address: str | None) -> Iterator[Written]:
    """Each member of a batch a `report_member` Ray task, yielded as they finish; a task Ray lost (a worker
    killed, out of memory) is that member's failure, as a trace that cannot be read is."""
    from stepscope.analyze._locations import default_cache_dir
    from stepscope.analyze.collection import Member
    from stepscope.analyze.engines import import_ray, ray_map
    from stepscope.errors import failure_line

    import_ray()

    def lost(args: tuple[str, str, str, str, int | None, bool, str], exc: BaseException) -> Written:
        given = args[1]
        m = Member(name=args[2], path=Path(given), bundle=None, failure=failure_line(exc, given),
                   row={"trace": Path(given).name, "error": f"{type(exc).__name__}: {exc}"})
        return m, {**m.row, "page": m.name}, []

    cache = str(default_cache_dir().absolute())
    jobs = [(str(p.absolute()), str(p), name, str(tmp.absolute()), step, perfetto, cache) for p, name in named]
    yield from ray_map(report_member, jobs, on_error=lost, address=address)


def _run_verdict(input_path: Path, rows: list[dict[str, Any]], verdicts: Mapping[Path, SummaryResult]
                 ) -> tuple[list[Section], str | None, list[str]]:
    """A run's verdict and ranks section (`run_summary`, `reports.run_page`), the page of its straggler to mark in
    the index, and a problem line instead where the run's verdict cannot be computed (the rest still renders);
    `verdicts`: the ranks' verdicts their pages computed, by ingested directory."""
    from stepscope.analyze.run_summary import run_analysis
    from stepscope.reports.run_page import run_section

    pages: dict[int, str] = {}
    for r in rows:
        if r.get("rank") is not None and "href" in r:
            pages.setdefault(int(r["rank"]), str(r["href"]))
    try:
        analysis = run_analysis(input_path, known=verdicts)
        section = run_section(analysis, pages, str(input_path))
    except Exception as exc:  # noqa: BLE001 - the ranks' own pages and the index still render
        return [], None, [f"run verdict could not be computed: {type(exc).__name__}: {exc}"]
    straggler = analysis.summary.straggler
    mark = next((str(r["page"]) for r in rows if straggler is not None and r.get("rank") == straggler), None)
    path, problems = _run_path(analysis, str(input_path))
    return [section, *path], mark, problems


#: the largest run whose critical path a report computes, in ranks and in events over all ranks: the run's graph
#: holds every rank's nodes and edges at once (2.1 GiB for 1,024 small generated ranks, benchmarks/comm_scale.py;
#: about 1.2 GB for a step of 1M events, benchmarks/critical_path.py)
RUN_PATH_MAX_RANKS = 64
RUN_PATH_MAX_EVENTS = 2_000_000


def _run_path(analysis: RunAnalysis, source: str) -> tuple[list[Section], list[str]]:
    """The run's critical path section (`run_graph`, `reports.run_page.run_path_section`) built from the calls the
    run's verdict read; a problem line instead where it cannot be computed, or the run has too many ranks."""
    from stepscope.analyze.run_graph import build_run_graph, run_critical_path
    from stepscope.reports.run_page import run_path_section

    ranks = len(analysis.calls.ranks)
    events = sum(t.meta.counts.events for r in analysis.calls.ranks for t in r.traces)
    if ranks > RUN_PATH_MAX_RANKS or events > RUN_PATH_MAX_EVENTS:
        size = (f"{ranks:,} ranks, over {RUN_PATH_MAX_RANKS}" if ranks > RUN_PATH_MAX_RANKS
                else f"{events:,} events, over {RUN_PATH_MAX_EVENTS:,}")
        return [], [f"run critical path left out: {size} (its graph holds every rank at once); "
                    f"`stepscope critical-path {source}` computes it"]
    try:
        return [run_path_section(run_critical_path(build_run_graph(analysis.calls)), source)], []
    except Exception as exc:  # noqa: BLE001 - the run's verdict, the ranks' pages and the index still render
        return [], [f"run critical path could not be computed: {type(exc).__name__}: {exc}"]


def _progress(found: Iterator[T], total: int) -> Iterator[T]:
    """A progress bar on stderr for two traces or more, where stderr is a terminal (in a log a bar's label is a
    stray line)."""
    if total < 2 or not sys.stderr.isatty():
        yield from found
        return
    with click.progressbar(found, length=total, label="reporting", file=sys.stderr) as bar:
        yield from bar
