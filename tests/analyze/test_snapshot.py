"""CUDA snapshots: safe loading, the peak (against the reference script), live blocks by frame, fragmentation."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from snapshot_builder import block, entry, frames, segment, write

from stepscope.analyze.snapshot import PRE_HISTORY, activation_estimate, analyze_snapshot, is_user_frame, read_snapshot
from stepscope.errors import SnapshotFormatError

MB = 1 << 20


def _snapshot() -> dict:
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
    # THEN the peak is 24 MB right after the 1 MB temporary, and the live blocks add up to it
    assert (result.peak_allocated_bytes, result.peak_time_us) == (24 * MB, 5)
    assert result.allocated_at_dump_bytes == 17 * MB and result.reserved_at_dump_bytes == 64 * MB
    live = dict(result.live_at_peak.select("frame", "live_bytes").rows())
    assert live == {"model.py:10 __init__": 10 * MB, "model.py:60 forward": 6 * MB, "model.py:54 forward": 4 * MB,
                    PRE_HISTORY: 2 * MB, "model.py:70 loss": 1 * MB, "model.py:5 setup": 1 * MB}
    assert sum(live.values()) == result.peak_allocated_bytes
    assert result.largest_allocations["size_bytes"].to_list()[0] == 10 * MB
    largest = result.largest_allocations
    assert largest.filter(largest["size_bytes"] == 4 * MB)["freed"].to_list() == [True]
    assert largest.filter(largest["size_bytes"] == 6 * MB)["freed"].to_list() == [False]
    seg = result.segments.row(0, named=True)
    assert (seg["free_bytes"], seg["largest_free_bytes"], seg["fragmentation_fraction"]) == (47 * MB, 47 * MB, 0.0)
    oom = result.ooms.row(0, named=True)
    assert (oom["requested_bytes"], oom["device_free_bytes"], oom["allocated_bytes"]) == (100 * MB, 3 * MB, 17 * MB)


def test_activation_estimate_names_the_largest_layer(tmp_path: Path) -> None:
    est = activation_estimate(read_snapshot(write(tmp_path / "s.pickle", _snapshot())))
    assert est.activations_bytes == 10 * MB and est.largest_layer == "model.py:60 forward"
    assert est.largest_layer_live_bytes == 6 * MB and est.checkpoint_saving_estimate_bytes == 4 * MB


def test_legacy_list_format_and_empty_history(tmp_path: Path) -> None:
    legacy = [segment(0, [block(0, 3 * MB, "active_allocated"), block(3 * MB, MB, "inactive"),
                          block(4 * MB, 2 * MB, "inactive")])]
    result = analyze_snapshot(read_snapshot(write(tmp_path / "legacy.pickle", legacy)))
    assert result.format == "legacy segment list" and not result.has_history
    assert result.peak_allocated_bytes == 3 * MB and result.timeline.height == 0
    seg = result.segments.row(0, named=True)
    assert seg["fragmentation_fraction"] == pytest.approx(1 - 2 / 3)
    empty = analyze_snapshot(read_snapshot(write(tmp_path / "e.pickle", {"segments": [], "device_traces": [[]]})))
    assert empty.peak_allocated_bytes == 0 and empty.live_at_peak.height == 0


def test_user_frames_skip_torch_stdlib_and_cpp() -> None:
    assert is_user_frame("/home/me/train.py")
    assert is_user_frame("C:\\proj\\.venv\\Lib\\site-packages\\transformers\\x.py")
    for f in ("/x/site-packages/torch/nn/modules/module.py", "<frozen runpy>", "/usr/lib/python3.11/runpy.py",
              "C:\\Python311\\Lib\\threading.py", "c10/core/Allocator.cpp", "??"):
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


@pytest.mark.parametrize("name", ["cs336_magma27/memory_snapshot.pickle", "decomfl/memory.pickle"])
def test_corpus_peak_matches_the_reference_script(corpus: Path, name: str) -> None:
    path = corpus / "snapshots" / name
    script = corpus.parent / "tools/reference_snapshot_peak.py"
    ref = json.loads(subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True,
                                    check=True).stdout)
    tables = read_snapshot(path)
    result = analyze_snapshot(tables, top=0)
    assert result.peak_allocated_bytes == ref["peak_bytes"]["0"]
    assert result.allocated_at_dump_bytes == ref["allocated_at_dump"]["0"]
    assert result.trace_entries == ref["trace_entries"]
    live = int(result.live_at_peak["live_bytes"].sum())
    assert abs(live - result.peak_allocated_bytes) <= 0.002 * result.peak_allocated_bytes  # see module docstring
    est = activation_estimate(tables)
    assert 0 <= est.checkpoint_saving_estimate_bytes <= est.activations_bytes <= result.peak_allocated_bytes


def test_cs336_activations_dominate_its_peak(corpus: Path) -> None:
    est = activation_estimate(read_snapshot(corpus / "snapshots/cs336_magma27/memory_snapshot.pickle"))
    assert est.largest_layer == "model.py:399 forward" and est.activations_of_peak_fraction > 0.8  # type: ignore[operator]


def test_an_address_reused_after_a_free_keeps_both_lifetimes(tmp_path: Path) -> None:
    stack = frames((3, "step"))
    trace = [entry("alloc", 10, 2 * MB, t=1, stack=stack), entry("free_completed", 10, 2 * MB, t=2),
             entry("alloc", 10, 5 * MB, t=3, stack=stack)]
    data = {"segments": [segment(0, [block(10, 5 * MB, "active_allocated", stack)])], "device_traces": [trace]}
    result = analyze_snapshot(read_snapshot(write(tmp_path / "s.pickle", data)))
    assert result.largest_allocations.select("size_bytes", "freed").rows() == [(5 * MB, False), (2 * MB, True)]
    assert result.peak_allocated_bytes == 5 * MB
