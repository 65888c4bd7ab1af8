"""Analysis benchmark: gaps, overlap and transfers (plus kernels, steps and summary where installed) from
Parquet, on the 54 MB df_index_resolver trace and on generated traces of three sizes, to show the time and
its growth with the number of events.

    python benchmarks/analyze.py                 # df_index_resolver + 0.5M, 1M, 2M-event generated traces
    python benchmarks/analyze.py --sizes 200000  # quicker

Traces are ingested first (not timed); each analysis is then timed on a freshly opened Trace. The growth
column is (time / smallest generated trace's time) / (events / its events): 1.0 is linear.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import write_trace  # noqa: E402

from stepscope.analyze import load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DF_INDEX = ROOT.parent / "shared/corpus/traces/hta/df_index_resolver/df_index_resolver.json.gz"
# (module, function): the first three are this benchmark's subject, the rest run where they are installed
CANDIDATES = (("gaps", "gpu_gaps"), ("overlap", "cpu_gpu_overlap"), ("transfers", "transfers"),
              ("kernels", "kernel_summary"), ("steps", "step_breakdown"), ("summary", "verdict"))


def analyses() -> dict[str, Callable[[Any], Any]]:
    """The analyses importable in this checkout, by module name."""
    found = {}
    for module, function in CANDIDATES:
        name = f"stepscope.analyze.{module}"
        if importlib.util.find_spec(name) is not None:
            found[module] = getattr(importlib.import_module(name), function)
    return found


def bench(path: Path, cache: Path, fns: dict[str, Callable[[Any], Any]]) -> tuple[int, dict[str, float]]:
    """Ingest (untimed), then time each analysis on a fresh Trace; returns (events + flows, seconds by name)."""
    trace = load(path, cache_dir=cache)
    events = trace.meta.counts.events + trace.meta.counts.flows
    times = {}
    for name, fn in fns.items():
        fresh = load(trace.directory)
        started = time.perf_counter()
        fn(fresh)
        times[name] = time.perf_counter() - started
    times["together"] = together(load(trace.directory))
    return events, times


def together(trace: Any) -> float:
    """All of them as a report computes them: gaps once, shared by steps and the verdict."""
    from stepscope.analyze.gaps import gpu_gaps
    from stepscope.analyze.kernels import kernel_summary
    from stepscope.analyze.overlap import cpu_gpu_overlap
    from stepscope.analyze.steps import step_breakdown
    from stepscope.analyze.summary import verdict
    from stepscope.analyze.transfers import transfers

    started = time.perf_counter()
    gaps = gpu_gaps(trace)
    steps = step_breakdown(trace, gaps=gaps)
    verdict(trace, gaps=gaps, steps=steps)
    cpu_gpu_overlap(trace)
    transfers(trace)
    kernel_summary(trace)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[500_000, 1_000_000, 2_000_000])
    args = parser.parse_args()
    fns = analyses()
    names = list(fns)
    print(f"{'trace':<28} {'events':>10} " + " ".join(f"{n:>9}" for n in names)
          + f" {'total s':>8} {'µs/event':>9} {'growth':>7} {'together':>9}", flush=True)
    base: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory(prefix="stepscope-analyze-") as tmp:
        jobs: list[tuple[str, Path | int]] = [("df_index_resolver (54 MB)", DF_INDEX)] if DF_INDEX.is_file() else []
        jobs += [(f"generated {size / 1e6:g}M events", size) for size in args.sizes]
        for label, source in jobs:
            if isinstance(source, int):
                path = Path(tmp) / f"synthetic_{source}.json"
                write_trace(path, source)
            else:
                path = source
            events, times = bench(path, Path(tmp) / "cache", fns)
            if isinstance(source, int):
                path.unlink()
            shared = times.pop("together")
            total = sum(times.values())
            growth = "-"
            if isinstance(source, int):
                base = base or (events, total)
                growth = f"{(total / base[1]) / (events / base[0]):.2f}"
            print(f"{label:<28} {events:>10,} " + " ".join(f"{times[n]:9.2f}" for n in names)
                  + f" {total:8.2f} {total / events * 1e6:9.2f} {growth:>7} {shared:9.2f}", flush=True)


if __name__ == "__main__":
    main()
