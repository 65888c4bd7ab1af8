"""Small traces with known critical paths, shared by the critical-path, what-if and CLI tests (times in µs).

Each builder returns the trace document; the expected path is in the test that uses it, worked out by hand
in the builder's docstring.
"""

from __future__ import annotations

from typing import Any

from builders import cpu_op, kernel, memcpy, runtime, step, trace

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def cuda_sync(name: str, ts: float, dur: float, *, stream: int, correlation: int, device: int = 0,
              **args: Any) -> dict[str, Any]:
    """A cuda_sync event as Kineto writes it (Stream Sync, Event Sync, Stream Wait Event, Context Sync)."""
    return {"ph": "X", "cat": "cuda_sync", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"cuda_sync_kind": name, "stream": stream, "correlation": correlation, "device": device, **args}}


def sync_serializes() -> dict[str, Any]:
    """A GEMM, then cudaDeviceSynchronize waits for it; then an add.

        CPU  step 0-200: aten::mm 10-30 > launch 15-25; cudaDeviceSynchronize 40-135; aten::add 140-160 > launch 145-150
        GPU  sgemm 30-130; elementwise 155-165
    -> path: step 0-10, aten::mm 10-15, launch latency 15-30, sgemm 30-130, sync 130-135, step 135-140,
       aten::add 140-145, cudaLaunchKernel 145-150, aten::add 150-160, step 160-200
    """
    return trace(
        step(1, ts=0, dur=200),
        cpu_op("aten::mm", ts=10, dur=20, external_id=1),
        runtime("cudaLaunchKernel", ts=15, dur=10, correlation=1, external_id=1),
        kernel("sgemm_128x64_nn", ts=30, dur=100, correlation=1),
        runtime("cudaDeviceSynchronize", ts=40, dur=95, correlation=9),
        cpu_op("aten::add", ts=140, dur=20, external_id=2),
        runtime("cudaLaunchKernel", ts=145, dur=5, correlation=2, external_id=2),
        kernel("vectorized_elementwise_kernel", ts=155, dur=10, correlation=2),
    )


def two_streams() -> dict[str, Any]:
    """A convolution on stream 7; an add on stream 20 waits for it through an event; a device sync.

        CPU  step 0-300: aten::conv 10-40 > launch 12-17; cudaEventRecord 20-22; cudaStreamWaitEvent 25-27;
             aten::add 45-65 > launch 50-55; cudaDeviceSynchronize 70-185
        GPU  stream 7: conv 20-170; stream 20: elementwise 171-180 (after the wait)
    -> path: step 0-10, aten::conv 10-12, launch latency 12-20, conv 20-170, stream wait 170-171,
       elementwise 171-180, sync 180-185, step 185-300
    """
    return trace(
        step(1, ts=0, dur=300),
        cpu_op("aten::conv2d", ts=10, dur=30, external_id=1),
        runtime("cudaLaunchKernel", ts=12, dur=5, correlation=1, external_id=1),
        kernel("implicit_convolve_sgemm", ts=20, dur=150, correlation=1, stream=7),
        runtime("cudaEventRecord", ts=20, dur=2, correlation=2),
        runtime("cudaStreamWaitEvent", ts=25, dur=2, correlation=3),
        cuda_sync("Stream Wait Event", ts=26, dur=1, stream=20, correlation=3, wait_on_stream=7,
                  wait_on_cuda_event_record_corr_id=2, wait_on_cuda_event_id=5),
        cpu_op("aten::add", ts=45, dur=20, external_id=4),
        runtime("cudaLaunchKernel", ts=50, dur=5, correlation=4, external_id=4),
        kernel("vectorized_elementwise_kernel", ts=171, dur=9, correlation=4, stream=20),
        runtime("cudaDeviceSynchronize", ts=70, dur=115, correlation=9),
    )


def launch_bound(iterations: int = 5) -> dict[str, Any]:
    """A loop of adds whose launch calls take 10 µs each for 2 µs kernels: the CPU is the path.

        iteration i: aten::add 10+16i .. +15 > cudaLaunchKernel 12+16i .. +10; kernel 24+16i .. +2
        the step's CPU span ends at 89, the last kernel at 90
    -> path: step 0-10, then per iteration but the last: aten::add 2, cudaLaunchKernel 10, aten::add 3, step 1;
       the last: aten::add 74-76, launch latency 76-88, kernel 88-90
    """
    events = [step(1, ts=0, dur=89)]
    for i in range(iterations):
        t = 10 + 16 * i
        events += [cpu_op("aten::add", ts=t, dur=15, external_id=i + 1),
                   runtime("cudaLaunchKernel", ts=t + 2, dur=10, correlation=i + 1, external_id=i + 1),
                   kernel("vectorized_elementwise_kernel", ts=t + 14, dur=2, correlation=i + 1)]
    return trace(*events)


def gpu_bound() -> dict[str, Any]:
    """Four 40 µs GEMMs launched in 20 µs, then cudaStreamSynchronize until they are done: the GPU is the path.

        CPU  step 0-180: aten::mm 2+5i .. +4 > launch 3+5i .. +2 (i = 0..3); cudaStreamSynchronize 25-175
        GPU  sgemm_i 10+40i .. +40
    -> path: step 0-2, aten::mm 2-3, launch latency 3-10, sgemm_0..3 10-170, sync 170-175, step 175-180
    """
    events = [step(1, ts=0, dur=180)]
    for i in range(4):
        events += [cpu_op("aten::mm", ts=2 + 5 * i, dur=4, external_id=i + 1),
                   runtime("cudaLaunchKernel", ts=3 + 5 * i, dur=2, correlation=i + 1, external_id=i + 1),
                   kernel(f"sgemm_{i}", ts=10 + 40 * i, dur=40, correlation=i + 1)]
    events += [runtime("cudaStreamSynchronize", ts=25, dur=150, correlation=99),
               cuda_sync("Stream Sync", ts=26, dur=148, stream=7, correlation=99)]
    return trace(*events)


def data_loading() -> dict[str, Any]:
    """A 30 µs DataLoader fetch, then an add: CPU-bound.

        CPU  step 0-60: DataLoader 1-31; aten::add 35-50 > launch 37-47; GPU kernel 55-57
    -> path: step 0-1, data loading 1-31, step 31-35, aten::add 35-37, launch 37-47, aten::add 47-50, step 50-60
    """
    from builders import annotation

    return trace(
        step(1, ts=0, dur=60),
        annotation(LOADER, ts=1, dur=30),
        cpu_op("aten::add", ts=35, dur=15, external_id=1),
        runtime("cudaLaunchKernel", ts=37, dur=10, correlation=1, external_id=1),
        kernel("vectorized_elementwise_kernel", ts=55, dur=2, correlation=1),
    )


def pageable_copy() -> dict[str, Any]:
    """A 40 µs pageable HtoD copy, then a kernel on its stream; the CPU finishes at 30.

        CPU  step 0-30: cudaMemcpyAsync 5-15, cudaLaunchKernel 20-22
        GPU  copy 10-50, kernel 50-60
    -> path: step 0-5, launch latency 5-10, copy 10-50, kernel 50-60
    """
    return trace(
        step(1, ts=0, dur=30),
        runtime("cudaMemcpyAsync", ts=5, dur=10, correlation=1),
        memcpy("HtoD", ts=10, dur=40, nbytes=40_000_000, correlation=1),
        runtime("cudaLaunchKernel", ts=20, dur=2, correlation=2),
        kernel("vectorized_elementwise_kernel", ts=50, dur=10, correlation=2),
    )
