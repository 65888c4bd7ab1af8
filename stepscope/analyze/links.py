"""The GPU-to-GPU link of a run, from the device table: what `stepscope comm` compares busbw with.

`data/device_links.csv` gives, for the devices of `data/device_peaks.csv` (same `key`) whose datasheet states
it, the link between GPUs of one node and the datasheet's figure, with its source. Datasheets quote the total
of both directions (H100 SXM: NVLink 900 GB/s, 450 GB/s each way; MI300X: 7 links x 128 GB/s); a collective
moves data one way per link at a time, and nccl-tests' busbw is meant to be read against that one-way peak,
so the link's peak here is half the datasheet's figure:

    NVIDIA H100 80GB HBM3 (h100-sxm)   NVLink 4, datasheet 900 GB/s  -> 450 GB/s per direction
    Tesla V100-SXM2-32GB               NVLink 2, datasheet 300 GB/s  -> 150 GB/s

A run's link is known only where every rank names its host and they name the same one (a collective between
hosts is bounded by the network, which a trace does not describe) and every rank's GPU maps to the same
link row; otherwise it is unknown, with the reason, and `--link-bandwidth GB/S` sets it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from stepscope.analyze.peaks import manifest_device, match_device
from stepscope.analyze.trace import Trace


@dataclass(frozen=True, kw_only=True)
class Link:
    """One device's link: `name` ("NVLink 4"), the datasheet's figure (both directions) and the peak per
    direction that busbw is read against, with the source."""

    key: str
    name: str
    datasheet_gbps: float
    source: str
    note: str

    @property
    def gbps(self) -> float:
        """The peak in one direction, GB/s: half the datasheet's two-way figure."""
        return self.datasheet_gbps / 2


@dataclass(frozen=True, kw_only=True)
class RunLink:
    """The link a run's busbw is compared with: `gbps` (None: unknown), where it comes from ("--link-bandwidth",
    or the link and device), and why it is unknown."""

    gbps: float | None
    described: str | None
    unknown_because: str | None


@cache
def load_link_table() -> dict[str, Link]:
    """The bundled link table, by device key."""
    text = resources.files("stepscope.analyze").joinpath("data/device_links.csv").read_text(encoding="utf-8")
    return parse_link_table(text)


def parse_link_table(text: str) -> dict[str, Link]:
    """Rows of a link table (key, link, datasheet_gbps, source, note); every row needs a source and a
    positive figure."""
    out: dict[str, Link] = {}
    for line, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        key, name, figure, source = (row.get(c) or "" for c in ("key", "link", "datasheet_gbps", "source"))
        try:
            gbps = float(figure)
        except ValueError:
            gbps = 0.0
        if not key or not name or gbps <= 0 or not source.strip():
            raise ValueError(f"device_links.csv line {line}: needs a key, a link, a positive datasheet_gbps and a "
                             "source")
        out[key] = Link(key=key, name=name, datasheet_gbps=gbps, source=source, note=row.get("note") or "")
    return out


def device_name(trace: Trace) -> str | None:
    """The name of the (first) GPU a trace lists, else the one its capture manifest records."""
    names = [d.name for d in trace.meta.devices if d.name]
    if names:
        return names[0]
    captured = manifest_device(Path(trace.meta.source.path), trace.meta.rank)
    return captured[1] if captured else None


def link_of(name: str | None) -> Link | None:
    """The link row of a device name (matched as the peak table matches it), None when the table has none."""
    row = match_device(name) if name else None
    return load_link_table().get(row.key) if row is not None else None


def run_link(hosts: Sequence[str | None], devices: Sequence[str | None], *,
             override_gbps: float | None = None) -> RunLink:
    """The link of a run whose ranks name these hosts and devices (module docstring); `override_gbps` wins."""
    if override_gbps is not None:
        return RunLink(gbps=override_gbps, described="--link-bandwidth", unknown_because=None)
    if not devices or not all(devices):
        return RunLink(gbps=None, described=None, unknown_because="a rank names no GPU")
    if not all(hosts):
        return RunLink(gbps=None, described=None,
                       unknown_because="the traces name no host, so ranks may be on several nodes (the network "
                                       "would bound their collectives)")
    if len(set(hosts)) > 1:
        return RunLink(gbps=None, described=None,
                       unknown_because=f"ranks on {len(set(hosts))} hosts: the network bounds collectives between "
                                       "them")
    links = {link_of(d) for d in devices}
    if None in links or len(links) != 1:
        return RunLink(gbps=None, described=None,
                       unknown_because=f"no link in the device table for {sorted(set(map(str, devices)))[0]}")
    (link,) = links
    assert link is not None
    return RunLink(gbps=link.gbps, unknown_because=None,
                   described=f"{link.name} ({link.key}: {link.datasheet_gbps:g} GB/s both ways, {link.gbps:g} each)")


__all__ = ["Link", "RunLink", "device_name", "link_of", "load_link_table", "parse_link_table", "run_link"]
