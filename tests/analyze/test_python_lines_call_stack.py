"""The user's Python line from an op's `Call stack` (the 2021 with_stack format, which writes no Python frames):
blame.python_lines through transfers and gaps, and blame.stack_lines on its own."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
from builders import kernel, load_events, memcpy, python_fn, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.blame import stack_lines
from stepscope.analyze.gaps import gpu_gaps
from stepscope.analyze.transfers import transfers

SITE = "/opt/conda/envs/train/lib/python3.8/site-packages"
#: innermost first, as the 2021 format writes it: the copy in torch's module call, under the user's forward
STACK = ";".join([f"{SITE}/torch/nn/modules/module.py(889): _call_impl", "model.py(20): forward",
                  f"{SITE}/torch/nn/modules/module.py(889): _call_impl", "train.py(44): <module>"])


def _op(name: str, ts: float, dur: float, stack: str | None = None, tid: int = 1) -> dict[str, Any]:
    """An `Operator` event of the 2021 format, with its `Call stack` where given."""
    args: dict[str, Any] = {"Device": 1000, "Trace name": "PyTorch Profiler"}
    if stack is not None:
        args["Call stack"] = stack
    return {"ph": "X", "cat": "Operator", "name": name, "pid": 1000, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _old(event: dict[str, Any], cat: str) -> dict[str, Any]:
    """A builder's event under the category the 2021 format names it by (Runtime, Memcpy, Kernel)."""
    return {**event, "cat": cat}


def test_a_copy_takes_the_users_frame_of_the_enclosing_ops_call_stack(tmp_path: Path) -> None:
    # GIVEN a 2021 trace: aten::to with a Call stack (torch's frames around the user's), aten::copy_ under it
    # without one, and the copy's cudaMemcpyAsync inside that; no python_function events at all
    doc = trace(
        _old(step(1, ts=0, dur=200), "Operator"),
        _op("aten::to", ts=10, dur=50, stack=STACK),
        _op("aten::copy_", ts=12, dur=45),
        _old(runtime("cudaMemcpyAsync", ts=15, dur=30, correlation=1), "Runtime"),
        _old(memcpy("HtoD", ts=20, dur=20, nbytes=1 << 20, correlation=1), "Memcpy"),
    )
    # WHEN its transfers are found
    copies = transfers(load_events(tmp_path, doc)).copies
    # THEN the copy's line is the innermost of the user's frames, written as the stack writes it
    assert copies["python_line"].to_list() == ["model.py(20): forward"]


def test_a_gap_under_an_op_with_a_call_stack_is_blamed_on_its_users_frame_with_torchs_as_context(
        tmp_path: Path) -> None:
    # GIVEN a sync inside aten::item (its Call stack: torch's frame innermost, then the user's) between kernels,
    # and a gap later under a backward op that has no Call stack (the 2021 format writes none for autograd's thread)
    doc = trace(
        _old(step(1, ts=-5, dur=310), "Operator"),
        _old(runtime("cudaLaunchKernel", ts=-4, dur=2, correlation=1), "Runtime"),
        _old(kernel("A", ts=0, dur=100, correlation=1), "Kernel"),
        _op("aten::item", ts=100, dur=80, stack=STACK),
        _old(runtime("cudaStreamSynchronize", ts=103, dur=75), "Runtime"),
        _old(runtime("cudaLaunchKernel", ts=182, dur=2, correlation=2), "Runtime"),
        _old(kernel("B", ts=185, dur=10, correlation=2), "Kernel"),
        _op("MeanBackward1", ts=190, dur=100, tid=2),
        _old(runtime("cudaLaunchKernel", ts=290, dur=2, tid=2, correlation=3), "Runtime"),
        _old(kernel("C", ts=295, dur=10, correlation=3), "Kernel"),
    )
    # WHEN its gaps are blamed
    gaps = gpu_gaps(load_events(tmp_path, doc)).gaps.sort("start_ns")
    blamed = gaps.filter(pl.col("dur_ns") > 10_000).select("blamed_op", "blamed_python", "blamed_library").rows()
    # THEN the sync's gap names the user's frame and, as context, torch's innermost frame without its install
    # prefix (as today's python_function frames name it); the backward op's gap names none
    assert blamed == [("aten::item", "model.py(20): forward", "torch/nn/modules/module.py(889): _call_impl"),
                      ("MeanBackward1", None, None)]


def test_python_frames_where_a_trace_has_them_win_over_a_call_stack(tmp_path: Path) -> None:
    # GIVEN a trace with a python_function frame around the copy and also a Call stack on its op
    doc = trace(
        step(1, ts=0, dur=200),
        python_fn("other.py(7): run", ts=5, dur=100),
        _op("aten::to", ts=10, dur=50, stack=STACK),
        runtime("cudaMemcpyAsync", ts=15, dur=30, correlation=1),
        memcpy("HtoD", ts=20, dur=20, nbytes=1 << 20, correlation=1),
    )
    # THEN the Python frame names the line, as before Call stacks were read
    assert transfers(load_events(tmp_path, doc)).copies["python_line"].to_list() == ["other.py(7): run"]


def test_stack_lines_per_stack() -> None:
    stacks = pl.Series([
        STACK,
        # every frame a library's (torch, then the standard library): the innermost shown, and as context
        f"{SITE}/torch/optim/optimizer.py(216): zero_grad;/usr/lib/python3.8/threading.py(870): run",
        "/usr/lib/python3.8/threading.py(870): run",
        "",
        None,
        "train.py(44): <module>",
    ], dtype=pl.String)
    assert stack_lines(stacks).rows() == [
        ("model.py(20): forward", "torch/nn/modules/module.py(889): _call_impl"),
        ("torch/optim/optimizer.py(216): zero_grad", "torch/optim/optimizer.py(216): zero_grad"),
        ("threading.py(870): run", "threading.py(870): run"),
        (None, None),
        (None, None),
        ("train.py(44): <module>", None),
    ]


RESNET = "kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _raw_copy_lines(path: Path) -> list[str]:
    """Per Memcpy of a raw 2021 trace (in start order): the first frame outside site-packages of the Call stack of
    the innermost Operator enclosing its runtime call, read off the JSON the slow, obvious way."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "Runtime" and "correlation" in e["args"]}
    lines = []
    for copy in sorted((e for e in events if e.get("cat") == "Memcpy"), key=lambda e: e["ts"]):
        call = calls[copy["args"]["correlation"]]
        ops = [e for e in events if e.get("cat") == "Operator" and e.get("args", {}).get("Call stack")
               and str(e["tid"]) == str(call["tid"]) and e["ts"] <= call["ts"] <= e["ts"] + e["dur"]]
        stack = max(ops, key=lambda e: (e["ts"], -e["dur"]))["args"]["Call stack"]
        lines.append(next(f for f in stack.split(";") if "site-packages" not in f))
    return lines


def test_resnet50_copies_are_placed_where_their_call_stacks_say(corpus: Path) -> None:
    # GIVEN the 2021 resnet50 capture (with_stack: Call stacks on its ops, no python_function events)
    path = corpus / "traces" / RESNET
    # WHEN its transfers are found
    copies = transfers(load(path)).copies  # (in start order)
    # THEN each of the 12 copies is at the user's line its op's raw Call stack names: the script's `.to(device)`
    expected = _raw_copy_lines(path)
    assert len(expected) == 12 and all(line.startswith("resnet50_profiler_api.py(44)") for line in expected)
    assert copies["python_line"].to_list() == expected
