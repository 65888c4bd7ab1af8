"""Memory timeline and op table benchmark: df_index_resolver (28k [memory] events) and generated traces with
250k / 500k / 1M [memory] events, to show linear growth.

    python benchmarks/memory.py                # target: 1M memory events in under 3 s (analysis, not ingest)
    python benchmarks/memory.py --max 2000000  # larger generated traces too

Each trace is ingested once (not timed here: benchmarks/ingest.py measures that); every analysis then runs
in a fresh child process, so wall time and peak RSS (VmHWM: the child's whole life, interpreter + polars +
the analysis; "before" is the peak after imports and opening the trace) are its own:
  memory    stepscope.analyze.memory.memory_timeline (series, op attribution, steps, mem_ops, never-freed)
  ops       stepscope.analyze.ops.op_table (nesting, memory in intervals, kernel links, grouping)
  nesting   the one Python loop: parent_index over every CPU-thread event (cpu_op, python, annotations,
            runtime), reported per million events
The generated trace is plain Kineto-like JSON: per step, cpu ops on one thread each holding one allocation
and its free ([memory] instants with Total Allocated / Total Reserved / Addr), plus a cudaLaunchKernel
and the kernel it launched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "traces"
DF_INDEX = CORPUS / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

CHILD = r"""
import json, sys, time
from pathlib import Path
mode, directory = sys.argv[1], Path(sys.argv[2])

def hwm_mib():  # VmHWM: this process's peak RSS (ru_maxrss would carry the forking parent's over exec)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")

from stepscope.analyze import load
t = load(directory)
base = hwm_mib()
extra = {}
start = time.perf_counter()
if mode == "memory":
    from stepscope.analyze.memory import memory_timeline
    r = memory_timeline(t)
    extra = {"events": r.memory_events, "peak": r.peak_allocated_bytes}
elif mode == "ops":
    from stepscope.analyze.ops import op_table
    r = op_table(t)
    extra = {"events": int(t.cpu.select(__import__("polars").len()).collect().item()), "rows": r.ops_total}
elif mode == "nesting":
    import polars as pl
    from stepscope.analyze.nesting import parent_index, sort_for_nesting
    from stepscope.analyze.ops import CPU_ROW_KINDS
    frame = sort_for_nesting(t.events.filter(pl.col("kind").is_in([k.value for k in CPU_ROW_KINDS])
                                             & pl.col("dur_ns").is_not_null())
                             .select("pid", "tid", "ts_ns", "dur_ns").collect())
    start = time.perf_counter()
    parent_index(frame)
    extra = {"events": frame.height}
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "rss_mib": hwm_mib(), "base_mib": base, **extra}))
"""


def generate(path: Path, memory_events: int) -> None:
    """A Kineto-like trace with `memory_events` [memory] instants (two per op: alloc, free)."""
    pid, tid = 1, 1
    ops = memory_events // 2
    events: list[str] = []
    allocated = 0
    ops_per_step = 10_000
    for s in range(-(-ops // ops_per_step)):
        t0 = s * ops_per_step * 10.0
        n = min(ops_per_step, ops - s * ops_per_step)
        events.append(json.dumps({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": pid,
                                  "tid": tid, "ts": t0, "dur": n * 10.0}))
        for i in range(n):
            k = s * ops_per_step + i
            ts = t0 + i * 10.0
            size = 512 * (1 + k % 64)
            allocated += size
            events.append(f'{{"ph":"X","cat":"cpu_op","name":"aten::op{k % 50}","pid":{pid},"tid":{tid},'
                          f'"ts":{ts + 1},"dur":8,"args":{{"External id":{k}}}}}')
            events.append(f'{{"ph":"i","s":"t","cat":"cpu_instant_event","name":"[memory]","pid":{pid},'
                          f'"tid":{tid},"ts":{ts + 2},"args":{{"Total Reserved":{1 << 34},'
                          f'"Total Allocated":{allocated},"Bytes":{size},"Device Id":0,"Device Type":1,'
                          f'"Addr":{1000 + k % 4096 * 1_000_000}}}}}')
            events.append(f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{pid},"tid":{tid},'
                          f'"ts":{ts + 3},"dur":1,"args":{{"External id":{k},"correlation":{k}}}}}')
            events.append(f'{{"ph":"X","cat":"kernel","name":"k{k % 20}","pid":0,"tid":7,"ts":{ts + 5},'
                          f'"dur":3,"args":{{"device":0,"stream":7,"correlation":{k}}}}}')
            allocated -= size
            events.append(f'{{"ph":"i","s":"t","cat":"cpu_instant_event","name":"[memory]","pid":{pid},'
                          f'"tid":{tid},"ts":{ts + 7},"args":{{"Total Reserved":{1 << 34},'
                          f'"Total Allocated":{allocated},"Bytes":{-size},"Device Id":0,"Device Type":1,'
                          f'"Addr":{1000 + k % 4096 * 1_000_000}}}}}')
    path.write_text('{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(events) + "\n]}\n")


def child(mode: str, directory: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(directory)], check=True, capture_output=True,
                         text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def ingested(src: Path, tmp: Path) -> Path:
    from stepscope.analyze import load

    return load(src, cache_dir=tmp / "cache").directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=1_000_000, help="largest generated trace, [memory] events")
    args = parser.parse_args()
    rows: list[tuple[str, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        targets: list[tuple[str, Path]] = []
        if DF_INDEX.exists():
            targets.append(("df_index_resolver (54 MB)", ingested(DF_INDEX, tmp)))
        size = 250_000
        while size <= args.max:
            path = tmp / f"generated_{size}.json"
            generate(path, size)
            targets.append((f"generated {size:,} [memory]", ingested(path, tmp)))
            path.unlink()
            size *= 2
        for label, directory in targets:
            for mode in ("memory", "ops", "nesting"):
                rows.append((label, mode, child(mode, directory)))
    print(f"{'trace':<30} {'analysis':<8} {'events':>10} {'wall s':>8} {'µs/event':>9} {'peak RSS MiB':>13} "
          f"{'before':>7}")
    for label, mode, r in rows:
        per = 1e6 * r["wall_s"] / r["events"] if r.get("events") else float("nan")
        print(f"{label:<30} {mode:<8} {int(r.get('events', 0)):>10,} {r['wall_s']:>8.3f} {per:>9.3f} "
              f"{r['rss_mib']:>13.0f} {r['base_mib']:>7.0f}")


if __name__ == "__main__":
    main()
