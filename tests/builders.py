"""Small synthetic Chrome traces built in code, for exact expectations.

Times are given in microseconds as in real traces (ints or floats); the ingested tables hold ns.

    trace_dict = trace(
        step(1, ts=0, dur=100),
        cpu_op("aten::mm", ts=5, dur=20, external_id=3),
        runtime("cudaLaunchKernel", ts=10, dur=5, correlation=7, external_id=3),
        kernel("sgemm", ts=30, dur=10, correlation=7),
    )
    t = load_events(tmp_path, trace_dict)      # -> stepscope Trace
"""

from __future__ import annotations

import gzip
import json
from itertools import count
from pathlib import Path
from typing import Any

from stepscope.analyze import Trace, load

PID = 1000
MAIN_TID = 1
_ids = count(1_000_000)


def _event(ph: str, cat: str | None, name: str, ts: float, dur: float | None, pid: Any, tid: Any,
           args: dict[str, Any] | None) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": ph, "name": name, "pid": pid, "tid": tid, "ts": ts}
    if cat is not None:
        e["cat"] = cat
    if dur is not None:
        e["dur"] = dur
    if args:
        e["args"] = args
    return e


def cpu_op(name: str, ts: float, dur: float, *, tid: Any = MAIN_TID, pid: Any = PID,
           external_id: int | None = None, **args: Any) -> dict[str, Any]:
    """A cpu_op (aten op, autograd node …)."""
    a = dict(args)
    if external_id is not None:
        a["External id"] = external_id
    return _event("X", "cpu_op", name, ts, dur, pid, tid, a)


def annotation(name: str, ts: float, dur: float, *, tid: Any = MAIN_TID, pid: Any = PID) -> dict[str, Any]:
    """A user_annotation (record_function)."""
    return _event("X", "user_annotation", name, ts, dur, pid, tid, None)


def step(n: int, ts: float, dur: float, *, tid: Any = MAIN_TID, pid: Any = PID) -> dict[str, Any]:
    """A ProfilerStep#n span."""
    return _event("X", "user_annotation", f"ProfilerStep#{n}", ts, dur, pid, tid, None)


def python_fn(name: str, ts: float, dur: float, *, tid: Any = MAIN_TID, pid: Any = PID,
              python_id: int | None = None, parent_id: int | None = None) -> dict[str, Any]:
    """A python_function frame (with_stack), e.g. name='train.py(42): forward'."""
    a: dict[str, Any] = {}
    if python_id is not None:
        a["Python id"] = python_id
    if parent_id is not None:
        a["Python parent id"] = parent_id
    return _event("X", "python_function", name, ts, dur, pid, tid, a)


def runtime(name: str, ts: float, dur: float, *, correlation: int | None = None, external_id: int | None = None,
            tid: Any = MAIN_TID, pid: Any = PID) -> dict[str, Any]:
    """A CUDA runtime call (cudaLaunchKernel, cudaMemcpyAsync, cudaDeviceSynchronize …)."""
    a: dict[str, Any] = {}
    if correlation is not None:
        a["correlation"] = correlation
    if external_id is not None:
        a["External id"] = external_id
    return _event("X", "cuda_runtime", name, ts, dur, pid, tid, a)


def kernel(name: str, ts: float, dur: float, *, device: int = 0, stream: int = 7, correlation: int | None = None,
           external_id: int | None = None, **args: Any) -> dict[str, Any]:
    """A GPU kernel."""
    a: dict[str, Any] = {"device": device, "stream": stream, **args}
    if correlation is not None:
        a["correlation"] = correlation
    if external_id is not None:
        a["External id"] = external_id
    return _event("X", "kernel", name, ts, dur, device, stream, a)


