"""`manifest.json`: what a capture run was, so the analyzer can tell profiled from unprofiled step time.

One manifest per process, written atomically when the session ends (also when the loop raised):
`manifest.json`, or `manifest.rank<N>.json` for each rank when a distributed launch sets WORLD_SIZE > 1.
Schema, manifest_version 1 (times in integer or float nanoseconds; null where unknown):

    manifest_version      1
    status                "ok" | "failed"          error: "<ExceptionType>: message" when the loop raised
    error_traceback       the loop's error as Python prints it ("Traceback (most recent call last): …", with
                          chained errors; under `stepscope capture`, the script's frames only); null when it
                          did not raise, and for SystemExit
    command               argv (the profiled program's command line), launcher_argv (this process's
                          sys.argv), cwd, host, pid, started_at / ended_at (ISO 8601, local time with offset)
    distributed           rank, local_rank, world_size, local_world_size, group_rank, launcher
                          ("torchrun" | "slurm" | "mpi" | "env" | null), run_id (torchrun's
                          TORCHELASTIC_RUN_ID)
    versions              python, torch, cuda, cudnn
    device                type "cpu": name, logical_cpus, torch_threads
                          type "cuda": index, name, total_memory_bytes, sm_count, compute_capability,
                          clock_rate_khz, memory_clock_rate_khz, memory_bus_width_bits, l2_cache_bytes,
                          warp_size, max_threads_per_sm, max_memory_allocated_bytes,
                          max_memory_reserved_bytes (process peaks when the run ended)
    profiler              the CaptureOptions (skip_first, baseline, wait, warmup, active, repeat,
                          record_shapes, profile_memory, with_stack, with_modules, with_flops, …),
                          activities (["cpu"] or ["cpu", "cuda"]), and profiler_step_offset: the
                          trace's ProfilerStep#N is the run's 0-based step N + profiler_step_offset
    timing_method         "cuda_event" (no synchronization added to the loop) | "perf_counter_ns"
    baseline              unprofiled step times (skip_first steps excluded): steps, durations_ns, mean_ns,
                          std_ns, p50_ns, p95_ns, p99_ns, steps_per_s, samples_per_s (with batch_size)
    profiled              the same figures over the recorded (active) steps, same clock
    overhead_ratio        profiled mean / baseline mean (null when either is missing)
    steps_seen            step() calls in the run; schedule_complete: whether every active step ran
    files                 each file written: name, kind ("trace" | "memory_snapshot" | "memory_timeline"),
                          bytes, and for traces: cycle, profiler_steps (the ProfilerStep#N inside),
                          complete (false: the cycle was cut short by the end of the loop or an error)
    notes                 facts a reader needs (e.g. "CPU capture: no GPU timeline, …")
    problems              optional exports that failed (memory timeline, snapshot), one line each
"""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path
from typing import Any, Literal

from stepscope._io import atomic_write_text

MANIFEST_VERSION = 1

FileKind = Literal["trace", "memory_snapshot", "memory_timeline"]


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def distributed_env() -> dict[str, Any]:
    """Rank, local rank, world size and launcher from the standard launcher variables.

    torchrun (and torch.distributed.launch) set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK
    and TORCHELASTIC_RUN_ID; SLURM (SLURM_PROCID, …) and Open MPI (OMPI_COMM_WORLD_RANK, …) are read when
    RANK is not set.
    """
    launcher = ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "env" if "RANK" in os.environ
                else "slurm" if "SLURM_PROCID" in os.environ else "mpi" if "OMPI_COMM_WORLD_RANK" in os.environ
                else None)
    return {
        "rank": _int_env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"),
        "local_rank": _int_env("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "world_size": _int_env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"),
        "local_world_size": _int_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        "group_rank": _int_env("GROUP_RANK", "SLURM_NODEID"),
        "launcher": launcher,
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
    }


def worker_name(env: dict[str, Any]) -> str:
    """`rank<N>` under a launcher, else `<host>_<pid>` (tensorboard_trace_handler's default)."""
    if env.get("rank") is not None:
        return f"rank{env['rank']}"
    return f"{socket.gethostname()}_{os.getpid()}"


def manifest_name(env: dict[str, Any]) -> str:
    """manifest.json for a single process; manifest.rank<N>.json for each rank of a distributed run."""
    if env.get("rank") is not None and (env.get("world_size") or 1) > 1:
        return f"manifest.rank{env['rank']}.json"
    return "manifest.json"


def versions(torch: Any, cuda: bool) -> dict[str, Any]:
    """Python, torch, CUDA and cuDNN versions."""
    cudnn = None
    if cuda:
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001 - a version is informative only
            cudnn = None
    return {"python": platform.python_version(), "torch": str(torch.__version__),
            "cuda": getattr(torch.version, "cuda", None), "cudnn": cudnn}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_CUDA_PROPS = (("clock_rate", "clock_rate_khz"), ("memory_clock_rate", "memory_clock_rate_khz"),
               ("memory_bus_width", "memory_bus_width_bits"), ("L2_cache_size", "l2_cache_bytes"),
               ("warp_size", "warp_size"), ("max_threads_per_multi_processor", "max_threads_per_sm"))


def device_info(torch: Any, cuda: bool) -> dict[str, Any]:
    """The device the run used, as torch reports it (get_device_properties on CUDA; no nvidia-smi)."""
    if not cuda:
        return {"type": "cpu", "name": _cpu_name(), "logical_cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads()}
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
    for attr, key in _CUDA_PROPS:
        value = getattr(props, attr, None)
        if value is not None:
            info[key] = value
    info["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(index)
    info["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(index)
    return info


def file_kind(path: Path) -> FileKind:
    """The kind of a file the capture wrote, from its name."""
    name = path.name
    if name.endswith(".pt.trace.json.gz"):
        return "trace"
    if name.endswith(".pickle"):
        return "memory_snapshot"
    return "memory_timeline"


def write_manifest(path: Path, manifest: dict[str, Any]) -> Path:
    """Write a manifest atomically (a reader never sees half a file)."""
    atomic_write_text(path, json.dumps(manifest, indent=2, default=str) + "\n")
    return path
