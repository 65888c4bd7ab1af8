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


def cpu_ahead() -> dict[str, Any]:
    """A GPU-bound loop whose CPU runs ahead: two steps launch two 40 µs GEMMs each in 20 µs of CPU, and the GPU
    still runs a GEMM launched before the trace began (correlation 1, no launch call) until 100.

        CPU  step 2 0-20: aten::mm 2-8 > launch 3-5, aten::mm 10-16 > launch 11-13 (correlations 10, 11)
             step 3 20-40: the same at +20 (12, 13); cudaDeviceSynchronize 40-262
        GPU  sgemm_q 0-100 (queued), sgemm_a 100-140, sgemm_b 140-180, sgemm_c 180-220, sgemm_d 220-260
    -> windows 100-180 (step 2 starts where the queued work ends) and 180-260: 80 µs each, the GPU's time
    """
    events = [step(2, ts=0, dur=20), step(3, ts=20, dur=20), kernel("sgemm_q", ts=0, dur=100, correlation=1)]
    for i, name in enumerate("abcd"):
        events += [cpu_op("aten::mm", ts=2 + 8 * i + 4 * (i // 2), dur=6, external_id=10 + i),
                   runtime("cudaLaunchKernel", ts=3 + 8 * i + 4 * (i // 2), dur=2, correlation=10 + i,
                           external_id=10 + i),
                   kernel(f"sgemm_{name}", ts=100 + 40 * i, dur=40, correlation=10 + i)]
    events += [runtime("cudaDeviceSynchronize", ts=40, dur=222, correlation=99),
               cuda_sync("Context Sync", ts=41, dur=220, stream=-1, correlation=99)]
    return trace(*events)


def graph_replay() -> dict[str, Any]:
    """One cudaGraphLaunch replays three kernels on stream 7 whose branches overlap: k2 starts before k1 ends, and
    k3 before k2 ends (it waited for k1 only).

        CPU  step 0-15: replay 5-14 > cudaGraphLaunch 10-12
        GPU  stream 7: k1 20-50, k2 30-60, k3 55-70
    -> path: step 0-5, replay 5-10, launch latency 10-20, k1 20-50, stream gap 50-55, k3 55-70: the stream
       edge into k3 comes from k1 (the latest end at or before its start), not from k2, which ends after it starts
    """
    return trace(
        step(1, ts=0, dur=15),
        cpu_op("replay", ts=5, dur=9, external_id=1),
        runtime("cudaGraphLaunch", ts=10, dur=2, correlation=1, external_id=1),
        *(kernel(name, ts=ts, dur=dur, correlation=1) for name, ts, dur in
          (("k1", 20, 30), ("k2", 30, 30), ("k3", 55, 15))),
    )


def launch_behind_a_graph() -> dict[str, Any]:
    """A graph replay whose two kernels overlap on stream 7 (a short one inside a long one), an add launched while
    the long one still runs, then two adds launched onto an idle stream 5 µs before they start.

        CPU  step 0-300: replay 5-14 > cudaGraphLaunch 10-12; aten::add 40-50 > launch 42-44;
             aten::add 250+20i .. +10 > launch 252+20i .. +2 (i = 0, 1)
        GPU  stream 7: long 20-200, short 25-30, add 201-204, add_i 257+20i .. +3
    -> launches that found their stream idle: the graph's (10 µs to its first kernel) and the two adds (5 µs). The
       add launched at 42 did not: the long kernel ran until 200, though the short one just before it had ended.
       Typical latency: the median of 10, 5, 5 = 5 µs (counting the add at 42, 159 µs, would make it 7.5 µs)
    """
    events = [step(1, ts=0, dur=300),
              cpu_op("replay", ts=5, dur=9, external_id=1),
              runtime("cudaGraphLaunch", ts=10, dur=2, correlation=1, external_id=1),
              kernel("long", ts=20, dur=180, correlation=1), kernel("short", ts=25, dur=5, correlation=1),
              cpu_op("aten::add", ts=40, dur=10, external_id=2),
              runtime("cudaLaunchKernel", ts=42, dur=2, correlation=2, external_id=2),
              kernel("add", ts=201, dur=3, correlation=2)]
    for i in range(2):
        events += [cpu_op("aten::add", ts=250 + 20 * i, dur=10, external_id=3 + i),
                   runtime("cudaLaunchKernel", ts=252 + 20 * i, dur=2, correlation=3 + i, external_id=3 + i),
                   kernel(f"add_{i}", ts=257 + 20 * i, dur=3, correlation=3 + i)]
    return trace(*events)


def held_start(wait: float = 205, launches: int = 3, call: float = 2,
               comm_ends_before: float | None = None) -> dict[str, Any]:
    """`launches` adds whose kernels start 5 µs after their launch on an idle stream (the typical latency where
    there are three or more), then a matmul whose kernel starts `wait` µs after its launch call (of `call` µs), the
    stream idle; with `comm_ends_before`, an NCCL all-reduce on stream 20 (no launch recorded) that ends that many
    µs before the matmul starts (what it waited for, by an event the trace does not link).

        CPU  step 0-100: aten::add 10+20i .. +10 > launch 12+20i .. +2 (i < launches); aten::mm 70-80 > launch 72-74
        GPU  add_i 17+20i .. +3; sgemm 72+wait .. +13
    -> path (wait 205, typical 5): ..., aten::mm 70-72, launch latency 72-77, start held 77-277, sgemm 277-290
    """
    events = [step(1, ts=0, dur=max(100, 76 + call))]
    for i in range(launches):
        events += [cpu_op("aten::add", ts=10 + 20 * i, dur=10, external_id=i + 1),
                   runtime("cudaLaunchKernel", ts=12 + 20 * i, dur=2, correlation=i + 1, external_id=i + 1),
                   kernel(f"add_{i}", ts=17 + 20 * i, dur=3, correlation=i + 1)]
    events += [cpu_op("aten::mm", ts=70, dur=max(10, call + 4), external_id=50),
               runtime("cudaLaunchKernel", ts=72, dur=call, correlation=50, external_id=50),
               kernel("sgemm", ts=72 + wait, dur=13, correlation=50)]
    if comm_ends_before is not None:
        events.append(kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", ts=80,
                             dur=72 + wait - comm_ends_before - 80, stream=20))
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


# ------------------------------------------------------------------------------------------------ runs (two ranks)

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
COMM_ARGS: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                             "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                             "Process Group Ranks": "[0, 1]"}


def late_rank_run(rank: int, *, late_by: str) -> dict[str, Any]:
    """One rank of a 2-rank step whose rank 1 reaches the all_reduce late, by 100 µs of data loading
    (late_by="data_loading") or by a GEMM 120 µs longer (late_by="gemm"); rank 0 waits in the all_reduce.

    late_by="data_loading" (the GEMMs on stream 7, the all_reduce on stream 20):
        rank 0  step 0-300: aten::mm 10-20 > launch 12-17 -> sgemm 20-60; launch 65-70 -> all_reduce 70-200;
                cudaStreamSynchronize(20) 75-205
        rank 1  the same 100 µs later after DataLoader 1-101: sgemm 120-160; all_reduce 180-200; sync 175-205
        latency 20 (rank 1's), rank 1 arrives last at 180; both end at 200, the syncs at 205, the steps at 300
    late_by="gemm" (everything on stream 7: the all_reduce waits for the GEMM):
        rank 0  aten::mm 10-20 > launch 12-17 -> sgemm 20-50; launch 25-30 -> all_reduce 50-200; sync 35-205
        rank 1  sgemm 20-170; all_reduce 170-200
        latency 30 (rank 1's), rank 1 arrives last at 170
    """
    late = rank == 1
    shift = 100 if late and late_by == "data_loading" else 0
    events = [step(1, ts=0, dur=300)]
    if late and late_by == "data_loading":
        from builders import annotation

        events.append(annotation(LOADER, ts=1, dur=100))
    events += [cpu_op("aten::mm", ts=10 + shift, dur=10, external_id=1),
               runtime("cudaLaunchKernel", ts=12 + shift, dur=5, correlation=1, external_id=1)]
    if late_by == "data_loading":
        events += [kernel("sgemm_128x64_nn", ts=20 + shift, dur=40, correlation=1, stream=7),
                   runtime("cudaLaunchKernel", ts=65 + shift, dur=5, correlation=2),
                   kernel(ALL_REDUCE, ts=70 + 110 * late, dur=130 - 110 * late, correlation=2, stream=20,
                          **COMM_ARGS),
                   runtime("cudaStreamSynchronize", ts=75 + shift, dur=130 - shift, correlation=3),
                   cuda_sync("Stream Sync", ts=76 + shift, dur=128 - shift, stream=20, correlation=3)]
    else:
        gemm = 150 if late else 30
        events += [kernel("sgemm_128x64_nn", ts=20, dur=gemm, correlation=1, stream=7),
                   runtime("cudaLaunchKernel", ts=25, dur=5, correlation=2),
                   kernel(ALL_REDUCE, ts=20 + gemm, dur=180 - gemm, correlation=2, stream=7, **COMM_ARGS),
                   runtime("cudaStreamSynchronize", ts=35, dur=170, correlation=3),
                   cuda_sync("Stream Sync", ts=36, dur=168, stream=7, correlation=3)]
    return trace(*events, distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl"})


def compute_waits_for_comm(gap: float = 1) -> dict[str, Any]:
    """An all_reduce on stream 20; a GEMM on stream 7 waits for it through an event; a small kernel first.
    `gap`: µs between the all_reduce's end and the GEMM's start (drawn for 1; with 0 the GEMM starts at the very
    ns the all_reduce ends, and everything after moves 1 µs earlier).

        CPU  step 0-50: launch 1-3 -> elementwise 4-5 (stream 7, latency 3); launch 5-7 -> all_reduce 10-60
             (stream 20, latency 5); cudaEventRecord 8-9; cudaStreamWaitEvent 11-12 (stream 7 on 20);
             launch 15-17 -> sgemm 61-91 (stream 7, after the wait)
        typical launch latency: median(3, 5, 46) = 5; the step ends with the GEMM at 91
    --overlap-comm: the GEMM no longer waits: 15 + 5 = 20 to 50; the step still ends with the all_reduce at 60
    """
    return trace(
        step(1, ts=0, dur=50),
        runtime("cudaLaunchKernel", ts=1, dur=2, correlation=1),
        kernel("vectorized_elementwise_kernel", ts=4, dur=1, correlation=1, stream=7),
        runtime("cudaLaunchKernel", ts=5, dur=2, correlation=2),
        kernel(ALL_REDUCE, ts=10, dur=50, correlation=2, stream=20),
        runtime("cudaEventRecord", ts=8, dur=1, correlation=3),
        runtime("cudaStreamWaitEvent", ts=11, dur=1, correlation=4),
        cuda_sync("Stream Wait Event", ts=11.5, dur=0.5, stream=7, correlation=4, wait_on_stream=20,
                  wait_on_cuda_event_record_corr_id=3, wait_on_cuda_event_id=1),
        runtime("cudaLaunchKernel", ts=15, dur=2, correlation=5),
        kernel("sgemm_128x64_nn", ts=60 + gap, dur=30, correlation=5, stream=7),
    )
