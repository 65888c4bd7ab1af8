"""A kineto-like synthetic trace of any size, for benchmarks (never committed).

Per step: a ProfilerStep span, a DataLoader annotation, forward ops each with a Python frame, an aten op,
a cudaLaunchKernel with a correlation id and its kernel on one of two streams, a pageable HtoD copy, a
[memory] allocation and free per op, an optimizer step and a loss.item() (DtoH copy, stream sync).
About 9 events per op.
"""

from __future__ import annotations

from pathlib import Path

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def write_trace(path: Path, target_events: int) -> int:
    """Write a trace of about `target_events` events to path; return the exact count."""
    ops_per_step = 400
    events_per_op = 9
    steps = max(1, target_events // (ops_per_step * events_per_op))
    count = 0
    t = 1_000_000
    corr = 0
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic H100", '
                 '"totalGlobalMem": 85899345920, "computeMajor": 9, "computeMinor": 0, "numSms": 132}], '
                 '"traceEvents": [\n')
        first = True

        def emit(text: str) -> None:
            nonlocal first, count
            fh.write(text if first else ",\n" + text)
            first = False
            count += 1

        for step in range(steps):
            step_start = t
            emit(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 1, "tid": 1, '
                 f'"ts": {t}, "dur": {ops_per_step * 40 + 600}}}')
            emit(f'{{"ph": "X", "cat": "user_annotation", "name": "{LOADER}", '
                 f'"pid": 1, "tid": 1, "ts": {t + 1}, "dur": 500}}')
            corr += 1
            emit(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": {t + 510}, '
                 f'"dur": 20, "args": {{"correlation": {corr}, "External id": {corr}}}}}')
            emit(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, '
                 f'"tid": 7, "ts": {t + 520}, "dur": 60, '
                 f'"args": {{"device": 0, "stream": 7, "correlation": {corr}, "bytes": 4194304}}}}')
            t += 600
            for op in range(ops_per_step):
                corr += 1
                stream = 7 if op % 4 else 20
                emit(f'{{"ph": "X", "cat": "python_function", "name": "model.py({op % 50}): forward", "pid": 1, '
                     f'"tid": 1, "ts": {t}, "dur": 30, "args": {{"Python id": {corr}, "Python parent id": 1}}}}')
                emit(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::op{op % 37}", "pid": 1, "tid": 1, "ts": {t + 1}, '
                     f'"dur": 25, "args": {{"External id": {corr}, "Input Dims": [[64, 128], [128, 128]], '
                     f'"Input type": ["float", "float"]}}}}')
                emit(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                     f'"ts": {t + 5}, "dur": 6, "args": {{"correlation": {corr}, "External id": {corr}}}}}')
                emit(f'{{"ph": "X", "cat": "kernel", "name": "void gemm_kernel_{op % 23}<float>(float*)", "pid": 0, '
                     f'"tid": {stream}, "ts": {t + 12}, "dur": {20 + op % 15}, '
                     f'"args": {{"device": 0, "stream": {stream}, '
                     f'"correlation": {corr}, "grid": [64, 1, 1], "block": [256, 1, 1]}}}}')
                emit(f'{{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": {corr}, "pid": 1, "tid": 1, "ts": {t + 5}}}')
                emit(f'{{"ph": "f", "cat": "ac2g", "name": "ac2g", "id": {corr}, "pid": 0, "tid": {stream}, '
                     f'"ts": {t + 12}, "bp": "e"}}')
                emit(f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, '
                     f'"ts": {t + 2}, "args": {{"Device Type": 1, "Device Id": 0, "Addr": {corr * 4096}, '
                     f'"Bytes": 32768, "Total Allocated": {1 << 30 + 0}, "Total Reserved": {2 << 30}}}}}')
                emit(f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, '
                     f'"ts": {t + 24}, "args": {{"Device Type": 1, "Device Id": 0, "Addr": {corr * 4096}, '
                     f'"Bytes": -32768, "Total Allocated": {1 << 30}, "Total Reserved": {2 << 30}}}}}')
                emit(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": {t + 3}, '
                     f'"dur": 2, "args": {{"External id": {corr + 10_000_000}}}}}')
                t += 40
            end = step_start + ops_per_step * 40 + 600
            emit(f'{{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, '
                 f'"ts": {end - 50}, "dur": 40}}')
            # loss.item(): a DtoH copy and a stream synchronize on the main thread
            corr += 1
            emit(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1, "ts": {end - 9}, '
                 f'"dur": 8, "args": {{"External id": {corr}}}}}')
            emit(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, '
                 f'"ts": {end - 8}, "dur": 2, "args": {{"correlation": {corr}, "External id": {corr}}}}}')
            emit(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, '
                 f'"ts": {end - 6}, "dur": 4}}')
            emit(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, '
                 f'"tid": 7, "ts": {end - 5}, "dur": 2, '
                 f'"args": {{"device": 0, "stream": 7, "correlation": {corr}, "bytes": 4}}}}')
        fh.write("\n]}\n")
    return count
