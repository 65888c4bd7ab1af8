"""Op table rules on synthetic traces (exact expectations) and on real GPU traces from the corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import annotation, cpu_op, kernel, load_events, memory, python_fn, runtime, thread_name, trace

from stepscope.analyze.ops import op_rows, op_table
from stepscope.errors import UsageError
from stepscope.reports.ops_text import format_memory, format_time_us, render_ops_table

RESNET = "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
QWEN = "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def _row(table: pl.DataFrame, name: str) -> dict[str, Any]:
    rows = table.filter(pl.col("name") == name)
    assert rows.height == 1, f"{name}: {rows.height} rows"
    return rows.row(0, named=True)


def test_self_cpu_subtracts_direct_children_including_python_frames(tmp_path: Path) -> None:
    # GIVEN linear 0..10 µs holding a python frame 1..2, and addmm 3..9 holding copy_ 4..5
    t = load_events(tmp_path, trace(
        cpu_op("aten::linear", 0, 10), python_fn("model.py(3): helper", 1, 1),
        cpu_op("aten::addmm", 3, 6), cpu_op("aten::copy_", 4, 1),
    ))
    ops = op_table(t).ops
    assert _row(ops, "aten::linear")["self_cpu_ns"] == 10_000 - 1_000 - 6_000
    assert _row(ops, "aten::addmm")["self_cpu_ns"] == 5_000
    assert _row(ops, "aten::copy_")["self_cpu_ns"] == 1_000
    assert _row(ops, "model.py(3): helper")["kind"] == "python_function"
    assert _row(ops, "aten::linear")["self_cpu_fraction"] == pytest.approx(3 / 10)
    assert _row(ops, "aten::linear")["cpu_total_fraction"] == pytest.approx(1.0)


def test_threads_nest_separately_and_filtered_names_vanish(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        cpu_op("aten::mm", 0, 10, tid=1), cpu_op("aten::add", 2, 3, tid=2),
        cpu_op("aten::is_leaf", 1, 1, tid=1), annotation("fwd", 0, 20, tid=2),
    ))
    ops = op_table(t).ops
    assert _row(ops, "aten::mm")["self_cpu_ns"] == 10_000  # is_leaf is dropped, as torch drops it
    assert "aten::is_leaf" not in ops["name"].to_list()
    assert _row(ops, "fwd")["self_cpu_ns"] == 17_000


def test_single_same_name_child_is_merged_into_its_parent(tmp_path: Path) -> None:
    # aten::to -> aten::to -> aten::_to_copy: torch counts one aten::to call whose child is _to_copy
    t = load_events(tmp_path, trace(cpu_op("aten::to", 0, 10), cpu_op("aten::to", 1, 8),
                                    cpu_op("aten::_to_copy", 2, 6)))
    ops = op_table(t).ops
    to = _row(ops, "aten::to")
    assert (to["calls"], to["cpu_total_ns"], to["self_cpu_ns"]) == (1, 10_000, 4_000)


def test_memory_counts_any_thread_inside_the_interval_and_unclaimed_become_rows(tmp_path: Path) -> None:
    # GIVEN an op 0..10 µs on thread 1 with an allocation at its end (inclusive) and one on thread 2 inside
    # it, a child op holding a free, and an allocation outside every op
    t = load_events(tmp_path, trace(
        cpu_op("aten::linear", 0, 10), cpu_op("aten::empty", 2, 2),
        memory(3, 4096, device=-1), memory(10, 512, device=-1), memory(5, 1000, device=0, tid=2),
        memory(20, 64, device=-1),
    ))
    ops = op_table(t).ops
    linear = _row(ops, "aten::linear")
    assert (linear["cpu_mem_bytes"], linear["self_cpu_mem_bytes"]) == (4096 + 512, 512)
    assert (linear["device_mem_bytes"], linear["self_device_mem_bytes"]) == (1000, 1000)
    empty = _row(ops, "aten::empty")
    assert (empty["cpu_mem_bytes"], empty["self_cpu_mem_bytes"]) == (4096, 4096)
    unclaimed = _row(ops, "[memory]")
    assert (unclaimed["calls"], unclaimed["cpu_mem_bytes"]) == (1, 64)


def test_device_time_goes_to_the_innermost_launching_op_and_up_to_its_parents(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        cpu_op("aten::linear", 0, 20, external_id=1), cpu_op("aten::addmm", 2, 10, external_id=2),
        runtime("cudaLaunchKernel", 3, 2, correlation=7, external_id=2),
        runtime("cudaLaunchKernel", 14, 2, correlation=8, external_id=1),
        kernel("sgemm", 30, 10, correlation=7), kernel("bias", 45, 4, correlation=8),
    ))
    result = op_table(t)
    ops = result.ops
    linear, addmm = _row(ops, "aten::linear"), _row(ops, "aten::addmm")
    assert (addmm["self_device_ns"], addmm["device_total_ns"]) == (10_000, 10_000)
    assert (linear["self_device_ns"], linear["device_total_ns"]) == (4_000, 14_000)
    sgemm = _row(ops, "sgemm")
    assert (sgemm["kind"], sgemm["self_device_ns"], sgemm["cpu_total_ns"]) == ("kernel", 10_000, 0)
    assert result.self_device_total_ns == 14_000  # kernels only: ops' device time is not counted twice
    assert _row(ops, "cudaLaunchKernel")["calls"] == 2  # runtime calls are rows and children, as in torch
    assert addmm["self_cpu_ns"] == 8_000
    assert result.sort_by == "self_device_ns" and ops["name"][0] == "aten::addmm"


def test_group_by_shape_uses_torchs_shape_text(tmp_path: Path) -> None:
    dims_a, dims_b = [[4, 3], []], [[8, 3], []]
    t = load_events(tmp_path, trace(
        cpu_op("aten::relu", 0, 1, **{"Input Dims": dims_a}),  # type: ignore[arg-type]
        cpu_op("aten::relu", 2, 1, **{"Input Dims": dims_a}),  # type: ignore[arg-type]
        cpu_op("aten::relu", 4, 1, **{"Input Dims": dims_b}),  # type: ignore[arg-type]
    ))
    ops = op_table(t, group_by_shape=True).ops
    assert sorted(zip(ops["input_shapes"], ops["calls"], strict=True)) == [("[[4, 3], []]", 2), ("[[8, 3], []]", 1)]
    assert op_table(t).ops.height == 1


def test_flops_sum_where_recorded_and_null_where_not(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("aten::mm", 0, 1, flops=100), cpu_op("aten::mm", 2, 1, flops=50),
                                    cpu_op("aten::relu", 4, 1)))
    ops = op_table(t).ops
    assert _row(ops, "aten::mm")["flops"] == 150
    assert _row(ops, "aten::relu")["flops"] is None


def test_sort_top_and_torch_sort_keys(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("a", 0, 5), cpu_op("b", 10, 1), cpu_op("b", 20, 1), cpu_op("b", 30, 1)))
    assert op_table(t, sort_by="calls").ops["name"].to_list() == ["b", "a"]
    assert op_table(t, sort_by="self_cpu_time_total").ops["name"].to_list() == ["a", "b"]
    top = op_table(t, sort_by="calls", top=1)
    assert (top.ops_shown, top.ops_total, top.ops["self_cpu_fraction"][0]) == (1, 2, pytest.approx(3 / 8))
    with pytest.raises(UsageError, match="cannot sort by"):
        op_table(t, sort_by="bogus")


def test_op_rows_has_one_row_per_event_with_parent(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(cpu_op("outer", 0, 10), cpu_op("inner", 1, 2), thread_name("main")))
    rows = op_rows(t)
    outer_id = rows.filter(pl.col("name") == "outer")["event_id"][0]
    assert rows.filter(pl.col("name") == "inner")["parent_event_id"][0] == outer_id


def test_ops_text_uses_torchs_columns_and_formats(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        cpu_op("aten::addmm", 0, 1500, external_id=2), runtime("cudaLaunchKernel", 3, 2, correlation=7, external_id=2),
        kernel("sgemm", 30, 10, correlation=7), memory(5, 3 * 1024 * 1024, device=0), memory(6, 2048, device=-1),
    ))
    text = render_ops_table(op_table(t))
    header = text.splitlines()[1]
    for col in ("Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA",
                "Self CUDA %", "CUDA total", "CUDA time avg", "CPU Mem", "Self CPU Mem", "CUDA Mem", "Self CUDA Mem",
                "# of Calls"):
        assert col in header
    assert "1.500ms" in text and "3.00 MB" in text and "2.00 KB" in text
    assert "Self CPU time total: 1.500ms" in text and "Self CUDA time total: 10.000us" in text
    assert (format_time_us(2_500_000), format_memory(-5), format_time_us(0.5)) == ("2.500s", "-5 B", "0.500us")


# ------------------------------------------------------------------ real GPU traces (the seed lab's checks)
@pytest.mark.parametrize("rel", [RESNET, QWEN])
def test_top_ops_on_real_gpu_traces(corpus: Path, rel: str, tmp_path: Path) -> None:
    from stepscope.analyze import load

    t = load(corpus / rel, cache_dir=tmp_path)
    top = op_table(t, kinds=["cpu_op"], top=10)
    assert top.sort_by == "self_device_ns" and top.ops.height >= 5
    first = top.ops.row(0, named=True)
    assert first["name"].startswith(("aten::", "cudnn", "Optimizer")) or "gemm" in first["name"].lower()
    assert first["self_device_ns"] > 0 and first["device_total_ns"] >= first["self_device_ns"]


def test_resnet_table_totals_match_the_reference_busy_time(corpus: Path, tmp_path: Path) -> None:
    from stepscope.analyze import load

    result = op_table(load(corpus / RESNET, cache_dir=tmp_path))
    # no two kernels overlap in this trace, so the summed kernel time is the reference busy 603,558 us
    assert result.self_device_total_ns == 603_558_000
    conv = _row(result.ops, "aten::cudnn_convolution")
    assert conv["calls"] == 318 and conv["device_total_ns"] > 100_000_000
    text = render_ops_table(result)
    assert "Self CUDA %" in text.splitlines()[1] and "CUDA Mem" in text


def test_kinds_filter_keeps_whole_table_percentages(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        cpu_op("aten::addmm", 0, 10, external_id=2), runtime("cudaLaunchKernel", 3, 2, correlation=7, external_id=2),
        kernel("sgemm", 30, 10, correlation=7),
    ))
    result = op_table(t, kinds=["cpu_op"])
    assert result.ops["name"].to_list() == ["aten::addmm"]
    assert result.ops["self_cpu_fraction"][0] == pytest.approx(8 / 10) and result.self_device_total_ns == 10_000
