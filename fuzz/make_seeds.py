"""Write the fuzz targets' seed corpora into fuzz/seeds/<target>/ (deterministic; run again after a format change).

Seeds are small (a few KB: libFuzzer mutates small inputs fastest): real events cut from sample_traces/ with
their exact text (Kineto's nanosecond timestamps, its formatting), a few synthetic documents for the event
kinds and odd values the samples lack (kernels, memcpys, flows, ROCm's numbers as strings, deep nesting,
numbers beyond int64 or a double), and snapshot pickles built as torch writes them.

    python fuzz/make_seeds.py
"""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"
sys.path.insert(0, str(ROOT / "tests" / "analyze"))
from snapshot_builder import TORCH, USER, block, entry, segment  # noqa: E402

from stepscope.analyze._columns import _SLOT_KEYS, _SLOT_TYPES  # noqa: E402
from stepscope.analyze._read import split_document  # noqa: E402

_MAX_SEED = 6000  # bytes; the targets' smoke runs with -max_len=8192


def _sample_seeds() -> list[bytes]:
    """From each sample trace: its head and tail around traceEvents (deviceProperties left out, it is long)
    with the first events of each (ph, cat), their text as Kineto wrote it, and a bare array of them."""
    seeds = []
    for trace in sorted(ROOT.glob("sample_traces/*/*.pt.trace.json.gz")):
        data = gzip.decompress(trace.read_bytes())
        start, end, top = split_document(data, trace)
        top.pop("deviceProperties", None)
        per_kind: dict[tuple[Any, Any], list[bytes]] = defaultdict(list)
        for raw in msgspec.json.decode(data[start:end], type=list[msgspec.Raw]):
            event = msgspec.json.decode(raw)
            kind = (event.get("ph"), event.get("cat"))
            if len(per_kind[kind]) < 2:
                per_kind[kind].append(bytes(raw))
        events = [raw for raws in per_kind.values() for raw in raws]
        while len(b",".join(events)) > _MAX_SEED - 600 and len(events) > 1:
            events.pop(max(range(len(events)), key=lambda i: len(events[i])))
        body = b"[\n" + b",\n".join(events) + b"\n]"
        head = json.dumps({k: top[k] for k in list(top)[:5]}).encode()[:-1]
        tail = json.dumps({k: top[k] for k in list(top)[5:]}).encode()[1:]
        seeds.append(head + b', "traceEvents": ' + body + b", " + tail)
        seeds.append(body)
    return seeds


_SYNTHETIC: list[Any] = [
    {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 12.25,
         "args": {"External id": 7, "Input Dims": [[32, 64], [64, 64]], "Input type": ["float", "float"],
                  "Sequence number": 3, "Fwd thread id": 0, "Record function id": 0, "Ev Idx": 5}},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x64_nn", "pid": 0, "tid": 7, "ts": 20.5, "dur": 3.25,
         "args": {"External id": 7, "correlation": 42, "device": 0, "stream": 7, "grid": [4, 1, 1],
                  "block": [256, 1, 1], "registers per thread": 72, "shared memory": 0, "blocks per SM": 0.5,
                  "warps per SM": 4.0, "est. achieved occupancy %": 12}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 4,
         "args": {"External id": 7, "correlation": 42, "cbid": 211}},
        {"ph": "s", "id": 42, "pid": 1, "tid": 1, "ts": 2, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 42, "pid": 0, "tid": 7, "ts": 20.5, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3,
         "args": {"Total Reserved": 2097152, "Total Allocated": 16384, "Bytes": 16384, "Addr": 140000000000000,
                  "Device Type": 1, "Device Id": 0}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 30,
         "dur": 2, "args": {"stream": "0x7", "bytes": "1024", "memory bandwidth (GB/s)": 0.5}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 33, "dur": 1,
         "args": {"stream": 7, "bytes": 64, "device": 0}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": 0, "tid": 7, "ts": 19, "dur": 20},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1, "dur": 40},
        {"ph": "X", "cat": "python_function", "name": "nn.Module: Linear_0 \"q\" \u00e9 \U0001f600", "pid": 1,
         "tid": 1, "ts": 1, "dur": 30, "args": {"Python id": 3, "Python parent id": 1}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 1, "ts": 5, "dur": 1},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 40, "dur": 1,
         "args": {"stream": 7, "device": 0}},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "args": None},
        {"ph": "B", "name": "begin", "pid": 1, "tid": 2, "ts": 1}, {"ph": "E", "pid": 1, "tid": 2, "ts": 2},
        {"ph": "X", "cat": "Operator", "name": "legacy", "pid": "1", "tid": "t", "ts": "7.5", "dur": None},
    ], "traceName": "synthetic.json", "deviceProperties": [{"id": 0, "name": "GPU"}],
     "baseTimeNanoseconds": 1700000000000000000},
    [{"ph": "X", "ts": 1, "dur": 1}],
    [],
    {"traceEvents": []},
    {"traceEvents": [{"ph": "X", "ts": 1}], "traceEvents2": [1, 2, "]"]},
    [{"ph": "X", "name": True, "pid": -1, "tid": 1.5, "ts": -3, "dur": 0.001, "args": {"stream": "-0x10"}}],
]

