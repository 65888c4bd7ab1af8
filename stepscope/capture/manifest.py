"""`manifest.json`: what a capture run was, so the analyzer can compare profiled and unprofiled steps.

Schema (manifest_version 1; one file per rank: `manifest.json`, or `manifest.rank<N>.json` when a
distributed launch sets RANK / WORLD_SIZE > 1):

    manifest_version   1
    status             "ok" | "failed"; error: "<ExceptionType>: message" when the loop raised
    command            the command line that ran (argv), cwd, start time, end time, host, pid
    distributed        rank, local_rank, world_size (RANK, LOCAL_RANK, WORLD_SIZE; torchrun sets them)
    versions           python, torch, cuda, cudnn
    device             type (cuda/cpu) and, on CUDA: name, total_memory_bytes, sm_count,
                       compute_capability, clock rates where torch reports them
    profiler           the CaptureOptions (schedule wait/warmup/active/repeat, baseline, record_shapes, …)
    baseline           unprofiled step timing over the baseline steps: steps, mean_ns, std_ns, p50_ns,
                       p95_ns, p99_ns, steps_per_s, samples_per_s (with batch_size); measured with CUDA
                       events on a GPU, time.perf_counter_ns on CPU
    steps_seen         step() calls in the run
    files              each file written (traces, memory snapshot, memory timeline): name, kind, bytes
    notes              facts a reader needs (e.g. "CPU capture: no GPU timeline, no H2D copies")
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope.analyze._io import atomic_write_text

if TYPE_CHECKING:
    from stepscope.capture.session import ProfileSession

MANIFEST_VERSION = 1


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def distributed_env() -> dict[str, int | None]:
    """Rank, local rank and world size from the usual launcher variables (torchrun, SLURM, Open MPI)."""
    return {
        "rank": _int_env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
        "local_rank": _int_env("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "world_size": _int_env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"),
    }


def _percentile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def step_stats(durations_ns: list[int], batch_size: int | None = None) -> dict[str, Any]:
    """mean, std, p50, p95, p99 (ns) and throughput of step durations."""
    if not durations_ns:
        return {"steps": 0}
    ordered = sorted(durations_ns)
    mean = statistics.fmean(ordered)
    out: dict[str, Any] = {
        "steps": len(ordered),
        "mean_ns": mean,
        "std_ns": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "p50_ns": _percentile(ordered, 0.50),
        "p95_ns": _percentile(ordered, 0.95),
        "p99_ns": _percentile(ordered, 0.99),
        "steps_per_s": 1e9 / mean if mean > 0 else None,
    }
    if batch_size:
        out["samples_per_s"] = batch_size * out["steps_per_s"] if out["steps_per_s"] else None
    return out


def device_info(torch: Any, cuda: bool) -> dict[str, Any]:
    """The device the run used, as torch reports it."""
    if not cuda:
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info: dict[str, Any] = {
        "type": "cuda",
        "index": index,
        "name": props.name,
        "total_memory_bytes": props.total_memory,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
    }
    for attr, key in (("clock_rate", "clock_rate_khz"), ("memory_clock_rate", "memory_clock_rate_khz"),
                      ("L2_cache_size", "l2_cache_bytes")):
        value = getattr(props, attr, None)
        if value is not None:
            info[key] = value
    return info


def manifest_name(rank: int | None, world_size: int | None) -> str:
    """manifest.json for a single process; manifest.rank<N>.json for each rank of a distributed run."""
    if rank is not None and (world_size or 1) > 1:
        return f"manifest.rank{rank}.json"
    return "manifest.json"


def write_manifest(session: ProfileSession) -> Path:
    """Write the run's manifest atomically into its directory."""
    torch = session._torch
    env = distributed_env()
    files = []
    for path in session.files:
        if path.exists():
            kind = ("trace" if path.name.endswith(".pt.trace.json.gz") else
                    "memory_snapshot" if path.suffix == ".pickle" else "memory_timeline")
            files.append({"name": path.name, "kind": kind, "bytes": path.stat().st_size})
    notes = []
    if not session._cuda:
        notes.append("CPU capture: no GPU timeline, no host-to-device copies, no CUDA memory snapshot")
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "status": "failed" if session.error else "ok",
        "error": session.error,
        "command": {"argv": session.command or list(sys.argv), "cwd": os.getcwd(), "started_at": session._started_at,
                    "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
                    "pid": os.getpid()},
        "distributed": env,
        "versions": {
            "python": platform.python_version(),
            "torch": getattr(torch, "__version__", None),
            "cuda": getattr(torch.version, "cuda", None),
            "cudnn": torch.backends.cudnn.version() if session._cuda else None,
        },
        "device": device_info(torch, session._cuda),
        "profiler": asdict(session.options),
        "baseline": step_stats(session.baseline_ns, session.options.batch_size),
        "steps_seen": session.steps_seen,
        "files": files,
        "notes": notes,
    }
    path = session.out_dir / manifest_name(env["rank"], env["world_size"])
    atomic_write_text(path, json.dumps(manifest, indent=2, default=str) + "\n")
    return path
