"""The GPU-to-GPU link table and a run's link: busbw's share of the link's one-way peak."""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from builders import kernel, trace, write_trace

from stepscope.analyze.collectives import collectives
from stepscope.analyze.links import link_of, load_link_table, parse_link_table, run_link
from stepscope.analyze.peaks import load_peak_table

H100 = "NVIDIA H100 80GB HBM3"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_every_row_names_a_device_of_the_peak_table_and_a_source() -> None:
    keys = {row.key for row in load_peak_table()}
    text = resources.files("stepscope.analyze").joinpath("data/device_links.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(text.splitlines()))
    assert rows and all(r["key"] in keys and r["source"].startswith(("NVIDIA", "AMD")) and "https://" in r["source"]
                        for r in rows)
    # the one-way peak is half the datasheet's two-way figure
    assert {k: link.gbps for k, link in load_link_table().items()} == {
        r["key"]: float(r["datasheet_gbps"]) / 2 for r in rows}


def test_a_row_without_a_source_or_figure_is_refused() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_link_table("key,link,datasheet_gbps,source,note\nh100-sxm,NVLink 4,900,,\n")
    with pytest.raises(ValueError, match="line 2"):
        parse_link_table("key,link,datasheet_gbps,source,note\nh100-sxm,NVLink 4,-1,NVIDIA x,\n")


@pytest.mark.parametrize(("name", "link", "gbps"), [
    (H100, "NVLink 4", 450), ("Tesla V100-SXM2-32GB", "NVLink 2", 150), ("NVIDIA A100-SXM4-80GB", "NVLink 3", 300),
    ("AMD Instinct MI300X", "Infinity Fabric (xGMI)", 448), ("NVIDIA H100 PCIe", "PCIe Gen5 x16", 64),
])
def test_device_names_map_to_their_link(name: str, link: str, gbps: float) -> None:
    found = link_of(name)
    assert found is not None and (found.name, found.gbps) == (link, gbps)


def test_the_link_is_known_only_on_one_named_host_of_one_device_kind() -> None:
    assert run_link(["n1", "n1"], [H100, H100]).gbps == 450
    assert run_link(["n1", "n1"], [H100, H100], override_gbps=25.0).gbps == 25.0  # the option wins
    for hosts, devices, why in ((["n1", "n2"], [H100, H100], "2 hosts"), ([None, None], [H100, H100], "no host"),
                                (["n1", "n1"], [H100, None], "names no GPU"),
                                (["n1", "n1"], ["Synthetic GPU"] * 2, "no link in the device table")):
        got = run_link(hosts, devices)
        assert got.gbps is None and got.unknown_because and why in got.unknown_because


def _rank(directory: Path, rank: int, start: float, *, host: str, gpu: str) -> None:
    args: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
                            "dtype": "Float", "Group size": 2, "Process Group Name": "0",
                            "Process Group Ranks": "[0, 1]"}
    doc = trace(kernel(AR, start, 200 - start, **args), host_name=host,
                baseTimeNanoseconds=1_700_000_000_000_000_000,
                distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2},
                deviceProperties=[{"id": rank, "name": gpu, "totalGlobalMem": 80 * 2**30, "numSms": 132}])
    write_trace(directory, doc, f"rank{rank}.pt.trace.json")


def test_comm_reads_busbw_against_the_devices_link(tmp_path: Path) -> None:
    # GIVEN two H100 ranks on one host in a 4 MiB all_reduce: rank 1 arrives 50 µs late, both end at 200 µs
    for rank, start in ((0, 100), (1, 150)):
        _rank(tmp_path / "run", rank, start, host="node1", gpu=H100)
    res = collectives(tmp_path / "run", cache_dir=tmp_path / "cache")
    # THEN the link is NVLink 4 at 450 GB/s per direction, and the share is busbw / 450 by hand:
    # latency 50 µs, 4 MiB -> algbw 83.886 GB/s, busbw x 2(n-1)/n = x 1 for n = 2
    assert res.link_bandwidth_gbps == 450 and res.link is not None and res.link.startswith("NVLink 4")
    (call,) = res.calls.iter_rows(named=True)
    busbw = (4 << 20) / 50_000
    assert call["busbw_gbps"] == pytest.approx(busbw) and call["link_share"] == pytest.approx(busbw / 450)
    # AND on two hosts the network bounds it: no share, and the reason
    for rank, start in ((0, 100), (1, 150)):
        _rank(tmp_path / "two", rank, start, host=f"node{rank}", gpu=H100)
    res = collectives(tmp_path / "two", cache_dir=tmp_path / "cache")
    assert res.link_bandwidth_gbps is None and res.link is not None and "2 hosts" in res.link
    assert "link_share" not in res.calls.columns
