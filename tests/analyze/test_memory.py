"""Memory timeline: synthetic traces in both formats, the reference peaks of real traces, layer activations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import PID, cpu_op, kernel, load_events, memory, python_fn, step, trace

from stepscope.analyze import load
from stepscope.analyze.memory import activation_memory, mem_ops, memory_series, memory_timeline

TOOLS = Path(__file__).resolve().parents[2].parent / "shared" / "tools"
REFERENCE_TRACES = {
    "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": {"0": 2_791_636_480},
    "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz": {"0": 2_088_508_416},
    "traces/hta/df_index_resolver/df_index_resolver.json.gz": {"1": 6_629_508_096},
}
MIB = 1024 * 1024


def _today(tmp_path: Path) -> Any:
    # GIVEN step 1 (0..100 µs) with aten::linear 10..50 holding aten::addmm 20..40; GPU allocations with
    # running totals, one never freed; a CPU allocation outside any op
    return load_events(tmp_path, trace(
        step(1, 0, 100),
        cpu_op("aten::linear", 10, 40), cpu_op("aten::addmm", 20, 20),
        memory(15, 4 * MIB, total_allocated=4 * MIB, total_reserved=20 * MIB, addr=1),
        memory(25, 8 * MIB, total_allocated=12 * MIB, total_reserved=20 * MIB, addr=2),
        memory(45, -4 * MIB, total_allocated=8 * MIB, total_reserved=20 * MIB, addr=1),
        memory(60, 1 * MIB, total_allocated=9 * MIB, total_reserved=20 * MIB, addr=3),
        memory(70, -1 * MIB, total_allocated=8 * MIB, total_reserved=20 * MIB, addr=3),
        memory(80, 4096, total_allocated=4096, total_reserved=0, device=-1, addr=9),
    ))


def test_peak_time_step_and_innermost_op(tmp_path: Path) -> None:
    r = memory_timeline(_today(tmp_path))
    assert (r.peak_device, r.peak_allocated_bytes, r.peak_step, r.peak_op) == ("cuda:0", 12 * MIB, 1, "aten::addmm")
    assert r.peak_offset_ns == 25_000 and r.totals_source == "Total Allocated"
    dev = r.devices.row(0, named=True)
    assert (dev["peak_reserved_bytes"], dev["final_allocated_bytes"]) == (20 * MIB, 8 * MIB)
    assert dev["max_reserved_minus_allocated_bytes"] == 16 * MIB
    assert r.devices["device_name"].to_list() == ["cuda:0", "cpu"]


def test_a_device_that_never_records_reserved_memory_has_it_unknown_not_negative(tmp_path: Path) -> None:
    # GIVEN the CPU's allocations, whose Total Reserved torch writes as 0 while 4 KiB is allocated
    r = memory_timeline(_today(tmp_path))
    # THEN the CPU's reserved and reserved - allocated are unknown everywhere, never -4 KiB; the GPU's stay known
    cpu = r.devices.filter(pl.col("device_name") == "cpu").row(0, named=True)
    assert (cpu["peak_reserved_bytes"], cpu["max_reserved_minus_allocated_bytes"]) == (None, None)
    cpu_slices = r.timeline.filter(pl.col("device_name") == "cpu")
    assert cpu_slices["reserved_bytes"].null_count() == cpu_slices["reserved_minus_allocated_bytes"].null_count() \
        == cpu_slices.height > 0
    assert r.timeline["reserved_minus_allocated_bytes"].drop_nulls().min() == 8 * MIB  # (cuda:0's)


@pytest.mark.parametrize(("work_device", "noted"), [(2, True), (0, False)])
def test_memory_and_work_numbering_one_gpu_apart_are_said_to_be_one(tmp_path: Path, work_device: int,
                                                                      noted: bool) -> None:
    """ROCm: [memory] events on hip:0 (the one GPU the process sees), kernels on device 2 (the physical GPU)."""
    t = load_events(tmp_path, trace(step(1, 0, 100), kernel("k", 10, 20, device=work_device),
                                    memory(15, MIB, total_allocated=MIB, total_reserved=MIB)))
    note = memory_timeline(t).note
    assert (note.startswith("cuda:0 is the GPU the trace's work ran on as device 2") if noted else note == "")


def test_mem_ops_self_and_inclusive(tmp_path: Path) -> None:
    ops = {row["name"]: row for row in memory_timeline(_today(tmp_path)).mem_ops.iter_rows(named=True)}
    assert ops["aten::addmm"]["self_device_mib"] == 8 and ops["aten::addmm"]["device_mib"] == 8
    assert ops["aten::linear"]["self_device_mib"] == 4 and ops["aten::linear"]["device_mib"] == 12
    assert ops["(outside any op)"]["device_mib"] == 1 and ops["(outside any op)"]["cpu_mib"] == 4096 / MIB


def test_never_freed_allocations_name_their_op(tmp_path: Path) -> None:
    r = memory_timeline(_today(tmp_path))
    leaks = r.never_freed.sort("alloc_bytes", descending=True)
    assert leaks.select("device_name", "addr", "alloc_bytes", "op").rows() == [
        ("cuda:0", "0x2", 8 * MIB, "aten::addmm"), ("cpu", "0x9", 4096, None)]
    assert r.devices.filter(pl.col("device_name") == "cuda:0")["unfreed_bytes"].item() == 8 * MIB


def test_never_freed_addresses_are_hex_like_snapshots(tmp_path: Path) -> None:
    # GIVEN a block at a typical CUDA address, never freed
    t = load_events(tmp_path, trace(memory(1, MIB, total_allocated=MIB, addr=0x55C4_A000_0000)))
    # THEN the address reads as torch's allocator and `snapshot` write it, not as a decimal number
    assert memory_timeline(t).never_freed["addr"].to_list() == ["0x55c4a0000000"]


def test_allocations_on_another_thread_belong_to_that_threads_op(tmp_path: Path) -> None:
    t = load_events(tmp_path, trace(
        cpu_op("aten::mm", 0, 10, tid=1), cpu_op("aten::add", 0, 10, tid=2),
        memory(5, 100, total_allocated=100, tid=2, addr=1),
    ))
    assert memory_timeline(t).peak_op == "aten::add"


def test_2021_format_uses_the_running_sum_of_bytes(tmp_path: Path) -> None:
    def old(ts: float, nbytes: int, device: int) -> dict[str, Any]:
        return {"ph": "i", "s": "t", "name": "[memory]", "pid": PID, "tid": 1, "ts": ts,
                "args": {"Device Type": 0 if device < 0 else 1, "Device Id": device, "Bytes": nbytes}}
    doc = {"traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "aten::empty", "pid": PID, "tid": 1, "ts": 0, "dur": 50},
        old(1, 1000, 0), old(2, 500, 0), old(3, -1000, 0), old(4, 300, -1), old(60, 2000, 0)]}
    r = memory_timeline(load_events(tmp_path, doc))
    assert r.totals_source == "running sum of Bytes from the trace's start (2021 format)"
    series = memory_series(load_events(tmp_path, doc))
    assert series.filter(pl.col("device_name") == "cuda:0")["allocated_bytes"].to_list() == [1000, 1500, 500, 2500]
    assert (r.peak_allocated_bytes, r.peak_op) == (2500, None)
    cuda = r.devices.row(0, named=True)
    assert cuda["unfreed_bytes"] is None  # no Addr: frees cannot be matched, so unknown rather than 0


def test_2021_format_says_its_figures_are_relative_and_never_freed_not_recorded(tmp_path: Path) -> None:
    # GIVEN a 2021-format trace (only Bytes: no totals, no addresses) that frees what it allocated
    doc = {"traceEvents": [{"ph": "i", "s": "t", "name": "[memory]", "pid": PID, "tid": 1, "ts": ts,
                            "args": {"Device Type": 1, "Device Id": 0, "Bytes": nbytes}}
                           for ts, nbytes in ((1, 1000), (2, -1000))]}
    r = memory_timeline(load_events(tmp_path, doc))
    # THEN its final 0 B is said to be relative to the trace's start, and an empty never-freed table to mean "not
    # recorded", not "none"
    assert r.devices["final_allocated_bytes"].to_list() == [0]
    assert r.note.startswith("Allocated bytes are relative to the trace's start")
    assert "never freed is not recorded" in r.note
    assert r.never_freed.height == 0
    assert r.empty_table_note("never_freed") == "not recorded (the trace has no addresses)"


def test_todays_format_has_no_format_note_and_an_empty_never_freed_is_none(tmp_path: Path) -> None:
    # GIVEN today's format (totals and addresses) where every allocation is freed
    r = memory_timeline(load_events(tmp_path, trace(memory(1, 8, total_allocated=8, addr=1),
                                                    memory(2, -8, total_allocated=0, addr=1))))
    # THEN nothing needs saying: the figures are absolute and nothing was left unfreed
    assert r.note == "" and r.never_freed.height == 0 and r.empty_table_note("never_freed") is None


def test_timeline_rows_are_each_slices_allocated_peak_with_reserved_at_that_moment(tmp_path: Path) -> None:
    # GIVEN two slices of cuda:0 with 20 MiB reserved throughout: 4, 12, 8 MiB allocated, then 9, 8 MiB
    r = memory_timeline(_today(tmp_path), buckets=2)
    cuda = r.timeline.filter(pl.col("device_name") == "cuda:0")
    # THEN each row is the slice's allocated peak and reserved - allocated at that moment (8 MiB, 11 MiB), not the
    # slice's largest reserved - allocated (16 MiB at 4 MiB allocated, 12 MiB at 8 MiB), and the headline says so
    assert cuda.select("allocated_bytes", "reserved_bytes", "reserved_minus_allocated_bytes").rows() == [
        (12 * MIB, 20 * MIB, 8 * MIB), (9 * MIB, 20 * MIB, 11 * MIB)]
    assert cuda["offset_ns"].to_list()[0] == 15_000
    assert r.timeline_rows.startswith("each slice at its allocated peak")


def test_trace_without_memory_events(tmp_path: Path) -> None:
    r = memory_timeline(load_events(tmp_path, trace(cpu_op("aten::mm", 0, 1))))
    assert (r.memory_events, r.peak_allocated_bytes, r.totals_source, r.devices.height) == (0, None, None, 0)


def test_activation_memory_on_synthetic_modules(tmp_path: Path) -> None:
    # GIVEN blocks allocated inside Linear_0 (2 MiB), Linear_1 (6 MiB, plus a freed temporary) and Net_0
    # itself (1 MiB, at the peak: the end is inclusive), all live at the 9 MiB peak at 50 µs
    t = load_events(tmp_path, trace(
        python_fn("nn.Module: Net_0", 0, 100), python_fn("nn.Module: Linear_0", 10, 10),
        python_fn("nn.Module: Linear_1", 30, 10),
        memory(15, 2 * MIB, total_allocated=2 * MIB, addr=1), memory(35, 6 * MIB, total_allocated=8 * MIB, addr=2),
        memory(36, MIB // 2, total_allocated=8 * MIB + MIB // 2, addr=3),  # a temporary, freed before the peak
        memory(38, -MIB // 2, total_allocated=8 * MIB, addr=3),
        memory(50, 1 * MIB, total_allocated=9 * MIB, addr=4), memory(200, -9 * MIB, total_allocated=0, addr=2),
    ))
    r = activation_memory(t)
    assert r.layers.rows() == [("Linear_1", 6 * MIB, 1), ("Linear_0", 2 * MIB, 1), ("Net_0", 1 * MIB, 1)]
    assert (r.activations_bytes, r.largest_layer, r.checkpoint_saving_estimate_bytes) == (9 * MIB, "Linear_1", 3 * MIB)
    assert r.activations_of_peak_fraction == pytest.approx(1.0)


# ------------------------------------------------------------------ real traces
@pytest.mark.parametrize("rel", sorted(REFERENCE_TRACES))
def test_peaks_match_the_reference_script_on_every_device(corpus: Path, rel: str, tmp_path: Path) -> None:
    if not (TOOLS / "reference_figures.py").exists():
        pytest.skip("../shared/tools is not present")
    out = subprocess.run([sys.executable, str(TOOLS / "reference_figures.py"), str(corpus / rel)],
                         check=True, capture_output=True, text=True).stdout
    reference = json.loads(out.splitlines()[0])["peak_alloc_bytes"]
    assert reference == REFERENCE_TRACES[rel]  # the README's figures
    r = memory_timeline(load(corpus / rel, cache_dir=tmp_path))
    ours = {str(d): p for d, p in r.devices.filter(pl.col("device").is_not_null())
            .select("device", "peak_allocated_bytes").rows()}
    assert ours == reference
    assert r.peak_op is not None and r.peak_step is not None


def test_mem_ops_on_a_real_gpu_trace(corpus: Path, tmp_path: Path) -> None:
    t = load(corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
             cache_dir=tmp_path)
    table = mem_ops(t, 20)
    with_device = table.filter(pl.col("device_mib") > 0)
    assert with_device.height >= 3 and (with_device["device_mib"] > 1).any()


def test_which_layers_activations_dominate_a_real_capture(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    # GIVEN three linears of distinct output sizes: each output is saved for the next layer's backward,
    # so at the peak Linear_1's 256x2048 floats (2 MiB) are the largest activation
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 2048), torch.nn.Linear(2048, 8))
    x = torch.randn(256, 64)

    def train_step() -> None:
        net(x).sum().backward()
        net.zero_grad(set_to_none=True)

    train_step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_stack=True, with_modules=True) as prof:
        train_step()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    r = activation_memory(load(tmp_path / "trace.json", cache_dir=tmp_path / "cache"))
    layers = dict(r.layers.select("module", "live_bytes").rows())
    assert r.largest_layer == "Linear_1" and layers["Linear_1"] == 256 * 2048 * 4
    assert layers["Linear_0"] == 256 * 128 * 4
    assert r.checkpoint_saving_estimate_bytes == r.activations_bytes - 256 * 2048 * 4
    assert r.activations_of_peak_fraction is not None
    assert 0 < r.activations_of_peak_fraction < 1  # weights and gradients are the rest of the peak
