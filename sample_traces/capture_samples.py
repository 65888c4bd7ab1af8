"""Regenerate the bundled sample traces with stepscope's own capture shim.

    python sample_traces/capture_samples.py                 # CPU, into sample_traces/
    python sample_traces/capture_samples.py --device cuda   # on a GPU box (adds memory snapshots)
    python sample_traces/capture_samples.py --only convnet_train

Each workload is a small, seeded loop; each writes sample_traces/<name>/ (manifest.json + trace(s)).
The workloads are the seed exercises: a conv net training step, a model that calls .item() inside
forward (and the fix), a transformer encoder step with memory profiling, pageable vs pinned host-to-device
copies, a DataLoader-bound loop (and the fix), and a 2-rank distributed run (torchrun, gloo on CPU or NCCL
on CUDA with 2 GPUs) whose rank 1 reaches every step's gradient all-reduce late. On CUDA four more: the conv
net under torch.compile, inference replayed from a CUDA graph (with a profile of the graph's capture beside the
run's trace), a training loop whose one over-long batch runs out of memory (the OOM snapshot), and bf16 matrix
products near the GPU's peak (FLOPs and MFU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stepscope.capture import CaptureOptions, profile_steps

# 1 start-up step, 3 timed unprofiled steps, then 1 wait, 1 warm-up and 3 recorded steps (ProfilerStep#2-4)
SCHEDULE: dict[str, Any] = {"skip_first": 1, "baseline": 3, "wait": 1, "warmup": 1, "active": 3}


def _steps() -> int:
    return CaptureOptions(**SCHEDULE).total_steps


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def convnet_train(out: Path, device: str) -> None:
    """(a) A small conv net training step."""
    _convnet_loop(out, device, compiled=False)


def _convnet_loop(out: Path, device: str, *, compiled: bool) -> None:
    """The conv net's training loop, recorded by the shim; `compiled`: the model under torch.compile (compiled in
    the first step, which the schedule leaves unrecorded)."""
    model = SmallConvNet().to(device)
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 32, 32, device=device), torch.randint(0, 10, (16,), device=device)
    with profile_steps(out, batch_size=16, device=device, **SCHEDULE) as prof:
        for _ in range(_steps()):
            loss = nn.functional.cross_entropy(forward(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


class GatedMLP(nn.Module):
    """The "find the bottleneck" model: forward reads a value back to the host to decide a branch."""

    def __init__(self, sync_in_forward: bool, width: int = 128) -> None:
        super().__init__()
        self.sync_in_forward = sync_in_forward
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
            if self.sync_in_forward:
                if x.mean().item() > 10.0:  # .item() waits for the device: a host sync per layer
                    x = x * 0.5
            else:
                x = torch.where(x.mean() > 10.0, x * 0.5, x)  # same math, stays on the device
        return x


def _gated(out: Path, device: str, sync: bool) -> None:
    # on a GPU, layers big enough that a layer's kernels take about as long as the CPU takes to launch them:
    # without syncs the CPU runs ahead and the GPU never waits; with .item() it waits for every launch
    width, batch = (1024, 2048) if device == "cuda" else (128, 64)
    model = GatedMLP(sync, width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    with profile_steps(out, batch_size=batch, device=device, **SCHEDULE) as prof:
        for _ in range(_steps()):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def item_in_forward(out: Path, device: str) -> None:
    """(b) .item() inside forward: a host synchronization in every layer."""
    _gated(out, device, sync=True)


def item_in_forward_fixed(out: Path, device: str) -> None:
    """(b, fixed) the same model with torch.where instead of .item()."""
    _gated(out, device, sync=False)


def transformer_memory(out: Path, device: str) -> None:
    """(c) A transformer encoder step with memory profiling (shapes, memory, stacks, modules)."""
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, 64, device=device)
    with profile_steps(out, batch_size=8, device=device, record_shapes=True, profile_memory=True,
                       with_stack=True, with_modules=True, **SCHEDULE) as prof:
        for _ in range(_steps()):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def pageable_vs_pinned(out: Path, device: str) -> None:
    """(d) Host-to-device copies from pageable and from pinned memory (pinned needs CUDA)."""
    model = nn.Linear(256, 256).to(device)
    pageable = [torch.randn(64, 256) for _ in range(4)]
    pinned = [t.pin_memory() for t in pageable] if device == "cuda" else []
    notes = [] if device == "cuda" else [
        "pageable_vs_pinned on CPU: .to('cpu') is a no-op and pin_memory needs CUDA, so this capture has no "
        "host-to-device copies; the pinned .to(device, non_blocking=True) path runs on CUDA only"]
    with profile_steps(out, batch_size=64, device=device, notes=notes, **SCHEDULE) as prof:
        for _ in range(_steps()):
            for t in pageable:  # synchronous copies from pageable memory
                model(t.to(device)).sum().backward()
            for t in pinned:  # asynchronous copies from pinned memory
                model(t.to(device, non_blocking=True)).sum().backward()
            prof.step()


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Per-sample Python work standing in for decoding and augmentation."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.0015)
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, 32, 32, generator=g), torch.tensor(index % 10)


def _loader_loop(out: Path, device: str, workers: int) -> None:
    model = SmallConvNet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=16, num_workers=workers, persistent_workers=workers > 0,
                        pin_memory=device == "cuda", prefetch_factor=4 if workers else None)
    batches = iter(loader)
    with profile_steps(out, batch_size=16, device=device, **SCHEDULE) as prof:
        for _ in range(_steps()):
            x, y = next(batches)
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def dataloader_bound(out: Path, device: str) -> None:
    """(e) num_workers=0 with a slow per-sample transform: the step waits for data."""
    _loader_loop(out, device, workers=0)


def dataloader_fixed(out: Path, device: str) -> None:
    """(e, fixed) the same loop with 4 loader workers prefetching (the transform runs off the main process)."""
    _loader_loop(out, device, workers=4)


def compiled_train(out: Path, device: str) -> None:
    """(f) The conv net step of convnet_train under torch.compile (compiled in the first, unrecorded step)."""
    _convnet_loop(out, device, compiled=True)


def cuda_graph_replay(out: Path, device: str) -> None:
    """(g) Inference replayed from a CUDA graph: one graph launch a step. The graph's capture is profiled too
    (graph_capture.pt.trace.json.gz beside the run's trace), which maps the replayed kernels to the ops that
    launched them at capture time (`stepscope graphs`)."""
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.LayerNorm(2048),
                          nn.Linear(2048, 512)).to(device).eval()
    static_x = torch.randn(32, 512, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as torch.cuda.graph's docs say
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        out.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities, record_shapes=True, with_stack=True) as capture:
            with torch.cuda.graph(graph):
                static_y = model(static_x)
        capture.export_chrome_trace(str(out / "graph_capture.pt.trace.json.gz"))
        with profile_steps(out, batch_size=32, device=device, **SCHEDULE) as prof:
            for _ in range(_steps()):
                static_x.copy_(torch.randn(32, 512, device=device))
                graph.replay()
                static_y.argmax(dim=1).cpu()  # the answer back to the host, as a server would
                prof.step()


def oom_dump(out: Path, device: str) -> None:
    """(h) A transformer training loop whose one over-long batch (the last recorded step, 8x the sequence
    length) does not fit: the allocator is capped at twice a normal step's peak, torch.cuda.OutOfMemoryError
    escapes the loop, and the capture writes the OOM memory snapshot and a manifest that says "failed"."""
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(seq: int) -> None:
        model(torch.randn(16, seq, 256, device=device)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step(256)
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 2 * torch.cuda.max_memory_reserved() / total))
    steps = _steps()
    try:
        with profile_steps(out, batch_size=16, device=device, **SCHEDULE) as prof:
            for k in range(steps):
                train_step(2048 if k == steps - 1 else 256)
                prof.step()
    except torch.cuda.OutOfMemoryError:
        pass  # what this sample is about: the capture has written the snapshot and the failed manifest
    else:
        raise SystemExit("oom_dump: the long batch fit; raise its length")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def gemm_bound(out: Path, device: str) -> None:
    """(i) bf16 matrix products big enough to run near the GPU's peak: the FLOPs / roofline / MFU sample, with
    with_flops on. torch's FlopCounterMode counts one step's FLOPs before the capture (the manifest's notes say
    how many), an oracle for `stepscope flops`."""
    from torch.utils.flop_counter import FlopCounterMode

    width, tokens, layers = 8192, 8192, 4
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device, torch.bfloat16)
    x = torch.randn(tokens, width, device=device, dtype=torch.bfloat16, requires_grad=True)

    def train_step() -> None:
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        x.grad = None

    with FlopCounterMode(display=False) as counter:
        train_step()
    counted = counter.get_total_flops()
    by_hand = 6 * tokens * width * width * layers  # forward, input and weight gradients: 3 GEMMs a layer
    notes = [f"FlopCounterMode: {counted} FLOPs per step ({by_hand} by hand: 6 x tokens x width^2 x layers)"]
    with profile_steps(out, batch_size=tokens, device=device, with_flops=True, notes=notes, **SCHEDULE) as prof:
        for _ in range(_steps()):
            train_step()
            prof.step()


LATE_RANK_SCRIPT = """
import os, time, torch, torch.distributed as dist
cuda = os.environ["SAMPLE_DEVICE"] == "cuda"
dist.init_process_group("nccl" if cuda else "gloo")
rank = dist.get_rank()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(9):
    x = torch.randn(64, 256, device=device)
    model(x).sum().backward()
    if rank == 1:
        time.sleep(0.03)  # rank 1 is late to every step's gradient all-reduce (a slow host, a straggler)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
dist.barrier()  # neither rank tears the group down while the other still talks to it
dist.destroy_process_group()
"""


def late_rank(out: Path, device: str) -> None:
    """A 2-rank run under torchrun through `stepscope capture` (gloo on CPU, NCCL on CUDA): rank 1 sleeps 30 ms
    before each step's all-reduces, so rank 0 waits in them; `stepscope comm` / `ranks` name rank 1."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "late_rank.py"
        script.write_text(LATE_RANK_SCRIPT)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "stepscope", "capture", "-o", str(out), "--skip-first", "1", "--baseline", "3", "--wait", "1",
               "--warmup", "1", "--active", "3", "--no-stack", "--batch-size", "64", "--", str(script)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SAMPLE_DEVICE": device}
        for _ in range(3):  # torch's gloo teardown now and then aborts at exit after the capture is written
            shutil.rmtree(out, ignore_errors=True)
            done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                return
        raise SystemExit(f"torchrun failed:\n{done.stderr[-3000:]}")


WORKLOADS: dict[str, Callable[[Path, str], None]] = {
    f.__name__: f for f in (convnet_train, item_in_forward, item_in_forward_fixed, transformer_memory,
                            pageable_vs_pinned, dataloader_bound, dataloader_fixed, late_rank, compiled_train,
                            cuda_graph_replay, oom_dump, gemm_bound)
}
CUDA_ONLY = {"compiled_train", "cuda_graph_replay", "oom_dump", "gemm_bound"}  # the CPU samples stay the seed exercises


def _runs(device: str, only: list[str] | None) -> list[str]:
    """The workloads to run: those named, else all that suit the device (late_rank on CUDA needs 2 GPUs)."""
    if only:
        if device == "cpu" and CUDA_ONLY & set(only):
            raise SystemExit(f"{', '.join(sorted(CUDA_ONLY & set(only)))}: CUDA only")
        return only
    if device == "cpu":
        return [name for name in WORKLOADS if name not in CUDA_ONLY]
    return [name for name in WORKLOADS if name != "late_rank" or torch.cuda.device_count() >= 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in _runs(args.device, args.only):
        torch.manual_seed(0)
        out = args.out / (name if args.device == "cpu" else f"{name}_{args.device}")
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        WORKLOADS[name](out, args.device)
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"{out}: {size / 1024:.0f} KiB in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
