"""The device peak table: the shipped file validates, names match the right row, overrides win, unknowns are clear."""

from __future__ import annotations

import csv
import gzip
import io
import json
from importlib import resources
from pathlib import Path

import pytest
from builders import kernel, load_events, step, trace

from stepscope.analyze import Trace
from stepscope.analyze.peaks import (
    DTYPES,
    load_peak_table,
    match_device,
    parse_peak_table,
    peaks_for,
    resolve_device,
    resolve_peaks,
    ridge_point,
)
from stepscope.errors import UsageError

# What every GPU name in ../shared/corpus/traces must resolve to (None: the table rightly does not know it).
CORPUS_NAMES: dict[str, str | None] = {
    "Tesla V100-DGXS-32GB": "v100-sxm2-32gb",
    "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "Tesla V100-SXM2-32GB": "v100-sxm2-32gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA A100-PG509-200": "a100-sxm4-40gb",
    "NVIDIA H100": "h100-sxm",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA B200": "b200",
    "AMD Instinct MI210": "mi210",
    "AMD Instinct MI300X": "mi300x",
    "AMD Instinct MI300X VF": "mi300x",
    "AMD Radeon Graphics": None,  # the MI250 trace: ROCm gave no model name, and APUs report the same one
    "Quadro GP100": None,  # not a device the table covers
}

REQUIRED_KEYS = {
    "v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie", "a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb",
    "a100-pcie-80gb", "a10", "l4", "l40s", "t4", "h100-sxm", "h100-pcie", "h100-nvl", "h200", "b200", "gb200",
    "rtx-3090", "rtx-4090", "mi210", "mi250x", "mi250", "mi300x", "mi325x", "mi355x",
}


def _gpu(name: str) -> dict[str, object]:
    return {"id": 0, "name": name, "totalGlobalMem": 80 * 2**30, "computeMajor": 9, "computeMinor": 0, "numSms": 132}


def _trace_of(tmp_path: Path, *names: str) -> Trace:
    doc = trace(step(1, ts=0, dur=50), kernel("sgemm", ts=10, dur=30, correlation=5))
    doc["deviceProperties"] = [{**_gpu(n), "id": i} for i, n in enumerate(names)]
    loaded = load_events(tmp_path, doc)
    assert isinstance(loaded, Trace)
    return loaded


# ------------------------------------------------------------------ the shipped table


def test_the_shipped_table_validates_and_covers_every_requested_device() -> None:
    # WHEN the table shipped in the package is loaded (load validates it)
    rows = load_peak_table()
    # THEN it has every device asked for, each row cites a source with a URL, and has a bandwidth and a peak
    assert {r.key for r in rows} == REQUIRED_KEYS
    for row in rows:
        assert "http" in row.source, row.key
        assert row.bandwidth_gbps > 0 and row.examples, row.key
        assert any(row.peak_tflops(d) for d in DTYPES), row.key
        assert all(v > 0 for v in row.tflops.values()), row.key


def test_dense_figures_are_half_the_sparse_ones_where_the_note_says_so() -> None:
    # GIVEN the H100 SXM row, whose datasheet prints only with-sparsity tensor figures
    h100 = match_device("NVIDIA H100 80GB HBM3")
    # THEN the row holds half of them, and says so
    assert h100 is not None and "half" in h100.note
    assert (h100.peak_tflops("bf16"), h100.peak_tflops("fp8"), h100.peak_tflops("tf32")) == (989.5, 1979, 494.5)
    # AND fp64 takes the faster of the vector and tensor paths
    assert h100.tflops["fp64"] == 34 and h100.peak_tflops("fp64") == 67


