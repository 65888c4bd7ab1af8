"""Ingest benchmark: stepscope's JSON -> Parquet against json.load and HolisticTraceAnalysis, side by side.

    python benchmarks/ingest.py                       # df_index_resolver (54 MB) + the whole corpus batch
    python benchmarks/ingest.py --large PATH          # also a large trace (make one: make_large_trace.py)
    python benchmarks/ingest.py --repeat 5            # each figure the fastest of 5 runs (default 3)

Both traces are ingested as `stepscope ingest FILE` does by default (on every core), and also with --jobs 1.
Each measurement runs in a fresh child process, so wall time and peak RSS (ru_maxrss) are its own; the runs
of the tools compared are interleaved, and each figure is the fastest of --repeat runs (this machine's
neighbours make single runs vary by 30% and more):
  stepscope  read + decode + build columns + write events/flows Parquet + meta.json (end to end), with
             pyarrow's system allocator and malloc tuned, as the `stepscope` command runs it (see
             stepscope.prefer_system_allocator and stepscope.keep_freed_memory)
  json.load  the stdlib parsing the same uncompressed JSON (parse only; the file is pre-read)
  HTA        holistictraceanalysis' TraceAnalysis loading the trace (when `pip install .[bench]` added it)
The batch rows ingest every corpus trace as `stepscope ingest DIR` does: with --jobs 1 held to one core (the
target's "on 1 core"), with --jobs 1 free to use the second core for its Parquet writer and polars threads,
and with --jobs 2 (parallel processes). Beside them, this machine's ceiling for this work at the time: two
processes each ingesting the corpus serially at once, one per core, against one alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "traces"

CHILD = r"""
import json, os, resource, sys, time, gzip
from pathlib import Path
mode, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode in ("stepscope", "batch", "serial"):  # pyarrow's allocator and malloc as the `stepscope` command sets them
    import stepscope
    stepscope.prefer_system_allocator()
    stepscope.keep_freed_memory()
jobs = int(sys.argv[4]) if len(sys.argv) > 4 else 1
if len(sys.argv) > 5:  # run on these cores only (before polars sizes its thread pool)
    os.sched_setaffinity(0, {int(c) for c in sys.argv[5].split(",")})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
extra = {}
if mode == "stepscope":
    from stepscope.analyze.ingest import ingest_trace
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    r = ingest_trace(src, out, force=True, jobs=jobs)
    wall = time.perf_counter() - t
    extra = {"events": r.n_events, "parquet_bytes": sum(p.stat().st_size for p in out.glob("*.parquet"))}
elif mode == "json":
    raw = src.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    json.loads(raw)
    wall = time.perf_counter() - t
elif mode == "hta":
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    TraceAnalysis(trace_dir=str(src.parent), trace_files={0: src.name})
    wall = time.perf_counter() - t
elif mode == "batch":  # as `stepscope ingest DIR -o OUT --jobs N --force` runs it
    from stepscope.analyze.dataset import ingest_many
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    r = ingest_many([src], out, jobs=jobs, force=True, fork_workers=True)
    wall = time.perf_counter() - t
    extra = {"files": len(r.outcomes), "failed": r.failed}
elif mode == "serial":  # every trace one after the other in this process (one of a pair run at once)
    from stepscope.analyze.ingest import ingest_trace
    from stepscope.analyze.inputs import find_trace_files
    files = find_trace_files([src])
    t = time.perf_counter()
    for f in files:
        ingest_trace(f, out / f.name, force=True)
    wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "peak_rss_bytes": peak * 1024, "base_rss_bytes": base * 1024, **extra}))
"""


def child(mode: str, src: Path, out: Path, jobs: int = 1, cores: str | None = None) -> dict[str, float] | None:
    """Run one measurement in a fresh interpreter (on `cores` only, e.g. "0,1", when given); None when it
    could not run (e.g. HTA missing)."""
    pinned = [cores] if cores else []
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out), str(jobs), *pinned],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  ({mode} did not run: {last[:120]})", file=sys.stderr)
        return None
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


Run = tuple[str, str, Path, Path, int, str | None]  # label, mode, source, output, jobs, cores (None: all)


def fastest(runs: list[Run], repeat: int) -> dict[str, dict[str, float] | None]:
    """Each run `repeat` times, interleaved; the fastest run of each label."""
    best: dict[str, dict[str, float] | None] = {label: None for label, *_ in runs}
    failed: set[str] = set()
    for _ in range(repeat):
        for label, mode, src, out, jobs, cores in runs:
            if label in failed:
                continue
            r = child(mode, src, out, jobs, cores)
            if r is None:
                failed.add(label)
                continue
            if best[label] is None or r["wall_s"] < best[label]["wall_s"]:  # type: ignore[index]
                best[label] = r
    return best


def json_size(path: Path) -> int:
    """Uncompressed size, streamed: the parent must stay small, since a child inherits its peak RSS mark."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    total = 0
    with opener(path, "rb") as fh:
        while block := fh.read(1 << 22):
            total += len(block)
    return total


