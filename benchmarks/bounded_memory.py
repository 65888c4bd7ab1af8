"""Ingest in bounded memory, whole CLI processes: a trace larger than memory should hold, a 600 MB one and a
54 MB one, against `json.load` and HolisticTraceAnalysis' load of the same file, side by side.

    python benchmarks/make_large_trace.py --target-mb 600 -o benchmarks/.data/large_cpu.pt.trace.json
    python benchmarks/make_huge_trace.py benchmarks/.data/large_cpu.pt.trace.json --copies 6 \
        -o benchmarks/.data/huge_cpu.pt.trace.json
    python benchmarks/bounded_memory.py --large benchmarks/.data/large_cpu.pt.trace.json \
        --huge benchmarks/.data/huge_cpu.pt.trace.json [--hta-python /tmp/htavenv/bin/python] [--repeat 3]

Every figure is one whole process (`python -m stepscope ingest FILE -o DATASET -q`, `python -c "json.load(…)"`,
HTA's `TraceAnalysis(trace_dir=…)` in its own environment: `pip install holistictraceanalysis "pandas<3"`),
timed around it, its peak RSS from the kernel's rusage of that child (and any process it starts); with
--repeat each the fastest of that many runs (the neighbours of a shared machine make single runs vary). The
large and huge inputs are plain JSON; the small one is the corpus' hta/df_index_resolver (gzip, 54 MB of JSON).
Each row prints the figures the fleet issue (#22) asks for beside its target:
  huge   peak RSS < 1 GiB, and MB/s >= 80% of the large trace's
  large  peak RSS <= 1x its JSON, and >= 15x faster than json.load
  small  >= 5x faster than json.load, >= 15x faster than HTA's load
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT.parent / "shared" / "corpus" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

PROBE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
         "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
         "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
JSON_LOAD = ("import gzip, json, sys; f = sys.argv[1]; "
             "json.load(gzip.open(f) if f.endswith('.gz') else open(f, 'rb'))")
HTA_LOAD = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"


def measure(args: list[str], repeat: int, before: list[str] | None = None) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of the fastest of `repeat` runs of the command; `before` runs ahead of each
    (not timed: e.g. removing the previous run's output)."""
    best: tuple[float, float] | None = None
    for _ in range(repeat):
        if before:
            subprocess.run(before, check=True)
        out = subprocess.run([sys.executable, "-c", PROBE, *args], check=True, capture_output=True,
                             text=True).stdout.split()
        run = float(out[0]), float(out[1])
        best = run if best is None or run[0] < best[0] else best
    assert best is not None
    return best


def json_mb(path: Path) -> float:
    from stepscope.analyze._read import json_size

    return json_size(path) / 1e6


def row(name: str, path: Path, tmp: Path, repeat: int, *, baselines: bool, hta: str | None) -> dict[str, float]:
    out = tmp / f"ds-{name}"
    took, rss = measure([sys.executable, "-m", "stepscope", "ingest", str(path), "-o", str(out), "-q"], repeat,
                        before=["rm", "-rf", str(out)])
    mb = json_mb(path)
    figures = {"mb": mb, "seconds": took, "mb_per_s": mb / took, "rss_mib": rss,
               "rss_per_json": rss * 2**20 / (mb * 1e6)}
    line = f"{name:<6} {mb:>8,.0f} MB  stepscope {took:7.2f} s  {mb / took:6.0f} MB/s  peak RSS {rss:7.0f} MiB " \
           f"({figures['rss_per_json']:.2f}x the JSON)"
    if baselines:
        took_json, rss_json = measure([sys.executable, "-c", JSON_LOAD, str(path)], 1 if mb > 200 else repeat)
        figures["json_load_s"] = took_json
        line += f"  |  json.load {took_json:.2f} s ({took_json / took:.1f}x), {rss_json:,.0f} MiB"
    if hta and baselines:
        trace_dir = tmp / f"hta-{name}"
        trace_dir.mkdir()
        (trace_dir / path.name).symlink_to(path.resolve())
        took_hta, _ = measure([hta, "-c", HTA_LOAD, str(trace_dir)], 1 if mb > 200 else repeat)
        figures["hta_s"] = took_hta
        line += f"  |  HTA {took_hta:.2f} s ({took_hta / took:.1f}x)"
    print(line, flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", type=Path, help="a ~600 MB plain JSON trace (make_large_trace.py)")
    parser.add_argument("--huge", type=Path, help="a multi-GB plain JSON trace (make_huge_trace.py)")
    parser.add_argument("--small", type=Path, default=SMALL)
    parser.add_argument("--hta-python", default=None, help="the python of an environment with HTA installed")
    parser.add_argument("--repeat", type=int, default=3, help="runs per stepscope figure; the fastest is shown")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bounded-"))
    env_note = f"{os.cpu_count()} cores; python {sys.version.split()[0]}"
    print(f"machine: {env_note}; each figure one whole process, the fastest of {args.repeat} runs "
          "(json.load and HTA of large traces: one run)")
    try:
        got: dict[str, dict[str, float]] = {}
        if args.small and args.small.exists():
            got["small"] = row("small", args.small, tmp, args.repeat, baselines=True, hta=args.hta_python)
        if args.large:
            got["large"] = row("large", args.large, tmp, args.repeat, baselines=True, hta=None)
        if args.huge:
            got["huge"] = row("huge", args.huge, tmp, max(1, args.repeat // 2), baselines=False, hta=None)
        print("\ntargets (issue #22, part 3):")
        if "small" in got:
            s = got["small"]
            print(f"  small >= 5x json.load: {s['json_load_s'] / s['seconds']:.1f}x" +
                  (f"; >= 15x HTA: {s['hta_s'] / s['seconds']:.1f}x" if "hta_s" in s else "; HTA not run"))
        if "large" in got:
            s = got["large"]
            print(f"  large RSS <= 1x its JSON: {s['rss_per_json']:.2f}x; >= 15x json.load: "
                  f"{s['json_load_s'] / s['seconds']:.1f}x")
        if "huge" in got:
            s = got["huge"]
            ratio = (f"{s['mb_per_s'] / got['large']['mb_per_s']:.0%} of the large trace's MB/s" if "large" in got
                     else "")
            print(f"  huge RSS < 1 GiB: {s['rss_mib']:,.0f} MiB; {ratio}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
