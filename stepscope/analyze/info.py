"""`stepscope info`: what a trace holds and what is odd about it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from stepscope.analyze.counters import COUNTER_RANGES_ONLY, RANGE_CATEGORY, range_events
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.meta import devices_by_id
from stepscope.analyze.schema import GPU_KINDS, Kind
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import tail_text

# Kineto writes ProfilerStep spans; a GPU event ending this long after the last one was cut by the window.
_DAY_NS = 86_400 * 10**9


@dataclass(frozen=True, kw_only=True)
class TraceInfo:
    """Headline facts about one trace, plus tables of event counts, devices and warnings."""

    trace_id: str
    source: str
    source_size_bytes: int
    sha256: str
    rank: int | None
    world_size: int | None
    rank_source: str | None
    trace_schema_version: int | None
    versions: dict[str, str]
    span_ns: int | None
    gpu_span_ns: int | None
    steps_found: int
    step_numbers: str
    step_source: str
    events: int
    flows: int
    profiler_options: dict[str, bool]
    counts_by_kind: pl.DataFrame
    devices: pl.DataFrame
    warnings: pl.DataFrame


def _step_range(steps: list[int]) -> str:
    if not steps:
        return "none"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])
    return ", ".join(str(s) for s in steps[:12]) + (" …" if len(steps) > 12 else "")


def profiler_options(trace: Trace) -> dict[str, bool]:
    """Which profiler options were on, from the trace's own keys where written, else from its events.

    record_shapes: ops carry Input Dims; profile_memory: [memory] events; with_stack: python_function
    events or Call stack args; with_modules: nn.Module frames or Module Hierarchy args; with_flops: flops.
    """
    ev = trace.events
    found = ev.select(
        shapes=pl.col("input_dims").is_not_null().any(),
        memory=(pl.col("kind") == Kind.MEMORY.value).any(),
        stacks=((pl.col("kind") == Kind.PYTHON_FUNCTION.value) | pl.col("call_stack").fill_null("").ne("")).any(),
        modules=(pl.col("name").str.starts_with("nn.Module:") | pl.col("module_hierarchy").fill_null("").ne("")).any(),
        flops=pl.col("flops").is_not_null().any(),
    ).collect(engine="in-memory").row(0, named=True)
    declared = trace.meta.profiler_options

    def flag(key: str, seen: bool) -> bool:
        value = declared.get(key)
        return bool(value) if isinstance(value, (bool, int)) else bool(seen)

    return {
        "record_shapes": flag("record_shapes", found["shapes"]),
        "profile_memory": flag("profile_memory", found["memory"]),
        "with_stack": flag("with_stack", found["stacks"]),
        "with_modules": flag("with_modules", found["modules"]),
        "with_flops": flag("with_flops", found["flops"]),
    }


_Add = Callable[[str, int, str], None]


def trace_warnings(source: Source) -> pl.DataFrame:
    """Oddities a reader should know before trusting the numbers: one row per finding (code, count, detail)."""
    frames = frames_of(source)
    rows: list[dict[str, object]] = []

    def add(code: str, count: int, detail: str) -> None:
        if count:
            rows.append({"code": code, "count": count, "detail": detail})

    _event_warnings(frames.trace, add)
    _counter_ranges(frames.trace, add)
    _launch_and_flow_warnings(frames, add)
    _step_warnings(frames, add)
    _capture_warnings(frames.trace, add)
    invalid = frames.trace.meta.invalid_utf8  # (the figures first: a terminal table cuts a long detail short)
    first = f", the first at byte {invalid.first_offset:,}" if invalid.first_offset is not None else ""
    add("invalid_utf8", invalid.strings,
        f"strings with bytes that are not UTF-8{first}: read as U+FFFD, every event kept (garbage some torch "
        "builds write into names)")
    unknown = frames.trace.meta.unknown_categories
    add("unknown_categories", sum(unknown.values()),
        "events of categories stepscope does not know, kept as kind 'other': " + ", ".join(sorted(unknown)))
    return pl.DataFrame(rows, schema={"code": pl.String, "count": pl.Int64, "detail": pl.String})


def _capture_warnings(trace: Trace, add: _Add) -> None:
    """A trace whose capture failed (the manifest beside it, `stepscope capture`'s, lists it with status "failed"):
    the script stopped partway, so its last step can be cut short (a trace exported at the failure)."""
    path = Path(trace.meta.source.path)
    try:
        manifests = sorted(path.parent.glob("manifest*.json"))
    except OSError:  # (the folder gone or unreadable: a trace ingested elsewhere)
        return
    for manifest in manifests:
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            named = {str(f.get("name")) for f in doc.get("files") or [] if isinstance(f, dict)}
        except (OSError, ValueError, AttributeError):  # a damaged manifest says nothing about the trace
            continue
        if doc.get("status") == "failed" and path.name in named:
            error = " ".join(str(doc.get("error") or "an error").split())
            error = error.split(". ")[0] if len(error) > 80 else error  # (an OOM's message runs to 600 characters)
            error = error if len(error) <= 80 else error[:79] + "…"
            add("capture_failed", 1, f"the capture that wrote this trace failed ({error}, {manifest.name}): the "
                "script stopped partway, so its last step can be cut short")
            return


def _event_warnings(trace: Trace, add: _Add) -> None:
    """Overlapping kernels on a stream, negative or missing times, a span (starts to ends) of more than a day."""
    gpu = trace.gpu.select("device", "stream", "ts_ns", "dur_ns", "kind")
    overlaps = (
        gpu.filter(pl.col("kind") == Kind.KERNEL.value)
        .sort("device", "stream", "ts_ns")
        .with_columns(prev_end=(pl.col("ts_ns") + pl.col("dur_ns")).shift().over("device", "stream"))
        .filter(pl.col("ts_ns") < pl.col("prev_end"))
        .select(pl.len())
        .collect(engine="in-memory")
        .item()
    )
    add("overlapping_kernels", int(overlaps),
        "kernels that start before the previous kernel on the same stream ended (clock skew or a "
        "profiler artefact; busy time uses the union, so nothing is double counted)")

    bad = trace.events.select(
        negative=(pl.col("dur_ns") < 0).sum(),
        missing_ts=pl.col("ts_ns").is_null().sum(),
        missing_dur=((pl.col("ph") == "X") & pl.col("dur_ns").is_null()).sum(),
        missing_ph=pl.col("ph").is_null().sum(),
        span=(pl.col("ts_ns").cast(pl.Float64) + pl.col("dur_ns").clip(lower_bound=0).fill_null(0)).max()
        - pl.col("ts_ns").min(),  # (in floats: a start and a duration near int64's end do not wrap)
    ).collect(engine="in-memory").row(0, named=True)
    add("negative_durations", int(bad["negative"] or 0), "events with a negative duration")
    add("missing_timestamps", int(bad["missing_ts"] or 0), "events without a usable ts (excluded from timing)")
    add("missing_durations", int(bad["missing_dur"] or 0), "complete (X) events without a usable dur")
    add("missing_phases", int(bad["missing_ph"] or 0),
        "events without a usable ph (kept, their kind taken from their category)")
    if bad["span"] is not None and bad["span"] > _DAY_NS:
        add("clock_span", 1, "events span more than a day: mixed clocks, or a corrupt timestamp or duration")


def _counter_ranges(trace: Trace, add: _Add) -> None:
    """A trace whose GPU work was recorded as counter ranges only: say why it has no GPU timeline. (Looked for
    only in a trace without GPU events, whose counts by kind say it holds other events.)"""
    by_kind = trace.meta.counts.by_kind
    if not by_kind.get(Kind.OTHER.value) or any(by_kind.get(k.value) for k in GPU_KINDS):
        return
    add(COUNTER_RANGES_ONLY, range_events(trace).height,
        f"{RANGE_CATEGORY} events and no kernel: the CUPTI range profiler (profiler_metrics) measured "
        "the GPU work, one event per kernel holding its hardware counters, not its time on the GPU, so there is "
        "no GPU timeline here (`stepscope counters` reads the counters); profile again without profiler_metrics "
        "for one")


def _launch_and_flow_warnings(frames: TraceFrames, add: _Add) -> None:
    """GPU work that starts before its launch call, flows with only one end."""
    trace = frames.trace
    launched_before = (
        frames.launches.filter(pl.col("launch_ts_ns").is_not_null() & (pl.col("ts_ns") < pl.col("launch_ts_ns")))
        .height
    )
    add("gpu_before_launch", int(launched_before),
        "GPU events that start before the runtime call that launched them (CPU and GPU clocks disagree)")

    flows = trace.flows.group_by("cat", "flow_id").agg(
        starts=(pl.col("ph") == "s").sum(), finishes=(pl.col("ph") == "f").sum()
    )
    dangling = flows.select(
        starts_only=((pl.col("starts") > 0) & (pl.col("finishes") == 0)).sum(),
        finishes_only=((pl.col("finishes") > 0) & (pl.col("starts") == 0)).sum(),
    ).collect(engine="in-memory").row(0, named=True)
    add("dangling_flow_starts", int(dangling["starts_only"] or 0),
        "flow starts with no finish (usually launches whose GPU work fell outside the window)")
    add("dangling_flow_finishes", int(dangling["finishes_only"] or 0),
        "flow finishes with no start")


def _step_warnings(frames: TraceFrames, add: _Add) -> None:
    """Steps inferred (no ProfilerStep) and a set-up iteration left out, GPU work outside the step spans, step
    numbers that skip."""
    steps = frames.profiler_steps
    found = frames.iterations
    if found.inferred:
        thread = f"{steps['pid'][0]}/{steps['tid'][0]}" if steps.height else "?"
        add("steps_inferred", found.spans.height,
            f"no ProfilerStep#N: the steps are iterations {found.source}, thread {thread}")
    if found.warmup is not None:
        add("setup_iteration_excluded", 1, found.warmup.text)
    add("tail_steps_excluded", frames.tail.height, tail_text(frames.tail) if frames.tail.height else "")
    gpu = frames.trace.gpu.select("ts_ns", "dur_ns")
    if steps.height:
        # past the last step's window, not its CPU span: a step's own GPU work running on after its CPU side
        # ended is inside its window (the window rule), the GPU lagging the CPU as it should
        last_end = int(frames.step_windows["end_ns"].max())  # type: ignore[arg-type]
        first_start = int(steps["ts_ns"].min())  # type: ignore[arg-type]
        late = gpu.filter(pl.col("ts_ns") + pl.col("dur_ns") > last_end).select(pl.len()).collect(
            engine="in-memory").item()
        add("gpu_after_last_step", int(late),
            "GPU events ending after the last step's window (work no step launched: outside every step figure)")
        early = gpu.filter(pl.col("ts_ns") < first_start).select(pl.len()).collect(engine="in-memory").item()
        add("gpu_before_first_step", int(early), "GPU events before the first step (outside the window)")
        numbers = steps["step"].sort().to_list()
        gaps = [b for a, b in zip(numbers, numbers[1:], strict=False) if b != a + 1]
        if not found.inferred:  # inferred steps skip only the set-up iteration, said above
            add("missing_steps", len(gaps), "ProfilerStep numbers are not consecutive")


def trace_info(source: Source) -> TraceInfo:
    """Devices, ranks, versions, time span, steps, counts by kind, profiler options, warnings."""
    frames = frames_of(source)
    trace = frames.trace
    meta = trace.meta
    counts = (
        trace.events.group_by("kind").agg(events=pl.len(), total_dur_ns=pl.col("dur_ns").sum())
        .sort("events", "kind", descending=[True, False]).collect(engine="in-memory")
    )
    gpu_span = trace.gpu.select(lo=pl.col("ts_ns").min(), hi=(pl.col("ts_ns") + pl.col("dur_ns")).max()).collect(
        engine="in-memory")
    lo, hi = gpu_span.row(0)
    used = trace.gpu.group_by("device").agg(gpu_events=pl.len()).collect(engine="in-memory")
    listed = devices_by_id(meta.devices, used["device"].drop_nulls().to_list())
    props = pl.DataFrame(
        [{"id": i, "name": d.name, "total_memory_bytes": d.total_memory_bytes, "num_sms": d.num_sms,
          "compute_capability": d.compute_capability} for i, d in listed.items()],
        schema={"id": pl.Int64, "name": pl.String, "total_memory_bytes": pl.Int64, "num_sms": pl.Int64,
                "compute_capability": pl.String},
    ).rename({"id": "device"})
    devices = used.join(props, on="device", how="left",
                        maintain_order="left").sort("device") if used.height else props.with_columns(
        gpu_events=pl.lit(0, pl.UInt32)).filter(pl.lit(False))
    steps = frames.profiler_steps["step"].sort().to_list()
    origin = meta.source
    versions = {k: str(v) for k, v in meta.versions.items()}
    return TraceInfo(
        trace_id=trace.trace_id,
        source=origin.path,
        source_size_bytes=origin.size_bytes or 0,
        sha256=origin.sha256,
        rank=meta.rank,
        world_size=meta.world_size,
        rank_source=meta.rank_source,
        trace_schema_version=meta.trace_schema_version,
        versions=versions,
        span_ns=meta.time.span_ns,
        gpu_span_ns=(hi - lo) if lo is not None and hi is not None else None,
        steps_found=len(steps),
        step_numbers=_step_range(steps),
        step_source=frames.iterations.source,
        events=meta.counts.events,
        flows=meta.counts.flows,
        profiler_options=profiler_options(trace),
        counts_by_kind=counts,
        devices=devices,
        warnings=trace_warnings(frames),
    )
