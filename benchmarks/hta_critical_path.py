"""Our critical path against HolisticTraceAnalysis's `critical_path_analysis` on HTA's own critical-path traces
(issue #20): for one annotation instance of each, the events on both paths, the ones on one only, and why.

HTA (its pandas code needs pandas < 3) lives in its own environment; this script runs there and takes our side
from the `stepscope` command (`critical-path TRACE --json`), so neither package is installed beside the other:

    python -m venv /tmp/htavenv && /tmp/htavenv/bin/pip install holistictraceanalysis "pandas<3"
    /tmp/htavenv/bin/python benchmarks/hta_critical_path.py
    /tmp/htavenv/bin/python benchmarks/hta_critical_path.py --stepscope .venv/bin/stepscope --top 5

Each trace is analysed on the same window by both: the instance of the annotation HTA's tests use, or the
outermost one holding it (`--annotation` takes outermost instances as steps; alexnet and simple_add nest the
measured `forward` HTA's tests pick, instance 1, inside instance 0), or the whole trace. Events are the
trace's `traceEvents` positions on both sides (HTA's `index`, our `event_id`), so they match exactly.

An event is *on a path* where the path spends time in it: HTA's operator/kernel edges with a weight, attributed
to an event (`CPGraph.get_event_attribution_for_edge`), and our `cpu` / `gpu` segments. The links between them
(launch latency, gaps on a stream, cross-stream waits, syncs, CPU time under no op) are summed per kind.
`HTA us` is HTA's path length (the sum of its edge weights: its sync and dependency edges weigh 0), `span` the
time from its path's first node to its last; `ours us` our step's wall time, which our segments tile.
Each difference is given a class: `annotation` (HTA's graph has no user annotations: a gap between top-level
ops is a 0-weight dependency edge there), `blocking` (HTA weighs a blocking CUDA call 0), `tie` (a kernel
launched at the moment the previous one on its stream ended: HTA takes the stream edge, we the launch), `gpu
branch` (HTA follows GPU work that ended before the CPU reached the sync: the CPU's path to it holds time HTA
weighs 0), `other` (none of these: read the two paths).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import logging
import shutil
import subprocess
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared/corpus/traces/hta/critical_path"
FORWARD = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
FORWARD_RE = r"\[param\|pytorch\.model\.alex_net\|0\|0\|0\|measure\|forward\]"


@dataclass(frozen=True, kw_only=True)
class Case:
    """One trace: HTA's annotation and instance (HTA's tests' choice, or the outermost instance holding it), and
    our `--annotation` for the same window (None: our default windows)."""

    name: str
    hta_annotation: str
    instance: int | None
    our_annotation: str | None
    note: str


CASES = (
    Case(name="alexnet", hta_annotation=FORWARD, instance=0, our_annotation=FORWARD_RE,
         note="outer measure|forward (HTA's tests: instance 1, nested in it)"),
    Case(name="simple_add", hta_annotation=FORWARD, instance=0, our_annotation=FORWARD_RE,
         note="outer measure|forward (HTA's tests: instance 1, nested in it)"),
    Case(name="cuda_event_sync", hta_annotation="ProfilerStep", instance=0, our_annotation="ProfilerStep",
         note="ProfilerStep#100, as HTA's tests"),
    Case(name="cuda_event_sync_multi_stream", hta_annotation="", instance=None, our_annotation=None,
         note="whole trace, as HTA's tests"),
)


@dataclass(frozen=True, kw_only=True)
class CpPath:
    """One side's path: µs of each event's own time on it (event index -> µs), µs per kind of link, its length,
    and (HTA) the span from its first node to its last; `order` is the events in path order."""

    length_us: float
    span_us: float | None
    events: dict[int, float]
    links: dict[str, float]
    order: list[int]


@dataclass(frozen=True, kw_only=True)
class HtaSide:
    """HTA's path, with what the classes need from its graph."""

    path: CpPath
    blocking: frozenset[int]  # events HTA treats as blocking calls
    graph_events: frozenset[int]  # events that are nodes of HTA's graph
    gpu_end_us: dict[int, float]  # GPU events on HTA's path: raw end time