def memcpy(direction: str, ts: float, dur: float, *, nbytes: int, device: int = 0, stream: int = 7,
           correlation: int | None = None, src: str = "Pageable", dst: str = "Device") -> dict[str, Any]:
    """A GPU memcpy, named as Kineto names them: 'Memcpy HtoD (Pageable -> Device)'."""
    a: dict[str, Any] = {"device": device, "stream": stream, "bytes": nbytes}
    if correlation is not None:
        a["correlation"] = correlation
    return _event("X", "gpu_memcpy", f"Memcpy {direction} ({src} -> {dst})", ts, dur, device, stream, a)


def memset(ts: float, dur: float, *, nbytes: int, device: int = 0, stream: int = 7,
           correlation: int | None = None) -> dict[str, Any]:
    """A GPU memset."""
    a: dict[str, Any] = {"device": device, "stream": stream, "bytes": nbytes}
    if correlation is not None:
        a["correlation"] = correlation
    return _event("X", "gpu_memset", "Memset (Device)", ts, dur, device, stream, a)


def memory(ts: float, nbytes: int, *, total_allocated: int | None = None, total_reserved: int | None = None,
           device: int = 0, addr: int | None = None, tid: Any = MAIN_TID, pid: Any = PID) -> dict[str, Any]:
    """A [memory] instant: +nbytes allocated (negative to free). device=-1 means CPU."""
    a: dict[str, Any] = {"Device Type": 0 if device < 0 else 1, "Device Id": device, "Bytes": nbytes,
                         "Addr": addr if addr is not None else next(_ids)}
    if total_allocated is not None:
        a["Total Allocated"] = total_allocated
    if total_reserved is not None:
        a["Total Reserved"] = total_reserved
    e = _event("i", "cpu_instant_event", "[memory]", ts, None, pid, tid, a)
    e["s"] = "t"
    return e


def flow(flow_id: int, ph: str, ts: float, *, pid: Any, tid: Any, cat: str = "ac2g") -> dict[str, Any]:
    """One flow point (ph 's' or 'f')."""
    e: dict[str, Any] = {"ph": ph, "id": flow_id, "pid": pid, "tid": tid, "ts": ts, "cat": cat, "name": cat}
    if ph == "f":
        e["bp"] = "e"
    return e


def thread_name(name: str, *, pid: Any = PID, tid: Any = MAIN_TID) -> dict[str, Any]:
    """An M metadata event naming a thread."""
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def trace(*events: dict[str, Any], **top: Any) -> dict[str, Any]:
    """A whole trace document (today's format): top-level keys plus traceEvents."""
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "Synthetic GPU", "totalGlobalMem": 80 * 2**30, "computeMajor": 9, "computeMinor": 0,
         "numSms": 132}]}
    doc.update(top)
    doc["traceEvents"] = list(events)
    return doc


def write_trace(directory: Path, doc: Any, name: str = "synthetic.pt.trace.json", *, gz: bool = False) -> Path:
    """Write a trace document to directory/name (gzip when gz)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name + (".gz" if gz and not name.endswith(".gz") else ""))
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def load_events(tmp_path: Path, doc: dict[str, Any], name: str = "synthetic.pt.trace.json") -> Trace:
    """Write, ingest (into tmp_path/cache) and open a synthetic trace."""
    path = write_trace(tmp_path / "traces", doc, name)
    return load(path, cache_dir=tmp_path / "cache")


def slow_union(ivs: list[tuple[float, float]]) -> list[list[float]]:
    """The union of intervals as disjoint [start, end] pairs, by start: the slow, obvious oracle for tests."""
    out: list[list[float]] = []
    for s, e in sorted(ivs):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "Runtime", "cuda_driver")


def slow_before_trace(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPU events of a raw trace launched before it began, slow and obvious: no runtime call in the trace has
    their correlation id, and it is below every id that one has (API calls are numbered in order)."""
    launched = {(e.get("args") or {}).get("correlation") for e in events
                if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES}
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    linked = [e["args"]["correlation"] for e in gpu if (e.get("args") or {}).get("correlation") in launched]
    if not linked:
        return []
    first = min(linked)
    return [e for e in gpu if (e.get("args") or {}).get("correlation") not in launched
            and (e.get("args") or {}).get("correlation", first) < first]
