"""CaptureOptions: the phase of every step, and validation (no torch needed)."""

from __future__ import annotations

import dataclasses

import pytest

from stepscope.capture import CaptureOptions
from stepscope.errors import CaptureError


def test_phases_run_skip_baseline_then_the_schedule_repeat_times() -> None:
    o = CaptureOptions(skip_first=1, baseline=2, wait=1, warmup=1, active=2, repeat=2)
    assert [o.phase(k) for k in range(o.total_steps + 1)] == [
        "skip", "baseline", "baseline",
        "wait", "warmup", "active", "active",
        "wait", "warmup", "active", "active",
        "done",
    ]
    assert o.profiler_start == 3 and o.total_steps == 11


@pytest.mark.parametrize("bad", [{"active": 0}, {"repeat": 0}, {"baseline": -1}, {"skip_first": -1},
                                 {"batch_size": 0}, {"snapshot_max_entries": 0}, {"device": "tpu"}])
def test_impossible_options_are_a_capture_error(bad: dict[str, object]) -> None:
    with pytest.raises(CaptureError):
        CaptureOptions(**bad)  # type: ignore[arg-type]


def test_options_are_frozen_and_keyword_only() -> None:
    o = CaptureOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.active = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        CaptureOptions(1)  # type: ignore[call-arg]


def test_timeline_needs_shapes_memory_and_stacks() -> None:
    assert CaptureOptions().timeline_wanted
    assert not CaptureOptions(with_stack=False).timeline_wanted