# Odd numbers and shapes, written as text (a Python float would drop their digits)
_SYNTHETIC_TEXT = [
    b'[{"ph": "X", "ts": 1712195495519689.047, "dur": 12.5}, {"ph": "X", "ts": 9223372036854775.807}]',
    b'[{"ph": "X", "ts": 1e17}, {"ph": "X", "ts": 1e400, "pid": 1' + b"0" * 40 + b"}]",
    b'[{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x", "v": 1e400}}, {"ph": "X", "ts": 1}]',
    b'[{"ph": "X", "cat": "kernel", "ts": 1, "args": {"bytes": ' + b"9" * 30 + b', "correlation": -0}}]',
    b'[{"ph": "X", "ts": 1, "args": {"x": ' + b"[" * 70 + b"]" * 70 + b"}}]",
    b'[{"ph": "X", "n\\u0061me": "\\ud83d\\ude00 \\u00e9 \\"", "ts": 1, "ts": 2}]',
    b'{"traceEvents": [{"ph": "X", "name": "\\ud800", "ts": 1}], "x": "\xff"}',
    b'[{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"flops": "inf", "dtype": 1.5}}]',
    b'[{"ph": "X", "ts": 1},]',
]


def trace_seeds() -> list[bytes]:
    synthetic = [json.dumps(doc, indent=i, ensure_ascii=a).encode()
                 for doc in _SYNTHETIC for i, a in ((None, True), (1, False))]
    return _sample_seeds() + synthetic + _SYNTHETIC_TEXT


def scan_api_seeds(traces: list[bytes]) -> list[bytes]:
    """fuzz_scan_events' layout (see there): flags, then keys and types unless the real ones, then the range."""
    seeds = []
    arrays = [t for t in traces if t.lstrip().startswith(b"[") and len(t) < 4000]
    for doc in arrays:
        seeds.append(b"\x00" + doc)  # the real keys, whole document
        body = doc.strip()[1:-1]
        seeds.append(b"\x02" + bytes([1, 0]) + bytes([1, 0]) + b"[" + body + b"]")  # the real keys, in place
    keys = bytes([3]) + b"".join(bytes([len(k)]) + k + bytes([t]) for k, t in
                                 [(b"stream", 0), (b"name", 2), (b"bytes", 1)])
    seeds.append(b"\x01" + keys + arrays[0])
    seeds.append(b"\x01" + bytes([2, 1]) + b"a" + bytes([4]) + bytes([0, 1]) + arrays[0])  # a bad type code
    assert len(_SLOT_KEYS) == len(_SLOT_TYPES)
    return seeds


def snapshot_seeds() -> list[bytes]:
    stack = [{"filename": TORCH, "line": 1750, "name": "_call_impl"}, {"filename": USER, "line": 54,
                                                                        "name": "forward"}]
    blocks = [block(0x7F0000000000, 512, "active_allocated", stack), block(0x7F0000000200, 1536, "inactive")]
    traces = [entry("segment_alloc", 0x7F0000000000, 2048, t=1), entry("alloc", 0x7F0000000000, 512, t=2,
                                                                        stack=stack),
              entry("free_requested", 0x7F0000000000, 512, t=3, stack=stack),
              entry("free_completed", 0x7F0000000000, 512, t=4, stack=stack), entry("oom", 0, 1 << 40, t=5,
                                                                                     device_free=1024),
              entry("snapshot", 0, 0, t=6)]
    full = {"segments": [segment(0x7F0000000000, blocks)], "device_traces": [traces, []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1},
            "external_annotations": [{"device": 0, "stage": "START", "name": "fwd", "time_us": 1}]}
    no_time = {"segments": [], "device_traces": [[{k: v for k, v in e.items() if k != "time_us"} for e in traces]]}
    legacy = [segment(0x7F0000000000, blocks)]
    seeds = [pickle.dumps(d, protocol=p) for d in (full, no_time, legacy) for p in (2, 4, 5)]
    seeds.append(pickle.dumps({"segments": [], "device_traces": [None]}, protocol=4))
    return seeds


def unpickle_seeds() -> list[bytes]:
    values: list[Any] = [0, 1, 255, 256, 65536, -1, 2**31, 2**63 - 1, -(2**63), 2**64, -(2**100), 1.5, -0.0,
                         float("inf"), None, True, False, "", "x", "\u00e9 \u2713", "s" * 300, (), (1,), (1, 2),
                         (1, 2, 3), (1, 2, 3, 4), [], {}, [[1, [2]], {"k": (3,)}]]
    shared = [1, 2]
    seeds = [pickle.dumps({"values": values, 7: "k", (1, "t"): "tuple key", "twice": [shared, shared]}, protocol=p)
             for p in range(6)]
    seeds += [pickle.dumps([b"bytes", b"b" * 300, {1, 2}, frozenset({"a"}), bytearray(b"ba")], protocol=p)
              for p in (4, 5)]
    seeds.append(pickle.dumps(Path("refused"), protocol=4))  # a global and REDUCE: refused
    return seeds


def _write(target: str, seeds: list[bytes]) -> None:
    folder = SEEDS / target
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for seed in seeds:
        (folder / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"{folder.relative_to(ROOT)}: {len(seeds)} seeds, {sum(map(len, seeds))} bytes")


def main() -> None:
    traces = trace_seeds()
    _write("trace", traces)
    _write("scan_events", scan_api_seeds(traces))
    _write("snapshot", snapshot_seeds())
    _write("unpickle", unpickle_seeds())


if __name__ == "__main__":
    main()
