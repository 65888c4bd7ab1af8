"""Report against json.load: the whole `stepscope report TRACE -o OUT/` process, its ingest already cached, paired
against `json.load` of the same trace (decompress and parse: what a user's own script pays before it has
looked at a single event). Target from issue 23: the report takes less time than json.load.

    python benchmarks/report_vs_json.py                # df_index_resolver and resnet50 (the corpus's two
                                                       # largest traces), 5 runs of each side
    python benchmarks/report_vs_json.py TRACE... -n 3

Each trace is ingested once into a fresh cache (not timed; benchmarks/ingest.py measures that). Then each run
is a fresh process (wall time around it), the sides in turn, so a busy moment of the machine hits them alike:
  json.load       python -c "json.load(gzip.open(TRACE))"
  report          stepscope report TRACE -o OUT/ (python -m stepscope): figures drawn by worker processes
                  while the trace is analysed, and on 4 cores or more groups of analyses computed by workers
                  too (stepscope.reports._render)
  report, serial  the same command with every figure drawn in the command's own process, one after another
                  (as before the figure workers): same analyses, the same page (checked, PNG bytes included)
  report, here    only on a machine where the report hands analyses to its workers (4 cores or more): the same
                  command with every analysis computed in the command's own process (figures still drawn by the
                  workers), the same page (checked)
Seconds are the min (and median) of the runs; CPU s (user + system) the min of the runs and peak RSS the
largest, both of the command's own process: its polars threads are counted, its workers are not (they are the
fork server's children, which the command does not wait for).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared/corpus/traces"
DEFAULT_TRACES = (CORPUS / "hta/df_index_resolver/df_index_resolver.json.gz",
                  CORPUS / "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
JSON_LOAD = ("import gzip, json, sys; p = sys.argv[1]; "
             "json.load(gzip.open(p) if p.endswith('.gz') else open(p, 'rb'))")
SIDES = ("json.load", "report", "report, serial", "report, here")


def serial_main(argv: list[str]) -> None:
    """`stepscope report` with its figures drawn in this process (the figure workers replaced by the inline
    renderer); a benchmark-only baseline, not an option of the command."""
    from stepscope.reports import _render
    from stepscope.reports._render import INLINE, FigureRenderer

    class Inline:
        def __init__(self, workers: int | None = None) -> None:
            pass

        def __enter__(self) -> FigureRenderer:
            return INLINE

        def __exit__(self, *exc: object) -> None:
            return None

    _render.FigureWorkers = Inline  # type: ignore[misc, assignment]
    from stepscope.cli import main

    sys.exit(main(argv))


def here_main(argv: list[str]) -> None:
    """`stepscope report` with no analysis handed to the workers (as on a machine of few cores); a
    benchmark-only baseline, not an option of the command."""
    from stepscope.reports import _render

    _render.AHEAD_MIN_CORES = 10**6
    from stepscope.cli import main

    sys.exit(main(argv))


def sides() -> tuple[str, ...]:
    """The sides this machine measures: 'report, here' only where the report hands analyses to its workers."""
    from stepscope.reports._render import analyses_ahead

    return SIDES if analyses_ahead() else SIDES[:-1]


def command(side: str, trace: Path, out: Path) -> list[str]:
    if side == "json.load":
        return [sys.executable, "-c", JSON_LOAD, str(trace)]
    if side == "report":
        return [sys.executable, "-m", "stepscope", "report", str(trace), "-o", str(out)]
    return [sys.executable, __file__, "--serial" if side == "report, serial" else "--here", "report", str(trace),
            "-o", str(out)]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, the figure workers' included) and peak RSS (MiB, the
    largest process of the run) of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(trace: Path, runs: int, tmp: Path) -> dict[str, list[tuple[float, float, float]]]:
    """Each side `runs` times, in turn; then check that both reports wrote the same page."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"))
    out = {side: tmp / f"out-{i}" for i, side in enumerate(sides())}
    subprocess.run(command("report", trace, out["report"]), env=env, check=True, stdout=subprocess.DEVNULL)  # ingest
    results: dict[str, list[tuple[float, float, float]]] = {side: [] for side in out}
    for _ in range(runs):
        for side in out:
            results[side].append(timed(command(side, trace, out[side]), env))
    pages = {side: re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", (out[side] / "index.html").read_text(encoding="utf-8"))
             for side in out if side != "json.load"}
    if len(set(pages.values())) != 1:
        raise SystemExit(f"{trace}: the pages differ between {', '.join(pages)}")
    return results


def show(trace: Path, results: dict[str, Any], runs: int) -> None:
    import gzip

    opener: Any = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rb") as f:
        size = len(f.read())
    print(f"trace: {trace.name} ({size / 1e6:.1f} MB of JSON, {trace.stat().st_size / 1e6:.1f} MB on disk), "
          f"{runs} runs of each side, interleaved")
    floor = min(w for w, _c, _r in results["json.load"])
    print(f"{'side':<16} {'min s':>7} {'median s':>9} {'min / json.load':>16} {'CPU s':>7} {'peak RSS':>9}")
    for side in results:
        walls = [w for w, _c, _r in results[side]]
        cpu = min(c for _w, c, _r in results[side])
        rss = max(r for _w, _c, r in results[side])
        print(f"{side:<16} {min(walls):7.2f} {statistics.median(walls):9.2f} {min(walls) / floor:15.2f}x "
              f"{cpu:7.2f} {rss:8.0f}M")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--serial", "--here"):
        (serial_main if sys.argv[1] == "--serial" else here_main)(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path, help="trace files (default: the two largest of the corpus)")
    parser.add_argument("-n", "--runs", type=int, default=5, help="runs of each side (default 5)")
    args = parser.parse_args()
    traces = args.traces or [t for t in DEFAULT_TRACES if t.exists()]
    if not traces:
        print(f"skipped: {CORPUS} not found (the shared corpus is absent)")
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    for trace in traces:
        if not trace.exists():
            parser.error(f"no such trace: {trace}")
        with tempfile.TemporaryDirectory(prefix="stepscope-report-vs-json-") as tmp:
            show(trace, measure(trace, args.runs, Path(tmp)), args.runs)


if __name__ == "__main__":
    main()
