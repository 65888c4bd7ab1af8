"""Critical path and what-if benchmark: the dependency graph, the measured path and a what-if replay, on ONE step
of growing size (the unit the issue sizes: a step of 1M events in a few seconds), and on a many-step trace of
_synth.py, to show the time and its growth with the number of events.

    python benchmarks/critical_path.py                        # one step of 0.25M, 0.5M, 1M events; 1M in steps
    python benchmarks/critical_path.py --sizes 100000 --no-multi

Traces are ingested first (not timed). `graph` is `depgraph.build_graph`, `path` the measured replay and walk
(`critical_path` given the graph), `whatif` one more replay with `--speedup gemm=2` and both walks. The growth
column is (CPU time / the smallest one-step trace's) / (events / its events): 1.0 is linear. `cpu s` is the
process's CPU time for the three (user + system, all threads): on a shared machine it moves less than the wall
time. Peak RSS is the process's. The load average is printed before and after: compare figures measured under
the same load.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import LOADER  # noqa: E402
from _synth import write_trace as write_steps  # noqa: E402

from stepscope.analyze import load  # noqa: E402


def write_one_step(path: Path, target_events: int) -> int:
    """One ProfilerStep holding about `target_events` events (the event mix of _synth.py: per op a Python frame,
    an aten op with an aten::empty, a launch with its flow, a kernel on one of two streams, two [memory] events;
    a DataLoader fetch and a pageable copy first, a loss.item() with a stream sync last). Returns the count."""
    events_per_op = 9
    ops = max(1, (target_events - 7) // events_per_op)
    out: list[str] = []
    t = 1_000_000
    end = t + 600 + ops * 40 + 20
    out.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": {t}, '
               f'"dur": {end - t}}}')
    out.append(f'{{"ph": "X", "cat": "user_annotation", "name": "{LOADER}", "pid": 1, "tid": 1, "ts": {t + 1}, '
               f'"dur": 500}}')
    out.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": {t + 510}, '
               f'"dur": 20, "args": {{"correlation": 1, "External id": 1}}}}')
    out.append(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, '
               f'"ts": {t + 520}, "dur": 60, "args": {{"device": 0, "stream": 7, "correlation": 1, '
               f'"bytes": 4194304}}}}')
    t += 600
    gpu_free = {7: 0, 20: 0}
    for op in range(ops):
        corr = op + 2
        stream = 7 if op % 4 else 20
        dur = 20 + op % 15
        start = max(t + 12, gpu_free[stream])
        gpu_free[stream] = start + dur
        out += [
            f'{{"ph": "X", "cat": "python_function", "name": "model.py({op % 50}): forward", "pid": 1, "tid": 1, '
            f'"ts": {t}, "dur": 30, "args": {{"Python id": {corr}, "Python parent id": 1}}}}',
            f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{op % 37}", "pid": 1, "tid": 1, "ts": {t + 1}, '
            f'"dur": 25, "args": {{"External id": {corr}}}}}',
            f'{{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": {t + 3}, "dur": 1, '
            f'"args": {{"External id": {corr + 100_000_000}}}}}',
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {t + 5}, '
            f'"dur": 6, "args": {{"correlation": {corr}, "External id": {corr}}}}}',
            f'{{"ph": "X", "cat": "kernel", "name": "void gemm_kernel_{op % 23}<float>(float*)", "pid": 0, '
            f'"tid": {stream}, "ts": {start}, "dur": {dur}, "args": {{"device": 0, "stream": {stream}, '
            f'"correlation": {corr}}}}}',
            f'{{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": {corr}, "pid": 1, "tid": 1, "ts": {t + 5}}}',
            f'{{"ph": "f", "cat": "ac2g", "name": "ac2g", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {start}, '
            f'"bp": "e"}}',
            f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, '
            f'"ts": {t + 2}, "args": {{"Device Type": 1, "Device Id": 0, "Addr": {corr * 4096}, "Bytes": 32768}}}}',
            f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, '
            f'"ts": {t + 24}, "args": {{"Device Type": 1, "Device Id": 0, "Addr": {corr * 4096}, "Bytes": -32768}}}}',
        ]
        t += 40
    sync_end = max(max(gpu_free.values()) + 3, end - 2)
    out += [
        f'{{"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1, "ts": {t}, '
        f'"dur": {sync_end - t + 1}}}',
        f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": {t + 1}, '
        f'"dur": {sync_end - t - 1}}}',
    ]
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(out) + "\n]}\n")
    return len(out)


def bench(path: Path, cache: Path) -> tuple[int, dict[str, float], int]:
    """Ingest (untimed), then time graph, path and what-if on a fresh Trace; (events + flows, seconds, steps)."""
    from stepscope.analyze.critical_path import critical_path
    from stepscope.analyze.depgraph import build_graph
    from stepscope.analyze.frames import TraceFrames
    from stepscope.analyze.whatif import WhatIf, what_if

    trace = load(path, cache_dir=cache)
    events = trace.meta.counts.events + trace.meta.counts.flows
    frames = TraceFrames(load(trace.directory))
    frames.step_windows  # noqa: B018 (the step windows are shared with every analysis: not this one's cost)
    times = {}
    cpu_started = time.process_time()
    started = time.perf_counter()
    graph = build_graph(frames)
    times["graph"] = time.perf_counter() - started
    started = time.perf_counter()
    result = critical_path(frames, graph=graph)
    times["path"] = time.perf_counter() - started
    started = time.perf_counter()
    what_if(frames, WhatIf(speedups=(("gemm", 2.0),)), graph=graph)
    times["whatif"] = time.perf_counter() - started
    times["cpu"] = time.process_time() - cpu_started
    return events, times, result.steps_found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[250_000, 500_000, 1_000_000])
    parser.add_argument("--no-multi", action="store_true", help="skip the many-step 1M-event trace")
    args = parser.parse_args()
    names = ("graph", "path", "whatif")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print(f"{'trace':<30} {'events':>10} {'steps':>6} " + " ".join(f"{n:>7}" for n in names)
          + f" {'total s':>8} {'cpu s':>6} {'µs/event':>9} {'growth':>7} {'peak RSS':>9}", flush=True)
    base: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory(prefix="stepscope-critical-path-") as tmp:
        jobs = [(f"one step, {size / 1e6:g}M events", size, True) for size in args.sizes]
        jobs += [] if args.no_multi else [("1M events in 3.6k-event steps", 1_000_000, False)]
        for label, size, one_step in jobs:
            path = Path(tmp) / f"synthetic_{size}_{one_step}.json"
            (write_one_step if one_step else write_steps)(path, size)
            events, times, steps = bench(path, Path(tmp) / "cache")
            path.unlink()
            cpu = times.pop("cpu")
            total = sum(times.values())
            growth = "-"
            if one_step:
                base = base or (events, cpu)
                growth = f"{(cpu / base[1]) / (events / base[0]):.2f}"
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{label:<30} {events:>10,} {steps:>6} " + " ".join(f"{times[n]:7.2f}" for n in names)
                  + f" {total:8.2f} {cpu:6.2f} {total / events * 1e6:9.2f} {growth:>7} {rss:7.0f} MB", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
