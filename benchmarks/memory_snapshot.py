"""Snapshot analysis benchmark: wall time and peak RSS against the pickle's size.

    python benchmarks/memory_snapshot.py              # a generated ~200 MB snapshot + the corpus snapshots
    python benchmarks/memory_snapshot.py --mb 50      # a smaller generated one

The generated snapshot has the structure torch.cuda.memory._dump_snapshot writes (segments with blocks,
one device trace of alloc / free_requested / free_completed entries with 8-frame stacks, new string
objects per frame as torch creates them). Each measurement runs in a fresh child process; RSS is its
own ru_maxrss (the parent stays small: a child inherits its parent's peak mark).
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "snapshots"

GENERATE = r"""
import pickle, random, sys
target = float(sys.argv[2]) * 1e6
random.seed(0)
files = [f"/home/user/project/models/block{i}.py" for i in range(40)]
torch_files = ["/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
               "/venv/lib/python3.11/site-packages/torch/nn/functional.py"]
def stack(i):
    out = [{"filename": "".join(torch_files[i % 2]), "line": 1750 + i % 7, "name": "_call_impl"}]
    for d in range(7):
        out.append({"filename": "".join(files[(i + d) % 40]), "line": 10 + (i * 7 + d) % 300,
                    "name": "forward" if d < 3 else "train_step"})
    return out
trace, live, t, addr = [], {}, 1_700_000_000_000_000, 1 << 32
while True:
    if live and random.random() < 0.45:
        a, size = live.popitem()
        for action in ("free_requested", "free_completed"):
            trace.append({"action": action, "addr": a, "size": size, "stream": 0, "time_us": t, "frames": stack(a)})
    else:
        addr += 1 << 20
        size = random.choice([512, 4096, 1 << 16, 1 << 20, 1 << 22])
        live[addr] = size
        trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": stack(addr)})
    t += 3
    if len(trace) % 20000 == 0 and len(pickle.dumps(trace[-2000:])) * len(trace) / 2000 > target:
        break
blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": stack(a)}
          for a, s in live.items()]
segments = [{"device": 0, "address": b["address"], "total_size": b["size"], "allocated_size": b["size"],
             "active_size": b["size"], "requested_size": b["size"], "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [b]} for b in blocks]
with open(sys.argv[1], "wb") as fh:
    pickle.dump({"segments": segments, "device_traces": [trace], "allocator_settings": {}}, fh, protocol=4)
print(len(trace))
"""

ANALYZE = r"""
import json, resource, sys, time
from stepscope.analyze.snapshot import analyze_snapshot, read_snapshot
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
result = analyze_snapshot(read_snapshot(sys.argv[1]))
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "base_rss_bytes": base * 1024, "entries": result.trace_entries,
                  "peak_allocated_bytes": result.peak_allocated_bytes}))
"""


def measure(path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", ANALYZE, str(path)], capture_output=True, text=True, check=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    size = path.stat().st_size
    print(f"  {path.name:<28} {size / 1e6:8.1f} MB  {r['entries']:>10,} entries  {r['wall_s']:7.2f} s  "
          f"peak RSS {r['peak_rss_bytes'] / 1e6:7.0f} MB  RSS/pickle {r['peak_rss_bytes'] / size:5.2f}  "
          f"(above the interpreter: {(r['peak_rss_bytes'] - r['base_rss_bytes']) / size:4.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="size of the generated snapshot")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-snap-") as tmp:
        generated = Path(tmp) / f"generated_{args.mb:.0f}mb.pickle"
        subprocess.run([sys.executable, "-c", GENERATE, str(generated), str(args.mb)], check=True,
                       capture_output=True)
        print("snapshot analysis (read + tables + peak, live blocks, largest, segments, timeline):")
        measure(generated)
        for path in sorted(CORPUS.rglob("*.pickle")) if CORPUS.is_dir() else []:
            measure(path)
    assert pickle  # the format benchmarked is the pickle torch writes


if __name__ == "__main__":
    main()
