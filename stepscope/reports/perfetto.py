"""`stepscope export`: the trace with the analyses' answers laid over it, as a Chrome trace-event file that
Perfetto (ui.perfetto.dev, or a local copy) and chrome://tracing open.

One trace: every original event is copied as it was (the bytes of its ``traceEvents`` array, untouched; with
``--steps`` each kept event is re-encoded from its own raw values, which changes nothing but whitespace), and
the other top-level keys are kept. The added tracks follow, in a process of their own ("stepscope", a pid above
every pid of the trace), each event with ``cat: "stepscope"`` so a reader can tell them apart:

    steps | phases | verdict | GPU <d> idle (one slice per gap, named by its cause, blame in args) |
    GPU <d> stream <s> exposed copies | host syncs | critical path (each step's, tiling its window) |
    counters: GPU busy %, queue depth, memory

A run (several ranks): one file, one process per rank ("rank N", pid 2N+1) holding all of that rank's events
(each original (pid, tid) becomes one thread of it, named "<process> · <thread>"; the original process and
thread name events are replaced by those names, written without a category: they name original events, so an
ingest that drops the added tracks keeps them), its times moved by the rank's clock offset (`collectives`:
matched collectives end together), flow and async ids renumbered so ranks never share one; "rank N ·
stepscope" (pid 2N+2) holds its added tracks and one slice per collective call, and flow arrows (``s``/``f``,
``cat: "stepscope"``) run from the rank that arrived last at each call to every other rank of the call.

Times are written as Kineto writes them, microseconds with the ns in three decimals, from integer ns exactly
(`_us`). The file is written to a temporary path and renamed; a name ending in .gz is gzip.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any

import msgspec
import polars as pl

from stepscope import __version__
from stepscope._io import atomic_path
from stepscope.analyze._read import Document, iter_chunks, locate_events, read_trace
from stepscope.analyze.bundle import TraceAnalysis
from stepscope.analyze.export import Annotations, StepRange, trace_annotations
from stepscope.analyze.inputs import Dataset, RunDir, TraceBatch, resolve
from stepscope.analyze.trace import Trace
from stepscope.errors import InputError, TraceFormatError, UsageError

#: the category of every added event: `ingest` reads them as kind "other"; filter on it to drop them
CATEGORY = "stepscope"
_CHUNK_BYTES = 8 << 20
_WRITE_BYTES = 1 << 20
_NON_SPACE = re.compile(rb"\S")
_ENCODE = msgspec.json.Encoder().encode
_DECODE_EVENTS = msgspec.json.Decoder(list[dict[str, msgspec.Raw]]).decode
_DECODE_ANY = msgspec.json.Decoder().decode
#: a collective call's slice: (call, rank, arrived last, pid, tid, ts_ns)
_Placed = tuple[int, int, bool, int, int, int]


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """`only_annotations`: write the added tracks alone; `steps`: (first, last) step: original events limited
    to those steps' windows (kept whole where they overlap them), and the added tracks to those steps."""

    only_annotations: bool = False
    steps: StepRange | None = None


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What was written: the file, its size, the events copied and added, the added tracks by process."""

    output: Path
    size_bytes: int
    ranks: tuple[int, ...]  # () for one trace
    original_events: int
    added_events: int
    tracks: dict[str, list[str]]
    warnings: tuple[str, ...] = ()


def export(paths: Sequence[Path], output: Path, options: ExportOptions, *,
           cache_dir: Path | None = None) -> ExportResult:
    """Export one trace, or a run (a run directory, a directory of several traces, a dataset, several paths). A
    capture run of one trace is that trace: no clocks to align, no collectives to link across ranks."""
    if len(paths) == 1:
        inp = resolve(paths[0])
        if isinstance(inp, RunDir) and len(inp.traces) == 1:
            return export_trace(inp.traces[0], output, options, cache_dir=cache_dir)
        if not isinstance(inp, RunDir | Dataset | TraceBatch):
            return export_trace(paths[0], output, options, cache_dir=cache_dir)
    return export_run(paths, output, options, cache_dir=cache_dir)


# ------------------------------------------------------------------------------------------------ one trace


def export_trace(path: Path, output: Path, options: ExportOptions, *, cache_dir: Path | None = None,
                 bundle: TraceAnalysis | None = None) -> ExportResult:
    """The trace at `path` (a raw trace, or an ingested directory whose source file is still there), annotated;
    `bundle`: its analysis where the caller has it (`report --perfetto`), else made here."""
    from stepscope.analyze.trace import load

    if bundle is None:
        bundle = TraceAnalysis.of(load(path, cache_dir=cache_dir))
    trace = bundle.trace
    try:
        ann = trace_annotations(bundle, steps=options.steps)
    except UsageError as exc:  # named by the path given (the cache is keyed by content, not by name)
        raise UsageError(exc.detail, path=path) from None
    source = _source_file(path, trace)
    pid = _pid_above(trace)
    process = _Process(pid=pid, name="stepscope", sort_index=-1)  # above the trace's own processes
    with _Output(output) as out:
        if not options.only_annotations:
            data, start, end, top = _document(source)
            window = ann.window_ns
            written = _copy_events(out, data, start, end, source,
                                   keep=None if window is None else _overlapping(window), rewrite=None)
            counts = trace.meta.counts  # every event copied as bytes: ingest counted them
            out.originals = written if written is not None else counts.events + counts.flows + counts.metadata_events
        else:  # the tracks alone, on the trace's clock: its base time too, or they would sit at its offsets
            base = trace.meta.base_time_ns
            top = {} if base is None else {"baseTimeNanoseconds": base}
        out.add(_annotation_events(ann, process, shift_ns=0))
        out.add(process.metadata())
        out.finish(_top_level(top, options, {"source": str(source)}))
    return ExportResult(output=output, size_bytes=output.stat().st_size, ranks=(), original_events=out.originals,
                        added_events=out.added, tracks={process.name: process.thread_names})


def _source_file(path: Path, trace: Trace) -> Path:
    """The raw trace file the events are copied from: `path` itself, or an ingested trace's source file."""
    if Path(path).is_file():
        return Path(path)
    source = Path(trace.meta.source.path) if trace.meta.source.path else None
    if source is None or not source.is_file():
        raise InputError(f"is an ingested trace whose source file ({source or 'unknown'}) is not there: export "
                         "copies the original events from it; pass the trace file itself", path=path)
    return source


