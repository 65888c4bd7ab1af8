"""Synthetic graph-replayed runs and profiles of their graph capture, shared by the graphs tests.

    full_graph_run()        three steps, each one FULL-graph replay (gemm, relu) launched from serve.py(10)
    full_graph_capture()    its capture: an eager warm-up, then the capture segment (ROCm-style launches that name
                            their kernel, or CUDA-style ones that do not: named=False)
    piecewise_run()         pieces A and B (gemm, relu) around an eager attention op, then piece C (lm_head gemm)
    piecewise_capture()     one capture segment per piece, the attention op eager between them
"""

from __future__ import annotations

from typing import Any

from builders import cpu_op, kernel, python_fn, runtime, step, trace

BF16 = "c10::BFloat16"
MM_DIMS = [[64, 128], [128, 256]]
MM_FLOPS = 2 * 64 * 128 * 256


def launch(ts: float, corr: int, ext: int, name: str | None = None, *, call: str = "hipLaunchKernel") -> dict[str, Any]:
    """A kernel launch call; `name` is the ROCm `kernel` arg (a CUDA call names no kernel)."""
    e = runtime(call, ts, 1, correlation=corr, external_id=ext)
    if name is not None:
        e["args"]["kernel"] = name
    return e


def graph_launch(ts: float, corr: int) -> dict[str, Any]:
    return runtime("hipGraphLaunch", ts, 2, correlation=corr)


def mm(ts: float, dur: float, ext: int) -> dict[str, Any]:
    return cpu_op("aten::mm", ts, dur, external_id=ext, **{"Input Dims": MM_DIMS, "Input type": [BF16, BF16]})


def full_graph_run() -> dict[str, Any]:
    """Three steps, each one FULL-graph replay (gemm, relu) launched from serve.py(10)."""
    events: list[dict[str, Any]] = []
    for i in range(3):
        t0 = i * 100
        events += [step(i + 1, ts=t0, dur=90), python_fn("serve.py(10): decode", t0 + 1, 20),
                   graph_launch(t0 + 5, 100 + i),
                   kernel("gemm_kernel", t0 + 10, 30, correlation=100 + i),
                   kernel("relu_kernel", t0 + 41, 10, correlation=100 + i)]
    return trace(*events)


def full_graph_capture(*, named: bool = True, extra_launch: bool = False) -> dict[str, Any]:
    """A warm-up run (executed: kernels name themselves) then the capture (launches only; `extra_launch`: one
    more unnamed launch in it than the graph replays, so its launch order says nothing)."""
    extra = [launch(117, 5, 4, None)] if extra_launch else []
    return trace(
        mm(0, 10, 1), launch(2, 1, 1, None), kernel("gemm_kernel", 20, 30, correlation=1),
        cpu_op("aten::relu", 12, 5, external_id=2), launch(13, 2, 2, None),
        kernel("relu_kernel", 51, 10, correlation=2),
        runtime("hipStreamBeginCapture", 100, 1),
        mm(102, 10, 3), launch(104, 3, 3, "gemm_kernel" if named else None),
        cpu_op("aten::relu", 114, 5, external_id=4), launch(115, 4, 4, "relu_kernel" if named else None),
        *extra,
        runtime("hipStreamEndCapture", 120, 1),
    )


def piecewise_run() -> dict[str, Any]:
    """Pieces A (gemm, relu), an eager attention op, piece B (gemm, relu), piece C (lm_head gemm)."""
    return trace(
        python_fn("model.py(7): forward", 0, 200),
        graph_launch(1, 10), kernel("gemm_kernel", 5, 10, correlation=10), kernel("relu_kernel", 16, 2, correlation=10),
        cpu_op("vllm::attention", 20, 10, external_id=50), launch(22, 11, 50, call="hipLaunchKernel"),
        kernel("attn_kernel", 25, 20, correlation=11),
        graph_launch(40, 12), kernel("gemm_kernel", 50, 10, correlation=12),
        kernel("relu_kernel", 61, 2, correlation=12),
        graph_launch(70, 13), kernel("lm_head_gemm", 75, 40, correlation=13),
    )


def piecewise_capture() -> dict[str, Any]:
    """Three capture segments (one per piece) with an eager attention op between the first two."""
    seg: list[dict[str, Any]] = []
    for i, t0 in enumerate((0, 100)):
        ext = 10 * (i + 1)
        seg += [runtime("hipStreamBeginCapture", t0, 1),
                cpu_op("vllm::gemm_wrapper", t0 + 2, 12), mm(t0 + 3, 10, ext), launch(t0 + 5, ext, ext, "gemm_kernel"),
                cpu_op("aten::relu", t0 + 15, 5, external_id=ext + 1), launch(t0 + 16, ext + 1, ext + 1, "relu_kernel"),
                runtime("hipStreamEndCapture", t0 + 25, 1)]
    seg += [cpu_op("vllm::attention", 50, 10, external_id=90), launch(52, 90, 90, "attn_kernel")]
    seg += [runtime("hipStreamBeginCapture", 200, 1),
            cpu_op("aten::matmul", 202, 10, external_id=40), launch(205, 40, 40, "lm_head_gemm"),
            runtime("hipStreamEndCapture", 215, 1)]
    return trace(*seg)
