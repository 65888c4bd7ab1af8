"""Transfers: pageable vs pinned, sync vs async, exposed time, and the corpus reference figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import cpu_op, kernel, load_events, memcpy, python_fn, runtime, step, trace

from stepscope.analyze import load
from stepscope.analyze.transfers import transfers


def test_pageable_sync_copy_and_pinned_async_copy(tmp_path: Path) -> None:
    doc = trace(
        step(1, ts=0, dur=200),
        kernel("k", ts=0, dur=10, correlation=9),
        python_fn("train.py(12): step", ts=1, dur=150),
        cpu_op("aten::copy_", ts=2, dur=40, external_id=1),
        runtime("cudaMemcpy", ts=3, dur=30, correlation=1, external_id=1),
        memcpy("HtoD", ts=5, dur=20, nbytes=2_000_000, correlation=1),  # 5..25; kernel covers 5..10
        runtime("cudaMemcpyAsync", ts=50, dur=2, correlation=2),
        memcpy("HtoD", ts=60, dur=10, nbytes=1_000_000, correlation=2, src="Pinned"),
    )
    r = transfers(load_events(tmp_path, doc))
    rows = r.copies.select("pageable", "pinned", "sync", "exposed_ns", "cpu_blocked_ns", "python_line", "step").rows()
    assert rows == [(True, False, True, 15_000, 30_000, "train.py(12): step", 1),
                    (False, True, False, 10_000, 0, "train.py(12): step", 1)]
    assert r.copies["gbps"].to_list() == [100.0, 100.0]
    assert (r.copies_total, r.pageable_copies, r.sync_copies, r.copied_bytes) == (2, 1, 1, 3_000_000)


def test_an_async_copy_the_host_then_synchronizes_on_is_a_sync_copy(tmp_path: Path) -> None:
    # GIVEN what torch's .to(device) without non_blocking records (an H200 trace, torch 2.11): cudaMemcpyAsync from
    # pageable memory (the call stages the data: 35 µs), the copy, then cudaStreamSynchronize on the same thread;
    # a pinned non-blocking copy followed by a kernel launch; and one whose next call is a sync ending before it
    doc = trace(
        step(1, ts=0, dur=300),
        runtime("cudaMemcpyAsync", ts=4, dur=35, correlation=1),
        memcpy("HtoD", ts=39, dur=5, nbytes=65_536, correlation=1),
        runtime("cudaStreamSynchronize", ts=40, dur=12),
        runtime("cudaMemcpyAsync", ts=100, dur=4, correlation=2),
        memcpy("HtoD", ts=110, dur=5, nbytes=65_536, correlation=2, src="Pinned"),
        runtime("cudaLaunchKernel", ts=106, dur=4, correlation=3), kernel("k", ts=116, dur=5, correlation=3),
        runtime("cudaMemcpyAsync", ts=200, dur=4, correlation=4),
        memcpy("HtoD", ts=230, dur=5, nbytes=65_536, correlation=4, src="Pinned"),
        runtime("cudaStreamSynchronize", ts=205, dur=3),
    )
    r = transfers(load_events(tmp_path, doc))
    # THEN the host waited for the first (issuing call and sync: 47 µs), not for the other two
    assert r.copies.select("sync", "cpu_blocked_ns").rows() == [(True, 47_000), (False, 0), (False, 0)]
    assert (r.sync_copies, r.cpu_blocked_ns) == (1, 47_000)


@pytest.mark.parametrize("rel", ["kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                                 "tracelens/b200/eager_trace.json.gz"])
def test_htod_figures_match_the_reference_script(corpus: Path, rel: str) -> None:
    path = corpus / "traces" / rel
    ref = json.loads(subprocess.run([sys.executable, str(corpus.parent / "tools/reference_figures.py"), str(path)],
                                    capture_output=True, text=True, check=True).stdout)
    h = transfers(load(path)).copies.filter(direction="HtoD")
    assert h.height == ref["h2d_count"]
    assert int(h["dur_ns"].sum()) == pytest.approx(ref["h2d_us"] * 1000, abs=1)
    assert int(h["exposed_ns"].sum()) == pytest.approx(ref["h2d_exposed_us"] * 1000, abs=1)
    assert int(h.filter(pageable=True)["dur_ns"].sum()) == pytest.approx(ref["h2d_pageable_us"] * 1000, abs=1)


def test_amd_copy_names_and_hip_sync_api(tmp_path: Path) -> None:
    # GIVEN a ROCm copy: "Memcpy HtoD (Host -> Device)" issued by hipMemcpyWithStream (blocking)
    doc = trace(step(1, ts=0, dur=100),
                runtime("hipMemcpyWithStream", ts=1, dur=40, correlation=1),
                memcpy("HtoD", ts=10, dur=20, nbytes=1_000, correlation=1, src="Host"))
    row = transfers(load_events(tmp_path, doc)).copies.row(0, named=True)
    # THEN the direction is parsed, pinned/pageable stay unknown, and the host was blocked for the whole call
    assert (row["direction"], row["pageable"], row["pinned"], row["sync"], row["cpu_blocked_ns"]) == (
        "HtoD", None, None, True, 40_000)


def test_a_pageable_count_over_copies_whose_names_do_not_say_is_refused(tmp_path: Path) -> None:
    # GIVEN AMD's names, which never say pageable or pinned, and a device-to-device copy (no host memory)
    amd = trace(step(1, ts=0, dur=100),
                runtime("hipMemcpyAsync", ts=1, dur=4, correlation=1),
                memcpy("HtoD", ts=10, dur=20, nbytes=1_000, correlation=1, src="Host"),
                runtime("hipMemcpyAsync", ts=40, dur=4, correlation=2),
                memcpy("DtoD", ts=50, dur=5, nbytes=1_000, correlation=2, src="Device"))
    r = transfers(load_events(tmp_path / "amd", amd))
    # THEN no pageable count over the host copy (not a 0 that reads as "all pinned"); the DtoD one is exact: 0
    assert r.pageable_copies is None
    assert dict(r.by_direction.select("direction", "pageable").rows()) == {"HtoD": None, "DtoD": 0}
    # AND with NVIDIA's names (one pageable, one pinned and the DtoD copy) every count is exact
    nvidia = trace(step(1, ts=0, dur=100),
                   memcpy("HtoD", ts=10, dur=20, nbytes=1_000), memcpy("DtoH", ts=35, dur=5, nbytes=1_000,
                                                                        src="Device", dst="Pinned"),
                   memcpy("DtoD", ts=50, dur=5, nbytes=1_000, src="Device"))
    r = transfers(load_events(tmp_path / "nvidia", nvidia))
    assert r.pageable_copies == 1
    assert dict(r.by_direction.select("direction", "pageable").rows()) == {"HtoD": 1, "DtoH": 0, "DtoD": 0}


def test_bytes_over_copies_of_unknown_size_are_refused_not_summed(tmp_path: Path) -> None:
    # GIVEN two HtoD copies of one step, the second without its `bytes` (ROCm traces record none), and a
    # DtoH copy whose size is known
    unsized = memcpy("HtoD", ts=40, dur=10, nbytes=0, src="Host")
    del unsized["args"]["bytes"]
    doc = trace(step(1, ts=0, dur=100), memcpy("HtoD", ts=10, dur=20, nbytes=1_000, src="Host"), unsized,
                memcpy("DtoH", ts=60, dur=4, nbytes=8_000, src="Device", dst="Pinned"))
    r = transfers(load_events(tmp_path, doc))
    # THEN the HtoD total, its GB/s and the whole total are unknown (never the 1,000 B of one copy, nor 0 B);
    # the DtoH figures, whose sizes are all known, stay exact
    assert r.copied_bytes is None
    by = {row["direction"]: row for row in r.by_direction.iter_rows(named=True)}
    assert (by["HtoD"]["copied_bytes"], by["HtoD"]["gbps"]) == (None, None)
    assert (by["DtoH"]["copied_bytes"], by["DtoH"]["gbps"]) == (8_000, 2.0)
    assert dict(r.by_step.select("direction", "copied_bytes").rows()) == {"DtoH": 8_000, "HtoD": None}


def test_resnet50_num_workers_0_copies_per_the_corpus_readme(corpus: Path, tmp_path: Path) -> None:
    path = corpus / "traces/kineto/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
    r = transfers(load(path, cache_dir=tmp_path))
    h = r.copies.filter(direction="HtoD")
    assert (h.height, int(h["pageable"].sum()), r.copy_time_ns) == (12, 12, 11_492_000)