def _pid_above(trace: Trace) -> int:
    """A numeric pid above every numeric pid of the trace (events, flows and process metadata)."""
    found = [trace.events.select(pl.col("pid").cast(pl.Int64, strict=False).max()).collect(engine="in-memory").item(),
             trace.flows.select(pl.col("pid").cast(pl.Int64, strict=False).max()).collect(engine="in-memory").item(),
             *(int(p) for p in trace.meta.processes if p.lstrip("-").isdigit())]
    return max([0, *(int(p) for p in found if p is not None)]) + 1


# ------------------------------------------------------------------------------------------------ a run


def export_run(paths: Sequence[Path], output: Path, options: ExportOptions, *,
               cache_dir: Path | None = None) -> ExportResult:
    """Every rank of the run in `paths` in one file, clocks aligned, collectives linked (module docstring)."""
    from stepscope.analyze._comm_run import run_calls
    from stepscope.analyze.collectives import analyze_run

    run = run_calls(list(paths), cache_dir=cache_dir)
    result = analyze_run(run)
    warnings = list(result.warnings)
    offsets = _offsets(result.ranks)
    if result.call_count == 0:
        warnings.append("no collective matched across ranks: clocks left as recorded, no flow arrows")
    ids = _Ids()
    tracks: dict[str, list[str]] = {}
    windows: dict[int, list[tuple[int, int] | None]] = {}
    with _Output(output) as out:
        for rank in run.ranks:
            shift = offsets.get(rank.rank, 0)
            original = _RankRewrite(pid=2 * rank.rank + 1, rank=rank.rank, shift_ns=shift, ids=ids)
            process = _Process(pid=2 * rank.rank + 2, name=f"rank {rank.rank} · stepscope",
                               sort_index=2 * rank.rank)  # just above the rank's own events
            for path, trace in zip(rank.files, rank.traces, strict=True):
                try:
                    ann = trace_annotations(TraceAnalysis.of(trace), steps=options.steps)
                except UsageError as exc:  # this window holds none of the steps asked for
                    warnings.append(f"rank {rank.rank}: {path.name}: left out: {exc.detail}")
                    continue
                windows.setdefault(rank.rank, []).append(ann.window_ns)
                if not options.only_annotations:
                    source = _source_file(path, trace)
                    data, start, end, _ = _document(source)
                    keep = None if ann.window_ns is None else _overlapping(ann.window_ns)
                    out.originals += _copy_events(out, data, start, end, source, keep=keep, rewrite=original) or 0
                out.add(_annotation_events(ann, process, shift_ns=shift))
            if not options.only_annotations:
                out.add(original.metadata())
            out.add(_collective_slices(result.waits, rank.rank, process, shift, windows.get(rank.rank, []),
                                       out.placed))
            out.add(process.metadata())
            tracks[process.name] = process.thread_names
        if not windows:
            raise UsageError(f"no rank holds steps {options.steps[0]}..{options.steps[1]}" if options.steps
                             else "no trace of the run could be exported", path=", ".join(map(str, paths)))
        out.add(_collective_flows(out.placed, ids))
        out.finish(_top_level({}, options, {
            "ranks": [r.rank for r in run.ranks],
            "clock_offsets_ns": {str(r): offsets.get(r, 0) for r in windows},
            "sources": {str(r.rank): [str(f) for f in r.files] for r in run.ranks},
        }))
    return ExportResult(output=output, size_bytes=output.stat().st_size, ranks=tuple(sorted(windows)),
                        original_events=out.originals, added_events=out.added, tracks=tracks,
                        warnings=tuple(warnings))


