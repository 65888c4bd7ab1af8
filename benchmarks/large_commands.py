"""Whole commands on a trace of about ten million events: time and peak RSS of `stepscope summary` (first run,
which ingests into the cache, and again from the cache) and of `stepscope report` from the cache, each one
whole CLI process, beside `json.load` of the same file where asked (--json-load: it needs several times the
file's size in memory).

    python benchmarks/large_commands.py                       # a generated trace of 10M events (about 2.5 GB)
    python benchmarks/large_commands.py --events 2000000      # quicker
    python benchmarks/large_commands.py --trace BIG.json      # a trace of your own

The generated trace (`_synth.write_trace`: steps with data loading, ops, launches, kernels on two streams,
copies, `[memory]` events and syncs) is written to a temporary directory and removed afterwards; the cache
is a temporary one too (XDG_CACHE_HOME), without a size limit. A report of a trace over 2M events keeps its
analyses in the command's own process (the figures are still drawn by worker processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import write_trace  # noqa: E402
from bounded_memory import JSON_LOAD, json_mb, measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000_000, help="events of the generated trace")
    parser.add_argument("--trace", type=Path, default=None, help="measure this trace instead of a generated one")
    parser.add_argument("--json-load", action="store_true", help="also time json.load of the trace (one run)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-large-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    os.environ["STEPSCOPE_CACHE_MAX"] = "0"
    try:
        path = args.trace
        if path is None:
            path = tmp / "generated.pt.trace.json"
            started = time.perf_counter()
            count = write_trace(path, args.events)
            print(f"generated {count:,} events, {json_mb(path):,.0f} MB in {time.perf_counter() - started:.0f} s",
                  flush=True)
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; each figure one whole process")
        stepscope = [sys.executable, "-m", "stepscope"]
        rows = [("summary, first run (ingest into the cache)", [*stepscope, "summary", str(path)]),
                ("summary, from the cache", [*stepscope, "summary", str(path)]),
                ("report, from the cache", [*stepscope, "report", str(path), "-o", str(tmp / "report")])]
        for name, command in rows:
            took, rss = measure(command, 1, before=["rm", "-rf", str(tmp / "report")])
            print(f"{name:<44} {took:7.1f} s   peak RSS {rss:7,.0f} MiB", flush=True)
        if args.json_load:
            took, rss = measure([sys.executable, "-c", JSON_LOAD, str(path)], 1)
            print(f"{'json.load (baseline)':<44} {took:7.1f} s   peak RSS {rss:7,.0f} MiB", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
