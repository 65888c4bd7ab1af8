"""Snapshot analysis benchmark: wall time and peak RSS against the pickle's size.

    python benchmarks/memory_snapshot.py                    # a generated ~200 MB snapshot + the corpus snapshots
    python benchmarks/memory_snapshot.py --mb 50            # a smaller generated one
    python benchmarks/memory_snapshot.py --unshared-frames  # worst case: a new frames list per entry

The generated snapshot has the structure torch.cuda.memory._dump_snapshot writes: segments with blocks,
one device trace of alloc / free_requested / free_completed entries with 8-frame stacks. torch shares one
Python frames list per distinct traceback, so the pickle memoizes them (about 85 bytes per trace entry,
like the corpus snapshots); `--unshared-frames` writes a fresh list per entry instead.

Each measurement runs in a fresh child process and reports its own ru_maxrss. Three rows per file:
`C unpickle only` (pickle's C unpickler restricted to plain data, building every object: what a reader
that unpickles first pays, before any conversion), `stream read` (read_snapshot: the streaming reader,
device traces straight into columns) and `full analysis` (read_snapshot + analyze_snapshot: tables, peak,
live blocks, largest, segments, timeline).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "snapshots"

GENERATE = r"""
import pickle, random, sys
target, shared = float(sys.argv[2]) * 1e6, sys.argv[3] == "shared"
random.seed(0)
files = [f"/home/user/project/models/block{i}.py" for i in range(40)]
torch_file = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
cache = {}
def stack(i):
    key = i % 5000
    if shared and key in cache:
        return cache[key]
    out = [{"filename": "".join(torch_file), "line": 1750 + key % 7, "name": "_call_impl"}]
    for d in range(7):
        out.append({"filename": "".join(files[(key + d) % 40]), "line": 10 + (key * 7 + d) % 300,
                    "name": "forward" if d < 3 else "train_step"})
    cache[key] = out
    return out
def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": stack(addr),
            "compile_context": "N/A", "user_metadata": ""}
trace, live, t, addr = [], {}, 1_700_000_000_000_000, 1 << 32
while True:
    if live and (len(live) > 4000 or random.random() < 0.45):
        a, size = live.popitem()
        trace.append(entry("free_requested", a, size, t))
        trace.append(entry("free_completed", a, size, t + 1))
    else:
        addr += 1 << 20
        size = random.choice([512, 4096, 1 << 16, 1 << 20, 1 << 22])
        live[addr] = size
        trace.append(entry("alloc", addr, size, t))
    t += 3
    if len(trace) % 50000 == 0 and len(pickle.dumps(trace[-50000:])) * len(trace) / 50000 > target:
        break
blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": stack(a)}
          for a, s in live.items()]
segments = [{"device": 0, "address": b["address"], "total_size": b["size"], "allocated_size": b["size"],
             "active_size": b["size"], "requested_size": b["size"], "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [b]} for b in blocks]
with open(sys.argv[1], "wb") as fh:
    pickle.dump({"segments": segments, "device_traces": [trace], "allocator_settings": {}}, fh, protocol=4)
"""

MEASURE = r"""
import gc, json, pickle, resource, sys, time
from stepscope.analyze.snapshot import analyze_snapshot
from stepscope.analyze.snapshot_read import read_snapshot

class PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")

t = time.perf_counter()
if sys.argv[2] == "unpickle":
    gc.disable()
    with open(sys.argv[1], "rb") as fh:
        data = PlainOnly(fh).load()
    entries = sum(len(x) for x in data.get("device_traces", [])) if isinstance(data, dict) else 0
elif sys.argv[2] == "read":
    entries = read_snapshot(sys.argv[1]).events.height
else:
    entries = analyze_snapshot(read_snapshot(sys.argv[1])).trace_entries
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "entries": entries}))
"""


def measure(path: Path, mode: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path), mode], capture_output=True, text=True,
                          check=True)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="size of the generated snapshot")
    parser.add_argument("--unshared-frames", action="store_true", help="a new frames list per trace entry")
    args = parser.parse_args()
    header = f"{'snapshot':<32} {'pickle MB':>9} {'entries':>10} {'step':<15} {'wall s':>7} {'peak RSS MB':>11} " \
             f"{'RSS/pickle':>10}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory(prefix="stepscope-snap-") as tmp:
        generated = Path(tmp) / f"generated_{args.mb:.0f}mb{'_unshared' if args.unshared_frames else ''}.pickle"
        subprocess.run([sys.executable, "-c", GENERATE, str(generated), str(args.mb),
                        "unshared" if args.unshared_frames else "shared"], check=True)
        paths = [generated, *(sorted(CORPUS.rglob("*.pickle")) if CORPUS.is_dir() else [])]
        for path in paths:
            size = path.stat().st_size
            for mode, label in (("unpickle", "C unpickle only"), ("read", "stream read"), ("full", "full analysis")):
                r = measure(path, mode)
                print(f"{path.name:<32} {size / 1e6:9.1f} {int(r['entries']):>10,} {label:<15} {r['wall_s']:7.2f} "
                      f"{r['peak_rss_bytes'] / 1e6:11.0f} {r['peak_rss_bytes'] / size:10.2f}")


if __name__ == "__main__":
    main()
