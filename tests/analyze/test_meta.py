"""TraceMeta types what analyses read from meta.json, keeps the rest in `raw`, and never fails on odd values."""

from __future__ import annotations

from pathlib import Path

from builders import kernel, step, trace, write_trace

from stepscope.analyze import load
from stepscope.analyze.meta import DeviceProperties, TraceMeta, devices_by_id


def test_an_ingested_trace_has_typed_meta_and_keeps_every_key(tmp_path: Path) -> None:
    # GIVEN a trace with distributedInfo and device properties
    doc = trace(step(1, ts=0, dur=50), kernel("sgemm", ts=10, dur=30, correlation=5))
    doc["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 4}
    doc["deviceProperties"] = [{"id": 0, "name": "H100", "totalGlobalMem": 80 * 2**30, "numSms": 132,
                                "computeMajor": 9, "computeMinor": 0}]
    # WHEN it is loaded
    meta = load(write_trace(tmp_path, doc, "t.json"), cache_dir=tmp_path / "cache").meta
    # THEN what analyses read is typed, and the document itself is kept whole
    assert (meta.rank, meta.world_size, meta.rank_source) == (1, 4, "distributedInfo")
    assert meta.distributed == {"backend": "nccl", "rank": 1, "world_size": 4}
    (device,) = meta.devices
    assert (device.id, device.name, device.num_sms, device.compute_capability) == (0, "H100", 132, "9.0")
    assert device.total_memory_bytes == 80 * 2**30 and device.properties["computeMajor"] == 9
    assert meta.counts.events == 2 and meta.counts.by_kind == {"kernel": 1, "user_annotation": 1}
    assert meta.source.name == "t.json" and len(meta.source.sha256) == 64
    assert meta.trace_id.startswith("t-") and meta.raw["trace_id"] == meta.trace_id
    assert set(meta.raw) >= {"ingest_schema_version", "source", "counts", "threads", "top_level"}


def test_missing_keys_and_wrong_types_read_as_unknown() -> None:
    # GIVEN a meta.json from another ingest version, with keys missing and values of the wrong type
    doc = {"rank": "3", "world_size": True, "devices": [{"id": 0, "name": 7}, "junk", {"id": 1, "name": ""}],
           "counts": {"events": 5},
           "threads": {"1/2": {"name": "main"}, "1/3": {}, "1/4": "junk"}, "extra_key": [1, 2]}
    # WHEN it is typed
    meta = TraceMeta.from_dict(doc, fallback_id="dir-name")
    # THEN odd values are None (never -1, never an exception) and nothing is lost
    assert meta.rank is None and meta.world_size is None and meta.rank_source is None
    assert meta.trace_id == "dir-name" and meta.source.name == "dir-name" and meta.source.sha256 == ""
    assert [(d.id, d.name) for d in meta.devices] == [(0, None), (1, None)]  # "": ROCm's unnamed GPUs
    assert (meta.counts.events, meta.counts.flows, dict(meta.counts.by_kind)) == (5, 0, {})
    assert meta.time.span_ns is None and meta.distributed is None and dict(meta.profiler_options) == {}
    assert meta.thread_names == {("1", "2"): "main"}
    assert meta.raw["extra_key"] == [1, 2]


def test_devices_by_id() -> None:
    def dev(i: int | None) -> DeviceProperties:
        return DeviceProperties(id=i, name=f"GPU {i}", total_memory_bytes=None, num_sms=None, compute_capability=None)

    four = [dev(i) for i in range(4)]
    assert devices_by_id(four, [1]) == {1: four[1]}
    assert devices_by_id(four, [1, 5]) == {1: four[1]}  # 5 is listed nowhere
    assert devices_by_id([four[0]], [2]) == {2: four[0]}  # the one GPU the process saw (ROCm's numbering)
    assert devices_by_id([four[0]], [0]) == {0: four[0]}
    assert devices_by_id([four[0]], [1, 2]) == {}  # two GPUs ran work; which is the listed one is not said
    assert devices_by_id(four[:2], [2]) == {}
    assert devices_by_id([], [0]) == {}
