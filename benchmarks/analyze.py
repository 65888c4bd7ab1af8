"""Analysis benchmark: every analysis from Parquet, on the 54 MB df_index_resolver trace and on generated
traces of three sizes, to show the time and its growth with the number of events.

    python benchmarks/analyze.py                 # df_index_resolver + 0.5M, 1M, 2M-event generated traces
    python benchmarks/analyze.py --sizes 200000  # quicker

Traces are ingested first (not timed); each analysis is then timed on a freshly opened Trace.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import write_trace  # noqa: E402

from stepscope.analyze import load  # noqa: E402
from stepscope.analyze.gaps import gpu_gaps  # noqa: E402
from stepscope.analyze.info import trace_info  # noqa: E402
from stepscope.analyze.kernels import kernel_summary  # noqa: E402
from stepscope.analyze.memory import memory_timeline  # noqa: E402
from stepscope.analyze.ops import op_table  # noqa: E402
from stepscope.analyze.overlap import cpu_gpu_overlap  # noqa: E402
from stepscope.analyze.steps import step_breakdown  # noqa: E402
from stepscope.analyze.summary import verdict  # noqa: E402
from stepscope.analyze.transfers import transfers  # noqa: E402

ANALYSES: dict[str, Callable[[Any], Any]] = {
    "info": trace_info, "kernels": kernel_summary, "gaps": gpu_gaps, "overlap": cpu_gpu_overlap,
    "transfers": transfers, "steps": step_breakdown, "summary": verdict, "ops": op_table, "memory": memory_timeline,
}
ROOT = Path(__file__).resolve().parents[1]
DF_INDEX = ROOT.parent / "shared/corpus/traces/hta/df_index_resolver/df_index_resolver.json.gz"


def bench(path: Path, cache: Path) -> tuple[int, dict[str, float]]:
    trace = load(path, cache_dir=cache)
    events = int(trace.meta["counts"]["events"]) + int(trace.meta["counts"]["flows"])
    times = {}
    for name, fn in ANALYSES.items():
        fresh = load(trace.directory)
        started = time.perf_counter()
        fn(fresh)
        times[name] = time.perf_counter() - started
    return events, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[500_000, 1_000_000, 2_000_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-analyze-") as tmp:
        rows = []
        if DF_INDEX.is_file():
            rows.append(("df_index_resolver (54 MB)", *bench(DF_INDEX, Path(tmp) / "cache")))
        for size in args.sizes:
            path = Path(tmp) / f"synthetic_{size}.json"
            write_trace(path, size)
            rows.append((f"generated {size / 1e6:g}M events", *bench(path, Path(tmp) / "cache")))
            path.unlink()
        names = list(ANALYSES)
        print(f"{'trace':<28} {'events':>10} " + " ".join(f"{n:>9}" for n in names) + f" {'total s':>8} {'µs/event':>9}")
        for label, events, times in rows:
            total = sum(times.values())
            print(f"{label:<28} {events:>10,} " + " ".join(f"{times[n]:9.2f}" for n in names)
                  + f" {total:8.2f} {total / events * 1e6:9.2f}")


if __name__ == "__main__":
    main()