def _offsets(ranks: pl.DataFrame) -> dict[int, int]:
    """rank -> clock offset in ns (`collectives`: 0 for the reference clock and for clocks it could not align)."""
    if "clock_offset_ns" not in ranks.columns:
        return {}
    return {int(r): int(o or 0) for r, o in ranks.select("rank", "clock_offset_ns").iter_rows()}


class _Ids:
    """New flow / async ids, unique in the whole file: one per (rank, cat, id) of the originals, and the
    collective arrows' own."""

    def __init__(self) -> None:
        self.next = 1
        self.seen: dict[tuple[int, bytes, bytes], int] = {}

    def of(self, rank: int, cat: bytes, raw: bytes) -> int:
        key = (rank, cat, raw)
        if key not in self.seen:
            self.seen[key] = self.fresh()
        return self.seen[key]

    def fresh(self) -> int:
        self.next += 1
        return self.next - 1


@dataclass
class _RankRewrite:
    """One rank's original events moved into its process: (pid, tid) -> a thread of pid `pid`, times shifted,
    ids renumbered; the process and thread metadata events are gathered and replaced by `metadata()`."""

    pid: int
    rank: int
    shift_ns: int
    ids: _Ids
    threads: dict[tuple[bytes, bytes], int] = field(default_factory=dict)
    process_names: dict[bytes, str] = field(default_factory=dict)
    process_labels: dict[bytes, str] = field(default_factory=dict)
    process_order: dict[bytes, int] = field(default_factory=dict)
    thread_names: dict[tuple[bytes, bytes], str] = field(default_factory=dict)
    thread_order: dict[tuple[bytes, bytes], int] = field(default_factory=dict)

    def __call__(self, ev: dict[str, msgspec.Raw]) -> dict[str, msgspec.Raw] | None:
        pid, tid = bytes(ev.get("pid", b"null")), bytes(ev.get("tid", b"null"))
        if _ph(ev) == b'"M"' and self._gathered(ev, pid, tid):
            return None
        out = dict(ev)
        out["pid"] = msgspec.Raw(str(self.pid).encode())
        if "tid" in ev:
            out["tid"] = msgspec.Raw(str(self.thread(pid, tid)).encode())
        if "ts" in ev and self.shift_ns:
            ns = _ns(ev["ts"])
            if ns is not None:
                out["ts"] = _us(ns + self.shift_ns)
        if "id" in ev:
            out["id"] = msgspec.Raw(str(self.ids.of(self.rank, bytes(ev.get("cat", b"")), bytes(ev["id"]))).encode())
        return out

    def _gathered(self, ev: dict[str, msgspec.Raw], pid: bytes, tid: bytes) -> bool:
        """Keep what a process / thread metadata event says (True), to write it as one rank's thread names."""
        kind = _DECODE_ANY(ev["name"]) if "name" in ev else None
        args = _DECODE_ANY(ev["args"]) if "args" in ev else None
        args = args if isinstance(args, dict) else {}
        if kind == "process_name":
            self.process_names[pid] = str(args.get("name", ""))
        elif kind == "process_labels":
            self.process_labels[pid] = str(args.get("labels", ""))
        elif kind == "process_sort_index" and isinstance(args.get("sort_index"), int):
            self.process_order[pid] = args["sort_index"]
        elif kind == "thread_name":
            self.thread_names[(pid, tid)] = str(args.get("name", ""))
        elif kind == "thread_sort_index" and isinstance(args.get("sort_index"), int):
            self.thread_order[(pid, tid)] = args["sort_index"]
        else:
            return kind in ("process_uptime_seconds",)
        return True

    def thread(self, pid: bytes, tid: bytes) -> int:
        if (pid, tid) not in self.threads:
            self.threads[(pid, tid)] = len(self.threads) + 1
        return self.threads[(pid, tid)]

    def metadata(self) -> list[dict[str, Any]]:
        """The rank's process name, and per thread "<process> · <thread>" (the process's label, as Kineto's
        "GPU 0", where it has one) in the order of the original processes and threads."""
        out = [_metadata("process_name", self.pid, 0, added=False, name=f"rank {self.rank}"),
               _metadata("process_sort_index", self.pid, 0, added=False, sort_index=self.pid)]

        def order(item: tuple[tuple[bytes, bytes], int]) -> tuple[int, int, int]:
            (pid, tid), new = item
            return self.process_order.get(pid, 0), self.thread_order.get((pid, tid), 0), new

        for index, ((pid, tid), new) in enumerate(sorted(self.threads.items(), key=order)):
            process = self.process_labels.get(pid) or self.process_names.get(pid) or f"pid {_text(pid)}"
            thread = (self.thread_names.get((pid, tid)) or f"tid {_text(tid)}").strip()
            out += [_metadata("thread_name", self.pid, new, added=False, name=f"{process} · {thread}"),
                    _metadata("thread_sort_index", self.pid, new, added=False, sort_index=index)]
        return out


