"""A small synthetic GPU trace for the report tests: two steps, kernels, a memcpy, memory, a hostile op name."""

from __future__ import annotations

from typing import Any

from builders import cpu_op, kernel, memcpy, memory, runtime, step, trace

XSS = "<script>alert(1)</script>"


def gpu_doc(scale: float = 1.0) -> dict[str, Any]:
    """Steps 1 and 2 (100 µs each), one mm + one hostile op per step; kernel durations times `scale`."""
    events: list[dict[str, Any]] = []
    for i, base in enumerate((0, 100)):
        corr = 10 * (i + 1)
        events += [
            step(i + 1, ts=base, dur=100),
            cpu_op("aten::mm", ts=base + 5, dur=20, external_id=corr),
            runtime("cudaLaunchKernel", ts=base + 10, dur=5, correlation=corr, external_id=corr),
            kernel("sgemm_128x64", ts=base + 30, dur=10 * scale, correlation=corr),
            cpu_op(XSS, ts=base + 40, dur=10, external_id=corr + 1),
            runtime("cudaMemcpyAsync", ts=base + 42, dur=3, correlation=corr + 1, external_id=corr + 1),
            memcpy("HtoD", ts=base + 50, dur=5, nbytes=4096, correlation=corr + 1),
            memory(base + 6, 1024, total_allocated=1024 * (i + 1), total_reserved=4096),
        ]
    return trace(*events)
