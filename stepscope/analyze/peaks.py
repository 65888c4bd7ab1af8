"""Device peaks: dense TFLOP/s per dtype and memory bandwidth, from a table that cites a source on every row.

The table is `stepscope/analyze/data/device_peaks.csv`, shipped with the package and read offline. One row
per device model: a regex on the name CUDA / ROCm reports (`deviceProperties[].name` in a trace, or
`device.name` in a capture's manifest.json), the memory bandwidth, and the DENSE peak (no 2:4 sparsity) of
each compute path. Where a vendor prints only the with-sparsity figure, the row holds half of it and says
so in its `note`; a figure no source gave is left empty, never estimated. Int8 figures are tera-ops/s.

A trace's devices are matched by name (`match_device`); a user's `--peak-tflops` / `--peak-bandwidth`
always win over the table (`peaks_for`, `resolve_peaks`):

    >>> peaks = peaks_for(trace, dtype="bf16")                   # UsageError for a device the table lacks
    >>> peaks.devices[0].peak_tflops, peaks.devices[0].ridge_point_flop_per_byte
    (989.5, 295.4)
    >>> resolve_peaks(trace, dtype="bf16").unknown               # never raises: names of unmatched devices
    ()
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import polars as pl

from stepscope.analyze.frames import Source, frames_of
from stepscope.analyze.schema import Kind
from stepscope.analyze.vocab import DTYPES as DTYPES  # re-exported with Dtype: callers import them from here
from stepscope.analyze.vocab import Dtype as Dtype
from stepscope.errors import UsageError

PeakOrigin = Literal["table", "override"]
#: who made the GPU a trace ran on: it decides which vendor's profiler the commands we print name
Vendor = Literal["NVIDIA", "AMD"]

#: the runtime versions Kineto writes at a trace's top level, by whose software stack writes them
_VERSION_VENDORS: Mapping[str, Vendor] = {
    "cuda_runtime_version": "NVIDIA", "cuda_driver_version": "NVIDIA", "cupti_version": "NVIDIA",
    "hip_runtime_version": "AMD", "hip_driver_version": "AMD", "roctracer_version": "AMD"}

# Table columns (unit suffix dropped) that give each dtype's peak. fp64 and fp32 may run on vector units or
# on tensor / matrix cores (NVIDIA FP64 tensor cores, AMD FP64/FP32 matrix cores): their peak is the larger.
_PATHS: Mapping[Dtype, tuple[str, ...]] = {
    "fp64": ("fp64", "fp64_tensor"),
    "fp32": ("fp32", "fp32_tensor"),
    "tf32": ("tf32_tensor",),
    "bf16": ("bf16_tensor",),
    "fp16": ("fp16_tensor",),
    "fp8": ("fp8_tensor",),
    "int8": ("int8_tensor",),
}
_COMPUTE_COLUMNS = {"fp64_tflops": "fp64", "fp64_tensor_tflops": "fp64_tensor", "fp32_tflops": "fp32",
                    "fp32_tensor_tflops": "fp32_tensor", "tf32_tensor_tflops": "tf32_tensor",
                    "bf16_tensor_tflops": "bf16_tensor", "fp16_tensor_tflops": "fp16_tensor",
                    "fp8_tensor_tflops": "fp8_tensor", "int8_tensor_tops": "int8_tensor"}
_COLUMNS = ("key", "vendor", "name", "pattern", "examples", "bandwidth_gbps", *_COMPUTE_COLUMNS, "source", "note")
_TABLE = "device_peaks.csv"


@dataclass(frozen=True, kw_only=True)
class DevicePeaks:
    """One row of the peak table.

    `tflops` maps a compute path (fp64, fp64_tensor, fp32, fp32_tensor, tf32_tensor, bf16_tensor,
    fp16_tensor, fp8_tensor, int8_tensor) to its dense peak in TFLOP/s (int8: tera-ops/s); a path the
    device lacks, or no source gave, is absent. `pattern` is matched against reported device names (see
    `match_device`); `examples` are names it must match, checked when the table is loaded.
    """

    key: str
    vendor: str
    name: str
    pattern: str
    examples: tuple[str, ...]
    tflops: Mapping[str, float]
    bandwidth_gbps: float
    source: str
    note: str

    def peak_tflops(self, dtype: Dtype) -> float | None:
        """Dense peak TFLOP/s for `dtype` (the faster of vector and tensor paths); None where the table has none."""
        figures = [self.tflops[path] for path in _PATHS[dtype] if path in self.tflops]
        return max(figures) if figures else None


@dataclass(frozen=True, kw_only=True)
class ResolvedDevice:
    """The peaks that apply to one GPU of a trace: an override where given, else the table row's figure.

    `row` is the matched table row (None when the name matches none); `peak_tflops` is at the requested
    dtype (None when no dtype was asked for and no override given, or when neither gives a figure);
    `*_from` say where each figure came from. `device_id` / `name` are None for the one pseudo-device that
    overrides make for a trace listing no GPU.
    """

    device_id: int | None
    name: str | None
    row: DevicePeaks | None
    dtype: Dtype | None
    peak_tflops: float | None
    peak_bandwidth_gbps: float | None
    tflops_from: PeakOrigin | None
    bandwidth_from: PeakOrigin | None

    @property
    def ridge_point_flop_per_byte(self) -> float | None:
        """Peak FLOP/s over bandwidth: the arithmetic intensity above which this device is compute-bound."""
        if self.peak_tflops is None or self.peak_bandwidth_gbps is None:
            return None
        return _ridge(self.peak_tflops, self.peak_bandwidth_gbps)


@dataclass(frozen=True, kw_only=True)
class ResolvedPeaks:
    """The peaks of every GPU a trace lists (deviceProperties order), at `dtype`."""

    dtype: Dtype | None
    devices: tuple[ResolvedDevice, ...]

    @property
    def unknown(self) -> tuple[str, ...]:
        """Names of the devices left without a figure the caller needs and no override supplies: not in the
        table (what a report calls "unknown device"), or matched to a row with no figure at `dtype`."""
        return tuple(d.name or "?" for d in self.devices if _missing(d))

    def for_device(self, device_id: int | None) -> ResolvedDevice | None:
        """The entry of GPU `device_id`; None when the trace does not list it."""
        return next((d for d in self.devices if d.device_id == device_id), None)


@cache
def load_peak_table() -> tuple[DevicePeaks, ...]:
    """The shipped peak table, validated: every row has a source, numbers are positive and finite, keys are
    unique, patterns compile, and every row's examples match that row (and no other) under `match_device`.
    A bad table raises ValueError naming the row: it is a packaging bug, not a user error."""
    text = resources.files("stepscope.analyze").joinpath("data").joinpath(_TABLE).read_text(encoding="utf-8")
    return parse_peak_table(text)


def parse_peak_table(text: str) -> tuple[DevicePeaks, ...]:
    """Parse and validate peak-table CSV text (the format of device_peaks.csv); see `load_peak_table`."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != _COLUMNS:
        raise ValueError(f"peak table columns are {reader.fieldnames}, expected {list(_COLUMNS)}")
    rows = tuple(_row(raw, line) for line, raw in enumerate(reader, start=2))
    keys = [r.key for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError(f"peak table has duplicate keys: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
    for row in rows:
        for example in row.examples:
            got = _best(rows, example)
            if got is not row:
                raise ValueError(f"peak table row {row.key!r}: example {example!r} matches "
                                 f"{got.key if got else 'no row'!r} instead")
    return rows


def match_device(name: str, table: tuple[DevicePeaks, ...] | None = None) -> DevicePeaks | None:
    """The table row for a reported device name; None when no row matches (or the name is a MIG slice).

    Rule: a row's `pattern` is searched (case-insensitive) in the name; of the rows that match, the one
    whose match covers the most characters of the name wins: the most specific. Two different rows
    covering equally many characters means the table cannot tell them apart, and the name is unknown.
    Row order never decides. Examples:

        "NVIDIA H100 PCIe"         h100-pcie matches "H100 PCIe"; the SXM row's "H100 80GB HBM3",
                                   "H100 SXM" and "^NVIDIA H100$" do not match, so PCIe never reads as SXM
        "NVIDIA H100 NVL"          only h100-nvl ("H100 NVL")
        "NVIDIA A100-SXM4-80GB"    only a100-sxm4-80gb; "A100-SXM4-40GB" differs in the memory size
        "NVIDIA A100 80GB PCIe"    only a100-pcie-80gb ("A100 80GB PCIe"); A100-PCIE-40GB is another row
        "NVIDIA A10G"              nothing: the A10 row is "NVIDIA A10$", so neither A10G nor A100 reads as A10
        "AMD Instinct MI300X VF"   mi300x ("AMD Instinct MI300X", 19 characters); "MI325X" does not match

    A MIG slice ("NVIDIA A100-SXM4-40GB MIG 3g.20gb") has a fraction of the GPU's SMs, so whole-GPU peaks
    would overstate it: it is unknown, and the user passes overrides.
    """
    if re.search(r"\bMIG\b", name):
        return None
    return _best(load_peak_table() if table is None else table, name)


def ridge_point(peaks: DevicePeaks, dtype: Dtype) -> float | None:
    """Peak FLOP/s at `dtype` over peak bytes/s (FLOP/byte); None where the row has no figure for `dtype`.

    H100 SXM at bf16: 989.5e12 FLOP/s / 3350e9 B/s = 295.4 FLOP/byte.
    """
    tflops = peaks.peak_tflops(dtype)
    return None if tflops is None else _ridge(tflops, peaks.bandwidth_gbps)


def busiest_gpu(launches: pl.DataFrame) -> int | None:
    """The GPU id that ran the most kernel time in `launches` (`TraceFrames.launches`), the lower id on a tie:
    the GPU whose peaks a trace's roofline and MFU take; None without kernels."""
    busiest = (launches.filter((pl.col("kind") == Kind.KERNEL.value) & pl.col("device").is_not_null())
               .group_by("device").agg(ns=pl.col("dur_ns").sum()).sort("ns", "device", descending=[True, False]))
    return int(busiest["device"][0]) if busiest.height else None


def resolve_device(name: str | None, *, device_id: int | None = None, peak_tflops: float | None = None,
                   peak_bandwidth_gbps: float | None = None, dtype: Dtype | None = None) -> ResolvedDevice:
    """The peaks of one device by its reported name (a trace's deviceProperties entry, or a capture
    manifest's `device.name`); overrides win; never raises for an unknown name (its figures are None)."""
    _check_overrides(peak_tflops, peak_bandwidth_gbps, dtype)
    row = match_device(name) if name else None
    table_tflops = row.peak_tflops(dtype) if row is not None and dtype is not None else None
    table_bandwidth = row.bandwidth_gbps if row is not None else None
    return ResolvedDevice(
        device_id=device_id, name=name, row=row, dtype=dtype,
        peak_tflops=peak_tflops if peak_tflops is not None else table_tflops,
        peak_bandwidth_gbps=peak_bandwidth_gbps if peak_bandwidth_gbps is not None else table_bandwidth,
        tflops_from="override" if peak_tflops is not None else "table" if table_tflops is not None else None,
        bandwidth_from="override" if peak_bandwidth_gbps is not None
        else "table" if table_bandwidth is not None else None,
    )


def resolve_peaks(source: Source, *, peak_tflops: float | None = None, peak_bandwidth_gbps: float | None = None,
                  dtype: Dtype | None = None) -> ResolvedPeaks:
    """The peaks of every GPU the trace lists, never raising for an unknown device (its figures are None,
    its name in `.unknown`), so a report can say "unknown device". A trace listing no GPU gives no entry,
    or one pseudo-device (id and name None) when both overrides are given."""
    _check_overrides(peak_tflops, peak_bandwidth_gbps, dtype)
    meta = frames_of(source).trace.meta
    listed = [(d.id, d.name) for d in meta.devices]
    if not listed or not all(name for _, name in listed):
        captured = manifest_device(Path(meta.source.path), meta.rank)
        if captured is not None:
            listed = [(i, name or captured[1]) for i, name in listed] or [captured]
    devices = tuple(resolve_device(name, device_id=i, peak_tflops=peak_tflops,
                                   peak_bandwidth_gbps=peak_bandwidth_gbps, dtype=dtype) for i, name in listed)
    if not devices and peak_tflops is not None and peak_bandwidth_gbps is not None:
        devices = (resolve_device(None, peak_tflops=peak_tflops, peak_bandwidth_gbps=peak_bandwidth_gbps,
                                  dtype=dtype),)
    return ResolvedPeaks(dtype=dtype, devices=devices)


def gpu_vendor(source: Source) -> Vendor | None:
    """Who made the GPU the trace ran on: from the runtime versions Kineto records (cuda_*/cupti_* or
    hip_*/roctracer_*), else from its runtime calls' names (`cudaLaunchKernel`, `cuLaunchKernel` or
    `hipLaunchKernel`; older ROCm traces record no versions), else from the table row its devices match. None where
    nothing says (a CPU-only trace) or the signs disagree."""
    frames = frames_of(source)
    meta = frames.trace.meta
    said: set[str] = {_VERSION_VENDORS[key] for key in meta.versions if key in _VERSION_VENDORS}
    if not said:
        calls = frames.trace.runtime.select(
            hip=pl.col("name").str.starts_with("hip").any(), cuda=pl.col("name").str.starts_with("cu").any()
        ).collect(engine="in-memory")
        said = {vendor for vendor, column in (("AMD", "hip"), ("NVIDIA", "cuda")) if calls[column].item()}
    if not said:
        rows = [match_device(d.name) for d in meta.devices if d.name]
        said = {row.vendor for row in rows if row is not None}
    if said == {"NVIDIA"}:
        return "NVIDIA"
    return "AMD" if said == {"AMD"} else None


def manifest_device(trace_path: Path, rank: int | None) -> tuple[int | None, str] | None:
    """(index, name) of the GPU a stepscope capture's manifest records for this trace, for a trace whose
    deviceProperties lists no GPU or no name (vLLM's traces leave the name empty); None where no manifest
    next to the trace (or one directory up, for rank_N/) says `device.type` "cuda" for its rank.

        run/manifest_rank_1.json {"distributed": {"rank": 1}, "device": {"type": "cuda", "index": 1,
                                  "name": "NVIDIA H100 80GB HBM3"}}   -> (1, "NVIDIA H100 80GB HBM3") for rank 1
    """
    for home in (trace_path.parent, trace_path.parent.parent):
        for manifest in sorted(home.glob("manifest*.json")):
            try:
                doc = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a damaged manifest says nothing; the trace is still analyzed
            if not isinstance(doc, dict):
                continue
            distributed, device = doc.get("distributed"), doc.get("device")
            ranked = distributed.get("rank") if isinstance(distributed, dict) else None
            if rank is not None and ranked is not None and ranked != rank:
                continue
            if isinstance(device, dict) and device.get("type") == "cuda" and isinstance(device.get("name"), str) \
                    and device["name"]:
                index = device.get("index")
                return (index if isinstance(index, int) else None), device["name"]
    return None


def peaks_for(source: Source, *, peak_tflops: float | None = None, peak_bandwidth_gbps: float | None = None,
              dtype: Dtype | None = None) -> ResolvedPeaks:
    """`resolve_peaks`, but every GPU must end with a peak and a bandwidth (a peak only when `dtype` is
    given): a UsageError names the first device that does not and the option(s) that would supply it."""
    resolved = resolve_peaks(source, peak_tflops=peak_tflops, peak_bandwidth_gbps=peak_bandwidth_gbps,
                             dtype=dtype)
    if not resolved.devices:
        raise UsageError("the trace lists no GPU (its deviceProperties is empty), so there is no peak to "
                         "compare with; pass --peak-tflops and --peak-bandwidth to set one")
    for device in resolved.devices:
        if _missing(device):
            raise UsageError(_missing_message(device))
    return resolved


def _missing(device: ResolvedDevice) -> bool:
    """True when a figure the caller needs is absent (a peak only counts when a dtype was asked for)."""
    return device.peak_bandwidth_gbps is None or (device.dtype is not None and device.peak_tflops is None)


def _missing_message(device: ResolvedDevice) -> str:
    flags = [flag for flag, absent in (("--peak-tflops", device.dtype is not None and device.peak_tflops is None),
                                       ("--peak-bandwidth", device.peak_bandwidth_gbps is None)) if absent]
    what = f"GPU {device.device_id} ({device.name!r})" if device.device_id is not None else repr(device.name)
    if device.row is None:
        reason = f"{what} is not in stepscope's device peak table"
    else:
        reason = f"{what} matches {device.row.name}, whose table row has no {device.dtype} figure"
    return f"{reason}; pass {' and '.join(flags)} (dense peak of this GPU, TFLOP/s and GB/s)"


def _check_overrides(peak_tflops: float | None, peak_bandwidth_gbps: float | None, dtype: Dtype | None) -> None:
    for flag, value in (("--peak-tflops", peak_tflops), ("--peak-bandwidth", peak_bandwidth_gbps)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be a positive number, got {value}")
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


def _ridge(tflops: float, bandwidth_gbps: float) -> float:
    return tflops * 1e12 / (bandwidth_gbps * 1e9)


def _best(rows: tuple[DevicePeaks, ...], name: str) -> DevicePeaks | None:
    """The row whose pattern covers the most characters of `name`; None on no match or a tie between rows."""
    spans: list[tuple[int, DevicePeaks]] = []
    for row in rows:
        found = _compiled(row.pattern).search(name)
        if found is not None:
            spans.append((found.end() - found.start(), row))
    if not spans:
        return None
    longest = max(span for span, _ in spans)
    winners = [row for span, row in spans if span == longest]
    return winners[0] if len(winners) == 1 else None


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def _row(raw: Mapping[str, str | None], line: int) -> DevicePeaks:
    key = (raw.get("key") or "").strip()
    where = f"peak table line {line} ({key or 'no key'})"
    for column in ("key", "vendor", "name", "pattern", "source"):
        if not (raw.get(column) or "").strip():
            raise ValueError(f"{where}: empty {column!r}")
    pattern = (raw["pattern"] or "").strip()
    try:
        _compiled(pattern)
    except re.error as exc:
        raise ValueError(f"{where}: pattern {pattern!r} does not compile: {exc}") from None
    tflops = {path: _positive(raw.get(column), where, column) for column, path in _COMPUTE_COLUMNS.items()
              if (raw.get(column) or "").strip()}
    if not tflops:
        raise ValueError(f"{where}: no compute figure at all")
    return DevicePeaks(
        key=key, vendor=(raw["vendor"] or "").strip(), name=(raw["name"] or "").strip(), pattern=pattern,
        examples=tuple(e.strip() for e in (raw.get("examples") or "").split(";") if e.strip()),
        tflops=tflops, bandwidth_gbps=_positive(raw.get("bandwidth_gbps"), where, "bandwidth_gbps"),
        source=(raw["source"] or "").strip(), note=(raw.get("note") or "").strip(),
    )


def _positive(text: str | None, where: str, column: str) -> float:
    try:
        value = float((text or "").strip())
    except ValueError:
        raise ValueError(f"{where}: {column} is {text!r}, not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: {column} must be positive, got {value}")
    return value