def _ph(ev: dict[str, msgspec.Raw]) -> bytes:
    """The event's phase as its JSON text (b'"X"'): a Raw value compares equal to nothing but itself."""
    return bytes(ev["ph"]) if "ph" in ev else b""


def _text(raw: bytes) -> str:
    """A pid / tid as text ("(none)" for an empty one)."""
    value = _DECODE_ANY(raw)
    return str(value) if value not in ("", None) else "(none)"


def _collective_slices(waits: pl.DataFrame, rank: int, process: _Process, shift_ns: int,
                       windows: list[tuple[int, int] | None], placed: list[_Placed]) -> Iterator[dict[str, Any]]:
    """One slice per collective call of `rank` (in its windows) on the aligned clock, each added to `placed`
    for the arrows."""
    if waits.height == 0:
        return
    rows = waits.filter(pl.col("rank") == rank).sort("ts_ns")
    if None not in windows:
        inside = pl.lit(False)
        for lo, hi in (w for w in windows if w is not None):
            inside = inside | ((pl.col("ts_ns") + pl.col("dur_ns") > lo) & (pl.col("ts_ns") < hi))
        rows = rows.filter(inside)
    spans = [(int(r["ts_ns"]) + shift_ns, int(r["ts_ns"]) + shift_ns + int(r["dur_ns"]))
             for r in rows.iter_rows(named=True)]
    for row, (span, lane) in zip(rows.iter_rows(named=True), zip(spans, _lanes(spans), strict=True), strict=True):
        tid = process.tid("collectives" + (f" ({lane + 1})" if lane else ""))
        yield _slice(f"{row['collective']} #{row['call']}", process.pid, tid, span[0], span[1] - span[0], {
            "call": row["call"], "rank": rank, "arrival": row["arrival"], "last": row["last"],
            "wait_ns": row["wait_ns"], "residual_ns": row["residual_ns"]})
        placed.append((int(row["call"]), rank, bool(row["last"]), process.pid, tid, span[0]))