def hta_side(trace_dir: Path, case: Case) -> HtaSide:
    """HTA's critical path of the case's annotation instance."""
    from hta.analyzers.critical_path_analysis import CPEdgeType, CPGraph
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=str(trace_dir))
    graph, ok = analyzer.critical_path_analysis(rank=0, annotation=case.hta_annotation, instance_id=case.instance)
    if not ok:
        raise SystemExit(f"{case.name}: HTA's critical_path_analysis failed")
    df = analyzer.t.get_trace(0)
    if not (df["index"] == df.index).all():
        raise SystemExit(f"{case.name}: HTA's trace frame index is not the traceEvents position")
    sym = analyzer.t.symbol_table.get_sym_table()
    blocking_names = set(CPGraph.BLOCKING_SYNC_CALLS)
    events: dict[int, float] = defaultdict(float)
    links: dict[str, float] = defaultdict(float)
    order: list[int] = []
    nodes = graph.critical_path_nodes
    for u, v in itertools.pairwise(nodes):
        edge = graph.edges[u, v]["object"]
        ev = graph.get_event_attribution_for_edge(edge)
        if edge.type == CPEdgeType.OPERATOR_KERNEL and ev is not None:
            events[int(ev)] += float(edge.weight)
            if edge.weight > 0 and int(ev) not in order:
                order.append(int(ev))
        else:
            links[edge.type.value.removeprefix("critical_path_")] += float(edge.weight)
    first, last = graph.node_list[nodes[0]], graph.node_list[nodes[-1]]
    gpu = df[df["stream"].ne(-1)]
    gpu_end = {int(i): float(t + analyzer.t.min_ts) for i, t in zip(gpu.index, gpu["ts"] + gpu["dur"], strict=True)
               if int(i) in events}
    return HtaSide(
        path=CpPath(length_us=float(sum(e.weight for e in graph.critical_path_edges_set)),
                   span_us=float(last.ts - first.ts), events={k: v for k, v in events.items() if v > 0},
                   links=dict(links), order=order),
        blocking=frozenset(int(i) for i, n in zip(df.index, df["name"], strict=True) if sym[int(n)] in blocking_names),
        graph_events=frozenset(int(i) for i in graph.event_to_start_node_map),
        gpu_end_us=gpu_end,
    )


def our_side(stepscope: str, trace: Path, case: Case) -> CpPath:
    """Our critical path of the case's window (the first step of `stepscope critical-path --json`)."""
    cmd = [stepscope, "critical-path", str(trace), "--json"]
    if case.our_annotation is not None:
        cmd += ["--annotation", case.our_annotation]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    step = out["steps"][0]
    events: dict[int, float] = defaultdict(float)
    links: dict[str, float] = defaultdict(float)
    order: list[int] = []
    for seg in out["segments"]:
        if seg["step"] != step["step"]:
            continue
        if seg["edge_type"] in ("cpu", "gpu") and seg["event_id"] is not None:
            events[seg["event_id"]] += seg["dur_ns"] / 1000
            if seg["event_id"] not in order:
                order.append(seg["event_id"])
        else:
            kind = "untraced cpu" if seg["edge_type"] == "cpu" else seg["edge_type"]
            links[kind] += seg["dur_ns"] / 1000
    return CpPath(length_us=step["wall_ns"] / 1000, span_us=None, events=dict(events), links=dict(links), order=order)


def classify(ev: int, *, only_ours: bool, raw: list[dict[str, Any]], hta: HtaSide,
             ours: CpPath) -> tuple[str, str | None]:
    """The class of one event on one path only (see the module docstring), and a line of evidence for a branch.

    A branch is told apart on the GPU events on HTA's path only (one run of them in these traces): our events
    there are the other side of it."""
    if only_ours and raw[ev].get("cat") == "user_annotation":
        return "annotation", None
    if only_ours and ev in hta.blocking and ev in hta.graph_events:
        return "blocking", None
    run = [g for g in hta.path.order if g not in ours.events and g in hta.gpu_end_us]
    if run and (only_ours or ev in run):
        return _gpu_branch(run, raw, hta, ours)
    return "other", None


def _gpu_branch(run: list[int], raw: list[dict[str, Any]], hta: HtaSide, ours: CpPath) -> tuple[str, str]:
    """`tie` where the GPU event after HTA's run was launched the moment the run ended, else `gpu branch`, with
    the time from the run's end to the start of the next blocking call on our path (the GPU idle before it)."""
    end = max(hta.gpu_end_us[g] for g in run)
    after = [g for g in hta.path.order if g in hta.gpu_end_us and hta.gpu_end_us[g] > end]
    if after:
        nxt = raw[after[0]]
        corr = nxt.get("args", {}).get("correlation")
        launch = next((e for e in raw if e.get("cat") in ("cuda_runtime", "cuda_driver")
                       and e.get("args", {}).get("correlation") == corr), None)
        if launch is not None and launch["ts"] == end:
            return "tie", (f"{_short(nxt['name'])} launched at the end of {_short(raw[run[-1]]['name'])}: "
                           "HTA takes the stream edge, we the launch edge")
    syncs = sorted((raw[k]["ts"], raw[k]["name"]) for k in ours.order if k in hta.blocking and raw[k]["ts"] >= end)
    if syncs:
        return "gpu branch", (f"HTA's GPU run ({_short(raw[run[0]]['name'])} ...) ends {syncs[0][0] - end:,.0f} us "
                              f"before our path's {syncs[0][1]} begins: the GPU had finished, the CPU set the end")
    return "gpu branch", f"HTA's GPU run ({_short(raw[run[0]]['name'])} ...) is not on our path"


