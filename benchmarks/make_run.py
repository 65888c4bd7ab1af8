"""A synthetic NCCL run of any number of ranks, for the distributed benchmarks (never committed).

    python benchmarks/make_run.py OUT_DIR --ranks 1024 [--steps 3] [--ops 100]

Each rank writes `rank<N>.pt.trace.json` (distributedInfo rank/world size, its own host and clock): per step a
ProfilerStep span, `--ops` forward/backward ops each launching a compute kernel, and four gradient
all-reduces (ncclDevKernel_AllReduce with the args torch >= 2.3 records: Seq, message size, dtype, group).
Every rank's clock is off by a known amount (rank x 1.5 µs) and rank `--late` (default 7) reaches each
step's first all-reduce 2 ms late, so the analyses have known answers at any scale: straggler = that rank,
skew of those calls ~2 ms, clock offsets = -rank x 1.5 µs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
LATE_US = 2000
BUCKET_ELEMS = (1 << 22, 1 << 22, 1 << 20, 1 << 16)


def rank_events(rank: int, world: int, steps: int, ops: int, late: int) -> list[dict[str, object]]:
    """One rank's events (module docstring), on a clock off by rank x 1.5 µs: step k starts at the same true
    time on every rank; every rank's copy of a collective ends at the same true time."""
    skew = rank * 1.5
    period = ops * 40 + LATE_US + 400 * len(BUCKET_ELEMS) + 200
    events: list[dict[str, object]] = []
    corr = seq = 0
    for step in range(steps):
        s = 1000.0 + step * period + skew  # this rank's clock
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": s, "dur": period - 50})
        for i in range(ops):
            corr += 1
            t = s + 40 * i
            events += [
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 8,
                 "args": {"External id": corr}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
                 "dur": 4, "args": {"correlation": corr, "External id": corr}},
                {"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": t + 10, "dur": 25 + i % 7,
                 "args": {"correlation": corr, "stream": 7, "device": 0}},
            ]
        arrive = s + ops * 40 + (LATE_US if rank == late else 0)
        for n, elems in enumerate(BUCKET_ELEMS):
            corr += 1
            seq += 1
            end = s + ops * 40 + LATE_US + 400 * (n + 1)
            events += [
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": arrive,
                 "dur": 4, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": AR, "pid": 0, "tid": 20, "ts": arrive + 5, "dur": end - arrive - 5,
                 "args": {"correlation": corr, "stream": 20, "device": 0, "Collective name": "allreduce",
                          "In msg nelems": elems, "Out msg nelems": elems, "dtype": "Float",
                          "Group size": world, "Process Group Name": "0", "Seq": seq}},
            ]
            arrive = end + 10
    return events


def write_run(out: Path, ranks: int, *, steps: int = 3, ops: int = 100, late: int = 7) -> int:
    """Write the run; return the total number of events."""
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(ranks):
        events = rank_events(rank, ranks, steps, ops, late)
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85899345920,
                                     "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
               "traceEvents": events}
        (out / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))
        total += len(events)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--late", type=int, default=7)
    args = parser.parse_args()
    total = write_run(args.out, args.ranks, steps=args.steps, ops=args.ops, late=args.late)
    print(f"{args.out}: {args.ranks} ranks, {total:,} events")


if __name__ == "__main__":
    main()