def _collective_flows(placed: list[_Placed], ids: _Ids) -> Iterator[dict[str, Any]]:
    """Arrows from the last arrival at each call to every other rank's slice of that call."""
    by_call: dict[int, list[tuple[int, bool, int, int, int]]] = {}
    for call, rank, last, pid, tid, ts in placed:
        by_call.setdefault(call, []).append((rank, last, pid, tid, ts))
    for call, slices in sorted(by_call.items()):
        if len(slices) < 2:
            continue
        source = next((s for s in slices if s[1]), slices[0])
        for target in slices:
            if target is source:
                continue
            flow_id = ids.fresh()
            name = f"collective #{call}: rank {source[0]} -> rank {target[0]}"
            yield {"ph": "s", "cat": CATEGORY, "name": name, "id": flow_id, "pid": source[2], "tid": source[3],
                   "ts": _us(source[4])}
            yield {"ph": "f", "bp": "e", "cat": CATEGORY, "name": name, "id": flow_id, "pid": target[2],
                   "tid": target[3], "ts": _us(target[4])}


# ------------------------------------------------------------------------------------------------ the added tracks


class _Process:
    """One added process: its pid, name and threads (tid by name, in the order first asked for)."""

    def __init__(self, *, pid: int, name: str, sort_index: int) -> None:
        self.pid = pid
        self.name = name
        self.sort_index = sort_index
        self.threads: dict[str, int] = {}

    def tid(self, name: str) -> int:
        if name not in self.threads:
            self.threads[name] = len(self.threads) + 1
        return self.threads[name]

    @property
    def thread_names(self) -> list[str]:
        return list(self.threads)

    def metadata(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            _metadata("process_name", self.pid, 0, name=self.name),
            _metadata("process_sort_index", self.pid, 0, sort_index=self.sort_index)]
        for name, tid in self.threads.items():
            out += [_metadata("thread_name", self.pid, tid, name=name),
                    _metadata("thread_sort_index", self.pid, tid, sort_index=tid)]
        return out


def _metadata(kind: str, pid: int, tid: int, *, added: bool = True, **args: Any) -> dict[str, Any]:
    """A metadata event naming (or ordering) an added process or thread; with `added` False, a rank's process
    or thread of original events (no category, as Kineto writes them: part of the trace, not of our tracks)."""
    event: dict[str, Any] = {"ph": "M", "cat": CATEGORY, "name": kind, "pid": pid, "tid": tid, "args": args}
    if not added:
        del event["cat"]
    return event


def _slice(name: str, pid: int, tid: int, ts_ns: int, dur_ns: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": CATEGORY, "name": name, "pid": pid, "tid": tid, "ts": _us(ts_ns), "dur": _us(dur_ns),
            "args": args}


def _lanes(spans: Sequence[tuple[int, int]]) -> list[int]:
    """A lane per span (spans in start order) such that spans sharing a lane never overlap: one thread each,
    since slices on one thread must nest."""
    ends: list[int] = []
    out = []
    for start, end in spans:
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        out.append(lane)
    return out


def _laned(frame: pl.DataFrame, process: _Process, thread: Callable[[dict[str, Any]], str], shift_ns: int,
           name: Callable[[dict[str, Any]], str], args: Callable[[dict[str, Any]], dict[str, Any]]
           ) -> Iterator[dict[str, Any]]:
    """One slice per row (start_ns, end_ns), on the thread `thread(row)` names (a lane of it where rows overlap)."""
    rows = list(frame.sort("start_ns").iter_rows(named=True))
    by_thread: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_thread.setdefault(thread(row), []).append(row)
    for base, group in by_thread.items():
        spans = [(int(r["start_ns"]), int(r["end_ns"])) for r in group]
        for row, (start, end), lane in zip(group, spans, _lanes(spans), strict=True):
            tid = process.tid(base + (f" ({lane + 1})" if lane else ""))
            yield _slice(name(row), process.pid, tid, start + shift_ns, end - start, args(row))