def _short(name: str, width: int = 34) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="directory holding the four trace folders")
    parser.add_argument("--stepscope", default=None, help="the stepscope command (default: .venv/bin/stepscope)")
    parser.add_argument("--top", type=int, default=3, help="differing events to name per class")
    args = parser.parse_args(argv)
    stepscope = args.stepscope or (str(ROOT / ".venv/bin/stepscope") if (ROOT / ".venv/bin/stepscope").exists()
                                   else shutil.which("stepscope"))
    if stepscope is None:
        raise SystemExit("no stepscope command: pass --stepscope PATH")
    import pandas as pd

    if int(pd.__version__.split(".")[0]) >= 3:
        raise SystemExit(f"HTA needs pandas < 3 (found {pd.__version__}): pip install 'pandas<3'")
    warnings.filterwarnings("ignore")  # HTA's pandas FutureWarnings
    logging.disable(logging.WARNING)  # HTA's parse log and its warnings about traces without ProfilerStep

    rows: list[tuple[str, ...]] = []
    details: list[str] = []
    for case in CASES:
        trace_dir = args.corpus / case.name
        trace = next(trace_dir.glob("*.json*"))
        with (gzip.open(trace) if trace.suffix == ".gz" else trace.open("rb")) as f:
            raw: list[dict[str, Any]] = json.load(f)["traceEvents"]
        hta = hta_side(trace_dir, case)
        ours = our_side(stepscope, trace, case)
        h, o = set(hta.path.events), set(ours.events)
        only_h, only_o = h - o, o - h
        rows.append((case.name, f"{hta.path.length_us:,.0f}", f"{hta.path.span_us:,.0f}", f"{ours.length_us:,.0f}",
                     str(len(h)), str(len(o)), str(len(h & o)),
                     f"{len(only_h)} / {sum(hta.path.events[k] for k in only_h):,.0f}",
                     f"{len(only_o)} / {sum(ours.events[k] for k in only_o):,.0f}"))
        details.append(f"{case.name}: {case.note}")
        both_h = sum(hta.path.events[k] for k in h & o)
        both_o = sum(ours.events[k] for k in h & o)
        details.append(f"  in both: {len(h & o)} events, {both_h:,.0f} us on HTA's path, {both_o:,.0f} us on ours")
        notes: dict[str, str] = {}
        for side, only, path, is_ours in (("only HTA ", only_h, hta.path, False), ("only ours", only_o, ours, True)):
            by_class: dict[str, list[int]] = defaultdict(list)
            for ev in only:
                cls, note = classify(ev, only_ours=is_ours, raw=raw, hta=hta, ours=ours)
                by_class[cls].append(ev)
                if note is not None:
                    notes[cls] = note
            for cls, evs in sorted(by_class.items(), key=lambda kv: -sum(path.events[k] for k in kv[1])):
                evs.sort(key=lambda k: -path.events[k])
                named = ", ".join(f"{_short(raw[k]['name'])} {path.events[k]:,.0f}" for k in evs[: args.top])
                more = f", +{len(evs) - args.top}" if len(evs) > args.top else ""
                details.append(f"  {side} {cls:<10} {len(evs):>3} ev {sum(path.events[k] for k in evs):>7,.0f} us: "
                               f"{named}{more}")
        details += [f"  {cls}: {note}" for cls, note in sorted(notes.items())]
        for side, links in (("HTA ", hta.path.links), ("ours", ours.links)):
            details.append(f"  links {side}: " + (", ".join(f"{k} {v:,.0f}" for k, v in sorted(links.items()))
                                                   or "none"))

    header = ("trace", "HTA us", "span", "ours us", "ev HTA", "ev ours", "both", "only HTA n/us", "only ours n/us")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print()
    print("\n".join(details))


if __name__ == "__main__":
    main()
