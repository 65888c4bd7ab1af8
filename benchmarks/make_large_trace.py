"""Generate a large real Chrome trace with CPU torch (for benchmarks only; never committed).

    python benchmarks/make_large_trace.py --target-mb 600 -o benchmarks/.data/large_cpu.pt.trace.json

Profiles a small MLP training loop with record_shapes, profile_memory and with_stack until the exported
trace is at least --target-mb megabytes; prints the size and event count.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, default=Path("benchmarks/.data/large_cpu.pt.trace.json"))
    parser.add_argument("--target-mb", type=float, default=600.0)
    parser.add_argument("--steps", type=int, default=None, help="profile exactly this many steps instead")
    args = parser.parse_args()

    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(12)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)

    def one_step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step()
    # a probe run measures bytes per step, then the real run records enough steps for the target size
    steps = args.steps
    if steps is None:
        probe = args.output.with_suffix(".probe.json")
        probe.parent.mkdir(parents=True, exist_ok=True)
        with torch.profiler.profile(record_shapes=True, profile_memory=True, with_stack=True) as prof:
            for _ in range(5):
                one_step()
                prof.step()
        prof.export_chrome_trace(str(probe))
        per_step = probe.stat().st_size / 5
        probe.unlink()
        steps = int(args.target_mb * 1e6 / per_step) + 1
    started = time.time()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with torch.profiler.profile(record_shapes=True, profile_memory=True, with_stack=True) as prof:
        for _ in range(steps):
            one_step()
            prof.step()
    prof.export_chrome_trace(str(args.output))
    size = os.path.getsize(args.output)
    print(f"{args.output}: {size / 1e6:.0f} MB, {steps} steps, {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
