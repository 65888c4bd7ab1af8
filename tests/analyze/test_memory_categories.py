"""export_memory_timeline files: HTA's reference row, the coalescing rule, a real CPU export in both formats."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import polars as pl
import pytest

from stepscope.analyze.memory_categories import CATEGORIES, memory_categories, read_memory_timeline
from stepscope.errors import TraceFormatError


def test_hta_reference_row(corpus: Path) -> None:
    # GIVEN HTA's test file; THEN rows (runs of equal floor(t_ns / 1000) in file order, cumulative) match its row 744
    _, t = read_memory_timeline(corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz")
    assert list(t.row(744)[1:]) == [102440608, 102228128, 19395584, 0, 2618160128, 58417152, 41811968, 25494440]
    assert t.height == 7717 and t["time_us"].null_count() == 1


def test_hta_reference_row_is_in_the_full_timeline_by_its_number(corpus: Path) -> None:
    # GIVEN HTA's test file, read with every row kept; THEN its row 744 is the reference row
    r = memory_categories(corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz", buckets=None)
    row = r.timeline.filter(pl.col("row") == 744).row(0, named=True)
    assert [row[f"{c}_bytes"] for c in CATEGORIES] == [102440608, 102228128, 19395584, 0, 2618160128, 58417152,
                                                        41811968, 25494440]
    assert r.timeline.height == r.rows == 7717


def test_raw_rows_coalesce_like_torch(tmp_path: Path) -> None:
    # GIVEN two tensors from before profiling, an activation created, the unknown tensor destroyed in the same
    # microsecond, then the activation's version bump re-categorizing it as a gradient
    rows = [[-1, 1, 512, 7], [-1, 1, 1024, 0], [5_000, 2, 256, 4], [5_400, 4, -512, 7], [9_000, 3, -256, 4],
            [9_000, 3, 256, 5]]
    path = tmp_path / "m.raw.json.gz"
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))
    _, t = read_memory_timeline(path)
    assert t["time_us"].to_list() == [None, 5, 9]
    assert t.select("parameter", "activation", "gradient", "unknown").rows() == [
        (1024, 0, 0, 512), (1024, 256, 0, 0), (1024, 0, 256, 0)]
    r = memory_categories(path)
    assert (r.format, r.rows, r.peak_total_bytes, r.peak_since_start_ns, r.start_time_us) == (
        "raw events", 3, 1536, None, 5)
    assert r.timeline.select("since_start_ns", "total_bytes").rows() == [(None, 1536), (0, 1280), (4000, 1280)]
    assert r.at_peak.rows()[:2] == [("parameter", 1024, 1024 / 1536), ("unknown", 512, 512 / 1536)]


def test_plain_times_sizes_format(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps([[1, 2], [[0, 10, 0, 0, 0, 5, 0, 0, 0], [0, 10, 0, 0, 0, 7, 0, 0, 1]]]))
    r = memory_categories(path)
    assert (r.format, r.peak_total_bytes, r.peak_since_start_ns) == ("category totals", 18, 1000)
    assert dict(r.at_peak.select("category", "size_bytes").rows())["activation"] == 7


def test_the_timeline_is_cut_into_buckets_that_keep_each_buckets_highest_row(tmp_path: Path) -> None:
    rows = [[1000 * (i + 1), 2, 10 * (i % 7), 4] for i in range(1000)]
    path = tmp_path / "m.raw.json"
    path.write_text(json.dumps(rows))
    _, full = read_memory_timeline(path)
    r = memory_categories(path, buckets=10)
    assert r.timeline.height == 10 and full.height == 1000
    expected = [int(full["activation"][i * 100:(i + 1) * 100].max()) for i in range(10)]  # type: ignore[arg-type]
    assert r.timeline["total_bytes"].to_list() == expected
    assert r.timeline["row"].to_list()[:2] == [99, 199]  # (cumulative: each slice's last row is its highest)
    assert r.timeline_rows == "10 of 1,000: in each of 10 equal slices of the rows, the one with the largest total"


def test_without_buckets_the_timeline_holds_every_row_numbered_from_0(tmp_path: Path) -> None:
    # GIVEN 1,000 rows
    path = tmp_path / "m.raw.json"
    path.write_text(json.dumps([[1000 * (i + 1), 2, 10 * (i % 7), 4] for i in range(1000)]))
    # WHEN the timeline is asked for without buckets
    r = memory_categories(path, buckets=None)
    # THEN it holds every row, numbered as read_memory_timeline numbers them, and says so
    _, full = read_memory_timeline(path)
    assert r.timeline["row"].to_list() == list(range(1000)) and r.timeline_rows == "every row"
    assert r.timeline["activation_bytes"].to_list() == full["activation"].to_list()


@pytest.mark.parametrize("content", [b'{"traceEvents": []}', b"[[1, 2, 3]]", b"[[1, 2, \"x\", 4]]", b"\x1f\x8bnope",
                                     b"not json", b"[]"])
def test_bad_files_are_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        memory_categories(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("rows", "needle"), [
    ([[-1, 1, 100, 9]], "event 0 has category 9, not one of torch's 0..7"),
    ([[-1, 1, 100, 0], [5, 2, 1, -1], [6, 2, 1, 8]], "event 1 has category -1, not one of torch's 0..7"),
    ([[-1, 1, 100, 0], [5, 2, 1, None]], "event 1 has category null"),
])
def test_an_event_outside_the_categories_is_refused_not_dropped(tmp_path: Path, rows: list[list[int | None]],
                                                                 needle: str) -> None:
    # GIVEN a raw export with an event whose category torch does not write (0..7 only)
    path = tmp_path / "m.raw.json"
    path.write_text(json.dumps(rows))
    # WHEN it is read; THEN one error line names the file and the event, instead of a peak that leaves its bytes out
    with pytest.raises(TraceFormatError) as info:
        memory_categories(path)
    assert str(path) in str(info.value) and needle in str(info.value) and "\n" not in str(info.value)


def test_a_real_cpu_export_raw_and_plain_agree(tmp_path: Path) -> None:
    # GIVEN a tiny model trained two steps with Adam under the profiler, exported in both formats on CPU
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated in torch >= 2.9
        prof.export_memory_timeline(str(tmp_path / "t.raw.json.gz"), device="cpu")
        prof.export_memory_timeline(str(tmp_path / "t.json.gz"), device="cpu")
    raw, plain = memory_categories(tmp_path / "t.raw.json.gz"), memory_categories(tmp_path / "t.json.gz")
    # THEN both formats give the same peak by category, and the parameters before profiling are the model's
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert (raw.format, plain.format) == ("raw events", "category totals")
    assert raw.at_peak.select("category", "size_bytes").rows() == plain.at_peak.select("category", "size_bytes").rows()
    assert read_memory_timeline(tmp_path / "t.raw.json.gz")[1].row(0)[:2] == (None, param_bytes)
    shares = dict(raw.at_peak.select("category", "size_bytes").rows())
    assert shares["optimizer_state"] >= 2 * param_bytes and shares["activation"] > 0 and shares["gradient"] > 0


def test_a_real_cpu_export_from_the_capture_shim() -> None:
    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "transformer_memory"
    path = next(sample.glob("*.memory_timeline.raw.json.gz"), None)
    if path is None:
        pytest.skip("sample_traces/transformer_memory is not present")
    r = memory_categories(path)
    shares = dict(r.at_peak.select("category", "size_bytes").rows())
    assert shares["activation"] > shares["parameter"] > 0 and shares["optimizer_state"] > 0
