"""Report analyses benchmark: what the per-trace bundle (`TraceAnalysis`) saves over running each analysis
on its own, on the 54 MB df_index_resolver trace (or TRACE).

    python benchmarks/report.py                  # df_index_resolver, 5 runs of each side
    python benchmarks/report.py TRACE -n 3

The trace is ingested once (not timed; benchmarks/ingest.py measures that). Each run is a fresh child
process, the two sides in turn (bundle, standalone, bundle, ...), timed in-process:
  bundle      load(trace), TraceAnalysis.of(it), then every analysis through it in the order a report needs
              them (info, gaps, steps, kernels, overlap, transfers, ops, memory, verdict, timeline()): derived
              frames and results (gaps -> steps -> verdict, gaps -> timeline) are computed once and shared
  standalone  each analysis on its own fresh load(trace), nothing shared (steps, verdict and timeline
              recompute gaps; every analysis rebuilds the launches and windows it needs)
Per analysis: the bundle's column is the time of its first access (what it adds to what came before), the
standalone column its load + run; the totals include the loads. Seconds are the min of the runs; peak RSS
(resource.getrusage ru_maxrss of the child: interpreter + polars + the analyses) is the largest of the runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DF_INDEX = ROOT.parent / "shared/corpus/traces/hta/df_index_resolver/df_index_resolver.json.gz"
NAMES = ("info", "gaps", "steps", "kernels", "overlap", "transfers", "ops", "memory", "verdict", "timeline")


def peak_rss_mib() -> float:
    """This process's peak RSS (ru_maxrss is KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def standalone_fns() -> dict[str, Callable[[Any], Any]]:
    """Each analysis as a function of a Trace, with the arguments the bundle gives it."""
    from stepscope.analyze.bundle import MEMORY_BUCKETS
    from stepscope.analyze.gaps import gpu_gaps
    from stepscope.analyze.info import trace_info
    from stepscope.analyze.kernels import kernel_summary
    from stepscope.analyze.memory import memory_timeline
    from stepscope.analyze.ops import op_table
    from stepscope.analyze.overlap import cpu_gpu_overlap
    from stepscope.analyze.steps import step_breakdown
    from stepscope.analyze.summary import verdict
    from stepscope.analyze.timeline import gpu_timeline
    from stepscope.analyze.transfers import transfers

    return {"info": trace_info, "gaps": gpu_gaps, "steps": step_breakdown, "kernels": kernel_summary,
            "overlap": cpu_gpu_overlap, "transfers": transfers, "ops": op_table,
            "memory": lambda trace: memory_timeline(trace, buckets=MEMORY_BUCKETS), "verdict": verdict,
            "timeline": gpu_timeline}


def run_bundle(directory: Path) -> dict[str, float]:
    """load + TraceAnalysis.of + every analysis through the bundle; seconds per step and in all."""
    from stepscope.analyze import load
    from stepscope.analyze.bundle import TraceAnalysis

    times: dict[str, float] = {}
    started = time.perf_counter()
    bundle = TraceAnalysis.of(load(directory))
    for name in NAMES:
        t0 = time.perf_counter()
        bundle.timeline() if name == "timeline" else getattr(bundle, name)
        times[name] = time.perf_counter() - t0
    times["total"] = time.perf_counter() - started
    return times


def run_standalone(directory: Path) -> dict[str, float]:
    """Each analysis on a fresh load, nothing shared; seconds (load + run) per analysis and in all."""
    from stepscope.analyze import load

    fns = standalone_fns()
    times: dict[str, float] = {}
    started = time.perf_counter()
    for name in NAMES:
        t0 = time.perf_counter()
        fns[name](load(directory))
        times[name] = time.perf_counter() - t0
    times["total"] = time.perf_counter() - started
    return times


def child_main(mode: str, target: Path, cache: Path) -> None:
    """One child run: print one JSON line (seconds, peak RSS; for 'ingest' the ingested directory)."""
    from stepscope.analyze import load

    if mode == "ingest":
        print(json.dumps({"directory": str(load(target, cache_dir=cache).directory)}))
        return
    times = run_bundle(target) if mode == "bundle" else run_standalone(target)
    print(json.dumps({**times, "rss_mib": peak_rss_mib()}))


def child(mode: str, target: Path, cache: Path) -> dict[str, Any]:
    """Run `mode` in a fresh interpreter (so each run's RSS and caches are its own); its JSON line."""
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(target), "--cache", str(cache)],
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", nargs="?", type=Path, default=DF_INDEX, help="a trace file (default: df_index)")
    parser.add_argument("-n", "--runs", type=int, default=5, help="runs of each side (default 5)")
    parser.add_argument("--child", choices=("ingest", "bundle", "standalone"), help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.trace, args.cache)
        return
    if not args.trace.exists():
        if args.trace == DF_INDEX:
            print(f"skipped: {DF_INDEX} not found (the shared corpus is absent)")
            return
        parser.error(f"no such trace: {args.trace}")
    with tempfile.TemporaryDirectory(prefix="stepscope-report-") as tmp:
        cache = Path(tmp) / "cache"
        directory = Path(child("ingest", args.trace, cache)["directory"])
        runs: dict[str, list[dict[str, Any]]] = {"bundle": [], "standalone": []}
        for _ in range(args.runs):
            for mode in runs:
                runs[mode].append(child(mode, directory, cache))
    best = {mode: {k: min(r[k] for r in rs) for k in (*NAMES, "total")} for mode, rs in runs.items()}
    rss = {mode: max(r["rss_mib"] for r in rs) for mode, rs in runs.items()}
    print(f"trace: {args.trace.name} ({args.trace.stat().st_size / 1e6:.1f} MB on disk), {args.runs} runs each, "
          f"seconds = min of runs")
    print(f"{'step':<10} {'bundle s':>9} {'standalone s':>13} {'standalone/bundle':>18}")
    for name in NAMES:
        b, s = best["bundle"][name], best["standalone"][name]
        print(f"{name:<10} {b:9.3f} {s:13.3f} {s / b if b > 0 else float('nan'):18.2f}")
    b, s = best["bundle"]["total"], best["standalone"]["total"]
    print(f"{'total':<10} {b:9.3f} {s:13.3f} {s / b:18.2f}")
    print(f"{'peak RSS':<10} {rss['bundle']:8.0f}M {rss['standalone']:12.0f}M {'(MiB, max of runs)':>18}")


if __name__ == "__main__":
    main()