@pytest.mark.parametrize(("column", "value", "message"), [
    ("source", "", "empty 'source'"),
    ("bandwidth_gbps", "-5", "must be positive"),
    ("fp32_tflops", "fast", "not a number"),
    ("pattern", "A100(", "does not compile"),
    ("examples", "NVIDIA H100 PCIe", "matches 'no row' instead"),
])
def test_a_bad_table_is_refused_naming_the_row(column: str, value: str, message: str) -> None:
    # GIVEN the shipped table cut to its first row, with one cell of that row made bad
    text = resources.files("stepscope.analyze").joinpath("data").joinpath("device_peaks.csv").read_text()
    reader = csv.DictReader(io.StringIO(text))
    first = next(reader)
    first[column] = value
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(first))
    writer.writeheader()
    writer.writerow(first)
    # WHEN it is parsed THEN a ValueError names the row and the fault
    with pytest.raises(ValueError, match=message) as info:
        parse_peak_table(out.getvalue())
    assert "v100-sxm2-16gb" in str(info.value)


# ------------------------------------------------------------------ matching


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),  # must not read as SXM
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", None),  # a different board; and A10 must not swallow A100 names either
    ("Tesla V100-PCIE-16GB", "v100-pcie"),
    ("Tesla V100S-PCIE-32GB", None),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 3090 Ti", None),
    ("AMD Instinct MI250X", "mi250x"),
    ("AMD Instinct MI250", "mi250"),
    ("AMD Instinct MI250X / MI250", None),  # the name cannot tell the two apart
    ("AMD Instinct MI325X", "mi325x"),
    ("nvidia h100 pcie", "h100-pcie"),  # case-insensitive
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", None),  # a MIG slice has a fraction of the SMs
])
def test_the_most_specific_row_wins(name: str, key: str | None) -> None:
    row = match_device(name)
    assert (row.key if row else None) == key


def test_a_tie_between_rows_is_unknown_not_decided_by_order() -> None:
    # GIVEN a table where two rows cover the same characters of a name
    rows = load_peak_table()
    a, b = rows[0], rows[1]
    tied = (type(a)(**{**a.__dict__, "pattern": "GPU X"}), type(b)(**{**b.__dict__, "pattern": "GPU X"}))
    # THEN the name matches neither, in either order
    assert match_device("GPU X", tied) is None and match_device("GPU X", tied[::-1]) is None


@pytest.mark.corpus
def test_every_corpus_gpu_name_matches_the_right_row(corpus: Path) -> None:
    # GIVEN every GPU name the corpus traces list in deviceProperties
    names: set[str] = set()
    for path in sorted((corpus / "traces").rglob("*")):
        if path.is_file() and path.name.endswith((".json", ".json.gz")):
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            doc = json.loads(raw)
            if isinstance(doc, dict):
                listed = [d.get("name") for d in doc.get("deviceProperties") or [] if isinstance(d, dict)]
                names |= {n for n in listed if isinstance(n, str) and n}  # vLLM's ROCm traces list "" names
    assert names, "no deviceProperties found in the corpus"
    # THEN each resolves to the row expected for it (a new corpus GPU must be added to CORPUS_NAMES)
    assert names <= set(CORPUS_NAMES), f"corpus GPUs not in CORPUS_NAMES: {sorted(names - set(CORPUS_NAMES))}"
    got = {name: (row.key if (row := match_device(name)) else None) for name in names}
    assert got == {name: CORPUS_NAMES[name] for name in names}


# ------------------------------------------------------------------ resolving a trace's devices


