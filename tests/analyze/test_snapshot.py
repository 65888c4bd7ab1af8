"""CUDA snapshots: safe loading, the peak (against the reference script), live blocks by frame, fragmentation."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshot_builder import block, entry, frames, segment, write

from stepscope.analyze.snapshot import (
    ESTIMATE_RULE,
    NO_FRAME,
    NO_HISTORY,
    PRE_HISTORY,
    ROUNDING,
    activation_estimate,
    analyze_snapshot,
)
from stepscope.analyze.snapshot_read import is_user_frame, read_snapshot
from stepscope.errors import SnapshotFormatError, UsageError

MB = 1 << 20


def _snapshot() -> dict[str, Any]:
    # GIVEN a history: weights (10 MB, never freed, before forward), two forward activations, a temporary,
    # a pre-history block freed late, and a block alive at dump that the history never mentions
    weights = frames((10, "__init__"))
    act1 = frames((54, "forward"), (90, "train_step"))
    act2 = frames((60, "forward"), (90, "train_step"))
    trace = [
        entry("segment_alloc", 0, 64 * MB, t=1),
        entry("alloc", 100, 10 * MB, t=2, stack=weights),
        entry("alloc", 200, 4 * MB, t=3, stack=act1),
        entry("alloc", 300, 6 * MB, t=4, stack=act2),
        entry("alloc", 400, 1 * MB, t=5, stack=frames((70, "loss"))),   # peak after this: 1+10+4+6+1+2 = 24
        entry("free_requested", 400, 1 * MB, t=6),
        entry("free_completed", 400, 1 * MB, t=7),
        entry("free_completed", 200, 4 * MB, t=8),
        entry("free_completed", 500, 2 * MB, t=9),                       # allocated before the history
        entry("oom", 0, 100 * MB, t=10, device_free=3 * MB),
    ]
    blocks = [block(100, 10 * MB, "active_allocated", weights), block(300, 6 * MB, "active_allocated", act2),
              block(600, 1 * MB, "active_allocated", frames((5, "setup"))), block(700, 47 * MB, "inactive")]
    return {"segments": [segment(0, blocks)], "device_traces": [trace], "allocator_settings": {"max_split_size": -1}}


def test_peak_live_blocks_largest_segments_and_ooms(tmp_path: Path) -> None:
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", _snapshot())))
    # THEN the peak is 24 MB right after the 1 MB temporary (4 us after the first entry), and the live blocks
    # add up to it
    assert (result.peak_allocated_bytes, result.peak_since_start_ns, result.trace_start_time_us) == (24 * MB, 4000, 1)
    assert result.allocated_at_dump_bytes == 17 * MB and result.reserved_at_dump_bytes == 64 * MB
    assert result.note is None and result.has_history
    live = dict(result.live_at_peak.select("frame", "live_bytes").rows())
    assert live == {"model.py:10 __init__": 10 * MB, "model.py:60 forward": 6 * MB, "model.py:54 forward": 4 * MB,
                    PRE_HISTORY: 2 * MB, "model.py:70 loss": 1 * MB, "model.py:5 setup": 1 * MB}
    assert sum(live.values()) == result.peak_allocated_bytes
    largest = result.largest_allocations
    assert largest.select("size_bytes", "since_start_ns", "lifetime_ns", "freed", "frame").rows() == [
        (10 * MB, 1000, None, False, "model.py:10 __init__"), (6 * MB, 3000, None, False, "model.py:60 forward"),
        (4 * MB, 2000, 5000, True, "model.py:54 forward"), (1 * MB, 4000, 2000, True, "model.py:70 loss")]
    seg = result.segments.row(0, named=True)
    assert (seg["segment_address"], seg["total_bytes"], seg["allocated_bytes"], seg["free_bytes"],
            seg["inactive_split_bytes"], seg["largest_free_bytes"], seg["fragmentation_fraction"]) == (
        "0x0", 64 * MB, 17 * MB, 47 * MB, 47 * MB, 47 * MB, 0.0)
    assert (result.inactive_split_at_dump_bytes, result.largest_free_block_at_dump_bytes) == (47 * MB, 47 * MB)
    assert result.ooms.rows(named=True) == [{"device": 0, "since_start_ns": 9000, "requested_bytes": 100 * MB,
                                            "device_free_bytes": 3 * MB, "allocated_bytes": 17 * MB,
                                            "reserved_bytes": 64 * MB}]
    assert result.oom_events == 1
    assert result.timeline["allocated_bytes"].max() == 24 * MB and result.timeline.height == 10


def test_activation_estimate_names_the_largest_layer(tmp_path: Path) -> None:
    # GIVEN two forward activations (4 MB at model.py:54, 6 MB at model.py:60) live at the peak
    est = activation_estimate(read_snapshot(write(tmp_path / "s.pickle", _snapshot())))
    # THEN the largest layer is model.py:60, and checkpointing could save at most the other layer's 4 MB
    assert (est.peak_allocated_bytes, est.activations_bytes) == (24 * MB, 10 * MB)
    assert est.largest_layer == "model.py:60 forward" and est.largest_layer_activations_bytes == 6 * MB
    assert est.checkpoint_saving_estimate_bytes == 4 * MB and est.activations_of_peak_fraction == 10 / 24
    assert est.rule == ESTIMATE_RULE and est.peak_device == 0
    assert est.layers.select("layer", "activations_bytes", "blocks").rows() == [
        ("model.py:60 forward", 6 * MB, 1), ("model.py:54 forward", 4 * MB, 1)]


def test_a_model_of_torch_modules_has_activations_but_no_saving_estimate(tmp_path: Path) -> None:
    """nn.TransformerEncoder has no forward of the user's: its activations are under torch's own module frames
    (sample_traces/oom_dump_cuda once showed 0 B of activations, against 393 MiB). Its layers' instances share
    those frames, so the saving is refused; a user's own forward still wins over torch's inside it."""
    site = "/usr/lib/python3.11/site-packages/torch/nn/modules/"

    def stack(module: str, line: int, *user: tuple[int, str]) -> list[dict[str, Any]]:
        return [{"filename": site + "linear.py", "line": 125, "name": "_conv_forward"},
                {"filename": site + module, "line": line, "name": "forward"},
                {"filename": site + "module.py", "line": 1750, "name": "_call_impl"}, *frames(*user)[1:]]
    attn, ffn = stack("activation.py", 1275, (90, "train_step")), stack("linear.py", 125, (90, "train_step"))
    mine = stack("linear.py", 125, (40, "forward"), (90, "train_step"))  # a Linear inside the user's own block
    trace = [entry("segment_alloc", 0, 64 * MB, t=1), entry("alloc", 100, 10 * MB, t=2, stack=frames((10, "init"))),
             entry("alloc", 200, 6 * MB, t=3, stack=attn), entry("alloc", 300, 3 * MB, t=4, stack=attn),
             entry("alloc", 400, 4 * MB, t=5, stack=ffn)]
    blocks = [block(100, 10 * MB, "active_allocated", frames((10, "init"))),
              block(200, 6 * MB, "active_allocated", attn), block(300, 3 * MB, "active_allocated", attn),
              block(400, 4 * MB, "active_allocated", ffn)]
    data = {"segments": [segment(0, blocks)], "device_traces": [trace]}
    est = activation_estimate(read_snapshot(write(tmp_path / "t.pickle", data)))
    assert est.activations_bytes == 13 * MB and est.largest_layer == "torch/nn/modules/activation.py:1275 forward"
    assert est.layers.select("layer", "activations_bytes", "blocks").rows() == [
        ("torch/nn/modules/activation.py:1275 forward", 9 * MB, 2),
        ("torch/nn/modules/linear.py:125 forward", 4 * MB, 1)]
    assert est.checkpoint_saving_estimate_bytes is None and "share one forward frame" in (est.note or "")
    # WHEN the Linear runs inside the user's own forward THEN that forward is the layer, and the saving is estimated
    trace[-1], blocks[-1] = entry("alloc", 400, 4 * MB, t=5, stack=mine), block(400, 4 * MB, "active_allocated", mine)
    trace[2:4] = [entry("alloc", 200, 6 * MB, t=3, stack=mine), entry("alloc", 300, 3 * MB, t=4, stack=mine)]
    blocks[1:3] = [block(200, 6 * MB, "active_allocated", mine), block(300, 3 * MB, "active_allocated", mine)]
    own = activation_estimate(read_snapshot(write(tmp_path / "u.pickle", data)))
    assert own.layers.select("layer", "activations_bytes").rows() == [("model.py:40 forward", 13 * MB)]
    assert own.checkpoint_saving_estimate_bytes == 0 and own.note is None


def test_rounded_block_sizes_are_one_row_so_live_bytes_add_up_to_the_peak(tmp_path: Path) -> None:
    # GIVEN the history records a 4-byte request and the dump its 512-byte block (torch rounds to 512)
    trace = [entry("alloc", 0, 4, t=1, stack=frames((3, "step"))), entry("alloc", 512, 1000, t=2),
             entry("free_completed", 512, 1000, t=3)]
    data = {"segments": [segment(0, [block(0, 512, "active_allocated", frames((3, "step"))),
                                     block(512, 1536, "inactive")])], "device_traces": [trace]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data)))
    # THEN the peak follows the reference definition (512 - 4 + 4 + 1000) and the rounding is its own row
    assert result.peak_allocated_bytes == 1512
    assert result.live_at_peak.select("frame", "live_bytes").rows() == [
        (NO_FRAME, 1000), (ROUNDING, 508), ("model.py:3 step", 4)]


def test_user_code_wins_over_libraries_and_libraries_over_torch(tmp_path: Path) -> None:
    lib = {"filename": "/venv/lib/python3.11/site-packages/einops/_backends.py", "line": 291, "name": "einsum"}
    own = {"filename": "/home/me/project/model.py", "line": 54, "name": "attention"}
    torch_frame = frames()[0]
    trace = [entry("alloc", 0, 10, t=1, stack=[torch_frame, lib, own]), entry("alloc", 10, 20, t=2, stack=[lib]),
             entry("alloc", 30, 30, t=3, stack=[torch_frame]), entry("alloc", 60, 40, t=4)]
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", {"segments": [], "device_traces": [trace]})))
    assert dict(result.live_at_peak.select("frame", "live_bytes").rows()) == {
        NO_FRAME: 70, "_backends.py:291 einsum": 20, "model.py:54 attention": 10}


def test_a_block_the_history_never_mentions_was_allocated_before_it(tmp_path: Path) -> None:
    # GIVEN a history of one 1 MB allocation, and a dump that also holds a 5 MB block without a stack that the
    # history never mentions (weights loaded before _record_memory_history, as cs336_magma27's 1 GB of them)
    act = frames((54, "forward"))
    blocks = [block(0, 5 * MB, "active_allocated"), block(5 * MB, MB, "active_allocated", act)]
    data = {"segments": [segment(0, blocks)],
            "device_traces": [[entry("alloc", 5 * MB, MB, t=1, stack=act)]]}
    live = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data))).live_at_peak
    # THEN it reads as allocated before the history, not as a block whose Python frame went unrecorded
    assert live.select("frame", "live_bytes").rows() == [(PRE_HISTORY, 5 * MB), ("model.py:54 forward", MB)]


def test_legacy_list_format_and_empty_history(tmp_path: Path) -> None:
    # GIVEN the legacy format: a bare list of segments, no history, no frames
    legacy = [segment(0, [block(0, 3 * MB, "active_allocated"), block(3 * MB, MB, "inactive"),
                          block(4 * MB, 2 * MB, "inactive")])]
    result = analyze_snapshot(read_snapshot(write(tmp_path / "legacy.pickle", legacy)))
    # THEN the peak is the allocated bytes at dump, and the result says why
    assert result.format == "legacy segment list" and not result.has_history and result.note == NO_HISTORY
    assert (result.peak_allocated_bytes, result.peak_since_start_ns) == (3 * MB, None)
    assert result.timeline.height == 0 and result.ooms.height == 0
    assert result.live_at_peak.select("frame", "live_bytes", "blocks").rows() == [(NO_FRAME, 3 * MB, 1)]
    seg = result.segments.row(0, named=True)
    assert (seg["free_bytes"], seg["inactive_split_bytes"], seg["largest_free_bytes"]) == (3 * MB, 3 * MB, 2 * MB)
    assert seg["fragmentation_fraction"] == pytest.approx(1 - 2 / 3)
    empty = analyze_snapshot(read_snapshot(write(tmp_path / "e.pickle", {"segments": [], "device_traces": [[]]})))
    assert empty.peak_allocated_bytes == 0 and empty.live_at_peak.height == 0 and empty.note == NO_HISTORY
    assert empty.largest_free_block_at_dump_bytes is None


def test_an_unknown_device_is_a_usage_error(tmp_path: Path) -> None:
    tables = read_snapshot(write(tmp_path / "s.pickle", _snapshot()))
    with pytest.raises(UsageError, match="device 3 is not in this snapshot"):
        analyze_snapshot(tables, device=3)
    assert analyze_snapshot(tables, device=0).peak_allocated_bytes == 24 * MB


def test_the_busiest_of_two_devices_is_the_headline(tmp_path: Path) -> None:
    small = [entry("alloc", 0, 5, t=1), entry("free_completed", 0, 5, t=2)]
    big = [entry("alloc", 0, 50, t=7), entry("alloc", 64, 70, t=8), entry("free_completed", 0, 50, t=9)]
    data = {"segments": [segment(0, [block(64, 70, "active_allocated")], device=1)], "device_traces": [small, big]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data)))
    assert result.devices.select("device", "peak_allocated_bytes", "peak_since_start_ns").rows() == [
        (0, 5, 0), (1, 120, 1000)]
    assert (result.peak_device, result.peak_allocated_bytes, result.trace_start_time_us) == (1, 120, 7)


def test_user_frames_skip_torch_stdlib_and_cpp() -> None:
    assert is_user_frame("/home/me/train.py")
    assert is_user_frame("C:\\proj\\.venv\\Lib\\site-packages\\transformers\\x.py")
    assert is_user_frame("/home/me/project/lib/model.py")
    for f in ("/x/site-packages/torch/nn/modules/module.py", "<frozen runpy>", "/usr/lib/python3.11/runpy.py",
              "C:\\Python311\\Lib\\threading.py", "c10/core/Allocator.cpp", "??",
              "C:\\Users\\me\\AppData\\Roaming\\uv\\python\\cpython-3.10.19-windows-x86_64-none\\lib\\copy.py",
              "/opt/conda/lib/json/decoder.py"):
        assert not is_user_frame(f), f


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}))
    with pytest.raises(SnapshotFormatError) as info:
        read_snapshot(path)
    assert "refusing to load" in str(info.value) and "system" in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize(("data", "needle"), [
    (b"", "not a pickle"), (b"hello, not a pickle", "not a pickle"),
    (pickle.dumps({"segments": []})[:-3], "truncated"), (pickle.dumps({"a": 1}), "not a CUDA memory snapshot"),
    (pickle.dumps([1, 2, 3]), "malformed snapshot entry"),
])
def test_bad_files_are_one_clear_error(tmp_path: Path, data: bytes, needle: str) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(data)
    with pytest.raises(SnapshotFormatError) as info:
        read_snapshot(path)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("name", "rounding"), [("cs336_magma27/memory_snapshot.pickle", 508),
                                              ("decomfl/memory.pickle", 2_944_380)])
def test_corpus_peak_matches_the_reference_script(corpus: Path, name: str, rounding: int) -> None:
    path = corpus / "snapshots" / name
    script = corpus.parent / "tools/reference_snapshot_peak.py"
    ref = json.loads(subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True,
                                    check=True).stdout)
    tables = read_snapshot(path)
    result = analyze_snapshot(tables, top=0)
    assert result.peak_allocated_bytes == ref["peak_bytes"]["0"]
    assert result.allocated_at_dump_bytes == ref["allocated_at_dump"]["0"]
    assert result.trace_entries == ref["trace_entries"]
    live = result.live_at_peak
    # THEN the live blocks plus the rounding row add up to the peak exactly
    assert int(live["live_bytes"].sum()) == result.peak_allocated_bytes
    assert live.filter(live["frame"] == ROUNDING)["live_bytes"].to_list() == [rounding]
    est = activation_estimate(tables)
    saving = est.checkpoint_saving_estimate_bytes
    assert est.activations_bytes <= result.peak_allocated_bytes
    assert (saving is None and est.note is not None) or 0 <= (saving or 0) <= est.activations_bytes


def test_cs336_activations_dominate_its_peak(corpus: Path) -> None:
    est = activation_estimate(read_snapshot(corpus / "snapshots/cs336_magma27/memory_snapshot.pickle"))
    assert est.largest_layer == "model.py:399 forward" and est.activations_bytes == 11_894_554_624
    assert est.largest_layer_activations_bytes == 3_623_878_656


def test_decomfl_live_memory_is_attributed_to_the_users_code_not_transformers(corpus: Path) -> None:
    result = analyze_snapshot(read_snapshot(corpus / "snapshots/decomfl/memory.pickle"))
    frames_ = result.live_at_peak["frame"].to_list()
    assert "client.py:176 reset_model" in frames_ and not any("modeling_utils" in f for f in frames_)


def test_an_address_reused_after_a_free_keeps_both_lifetimes(tmp_path: Path) -> None:
    stack = frames((3, "step"))
    trace = [entry("alloc", 10, 2 * MB, t=1, stack=stack), entry("free_completed", 10, 2 * MB, t=2),
             entry("alloc", 10, 5 * MB, t=3, stack=stack)]
    data = {"segments": [segment(0, [block(10, 5 * MB, "active_allocated", stack)])], "device_traces": [trace]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data)))
    assert result.largest_allocations.select("size_bytes", "freed").rows() == [(5 * MB, False), (2 * MB, True)]
    assert result.peak_allocated_bytes == 5 * MB


def test_entries_without_time_or_frames(tmp_path: Path) -> None:
    # GIVEN an older trace: no time_us, no frames
    trace = [{"action": "alloc", "addr": 0, "size": 8}, {"action": "alloc", "addr": 8, "size": 8},
             {"action": "free_completed", "addr": 0, "size": 8}]
    data = {"segments": [segment(0, [block(8, 8, "active_allocated")])], "device_traces": [trace]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data)))
    assert (result.peak_allocated_bytes, result.peak_since_start_ns, result.trace_start_time_us) == (16, None, None)
    assert result.live_at_peak.select("frame", "live_bytes", "blocks").rows() == [(NO_FRAME, 16, 2)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.sampled_from([512, 1024, 4096])), max_size=40),
       before=st.lists(st.integers(6, 8), max_size=3, unique=True))
def test_peak_matches_brute_force_and_live_blocks_add_up(tmp_path: Path, ops: list[tuple[bool, int, int]],
                                                         before: list[int]) -> None:
    # GIVEN blocks alive before the history (addresses 6..8) and a random alloc/free history on addresses 0..5
    live: dict[int, int] = {a: 2048 for a in before}
    trace = []
    for t, (alloc, slot, size) in enumerate(ops):
        if alloc and slot not in live:
            live[slot] = size
            trace.append(entry("alloc", slot, size, t=t, stack=frames((slot, "f"))))
        elif not alloc and live:
            addr = sorted(live)[slot % len(live)]
            trace.append(entry("free_completed", addr, live.pop(addr), t=t))
    blocks = [block(a, s, "active_allocated") for a, s in sorted(live.items())]
    data = {"segments": [segment(0, blocks)] if blocks else [], "device_traces": [trace]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "p.pickle", data)), top=0)
    # THEN the peak is the brute-force maximum from the reference definition, and the live blocks sum to it
    current = sum(live.values()) - sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace)
    peak = current
    for e in trace:
        current += e["size"] if e["action"] == "alloc" else -e["size"]
        peak = max(peak, current)
    assert result.peak_allocated_bytes == peak
    assert int(result.live_at_peak["live_bytes"].sum() or 0) == peak
