"""export_memory_timeline files: HTA's reference row, torch's own coalescing rule, a real CPU export."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stepscope.analyze.memory_categories import CATEGORIES, memory_categories, timeline_by_category
from stepscope.errors import TraceFormatError


def test_hta_reference_row(corpus: Path) -> None:
    t = timeline_by_category(corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz")
    assert list(t.row(744)[1:]) == [102440608, 102228128, 19395584, 0, 2618160128, 58417152, 41811968, 25494440]


def test_raw_rows_coalesce_like_torch(tmp_path: Path) -> None:
    rows = [[-1, 1, 512, 7], [-1, 1, 1024, 0], [5_000, 2, 256, 4], [5_000, 4, -512, 7], [9_000, 3, -256, 4],
            [9_000, 3, 256, 5]]
    path = tmp_path / "m.raw.json.gz"
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))
    t = timeline_by_category(path)
    assert t["time_us"].to_list() == [-1, 5, 9]
    assert t.select("parameter", "activation", "gradient", "unknown").rows() == [
        (1024, 0, 0, 512), (1024, 256, 0, 0), (1024, 0, 256, 0)]
    r = memory_categories(path)
    assert r.peak_total_bytes == 1536 and r.format == "raw events"


def test_plain_times_sizes_format(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps([[1, 2], [[0, 10, 0, 0, 0, 5, 0, 0, 0], [0, 10, 0, 0, 0, 7, 0, 0, 1]]]))
    r = memory_categories(path)
    assert r.peak_total_bytes == 18 and r.peak_time_us == 2 and len(CATEGORIES) == 8


def test_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError):
        memory_categories(path)


def test_a_real_cpu_export_from_the_capture_shim() -> None:
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_memory"
    path = next(sample.glob("*.memory_timeline.raw.json.gz"))
    r = memory_categories(path)
    shares = dict(r.at_peak.select("category", "size_bytes").rows())
    assert shares["activation"] > shares["parameter"] > 0 and shares["optimizer_state"] > 0
