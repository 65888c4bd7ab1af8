"""One colour per category, the same in every figure and in the HTML report.

Categories are the GPU work kinds (kernel, memcpy, memset), kernel categories (gemm, conv, …, as the
kernel analysis names them), idle-gap causes, memory series and the kinds of critical-path time. Unknown names
get a stable colour from a fixed cycle (hash of the name), so a category keeps its colour across figures and reports.
"""

from __future__ import annotations

import zlib

# Tableau-like, colour-blind friendly where it matters (busy vs idle vs transfers).
FIXED: dict[str, str] = {
    # GPU work kinds
    "kernel": "#4e79a7",
    "memcpy": "#f28e2b",
    "memset": "#edc948",
    # kernel categories
    "gemm": "#4e79a7",
    "conv": "#59a14f",
    "convolution": "#59a14f",
    "normalization": "#b6992d",
    "attention": "#b07aa1",
    "elementwise": "#76b7b2",
    "reduction": "#9c755f",
    "norm": "#86bcb6",
    "communication": "#e15759",
    "nccl": "#e15759",
    "collective": "#e15759",
    "triton": "#ff9da7",
    "memcpy_dtoh": "#f28e2b",
    "memcpy_htod": "#ffbe7d",
    "memcpy_dtod": "#d4a6c8",
    "other": "#bab0ac",
    # idle causes and memory series
    "idle": "#d3d3d3",
    "allocated": "#4e79a7",
    "reserved": "#a0cbe8",
    "peak": "#e15759",
    # export_memory_timeline categories
    "parameter": "#4e79a7",
    "optimizer_state": "#b07aa1",
    "input": "#f28e2b",
    "temporary": "#edc948",
    "activation": "#59a14f",
    "gradient": "#e15759",
    "autograd_detail": "#76b7b2",
    "unknown": "#bab0ac",
    # CPU phases of a step
    "data_loading": "#f28e2b",
    "forward": "#8cd17d",
    "backward": "#76b7b2",
    "optimizer": "#b07aa1",
    "other_cpu": "#bab0ac",
    "gpu_busy": "#4e79a7",
    "gpu_idle": "#d3d3d3",
    # CPU / device time in op bars
    "cpu": "#59a14f",
    "device": "#4e79a7",
    "before": "#a0cbe8",
    "after": "#4e79a7",
}

_CYCLE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
          "#9c755f", "#bab0ac", "#8cd17d", "#b6992d", "#499894", "#d37295", "#a0cbe8", "#ffbe7d")

# idle-gap causes get light tones so they never look like busy GPU time
IDLE_FIXED: dict[str, str] = {
    "data_loading": "#fdd0a2",
    "host_sync": "#fcbba1",
    "communication_wait": "#dadaeb",
    "memcpy_wait": "#f4cae4",
    "launch_overhead": "#cfd8dc",
    "other": "#eeeeee",
    "unknown": "#eeeeee",
}
_IDLE_CYCLE = ("#fdd0a2", "#fdae6b", "#c7c7c7", "#f4cae4", "#fff2ae", "#cbd5e8", "#e6f5c9", "#d9d9d9")


# critical-path time off the GPU (`depgraph.PathKind`): dark or strong tones no kernel category takes, so a
# path segment's colour says "CPU" or "kernel" at a glance; kernels and copies on a path keep their category's
PATH_FIXED: dict[str, str] = {
    "cpu": "#3d3d3d",
    "launch_overhead": "#17becf",
    "sync_wait": "#8c2d04",
    "data_loading": "#b35806",
    "idle": "#d3d3d3",
}


def color(name: str | None) -> str:
    """The colour of a category name (case-insensitive); stable for names not in the fixed table."""
    key = (name or "other").lower()
    if key in FIXED:
        return FIXED[key]
    return _CYCLE[zlib.crc32(key.encode()) % len(_CYCLE)]


def idle_color(cause: str | None) -> str:
    """The shading of an idle gap of this cause (light, distinct from every busy colour)."""
    key = (cause or "unknown").lower()
    if key in IDLE_FIXED:
        return IDLE_FIXED[key]
    return _IDLE_CYCLE[zlib.crc32(key.encode()) % len(_IDLE_CYCLE)]


def path_color(kind: str | None, category: str | None) -> str:
    """The colour of a critical-path segment: a kernel or copy by its category (as in the GPU lanes), other
    time by its kind (`PATH_FIXED`)."""
    key = (kind or "idle").lower()
    if key in ("kernel", "copy"):
        return color(category or key)
    return PATH_FIXED.get(key, color(key))
