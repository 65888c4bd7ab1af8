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
