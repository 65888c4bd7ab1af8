"""Synthetic inference-server traces for the serving tests: engine iterations that launch kernels (or replay a
CUDA graph), with the names vLLM and SGLang give them. Times in µs, as in real traces."""

from __future__ import annotations

from typing import Any

from builders import annotation, kernel, python_fn, runtime, trace

VLLM_MIXED = ("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37"
              "(sq37sk34489sqsq37sqsk34489)")


def iteration(name: str, t0: float, cpu: float, kernels: list[tuple[float, float]], corr: int, *,
               graph: bool = False, frame: bool = False) -> list[dict[str, Any]]:
    """One engine iteration from t0 (µs): its span (an annotation, or a Python frame) of `cpu` µs, launching at
    t0 + 1 either one cudaGraphLaunch replaying every kernel, or one cudaLaunchKernel per kernel; `kernels` are
    (start after t0, duration)."""
    span = python_fn(name, ts=t0, dur=cpu) if frame else annotation(name, ts=t0, dur=cpu)
    events = [span]
    if graph:
        events.append(runtime("cudaGraphLaunch", ts=t0 + 1, dur=0.5, correlation=corr))
        events += [kernel(f"replayed_{i}", ts=t0 + s, dur=d, correlation=corr) for i, (s, d) in enumerate(kernels)]
        return events
    for i, (s, d) in enumerate(kernels):
        events.append(runtime("cudaLaunchKernel", ts=t0 + 1 + 0.1 * i, dur=0.05, correlation=corr + i))
        events.append(kernel(f"k{i}", ts=t0 + s, dur=d, correlation=corr + i))
    return events


def gpu_annotation(name: str, ts: float, dur: float) -> dict[str, Any]:
    """The GPU-side copy Kineto writes of an annotation (on the GPU's timeline): never an iteration of its own."""
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7}}


# (name, start µs, CPU µs, kernels (start after the span's start, duration) µs): walls are max(CPU end, GPU end)
SGLANG_STEPS: list[tuple[str, float, float, list[tuple[float, float]]]] = [
    ("step[EXTEND bs=2 toks=1024]", 0, 40, [(2, 50), (30, 30)]),          # GPU ends at 60: wall 60, busy 58
    ("step[DECODE bs=2]", 100, 10, [(2, 6), (5, 6)]),                     # wall 11, busy 9 (overlap counted once)
    ("step[DECODE bs=2]", 200, 12, [(2, 8)]),                             # wall 12, busy 8
    ("step[EXTEND bs=1 toks=300]", 300, 20, [(2, 25)]),                   # wall 27, busy 25
    ("step[DECODE bs=3]", 400, 9, [(2, 5)]),                              # wall 9, busy 5
    ("step[MIXED bs=4 c=1 g=3 c_sq=256 c_sk=256 c_sqsq=65536 c_sqsk=65536 g_sq=3 g_sk=900 g_sqsq=3 g_sqsk=900]",
     500, 30, [(2, 40)]),                                                 # wall 42, busy 40
    ("step[DECODE bs=3 g_sqsq=3 g_sqsk=1200 g_sk=1200]", 600, 10, [(2, 4)]),  # wall 10, busy 4
    ("step[IDLE bs=0]", 700, 3, []),                                      # wall 3, busy 0
]
SGLANG_WALL_US = [60, 11, 12, 27, 9, 42, 10, 3]
SGLANG_BUSY_US = [58, 9, 8, 25, 5, 40, 4, 0]


def sglang_server() -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for i, (name, t0, cpu, ks) in enumerate(SGLANG_STEPS):
        events += iteration(name, t0, cpu, ks, corr=100 * (i + 1))
        events.append(gpu_annotation(name, t0 + 2, cpu))
    return trace(*events)
