"""TraceFrames.launches: every kernel tied to the op that issued it, by External id or, where the ids do not
name an op, by nesting; checked against a slow scan of the raw JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze import load
from stepscope.analyze.frames import frames_of


def _issuing_ops_by_scan(path: Path) -> dict[tuple[int, str], str]:
    """(kernel ts in µs x 1000, kernel name) -> name of the innermost cpu_op enclosing its launch call on the
    call's thread (the obvious quadratic search)."""
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    runtime = {e["args"]["correlation"]: e for e in events
               if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    out = {}
    for k in (e for e in events if e.get("cat") == "kernel"):
        call = runtime.get(k["args"].get("correlation"))
        if call is None:
            continue
        around = [o for o in ops if (o["pid"], o["tid"]) == (call["pid"], call["tid"])
                  and o["ts"] <= call["ts"] <= o["ts"] + o["dur"]]
        if around:
            inner = min(around, key=lambda o: (o["dur"], -o["ts"]))
            out[(round(k["ts"] * 1000), k["name"])] = inner["name"]
    return out


def test_kernels_link_by_nesting_where_external_ids_name_no_op(corpus: Path) -> None:
    # PARAM's DLRM traces: a launch call's External id is its correlation id, which no op carries
    path = corpus / "traces/param/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json"
    expected = _issuing_ops_by_scan(path)
    launches = frames_of(load(path)).launches.filter(pl.col("kind") == "kernel")
    got = {(ts, name): op for ts, name, op in launches.select("ts_ns", "name", "op_name").iter_rows()}
    assert len(expected) > 200
    assert {key: got.get(key) for key in expected} == expected
