"""The op table against torch's own key_averages() on the same capture (CPU torch, tiny workloads).

GIVEN a real profile (record_shapes, profile_memory, with_stack, with_flops) exported as a Chrome trace,
WHEN stepscope builds its op table from the trace alone,
THEN every key_averages() row is there with the same calls, CPU total and self CPU within 1% or 2 µs, the
same CPU Mem / Self CPU Mem to the byte and the same FLOPs where the trace carries them (torch 2.x's
export drops them: then every FLOPs cell is null), and stepscope has no extra rows.

Nothing is inherently lost at export for these CPU workloads: torch's own rules (python frames are
children, same-name single children merge into their parent, memory is counted in any thread's interval,
unclaimed [memory] become `[memory]` rows) reproduce key_averages() exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from stepscope.analyze import load
from stepscope.analyze.ops import op_table

torch = pytest.importorskip("torch")


def _conv_step() -> Callable[[], None]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))

    def step() -> None:
        with torch.profiler.record_function("forward"):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def _transformer_step() -> Callable[[], None]:
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    x = torch.randn(2, 8, 32)

    def step() -> None:
        block(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


WORKLOADS: dict[str, Callable[[], Callable[[], None]]] = {"convnet": _conv_step, "transformer": _transformer_step}


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def capture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    step = WORKLOADS[request.param]()
    step()  # warm-up outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                profile_memory=True, with_stack=True, with_flops=True) as prof:
        for i in range(2):  # what a scheduled profile's prof.step() records: torch's table has one ProfilerStep* row
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                step()
    out = tmp_path_factory.mktemp(request.param)
    path = out / "trace.json"
    prof.export_chrome_trace(str(path))
    return prof, out


def _compare(prof: Any, directory: Path, by_shape: bool) -> None:
    trace = load(directory / "trace.json", cache_dir=directory / "cache")
    ours = op_table(trace, group_by_shape=by_shape).ops
    # torch 2.x's Chrome export drops the `flops` arg that key_averages() has (with_flops=True); where the
    # trace carries none, the table must say "unknown" (null), never 0, and FLOPs cannot be compared.
    trace_has_flops = trace.cpu_ops.select(pl.col("flops").is_not_null().any()).collect().item()
    if not trace_has_flops:
        assert ours["flops"].null_count() == ours.height
    rows = {(r["name"], r["input_shapes"] if by_shape else ""): r for r in ours.iter_rows(named=True)}
    theirs = prof.key_averages(group_by_input_shape=by_shape)
    assert len(theirs) > 30
    problems = []
    for e in theirs:
        key = (e.key, str(e.input_shapes) if by_shape else "")
        r = rows.pop(key, None)
        if r is None:
            problems.append(f"missing {key}")
            continue
        if r["calls"] != e.count:
            problems.append(f"{key} calls {r['calls']} != {e.count}")
        for col, want_us in (("cpu_total_ns", e.cpu_time_total), ("self_cpu_ns", e.self_cpu_time_total)):
            got_us = r[col] / 1e3
            if abs(got_us - want_us) > max(2.0, 0.01 * abs(want_us)):
                problems.append(f"{key} {col} {got_us} µs != {want_us} µs")
        for col, want in (("cpu_mem_bytes", e.cpu_memory_usage), ("self_cpu_mem_bytes", e.self_cpu_memory_usage)):
            if r[col] != want:
                problems.append(f"{key} {col} {r[col]} != {want}")
        if trace_has_flops and (r["flops"] or 0) != (e.flops or 0):
            problems.append(f"{key} flops {r['flops']} != {e.flops}")
    assert not problems, "\n".join(problems[:20])
    assert not rows, f"rows torch does not have: {list(rows)[:10]}"


def test_op_table_matches_key_averages(capture: tuple[Any, Path]) -> None:
    prof, directory = capture
    _compare(prof, directory, by_shape=False)


def test_op_table_by_shape_matches_key_averages_by_input_shape(capture: tuple[Any, Path]) -> None:
    prof, directory = capture
    _compare(prof, directory, by_shape=True)


def test_self_cpu_total_matches_torch(capture: tuple[Any, Path]) -> None:
    prof, directory = capture
    result = op_table(load(directory / "trace.json", cache_dir=directory / "cache"))
    assert result.self_cpu_total_ns / 1e3 == pytest.approx(prof.key_averages().self_cpu_time_total, rel=1e-3)