def _annotation_events(ann: Annotations, process: _Process, *, shift_ns: int) -> Iterator[dict[str, Any]]:
    """The added slices, instants and counters of one trace (see the module docstring), shifted by `shift_ns`."""
    if ann.steps.height:
        yield from _laned(ann.steps, process, lambda r: "steps", shift_ns, lambda r: f"step {r['step']}",
                          lambda r: {k: r[k] for k in ("step", "wall_ns", "cpu_start_ns", "cpu_end_ns",
                                                       "gpu_busy_fraction", "outlier")})
    yield from _laned(ann.phases, process, lambda r: "phases", shift_ns, lambda r: str(r["phase"]),
                      lambda r: {"step": r["step"], "phase": r["phase"], "dur_ns": r["end_ns"] - r["start_ns"]})
    yield from _verdict(ann, process, shift_ns)
    yield from _laned(ann.gaps, process, lambda r: f"GPU {r['device']} idle", shift_ns, lambda r: str(r["cause"]),
                      lambda r: {k: r[k] for k in ("cause", "dur_ns", "step", "blamed_op", "blamed_python",
                                                   "blamed_library", "blamed_runtime", "prev_kernel", "next_kernel",
                                                   "tid")} | {"dur_ns": r["end_ns"] - r["start_ns"]})
    yield from _laned(ann.copies, process, lambda r: f"GPU {r['device']} stream {r['stream']} exposed copies",
                      shift_ns, lambda r: f"exposed {r['name']}",
                      lambda r: {k: r[k] for k in ("exposed_ns", "bytes", "runtime", "op", "python_line")})
    yield from _laned(ann.syncs, process, lambda r: "host syncs", shift_ns, lambda r: str(r["name"]),
                      lambda r: {"op": r["op"], "python": r["python"], "thread": f"{r['pid']}/{r['tid']}",
                                 "dur_ns": r["end_ns"] - r["start_ns"]})
    yield from _laned(ann.critical_path, process, lambda r: "critical path", shift_ns, lambda r: str(r["name"]),
                      lambda r: {k: r[k] for k in ("step", "seq", "kind", "category", "lane", "edge_type")}
                      | {"dur_ns": r["end_ns"] - r["start_ns"]})
    yield from _counters(ann, process, shift_ns)


def _verdict(ann: Annotations, process: _Process, shift_ns: int) -> Iterator[dict[str, Any]]:
    """The verdict as one instant at the start of the first step (else of the first gap) with its evidence,
    and each step's verdict at that step's start with its runner-up, margin and evidence (summary's per step)."""
    v = ann.verdict
    starts = [int(ann.steps["start_ns"].min())] if ann.steps.height else []  # type: ignore[arg-type]
    starts += [int(ann.gaps["start_ns"].min())] if ann.gaps.height else []  # type: ignore[arg-type]
    if ann.window_ns is not None:
        starts = [ann.window_ns[0]]
    if not starts:
        return
    tid = process.tid("verdict")
    evidence = {k: getattr(v, k) for k in (
        "gpu_busy_fraction", "data_loading_fraction", "sync_fraction", "memcpy_fraction", "pageable_memcpy_fraction",
        "sync_idle_fraction", "memcpy_idle_fraction", "launch_idle_fraction", "tiny_kernel_fraction", "sync_calls",
        "mfu_fraction", "steps_found", "wall_ns")}
    yield {"ph": "i", "s": "t", "cat": CATEGORY, "name": f"verdict: {v.verdict.value}", "pid": process.pid,
           "tid": tid, "ts": _us(min(starts) + shift_ns), "args": {
               "verdict": v.verdict.value, "reason": v.reason, "advice": v.advice,
               "margin": v.margin.text if v.margin else None,
               "runner_up": v.runner_up.value if v.runner_up else None, "evidence": evidence,
               "places": v.places.to_dicts() if v.places.height else []}}
    for row in ann.step_verdicts.iter_rows(named=True):
        yield {"ph": "i", "s": "t", "cat": CATEGORY, "name": f"step {row['step']}: {row['verdict']}",
               "pid": process.pid, "tid": tid, "ts": _us(int(row["start_ns"]) + shift_ns),
               "args": {k: v for k, v in row.items() if k != "start_ns"}}