def bench_file(path: Path, tmp: Path, jobs: int, repeat: int) -> None:
    size = json_size(path)
    print(f"\n{path.name}: {size / 1e6:.0f} MB of JSON (fastest of {repeat})")
    print(f"  {'what':<22} {'wall s':>8} {'MB/s':>8} {'peak RSS MB':>12} {'RSS/JSON':>9} {'vs stepscope':>13}")
    runs: list[Run] = [("stepscope ingest" + (f" -j{jobs}" if jobs > 1 else ""), "stepscope", path, tmp / "ours", jobs,
                        None)]
    if jobs > 1:
        runs.append(("stepscope ingest -j1", "stepscope", path, tmp / "ours1", 1, None))
    runs += [("json.load (parse only)", "json", path, tmp / "j", 1, None),
             ("HTA TraceAnalysis load", "hta", path, tmp / "h", 1, None)]
    best = fastest(runs, repeat)
    ours = best[runs[0][0]]
    for name, r in best.items():
        if r is None:
            print(f"  {name:<22} {'n/a':>8}")
            continue
        ratio = (r["wall_s"] / ours["wall_s"]) if ours else float("nan")
        print(f"  {name:<22} {r['wall_s']:8.2f} {size / 1e6 / r['wall_s']:8.0f} {r['peak_rss_bytes'] / 1e6:12.0f} "
              f"{r['peak_rss_bytes'] / size:9.2f} {ratio:12.1f}x")
    if ours:
        print(f"  events: {int(ours['events']):,}; Parquet: {ours['parquet_bytes'] / 1e6:.1f} MB "
              f"({size / ours['parquet_bytes']:.0f}x smaller than the JSON); interpreter baseline RSS "
              f"{ours['base_rss_bytes'] / 1e6:.0f} MB")


def workload_ceiling(tmp: Path, repeat: int) -> float:
    """What two processes doing this work at once get on this machine now: every corpus trace ingested one
    after the other in one process on core 0, then in two such processes at once on cores 0 and 1;
    2 x alone / the slower of the pair (2.0 where two cores share nothing; less where they share memory
    bandwidth or a busy host takes its share). The fastest of `repeat` runs each."""
    def serial(cores: list[str]) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, "serial", str(CORPUS), str(tmp / f"serial{c}"), "1", c],
                                  stdout=subprocess.PIPE, text=True) for c in cores]
        return max(float(json.loads(p.communicate()[0].strip().splitlines()[-1])["wall_s"]) for p in procs)

    alone = pair = float("inf")
    for _ in range(repeat):
        alone, pair = min(alone, serial(["0"])), min(pair, serial(["0", "1"]))
    return 2 * alone / pair


def bench_batch(tmp: Path, repeat: int) -> None:
    files = [p for p in CORPUS.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
             and "memory_timeline" not in p.name]
    total = sum(json_size(p) for p in files)
    print(f"\ncorpus batch (stepscope ingest DIR --jobs N): {len(files)} traces, {total / 1e6:.0f} MB of JSON "
          f"(fastest of {repeat})")
    runs: list[Run] = [("--jobs 1, on 1 core", "batch", CORPUS, tmp / "batch1c", 1, "0"),
                       ("--jobs 1", "batch", CORPUS, tmp / "batch1", 1, None),
                       ("--jobs 2", "batch", CORPUS, tmp / "batch2", 2, None)]
    best = fastest(runs, repeat)
    for label, r in best.items():
        if r:
            print(f"  {label:<20} {r['wall_s']:.2f} s, {total / 1e6 / r['wall_s']:.0f} MB/s, "
                  f"{int(r['files'])} files, {int(r['failed'])} failed")
    one_core, one, two = best["--jobs 1, on 1 core"], best["--jobs 1"], best["--jobs 2"]
    if one_core and one and two:
        print(f"  speed-up on 2 cores: {one_core['wall_s'] / two['wall_s']:.2f}x over 1 core "
              f"({one['wall_s'] / two['wall_s']:.2f}x over --jobs 1, whose Parquet writer and polars threads "
              f"already use the second core)")
        if (os.cpu_count() or 1) >= 2:
            print(f"  this machine's ceiling for this work now (two serial ingests of the corpus at once, one per "
                  f"core): {workload_ceiling(tmp, repeat):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", type=Path, default=None, help="a large trace (>= 500 MB) to include")
    parser.add_argument("--no-batch", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the fastest is shown")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-"))
    try:
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
        if CORPUS.is_dir():
            bench_file(CORPUS / "hta/df_index_resolver/df_index_resolver.json.gz", tmp, jobs=os.cpu_count() or 1,
                       repeat=args.repeat)
        if args.large:
            bench_file(args.large, tmp, jobs=os.cpu_count() or 1, repeat=args.repeat)
        if CORPUS.is_dir() and not args.no_batch:
            bench_batch(tmp, repeat=args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
