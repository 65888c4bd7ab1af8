"""The same trace gives the same answer every time: every analysis of the bundle, run again on a fresh bundle, is
equal to the first run, table rows in the same order.

Polars sorts are not stable by default and run on several threads, so rows that tie on the sort keys come out in
a different order from run to run; where the first of a tie is then taken (a gap's neighbouring kernel, the top
row of a table) the answer itself changed. These traces each showed such a tie in one analysis or another."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from stepscope.analyze.bundle import TraceAnalysis

ANALYSES = ("gaps", "steps", "kernels", "overlap", "transfers", "ops", "memory", "roofline", "serving", "verdict",
            "critical_path", "info")

TRACES = (
    "hta/trace_diff/test/test.json.gz",  # gaps: kernels ending/starting together on two streams; copies at one ns
    "hta/trace_filter/sampled_rank-0.json.gz",  # roofline: one op in two dtypes with equal GPU time
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",  # info: kinds with equal event counts
    "param/dlrm_kineto/worker3_step_12.1694128201557.pt.trace.json",  # transfers: directions with equal time
)


def _differences(a: Any, b: Any, path: str) -> list[str]:
    """Where two results differ (field paths); DataFrames compared whole, row order included."""
    if isinstance(a, pl.DataFrame):
        return [] if a.equals(b) else [path]
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return [d for f in dataclasses.fields(a)
                for d in _differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")]
    if isinstance(a, list | tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:  # NaN
        return []
    return [] if a == b else [path]


@pytest.mark.parametrize("name", TRACES)
def test_every_analysis_gives_the_same_answer_each_run(corpus: Path, name: str) -> None:
    from stepscope.analyze import load

    trace = load(corpus / "traces" / name)
    first = TraceAnalysis.of(trace)
    for _ in range(3):
        again = TraceAnalysis.of(trace)
        found = [d for a in ANALYSES for d in _differences(getattr(first, a), getattr(again, a), a)]
        assert found == [], f"{name}: differs from run to run in {found}"


def test_one_polars_thread_gives_the_answer_of_many(corpus: Path, tmp_path: Path) -> None:
    # GIVEN a trace analysed in a process whose polars runs one thread, and here (a thread per core, joins and
    # group-bys partitioned differently) THEN every analysis writes the same JSON, row order included
    import json
    import os
    import subprocess
    import sys

    from stepscope.reports.text import render_json

    path = corpus / "traces" / TRACES[-1]
    script = ("import json, sys; from stepscope.analyze import load; from stepscope.analyze.bundle import "
              "TraceAnalysis; from stepscope.reports.text import render_json; b = TraceAnalysis.of(load(sys.argv[1])); "
              f"print(json.dumps({{a: render_json(getattr(b, a), max_rows=None) for a in {ANALYSES!r}}}))")
    env = {**os.environ, "POLARS_MAX_THREADS": "1"}
    one = json.loads(subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True,
                                    capture_output=True, text=True).stdout)
    from stepscope.analyze import load

    here = TraceAnalysis.of(load(path))
    assert {a: render_json(getattr(here, a), max_rows=None) for a in ANALYSES} == one