def test_table_figures_apply_to_a_known_device(tmp_path: Path) -> None:
    # GIVEN a trace on two H100 SXM GPUs
    t = _trace_of(tmp_path, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    # WHEN its peaks are resolved at bf16
    peaks = peaks_for(t, dtype="bf16")
    # THEN each GPU gets the table's figures, marked as such
    assert [d.device_id for d in peaks.devices] == [0, 1]
    first = peaks.devices[0]
    assert (first.peak_tflops, first.peak_bandwidth_gbps) == (989.5, 3350)
    assert (first.tflops_from, first.bandwidth_from) == ("table", "table")
    assert first.row is not None and first.row.key == "h100-sxm" and peaks.unknown == ()
    assert first.ridge_point_flop_per_byte == pytest.approx(989.5e12 / 3350e9)


def test_overrides_always_win(tmp_path: Path) -> None:
    # GIVEN a known device and a user's peak override
    t = _trace_of(tmp_path, "NVIDIA A100-SXM4-80GB")
    # WHEN peaks are resolved with --peak-tflops only
    device = peaks_for(t, dtype="fp16", peak_tflops=250.0).devices[0]
    # THEN the override replaces the table's peak, and the bandwidth still comes from the table
    assert (device.peak_tflops, device.tflops_from) == (250.0, "override")
    assert (device.peak_bandwidth_gbps, device.bandwidth_from) == (2039, "table")
    # AND --peak-bandwidth alone wins over the table's bandwidth
    device = peaks_for(t, dtype="fp16", peak_bandwidth_gbps=1000.0).devices[0]
    assert (device.peak_tflops, device.peak_bandwidth_gbps) == (312, 1000.0)
    assert device.ridge_point_flop_per_byte == pytest.approx(312e12 / 1000e9)


def test_an_unknown_device_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    # GIVEN a trace on a GPU the table does not know
    t = _trace_of(tmp_path, "Quadro GP100")
    # WHEN peaks are required THEN a UsageError names the device and the options to pass
    with pytest.raises(UsageError, match="Quadro GP100") as info:
        peaks_for(t, dtype="fp32")
    assert "--peak-tflops" in str(info.value) and "--peak-bandwidth" in str(info.value)
    assert info.value.exit_code == 2
    # AND asking without raising says "unknown" instead
    resolved = resolve_peaks(t, dtype="fp32")
    assert resolved.unknown == ("Quadro GP100",)
    assert resolved.devices[0].row is None and resolved.devices[0].peak_tflops is None
    # AND with only one override the error asks for the other one
    with pytest.raises(UsageError, match="pass --peak-bandwidth \\("):
        peaks_for(t, dtype="fp32", peak_tflops=10.6)
    # AND both overrides make it usable
    device = peaks_for(t, dtype="fp32", peak_tflops=10.6, peak_bandwidth_gbps=732.0).devices[0]
    assert (device.peak_tflops, device.peak_bandwidth_gbps) == (10.6, 732.0)


def test_a_dtype_the_row_lacks_asks_for_an_override() -> None:
    # GIVEN a T4, which has no bf16 tensor path
    device = resolve_device("Tesla T4", device_id=0, dtype="bf16")
    # THEN its bandwidth is known but its bf16 peak is not
    assert device.row is not None and device.peak_tflops is None and device.peak_bandwidth_gbps == 320


def test_a_trace_without_gpus(tmp_path: Path) -> None:
    # GIVEN a trace that lists no GPU
    doc = trace(step(1, ts=0, dur=50))
    doc["deviceProperties"] = []
    t = load_events(tmp_path, doc)
    # THEN resolving gives nothing, requiring is a UsageError, and both overrides give one pseudo-device
    assert resolve_peaks(t).devices == ()
    with pytest.raises(UsageError, match="lists no GPU"):
        peaks_for(t)
    (only,) = peaks_for(t, peak_tflops=1.0, peak_bandwidth_gbps=50.0).devices
    assert (only.device_id, only.name, only.peak_tflops) == (None, None, 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_overrides_must_be_positive(bad: float) -> None:
    with pytest.raises(UsageError, match="--peak-tflops must be a positive number"):
        resolve_device("NVIDIA B200", peak_tflops=bad)


# ------------------------------------------------------------------ ridge point


def test_ridge_point_by_hand() -> None:
    # GIVEN the A100 SXM4 80GB row: 312 dense bf16 TFLOP/s, 2,039 GB/s
    a100 = match_device("NVIDIA A100-SXM4-80GB")
    assert a100 is not None
    # THEN its bf16 ridge point is 312e12 / 2039e9 = 153.02 FLOP/byte, and fp8 (no FP8 on A100) has none
    assert ridge_point(a100, "bf16") == pytest.approx(153.016, abs=1e-3)
    assert ridge_point(a100, "fp8") is None
