"""The bundled samples are real captures that the analyzer reads and that show what they claim."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from stepscope.analyze import load

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
NAMES = ["convnet_train", "item_in_forward", "item_in_forward_fixed", "transformer_memory",
         "pageable_vs_pinned", "dataloader_bound", "dataloader_fixed"]


@pytest.mark.parametrize("name", NAMES)
def test_each_sample_is_a_complete_capture_run(name: str, tmp_path: Path) -> None:
    run = SAMPLES / name
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["baseline"]["steps"] == 3
    for f in manifest["files"]:
        assert (run / f["name"]).stat().st_size == f["bytes"] < 2 * 1024 * 1024
    trace = load(run, cache_dir=tmp_path)
    assert trace.steps.collect()["step"].to_list() == [2, 3, 4]


def _per_step_ns(name: str, pattern: str, tmp_path: Path) -> float:
    trace = load(SAMPLES / name, cache_dir=tmp_path)
    total = trace.events.filter(pl.col("name").str.contains(pattern)).select(pl.col("dur_ns").sum()).collect().item()
    return float(total or 0) / trace.steps.collect().height


def test_the_dataloader_sample_waits_for_data_and_its_fix_does_not(tmp_path: Path) -> None:
    bound = load(SAMPLES / "dataloader_bound", cache_dir=tmp_path).steps.collect()["dur_ns"].mean()
    fixed = load(SAMPLES / "dataloader_fixed", cache_dir=tmp_path).steps.collect()["dur_ns"].mean()
    assert _per_step_ns("dataloader_bound", "DataLoader", tmp_path) > 0.5 * bound  # type: ignore[operator]
    assert _per_step_ns("dataloader_fixed", "DataLoader", tmp_path) < 0.25 * fixed  # type: ignore[operator]


def test_the_item_sample_syncs_once_per_layer_more_than_its_fix(tmp_path: Path) -> None:
    items = {n: load(SAMPLES / n, cache_dir=tmp_path).events.filter(pl.col("name") == "aten::item")
             .select(pl.len()).collect().item() for n in ("item_in_forward", "item_in_forward_fixed")}
    assert items["item_in_forward"] - items["item_in_forward_fixed"] == 6 * 3  # 6 layers x 3 active steps


def test_the_dataloader_sample_points_at_its_dataset_s_python_line(tmp_path: Path) -> None:
    # GIVEN the data-loading-bound sample, whose dataset builds each item in Python (no op shows that time)
    import gzip

    from stepscope.analyze.summary import verdict

    places = verdict(load(SAMPLES / "dataloader_bound", cache_dir=tmp_path)).places.rows()
    # THEN after the fetches, the place to look is the dataset's __getitem__ with the time the raw trace gives it
    # inside the DataLoader's fetches (a slow, obvious sum over the JSON), before any op
    path = next((SAMPLES / "dataloader_bound").glob("*.pt.trace.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    fetches = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and "DataLoader" in str(
        e.get("name")) and e.get("cat") == "user_annotation" and any(s["ts"] <= e["ts"] < s["ts"] + s["dur"]
                                                                       for s in steps)]
    getitem = [e for e in events if e.get("cat") == "python_function" and str(e["name"]).endswith("__getitem__")
               and any(a <= e["ts"] < b for a, b in fetches)]
    assert places[0][:2] == ("annotation", "DataLoader __next__")
    what, name, total_ns, count = places[1]
    assert (what, name, count) == ("python (inside DataLoader)", getitem[0]["name"], len(getitem))
    assert total_ns == pytest.approx(sum(e["dur"] for e in getitem) * 1000, abs=len(getitem))