def _counters(ann: Annotations, process: _Process, shift_ns: int) -> Iterator[dict[str, Any]]:
    """Counter tracks of the added process: GPU busy % per step, queue depth per stream, memory per device."""

    def counter(name: str, ts_ns: int, values: dict[str, Any]) -> dict[str, Any]:
        return {"ph": "C", "cat": CATEGORY, "name": name, "pid": process.pid, "ts": _us(ts_ns + shift_ns),
                "args": values}

    for ts, busy in ann.utilization.iter_rows():
        yield counter("GPU busy % (per step)", int(ts), {"busy %": round(float(busy), 3)})
    for device, stream, ts, depth in ann.queue_depth.iter_rows():
        yield counter(f"launch queue depth GPU {device} stream {stream}", int(ts), {"depth": int(depth)})
    mib = 1 / (1 << 20)
    for device_name, ts, allocated, reserved in ann.memory.iter_rows():
        values = {label: round(v * mib, 3) for label, v in (("allocated MiB", allocated), ("reserved MiB", reserved))
                  if v is not None}
        if values:
            yield counter(f"memory {device_name}", int(ts), values)


# ------------------------------------------------------------------------------------------------ the file


class _Output:
    """The file being written: the `traceEvents` array, then the top-level keys; atomic, gzip by suffix."""

    def __init__(self, target: Path) -> None:
        self.target = Path(target)
        self.originals = 0
        self.added = 0
        self.first = True
        self.placed: list[_Placed] = []
        self._fh: IO[bytes] | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def __enter__(self) -> _Output:
        self._atomic = atomic_path(self.target, create_parents=False)
        tmp = self._atomic.__enter__()
        try:
            fh: IO[bytes] = (gzip.GzipFile(tmp, "wb", compresslevel=6)  # type: ignore[assignment]
                             if self.target.name.endswith(".gz") else open(tmp, "wb", buffering=1 << 20))
            self._fh = fh
            fh.write(b'{"traceEvents":[')
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self._fh is not None:
            self._fh.close()
        self._atomic.__exit__(kind, exc, tb)

    def write(self, piece: bytes) -> None:
        """One event's JSON; events are gathered into pieces of about _WRITE_BYTES (a gzip write per event
        would cost more than encoding it)."""
        if not self.first:
            self._pending.append(b",")
        self.first = False
        self._pending.append(piece)
        self._pending_bytes += len(piece) + 1
        if self._pending_bytes >= _WRITE_BYTES:
            self._flush()

    def _flush(self) -> None:
        assert self._fh is not None
        if self._pending:
            self._fh.write(b"".join(self._pending))
        self._pending, self._pending_bytes = [], 0

    def write_body(self, data: Document, lo: int, hi: int) -> None:
        """The bytes data[lo:hi] (whole events, comma-separated) as they are, in pieces."""
        self._flush()
        assert self._fh is not None
        if not self.first:
            self._fh.write(b",")
        self.first = False
        view = memoryview(data)
        for at in range(lo, hi, _WRITE_BYTES):
            self._fh.write(view[at:min(hi, at + _WRITE_BYTES)])

    def add(self, events: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> None:
        for ev in events:
            self.write(_ENCODE(ev))
            self.added += 1

    def finish(self, top: dict[str, Any]) -> None:
        self._flush()
        assert self._fh is not None
        self._fh.write(b"]")
        for key, value in top.items():
            self._fh.write(b"," + _ENCODE(key) + b":" + _ENCODE(value))
        self._fh.write(b"}\n")


def _document(source: Path) -> tuple[Document, int, int, dict[str, Any]]:
    """The source's JSON, the byte span of its traceEvents array and its other top-level keys."""
    data, _ = read_trace(source)
    start, end, top, _ = locate_events(data, source)
    return data, start, end, top


def _top_level(top: dict[str, Any], options: ExportOptions, info: dict[str, Any]) -> dict[str, Any]:
    """The source's top-level keys (one trace), and what this export is under the key "stepscope"."""
    return {**{k: v for k, v in top.items() if k != "traceEvents"}, "stepscope": {
        "version": __version__, **info, "only_annotations": options.only_annotations,
        "steps": list(options.steps) if options.steps else None, "category": CATEGORY}}


def _overlapping(window: tuple[int, int]) -> Callable[[dict[str, msgspec.Raw]], bool]:
    """Whether an event overlaps [lo, hi) in ns (an instant: lies in it); metadata and untimed events: yes."""
    lo, hi = window

    def keep(ev: dict[str, msgspec.Raw]) -> bool:
        if "ts" not in ev or _ph(ev) == b'"M"':
            return True
        ts = _ns(ev["ts"])
        if ts is None:
            return True
        dur = _ns(ev["dur"]) if "dur" in ev else None
        return ts < hi and (ts + dur > lo if dur is not None and dur > 0 else ts >= lo)

    return keep


def _copy_events(out: _Output, data: Document, start: int, end: int, source: Path, *,
                 keep: Callable[[dict[str, msgspec.Raw]], bool] | None,
                 rewrite: Callable[[dict[str, msgspec.Raw]], dict[str, msgspec.Raw] | None] | None) -> int | None:
    """Write the source's events (all of them as bytes, or those `keep` keeps, each through `rewrite`); how many
    (None for all of them as bytes: they are not decoded to be counted).

    Kept flow events whose other end was left out are dropped with it (a flow needs both ends)."""
    body_start, body_end = start + 1, data.rfind(b"]", start, end)
    if keep is None and rewrite is None:
        if _NON_SPACE.search(data, body_start, body_end) is None:
            return 0
        out.write_body(data, body_start, body_end)
        return None
    written = 0
    flows: dict[tuple[bytes, bytes], list[dict[str, msgspec.Raw]]] = {}
    for ev in _events(data, start, end, source):
        if keep is not None and not keep(ev):
            continue
        if keep is not None and _ph(ev) in (b'"s"', b'"t"', b'"f"') and "id" in ev:
            flows.setdefault((bytes(ev.get("cat", b"")), bytes(ev["id"])), []).append(ev)
            continue
        new = rewrite(ev) if rewrite is not None else ev
        if new is not None:
            out.write(_ENCODE(new))
            written += 1
    for group in flows.values():
        if {_ph(e) for e in group} >= {b'"s"', b'"f"'}:
            for ev in group:
                new = rewrite(ev) if rewrite is not None else ev
                if new is not None:
                    out.write(_ENCODE(new))
                    written += 1
    return written


def _events(data: Document, start: int, end: int, source: Path) -> Iterator[dict[str, msgspec.Raw]]:
    """Each event of data[start:end] as {key: raw value}, span by span (a span cut inside a string joins the next)."""
    pending: int | None = None
    for lo, hi in iter_chunks(data, start, end, _CHUNK_BYTES):
        begin = lo if pending is None else pending
        try:
            events = _DECODE_EVENTS(b"[" + bytes(data[begin:hi]) + b"]")
        except msgspec.DecodeError:
            pending = begin
            continue
        pending = None
        yield from events
    if pending is not None:
        raise TraceFormatError("traceEvents cannot be read as an array of events", path=source)


def _ns(raw: bytes) -> int | None:
    """A ts/dur value (µs) in integer ns, read from its text exactly as ingest reads it (`_coerce`'s time rule).

        b"1712195495519689.047" -> 1712195495519689047      b"12" -> 12000      b'"x"' -> None
    """
    text = bytes(raw)
    if text.isdigit():
        return int(text) * 1000
    try:
        return int((Decimal(text.decode()) * 1000).to_integral_value())
    except (InvalidOperation, ValueError, UnicodeDecodeError):
        return None


def _us(ns: int) -> msgspec.Raw:
    """Integer ns as µs with three decimals, exactly (a float would lose the ns of today's timestamps).

        1712195495519689047 -> 1712195495519689.047      12000 -> 12      -1500 -> -1.500
    """
    whole, frac = divmod(abs(ns), 1000)
    sign = "-" if ns < 0 else ""
    return msgspec.Raw(f"{sign}{whole}.{frac:03d}".encode() if frac else f"{sign}{whole}".encode())


__all__ = ["CATEGORY", "ExportOptions", "ExportResult", "export", "export_run", "export_trace"]
