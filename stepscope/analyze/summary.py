"""`stepscope summary`: one verdict on what bounds the training loop, per step and overall, with evidence.

The verdict comes from an ordered rule table, `RULES` (first rule whose condition holds wins), in the
spirit of Nsight Systems' expert rules and the TensorBoard plugin's advice; `rules_markdown` renders it for the
README and the HTML report shows the same rows. Fractions are of the step's wall time (tb_plugin's step window,
see `stepscope.analyze.steps`), summed over steps for the overall verdict (over the GPU span when the trace has
no ProfilerStep, and over the whole trace, first event to last, when it has no GPU work either). Data loading
comes first: a loop that waits for data is data-loading-bound with or without a GPU (a CPU-only capture of
such a loop should say so, not just "no GPU"), with advice that fits each. A sync counts while the GPU is busy
< 60% only: a sync while the GPU is busy only waits for work that had to run anyway.
A figure the trace cannot give (None: no GPU work, an empty window) never passes a test.

Syncs bound the step only where removing them could save SYNC_MIN of it, and that saving is at most the smaller of
two figures: the GPU's idle behind the syncs (`sync_idle_fraction`: the GPU ran dry while the host waited, then
waited for the next launch) and the host's time blocked in them (`sync_fraction`). Without the syncs the CPU still
does all its other work (the step >= the step less the blocked time) and the GPU all of its own (the step >= the
step less the idle behind syncs). So a loop whose CPU is the bottleneck, whose syncs return at once and whose GPU
then waits for the CPU's slow launches, is launch_bound, not sync_bound (`item_in_forward_cuda`: 13.8% idle
behind syncs, 0.8% blocked in them; `whatif --no-sync` predicts 0.8% and the fix is no faster). A trace that
records no runtime calls (`runtime_calls` 0: no launch linked to its GPU work, no sync call) cannot show the
blocked time: there the idle alone decides.

Communication (DESIGN.md, "Distributed runs"; `_comm_events.comm_split`, the definition `stepscope ranks` uses):
`exposed_comm_fraction` is the collectives' time (NCCL/RCCL kernels, or a CPU backend's collective ops) not
covered by compute kernels on the same device, inside the step windows (over devices as one timeline, as GPU
busy is). It comes before launch_bound and gpu_bound, so a GPU busy with NCCL is never called compute-bound or
launch-bound, and before the sync-calls clause of sync_bound, since a host sync during an exposed collective
waits for the communication. Threshold COMM_MIN = 20%: DDP's last gradient bucket, the optimizer's wait and a
few small collectives are exposed in any data-parallel step (a few % to ~15% in a well-tuned job); 20% is where
communication, not compute or the host, is the step's largest cost (the dlrm ranks that wait for their
straggler: 25% to 56%; the straggler itself: 13%, its GPU idle behind the host 52%).

What one rank's trace cannot say: whether the time inside a collective is the transfer or waiting for a later
rank (the latency is the shortest duration across ranks, `stepscope comm`). It gives a hint only:
`comm_excess_fraction`, the collectives' time above the fastest call of their kind on this rank (same collective
and message size), a share of the step: waiting for a later rank, or a slower transfer; no rule tests it, and
the straggler verdict is a run's (`stepscope summary RUN`, `run_summary`).

Before/after: a 100 ms step with 30 ms of exposed data loading and 40 ms GPU busy is data_loading_bound
(data loading comes before launch_bound); with 5 ms of data loading it is launch_bound.

How close the call was: `decision_margin` is the nearest threshold one figure could cross alone to change the
verdict (GPU busy 59.6% is launch_bound, 0.4 points from gpu_bound), and `runner_up` the rule that decides next.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Literal

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze._comm_events import CommSplit, comm_split, gpu_work, per_window, rank_calls
from stepscope.analyze._text import plural
from stepscope.analyze.blame import (
    host_memory_unsaid,
    is_library_frame,
    is_sync_runtime,
    short_name,
    source_frames,
    step_row_name,
)
from stepscope.analyze.counters import COUNTER_RANGES_ONLY
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.gaps import GapCause, GapsResult, gpu_gaps
from stepscope.analyze.graph_capture import GRAPH_LAUNCH
from stepscope.analyze.info import trace_warnings
from stepscope.analyze.kernels import KernelCategory, KernelsResult, kernel_summary
from stepscope.analyze.loading import exposed_in_window
from stepscope.analyze.peaks import Vendor
from stepscope.analyze.roofline import RooflineResult, roofline
from stepscope.analyze.schema import Kind
from stepscope.analyze.serving import ServingResult, serving_iterations
from stepscope.analyze.steps import DATALOADER_PATTERN, StepsResult, step_breakdown
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import cpu_spans, with_step
from stepscope.analyze.workload import workload_evidence

TINY_KERNEL_NS = 10_000

DATA_LOADING_MIN = 0.10
SYNC_MIN = 0.10
MEMCPY_MIN = 0.10
PAGEABLE_MIN = 0.05
GPU_BUSY_MIN = 0.60
MOST = 0.50  # "most kernel time": graph-replayed, compiled, memory-bound
COMM_MIN = 0.20  # exposed communication: see the module docstring


class Verdict(enum.Enum):
    """What bounds the step."""

    NO_GPU = "no_gpu"
    DATA_LOADING_BOUND = "data_loading_bound"
    SYNC_BOUND = "sync_bound"
    TRANSFER_BOUND = "transfer_bound"
    COMMUNICATION_BOUND = "communication_bound"
    LAUNCH_BOUND = "launch_bound"
    GPU_BOUND = "gpu_bound"
    STRAGGLER = "straggler"  # a run's verdict only (`run_summary`): one rank cannot see another arrive late


Evidence = dict[str, float | None]


@dataclass(frozen=True)
class Test:
    """`evidence[key] < threshold` or `>= threshold`; an unknown figure (None, or absent) passes neither."""

    key: str
    op: Literal["<", ">="]
    threshold: float

    def holds(self, evidence: Evidence) -> bool:
        value = evidence.get(self.key)
        if value is None:
            return False
        return value < self.threshold if self.op == "<" else value >= self.threshold


def _below(key: str, threshold: float) -> Test:
    return Test(key, "<", threshold)


def _at_least(key: str, threshold: float) -> Test:
    return Test(key, ">=", threshold)


NO_GPU_WORK = _below("gpu_events", 1)
GPU_WORK = _at_least("gpu_events", 1)


@dataclass(frozen=True)
class Rule:
    """One row of the rule table: the verdict is `verdict` when every test of one of the groups `any_of` holds
    (`when` says so in words)."""

    verdict: Verdict
    any_of: tuple[tuple[Test, ...], ...]
    when: str
    advice: str

    def condition(self, evidence: Evidence) -> bool:
        """Whether this rule holds for `evidence` (regardless of the rules before it)."""
        return any(all(t.holds(evidence) for t in group) for group in self.any_of)


_COMM_ADVICE = ("Communication is not hidden behind compute. {}Waiting inside a collective is often another rank "
                "arriving late: `stepscope summary RUN` (or `stepscope ranks RUN`) on every rank's trace names a "
                "straggler; `stepscope comm RUN` gives each collective's bandwidth by message size.")
_LOADER_ADVICE = ("Load data in parallel: DataLoader(num_workers>0, {}persistent_workers=True, prefetch_factor), "
                  "and move decoding/augmentation off the training process.")

_SYNC_ADVICE = ("Remove host syncs from the loop: .item(), .cpu(), print(tensor), torch.cuda.synchronize(), "
                "blocking copies; log metrics every N steps.")

RULES: tuple[Rule, ...] = (
    # without a GPU there is nothing to pin memory for: the same verdict, advice without pin_memory
    Rule(Verdict.DATA_LOADING_BOUND, ((_at_least("data_loading_fraction", DATA_LOADING_MIN), NO_GPU_WORK),),
         f"exposed data loading >= {DATA_LOADING_MIN:.0%} of the step, no GPU work in the trace",
         _LOADER_ADVICE.format("")),
    Rule(Verdict.DATA_LOADING_BOUND, ((_at_least("data_loading_fraction", DATA_LOADING_MIN),),),
         f"exposed data loading >= {DATA_LOADING_MIN:.0%} of the step",
         _LOADER_ADVICE.format("pin_memory=True, ")),
    # a CPU backend (gloo) waiting in its collectives: say so before "no GPU"
    Rule(Verdict.COMMUNICATION_BOUND, ((_at_least("exposed_comm_fraction", COMM_MIN), NO_GPU_WORK),),
         f"CPU collectives (gloo …) >= {COMM_MIN:.0%} of the step, no GPU work in the trace",
         _COMM_ADVICE.format("On GPUs use the NCCL backend; overlap the all-reduce with backward (DDP buckets: "
                             "bucket_cap_mb) and send fewer, larger messages. ")),
    # kernels measured by the CUPTI range profiler: no timeline, but counters to read instead
    Rule(Verdict.NO_GPU, ((NO_GPU_WORK, _at_least("counter_ranges", 1)),),
         "no GPU timeline: the kernels were measured by the CUPTI range profiler (counter ranges)",
         "The trace was recorded with profiler_metrics: each kernel has its hardware counters, not its time, so "
         "nothing here says where the step's time goes. `stepscope counters` gives the counters and FLOPs per "
         "kernel and op; profile again without profiler_metrics (a schedule, ProfilerActivity.CUDA) for the "
         "timeline."),
    Rule(Verdict.NO_GPU, ((NO_GPU_WORK,),), "no GPU work in the trace",
         "No GPU kernel, memcpy or memset was recorded: a CPU-only run, or GPU activity was not captured "
         "(add ProfilerActivity.CUDA). See `stepscope ops` for where the CPU time goes."),
    # removing the syncs saves at most the smaller of the two (the module docstring); without runtime calls the
    # host's blocked time is unseen, and the idle alone decides
    Rule(Verdict.SYNC_BOUND, ((_at_least("sync_idle_fraction", SYNC_MIN), _at_least("sync_fraction", SYNC_MIN)),
                              (_at_least("sync_idle_fraction", SYNC_MIN), _below("runtime_calls", 1))),
         f"GPU idle behind host syncs >= {SYNC_MIN:.0%}, host blocked in them >= {SYNC_MIN:.0%} (idle alone "
         "without runtime calls)", _SYNC_ADVICE),
    # before launch/gpu_bound: NCCL kernels are not compute; before the sync calls: those wait for the collective
    Rule(Verdict.COMMUNICATION_BOUND, ((GPU_WORK, _at_least("exposed_comm_fraction", COMM_MIN)),),
         f"exposed communication (not overlapped by compute kernels) >= {COMM_MIN:.0%} of the step",
         _COMM_ADVICE.format("Overlap it: with DDP, tune bucket_cap_mb (smaller buckets start all-reduces earlier "
                             "in backward) and set gradient_as_bucket_view=True; with FSDP, prefetch "
                             "(backward_prefetch=BACKWARD_PRE, forward_prefetch=True); accumulate gradients "
                             "under no_sync() or grow the per-rank batch so each step communicates less per sample. ")),
    Rule(Verdict.SYNC_BOUND, ((_at_least("sync_fraction", SYNC_MIN), _below("gpu_busy_fraction", GPU_BUSY_MIN)),),
         f"sync calls >= {SYNC_MIN:.0%} with GPU busy < {GPU_BUSY_MIN:.0%}", _SYNC_ADVICE),
    Rule(Verdict.TRANSFER_BOUND, ((_at_least("memcpy_fraction", MEMCPY_MIN),),
                                  (_at_least("pageable_memcpy_fraction", PAGEABLE_MIN),),
                                  (_at_least("memcpy_idle_fraction", MEMCPY_MIN),)),
         f"memcpy >= {MEMCPY_MIN:.0%}, pageable memcpy >= {PAGEABLE_MIN:.0%}, or GPU idle waiting for copies "
         f">= {MEMCPY_MIN:.0%}",
         "Pin host memory (pin_memory=True) and copy with non_blocking=True; keep tensors on the GPU "
         "between steps."),
    # launch-bound code that already replays graphs or runs compiled kernels: advice for what is left
    Rule(Verdict.LAUNCH_BOUND, ((_below("gpu_busy_fraction", GPU_BUSY_MIN), _at_least("graph_replay_fraction", MOST)),),
         f"GPU busy < {GPU_BUSY_MIN:.0%} of the step, most kernel time replayed from CUDA/HIP graphs",
         "Kernels already replay from CUDA/HIP graphs, so their launch cost is gone: the GPU waits for the CPU "
         "between replays (eager ops between piecewise graphs, scheduling, sampling, Python). Capture more of the "
         "step in one graph and batch more work per step; `stepscope graphs` shows the replays and the Python "
         "line launching each."),
    Rule(Verdict.LAUNCH_BOUND, ((_below("gpu_busy_fraction", GPU_BUSY_MIN), _at_least("compiled_fraction", MOST)),),
         f"GPU busy < {GPU_BUSY_MIN:.0%} of the step, most kernel time in compiled (Triton) kernels",
         "The code already runs compiled (torch.compile / inductor): what is left is launching its kernels. Add "
         "CUDA graphs (torch.compile(mode=\"reduce-overhead\")), remove graph breaks and recompilations "
         "(TORCH_LOGS=graph_breaks,recompiles), compile the uncompiled share, batch more work per step."),
    Rule(Verdict.LAUNCH_BOUND, ((_below("gpu_busy_fraction", GPU_BUSY_MIN),),),
         f"GPU busy < {GPU_BUSY_MIN:.0%} of the step",
         "The CPU cannot keep the GPU fed: fuse small ops (torch.compile), use CUDA graphs, larger batches; "
         "see tiny_kernel_fraction and the top ops by launches."),
    # a busy GPU whose matmuls sit left of the ridge point: more bandwidth per FLOP, not faster math
    Rule(Verdict.GPU_BOUND, ((GPU_WORK, _at_least("memory_bound_fraction", MOST)),),
         "otherwise, with most of the FLOP ops' GPU time memory-bound on the device's roofline",
         "The GPU is busy but bandwidth-bound: its matmuls move more bytes than their math needs (low arithmetic "
         "intensity, as in decode and small batches), so faster math will not help. Batch more tokens or requests "
         "per step, quantize weights or the KV cache (int8/fp8), fuse memory-bound ops; see `stepscope flops`."),
    Rule(Verdict.GPU_BOUND, ((GPU_WORK, _at_least("graph_replay_fraction", MOST)),),
         "otherwise, with most kernel time replayed from CUDA/HIP graphs",
         "The GPU is busy with graph-replayed kernels, so launch overhead is already gone: what is left is the "
         "kernels themselves. See how far each op is from the roofline (`stepscope flops`; replayed kernels count "
         "for their ops with a profile of the graph capture, `--graph-capture` or one in the run directory): decode "
         "matmuls are usually bandwidth-bound, helped by larger batches and quantized weights, not faster math."),
    Rule(Verdict.GPU_BOUND, ((GPU_WORK,),), "otherwise, with GPU work in the trace",
         "The GPU is busy: speed up the longest compute kernels (mixed precision, channels_last, better "
         "algorithms)."),
)

#: what each figure a rule tests is called in a margin ("GPU busy 59.6% < 60%")
FIGURE_NAMES = {
    "gpu_busy_fraction": "GPU busy", "data_loading_fraction": "exposed data loading", "sync_fraction": "sync calls",
    "memcpy_fraction": "memcpy", "pageable_memcpy_fraction": "pageable memcpy",
    "sync_idle_fraction": "GPU idle behind host syncs", "memcpy_idle_fraction": "GPU idle waiting for copies",
    "exposed_comm_fraction": "exposed communication",
}


def decide(evidence: Evidence) -> Rule:
    """The first rule of `RULES` whose condition holds for `evidence` (one always does where `gpu_events` is
    known: no_gpu or gpu_bound)."""
    return next(r for r in RULES if r.condition(evidence))


@dataclass(frozen=True, kw_only=True)
class Margin:
    """How close the call was: the figure nearest to a threshold whose crossing alone changes the verdict, the
    threshold, the distance between them (in fraction points), and the verdict past the threshold.

    GPU busy 59.6% with nothing else near a threshold: figure gpu_busy_fraction, value 0.596, threshold 0.60,
    margin 0.004, towards gpu_bound; text "GPU busy 59.6% < 60%: 0.4 points from gpu_bound"."""

    figure: str
    value_fraction: float
    threshold_fraction: float
    margin_fraction: float
    towards: Verdict
    text: str


def _margin_text(figure: str, value: float, threshold: float, towards: Verdict) -> str:
    distance = abs(value - threshold)
    digits = 1 if distance >= 0.001 else 2  # 59.96% is not "60.0% < 60%"
    side = "<" if value < threshold else ">="
    return (f"{FIGURE_NAMES.get(figure, figure)} {value:.{digits}%} {side} {threshold:.0%}: "
            f"{100 * distance:.{digits}f} points from {towards.value}")


def _flips(evidence: Evidence, decided: Verdict) -> list[tuple[Margin, Rule]]:
    """Each threshold a fraction of `evidence` could cross alone to change the verdict, with the rule that would
    decide past it; nearest first, relative to the threshold (0.4 points from 60% is nearer than 0.4 points from
    5%, and a figure at 0 is as far as can be from any), ties in table order. Counts (gpu_events) are not a
    matter of degree. `decided`: `evidence`'s own verdict (`decide`)."""
    seen: set[tuple[str, float]] = set()
    out = []
    for test in (t for rule in RULES for group in rule.any_of for t in group):
        value = evidence.get(test.key)
        if not test.key.endswith("_fraction") or value is None or (test.key, test.threshold) in seen:
            continue
        seen.add((test.key, test.threshold))
        # just across the threshold: tests are `< t` or `>= t`, so t itself and the float below it differ
        across = test.threshold if value < test.threshold else math.nextafter(test.threshold, -math.inf)
        rule = decide({**evidence, test.key: across})
        if rule.verdict is not decided:
            out.append((Margin(figure=test.key, value_fraction=value, threshold_fraction=test.threshold,
                               margin_fraction=abs(value - test.threshold), towards=rule.verdict,
                               text=_margin_text(test.key, value, test.threshold, rule.verdict)), rule))
    return sorted(out, key=lambda f: f[0].margin_fraction / f[0].threshold_fraction)


def decision_margin(evidence: Evidence) -> Margin | None:
    """The nearest threshold (relative to itself) that one figure could cross alone to change the verdict (None
    where no figure can: a CPU-only trace without data loading figures).

    Before/after: GPU busy 59.6%, nothing else near a threshold: launch_bound, "GPU busy 59.6% < 60%: 0.4 points
    from gpu_bound"; GPU busy 30% with exposed data loading 9.8%: still launch_bound, but "exposed data loading
    9.8% < 10%: 0.2 points from data_loading_bound"."""
    return judge(evidence)[2]


def runner_up(evidence: Evidence) -> Rule | None:
    """The rule that would decide next: the first rule after the deciding one, of another verdict, whose condition
    also holds; where none does (gpu_bound, no_gpu), the rule that decides past the nearest threshold
    (`decision_margin`): the one that would have decided had the verdict's own condition not held."""
    return judge(evidence)[1]


def judge(evidence: Evidence) -> tuple[Rule, Rule | None, Margin | None]:
    """The deciding rule (`decide`), the runner-up (`runner_up`) and the margin (`decision_margin`) of `evidence`,
    its thresholds tried once for both (a summary judges every step)."""
    decided = decide(evidence)
    flips = _flips(evidence, decided.verdict)
    after = RULES[RULES.index(decided) + 1:]
    nxt = next((r for r in after if r.verdict is not decided.verdict and r.condition(evidence)), None)
    if nxt is None and flips:
        nxt = flips[0][1]
    return decided, nxt, flips[0][0] if flips else None


def rules_markdown() -> str:
    """`RULES` as a Markdown table (order, verdict, when, advice): the README's copy between its
    `<!-- verdict-rules:start -->` and `<!-- verdict-rules:end -->` lines, which a test keeps equal to this."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| # | verdict | when | advice |", "|---|---|---|---|"]
    lines += [f"| {i} | `{r.verdict.value}` | {cell(r.when)} | {cell(r.advice)} |" for i, r in enumerate(RULES, 1)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class SummaryResult:
    """Overall verdict and advice, how close the call was (`margin`, `decision_margin`) and the rule that would
    decide next (`runner_up`, its `when` as `runner_up_reason`), the evidence behind it, per-step verdicts (with
    their runner-up and margin) and the top places to look, the rule table as applied (`rules`: holds, matched,
    runner_up), and the trace's warnings (`info.trace_warnings`: missing timestamps, negative durations …).
    Communication (see the module docstring): `exposed_comm_fraction` (a rule's figure), `comm_excess_fraction` and
    `comm_note` (one rank's hint at waiting in its collectives, and what it cannot tell)."""

    verdict: Verdict
    reason: str
    advice: str
    margin: Margin | None
    runner_up: Verdict | None
    runner_up_reason: str | None
    steps_found: int
    wall_ns: int
    gpu_busy_fraction: float | None
    data_loading_fraction: float | None
    sync_fraction: float | None
    memcpy_fraction: float | None
    pageable_memcpy_fraction: float | None
    sync_idle_fraction: float | None
    memcpy_idle_fraction: float | None
    launch_idle_fraction: float | None
    other_idle_fraction: float | None = None  # GPU idle whose cause `gaps` could not name (cause "other")
    data_loading_idle_fraction: float | None = None  # GPU idle while the host loaded data (gaps' data_loading)
    comm_idle_fraction: float | None = None  # GPU idle before a collective (gaps' communication_wait)
    tiny_kernel_fraction: float | None
    sync_calls: int
    per_step: pl.DataFrame
    places: pl.DataFrame
    rules: pl.DataFrame
    warnings: pl.DataFrame
    mfu_fraction: float | None = None
    profile_next: str | None = None
    graph_replay_fraction: float | None = None  # `workload.workload_evidence`: shares of kernel time / FLOP-op time
    compiled_fraction: float | None = None
    memory_bound_fraction: float | None = None
    exposed_comm_fraction: float | None = None  # collectives not overlapped by compute (`_comm_events.comm_split`)
    comm_excess_fraction: float | None = None  # collective time above the fastest of its kind: a hint at waiting
    comm_note: str | None = None
    sync_note: str | None = None  # `_sync_note`: GPU idle behind syncs whose removal could not save it
    idle_note: str | None = None  # `_idle_note`: launch_bound by GPU busy alone, its idle mostly of no cause found
    serving: str | None = None  # `serving.ServingResult.line`: the engine iterations of an inference server
    predicted_savings: pl.DataFrame | None = None  # `savings.predicted_savings` (summary --predict): each fix, replayed


#: the systems profiler's command, by GPU vendor, where the CPU makes the GPU wait. NVIDIA: Nsight Systems over a
#: capture range the program opens and closes (torch.cuda.profiler.start()/stop() around a few steps), CUDA API
#: and NVTX with the Python backtrace of each CUDA call. AMD: rocprofv3's runtime trace (HIP API, ROCTx markers,
#: kernel dispatches and copies), written for Perfetto
SYSTEMS_COMMANDS: dict[Vendor, str] = {
    "NVIDIA": "nsys profile --trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi --capture-range-end=stop "
              "--python-backtrace=cuda --sample=none -o stepscope_nsys python train.py",
    "AMD": "rocprofv3 --runtime-trace --output-format pftrace -d stepscope_rocprof -- python train.py",
}


def profile_next_command(verdict: Verdict, limits: RooflineResult) -> str | None:
    """The tool to run next where a trace cannot say more, the GPU vendor's (`limits.vendor`; NVIDIA's where the
    trace does not say): for a GPU-bound step, the kernel profiler on the kernel furthest below its roofline
    (`roofline.handoff`); for a launch-, sync- or transfer-bound step, the systems profiler with the CPU side
    (`SYSTEMS_COMMANDS`); None otherwise (data loading is the input pipeline's)."""
    if verdict is Verdict.GPU_BOUND and limits.handoff.height:
        return str(limits.handoff["command"][0])
    if verdict in (Verdict.LAUNCH_BOUND, Verdict.SYNC_BOUND, Verdict.TRANSFER_BOUND):
        return SYSTEMS_COMMANDS[limits.vendor or "NVIDIA"]
    return None


def _sync_calls(trace: Trace) -> pl.DataFrame:
    """Synchronizing runtime calls, by the one definition `overlap`, `gaps` and `transfers` use too."""
    return trace.runtime.filter(is_sync_runtime(pl.col("name")) & pl.col("dur_ns").is_not_null()).select(
        "name", "ts_ns", "dur_ns", "external_id").collect(engine="in-memory")


def _per_step(frames: TraceFrames, steps: pl.DataFrame, syncs: pl.DataFrame) -> pl.DataFrame:
    gpu = frames.gpu_by_step
    extra = gpu.group_by("step").agg(
        gpu_events=pl.len(),
        pageable_ns=_pageable_ns(),
        tiny=(pl.col("dur_ns").filter(pl.col("kind") == Kind.KERNEL.value) < TINY_KERNEL_NS).sum(),
        kernels=(pl.col("kind") == Kind.KERNEL.value).sum(),
    )
    # the steps' sync calls (those a step's CPU span issued: not the profiler harness's before and after the steps),
    # their time inside each step's window, which the share divides by (a call at the start of a step's CPU span that
    # waits for the previous step's GPU work runs in that step's window, before its own opens: tracelens' Qwen, 14 ms
    # before a 35 ms window), and the calls that overlap the window
    own = with_step(syncs, cpu_spans(frames.profiler_steps), at="ts_ns").filter(pl.col("step").is_not_null())
    calls = own.lazy().select(start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    w = steps.lazy().select("step", w_start="start_ns", w_end="end_ns")
    sync = (calls.join_where(w, pl.col("start_ns") < pl.col("w_end"), pl.col("end_ns") > pl.col("w_start"))
            .group_by("step").agg(sync_calls=pl.len()).collect(engine="in-memory")
            .join(per_window(intervals.union(calls, start="start_ns"), steps, "sync_ns"), on="step", how="left"))
    return (
        steps.join(extra, on="step", how="left", maintain_order="left")
        .join(sync, on="step", how="left", maintain_order="left")
        .with_columns(pl.col("gpu_events", "tiny", "kernels", "sync_ns", "sync_calls", "gpu_busy_ns",
                             "memcpy_ns").fill_null(0),
                      pageable_ns=pl.when(pl.col("gpu_events").is_null()).then(0).otherwise("pageable_ns"))
    )


def _blocked(syncs: pl.LazyFrame, *, by: list[str], within: pl.LazyFrame | None = None) -> pl.LazyFrame:
    """by..., sync_ns: the host's time blocked in sync calls inside `within` (by..., start_ns, end_ns: the windows
    the share divides by; None: no limit), overlapping calls (syncs on two threads at once) counted once, so the
    figure is a share of the step, never more than all of it."""
    calls = syncs.select(*by, start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    inside = calls if within is None else intervals.clip(calls, within, by=by)
    return intervals.union_length(inside, by=by, start="start_ns").rename({"length_ns": "sync_ns"})


def _pageable_ns() -> pl.Expr:
    """Over GPU events (kind, name, dur_ns): the time of the copies from or to pageable host memory; null where a
    host copy's name does not say pageable or pinned (AMD's), since the figure would then read as "all pinned"."""
    copy = pl.col("kind") == Kind.MEMCPY.value
    return pl.when(~(copy & host_memory_unsaid(pl.col("name"))).any()).then(
        pl.col("dur_ns").filter(copy & pl.col("name").str.contains("Pageable")).sum())


def _evidence(wall: int, gpu_events: int, busy: int, dl: int, sync: int, memcpy: int, pageable: int | None,
              tiny: int, kernels: int, idle: dict[str, int], exposed_comm: int, runtime_calls: int) -> Evidence:
    """The figures the rules test. `runtime_calls`: the runtime calls the trace records (launches linked to their
    GPU work, and sync calls); with none, the host's side of the syncs is not recorded, so in a trace with GPU work
    the host's blocked time is unknown (None), not 0."""
    def frac(x: int | None) -> float | None:
        return x / wall if wall and x is not None else None

    return {
        "gpu_events": float(gpu_events),
        "runtime_calls": float(runtime_calls),
        "gpu_busy_fraction": frac(busy) if gpu_events else None,
        "data_loading_fraction": frac(dl),
        "sync_fraction": frac(sync) if runtime_calls or not gpu_events else None,
        "memcpy_fraction": frac(memcpy) if gpu_events else None,
        "pageable_memcpy_fraction": frac(pageable) if gpu_events else None,
        "sync_idle_fraction": frac(idle["host_sync"]) if gpu_events else None,
        "memcpy_idle_fraction": frac(idle["memcpy_wait"]) if gpu_events else None,
        "launch_idle_fraction": frac(idle["launch_overhead"]) if gpu_events else None,
        "tiny_kernel_fraction": tiny / kernels if kernels else None,
        "exposed_comm_fraction": frac(exposed_comm),
    }


def _places(frames: TraceFrames, verdict: Verdict, syncs: pl.DataFrame, gaps: GapsResult,
            kernels: KernelsResult | None, comm: tuple[pl.DataFrame, CommSplit]) -> pl.DataFrame:
    """Top three places to look for this verdict: (what, name, total_ns, count)."""
    trace = frames.trace
    ops = trace.cpu_ops.select("name", "ts_ns", "dur_ns", "external_id", "pid", "tid")
    if verdict is Verdict.DATA_LOADING_BOUND:
        loaders = trace.cpu.filter(pl.col("name").str.contains(DATALOADER_PATTERN)).select(
            "pid", "tid", s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns")).collect(engine="in-memory").sort("s")
        if frames.profiler_steps.height:  # the fetches of the steps the figures count (not a set-up iteration's)
            loaders = with_step(loaders, cpu_spans(frames.profiler_steps), at="s").filter(
                pl.col("step").is_not_null()).drop("step").sort("s")
        inside = (
            ops.filter(~pl.col("name").str.contains(DATALOADER_PATTERN)).collect(engine="in-memory").sort("ts_ns")
            .join_asof(loaders, left_on="ts_ns", right_on="s", by=["pid", "tid"], strategy="backward",
                       check_sortedness=False)
            .filter(pl.col("ts_ns") < pl.col("e"))
        )
        top = inside.group_by("name").agg(total_ns=pl.col("dur_ns").sum(), count=pl.len())
        head = loaders.select(name=pl.lit("DataLoader __next__"), total_ns=(pl.col("e") - pl.col("s")).sum(),
                              count=pl.len().cast(pl.UInt32))
        # the user's Python frame that takes the fetch's time (a dataset's __getitem__ sleeping on I/O: no op shows it)
        user = (source_frames(trace).filter(~is_library_frame(pl.col("name")) & pl.col("dur_ns").is_not_null())
                .select("name", "ts_ns", "dur_ns", "pid", "tid").collect(engine="in-memory").sort("ts_ns")
                .join_asof(loaders, left_on="ts_ns", right_on="s", by=["pid", "tid"], strategy="backward",
                           check_sortedness=False)
                .filter(pl.col("ts_ns") < pl.col("e"))
                .group_by("name").agg(total_ns=pl.col("dur_ns").sum(), count=pl.len())
                .sort("total_ns", "name", descending=[True, False]).head(1))
        out = pl.concat([head.with_columns(what=pl.lit("annotation")),
                         user.with_columns(what=pl.lit("python (inside DataLoader)")),
                         top.sort("total_ns", "name", descending=[True, False]).with_columns(
                             what=pl.lit("op (inside DataLoader)"))],
                        how="diagonal_relaxed")
    elif verdict is Verdict.SYNC_BOUND:
        # where the GPU waited behind a sync (Python line, else op), then the sync calls by the op issuing them
        behind = gaps.gaps.filter(pl.col("cause") == GapCause.HOST_SYNC.value).group_by(
            name=pl.coalesce("blamed_python", "blamed_op", "blamed_runtime")).agg(
            total_ns=pl.col("dur_ns").sum(), count=pl.len()).with_columns(what=pl.lit("GPU idle behind sync at"))
        by_op = syncs.join(ops.select("external_id", op="name").collect(engine="in-memory").unique("external_id"),
                           on="external_id", how="left", maintain_order="left")
        calls = by_op.group_by(name=pl.coalesce("op", "name")).agg(total_ns=pl.col("dur_ns").sum(), count=pl.len()) \
            .with_columns(what=pl.lit("sync call (op)"))
        out = pl.concat([behind.sort("total_ns", "name", descending=[True, False], nulls_last=True).head(2),
                         calls.sort("total_ns", "name", descending=[True, False], nulls_last=True)],
                        how="diagonal_relaxed")
    elif verdict is Verdict.TRANSFER_BOUND:
        out = (frames.launches.filter(pl.col("kind") == Kind.MEMCPY.value)
               .group_by(name=pl.coalesce("op_name", "name")).agg(total_ns=pl.col("dur_ns").sum(), count=pl.len())
               .with_columns(what=pl.lit("memcpy (op)")))
    elif verdict is Verdict.LAUNCH_BOUND:
        # where the GPU waited for the CPU to launch (Python line, else op), then the op launching the most work
        late = gaps.gaps.filter(pl.col("cause") == GapCause.LAUNCH_OVERHEAD.value).group_by(
            name=pl.coalesce("blamed_python", step_row_name(pl.col("blamed_op")))).agg(
            total_ns=pl.col("dur_ns").sum(), count=pl.len()) \
            .drop_nulls("name").with_columns(what=pl.lit("GPU idle, launch late at"))
        # one row per launch call: a graph launch starts many kernels, its time counts once and for the graph
        # launch (its kernels' ops ran at capture, not here)
        graph = pl.col("runtime_name").fill_null("").str.contains(GRAPH_LAUNCH)
        launches = (frames.launches.filter(pl.col("launch_dur_ns").is_not_null())
                    .unique(subset="runtime_event_id", keep="first", maintain_order=True)
                    .group_by(name=pl.when(graph).then("runtime_name")
                              .otherwise(pl.coalesce(step_row_name(pl.col("op_name")), "runtime_name")))
                    .agg(count=pl.len(), total_ns=pl.col("launch_dur_ns").sum())
                    .with_columns(what=pl.lit("op (launches, launch time)")))
        out = pl.concat([late.sort("total_ns", "name", descending=[True, False]).head(2),
                         launches.sort("count", "total_ns", "name", descending=[True, True, False]).head(3)],
                        how="diagonal_relaxed")
    elif verdict is Verdict.COMMUNICATION_BOUND:
        out = _comm_places(*comm)
    elif verdict is Verdict.GPU_BOUND:
        # by short name: template instances of one kernel (elementwise_kernel<…Add…>, <…Mul…>) are one place
        k = (kernel_summary(frames) if kernels is None else kernels).by_name
        k = k.filter(pl.col("category") != KernelCategory.COMMUNICATION.value)  # NCCL kernels are not compute
        out = (k.group_by(name=short_name(pl.col("name"))).agg(pl.col("total_ns", "count").sum())
               .with_columns(what=pl.lit("kernel")))
    else:
        out = ops.group_by(step_row_name(pl.col("name")).alias("name")).agg(
            total_ns=pl.col("dur_ns").sum(), count=pl.len()).with_columns(
            what=pl.lit("op (inclusive CPU)")).collect(engine="in-memory")
    if verdict not in (Verdict.LAUNCH_BOUND, Verdict.DATA_LOADING_BOUND, Verdict.SYNC_BOUND,
                       Verdict.COMMUNICATION_BOUND):
        out = out.sort("total_ns", "name", descending=[True, False], nulls_last=True)
    return out.select("what", "name", pl.col("total_ns").cast(pl.Int64), pl.col("count").cast(pl.Int64)).head(3)


def _kind_name() -> pl.Expr:
    """A collective's kind as one place: its type and message size ("all_reduce 4096 B"; shown "4,096 B"), the type
    alone where the trace records no size."""
    return (pl.when(pl.col("message_bytes").is_not_null())
            .then(pl.format("{} {} B", "collective", "message_bytes")).otherwise(pl.col("collective")))


def _excess(calls: pl.DataFrame, windows: pl.DataFrame | None) -> pl.DataFrame:
    """Each collective (in a step window where the trace has steps) with `excess_ns`: its duration above the fastest
    call of its kind on this rank (source, collective and message size): the one-rank hint at waiting.

        all_reduce 4096 B: 120 µs, 40 µs, 45 µs  ->  excess 80, 0, 5
    """
    timed = calls.filter(pl.col("dur_ns").is_not_null()).with_columns(
        excess_ns=pl.col("dur_ns") - pl.col("dur_ns").min().over("source", "collective", "message_bytes"))
    if windows is None:
        return timed
    return with_step(timed, windows, at="ts_ns").filter(pl.col("step").is_not_null())


def _comm_places(calls: pl.DataFrame, split: CommSplit) -> pl.DataFrame:
    """For communication_bound: the kinds of collective (type and size) with the most exposed time, then the kind
    with the most time above its fastest call (the one-rank hint at waiting for a later rank)."""
    pieces = split.exposed.collect(engine="in-memory")
    inside = pl.min_horizontal("end_ns", "e") - pl.max_horizontal("start_ns", "s")
    per_call = calls.with_row_index("_i").with_columns(s="ts_ns", e=pl.col("ts_ns") + pl.col("dur_ns"))
    # each call with the exposed pieces it overlaps, device by device (an interval join: the pairs that overlap,
    # not every call with every piece of its device, which took 0.7 GB on a 54 MB trace)
    overlaps = [
        group.join_where(pieces.filter(pl.col("device").eq_missing(device)).select("start_ns", "end_ns"),
                         pl.col("start_ns") < pl.col("e"), pl.col("end_ns") > pl.col("s"))
        for (device,), group in per_call.group_by("device")]
    exposed = (pl.concat(overlaps, how="vertical_relaxed") if overlaps
               else per_call.head(0).with_columns(start_ns=pl.lit(0), end_ns=pl.lit(0))
               ).group_by("_i").agg(exposed_ns=inside.sum())
    kinds = (per_call.join(exposed, on="_i", how="left", maintain_order="left").group_by(name=_kind_name())
             .agg(total_ns=pl.col("exposed_ns").fill_null(0).sum(), count=pl.len())
             .filter(pl.col("total_ns") > 0).sort("total_ns", "name", descending=[True, False])
             .with_columns(what=pl.lit("collective, exposed time")))
    waits = (_excess(calls, None).group_by(name=_kind_name())
             .agg(total_ns=pl.col("excess_ns").sum(), count=(pl.col("excess_ns") > 0).sum())
             .filter(pl.col("total_ns") > 0).sort("total_ns", "name", descending=[True, False])
             .with_columns(what=pl.lit("above its fastest call (wait?)")))
    places = pl.concat([kinds.head(2), waits.head(1)], how="diagonal_relaxed")
    # grouped and ordered by the exact name above; shown with the size's digits grouped ("all_reduce 1,285,084 B")
    return places.with_columns(name=pl.Series([re.sub(r"\b(\d{4,}) B$", lambda m: f"{int(m.group(1)):,} B", n)
                                                for n in places["name"].to_list()], dtype=pl.String))


def _sync_note(ev: Evidence) -> str | None:
    """Where the GPU idles behind host syncs for SYNC_MIN of the step or more while the host is blocked in them
    for less, why that is not sync_bound: removing the syncs saves at most the blocked time (module docstring).

        idle behind syncs 13.8%, blocked 0.8%  ->  "GPU idle behind host syncs 13.8%, but the host was blocked in
                                                    them for 0.8% of the step: …"
    """
    idle, blocked = ev.get("sync_idle_fraction"), ev.get("sync_fraction")
    if idle is None or blocked is None or idle < SYNC_MIN or blocked >= SYNC_MIN:
        return None
    return (f"GPU idle behind host syncs {idle:.1%}, but the host was blocked in them for {blocked:.1%} of the step: "
            "removing them saves at most that, since after each sync the GPU waits for the CPU's next launches, "
            "which take as long without it (not sync_bound; `stepscope whatif --no-sync` predicts the saving)")


def _idle_note(verdict: Verdict, ev: Evidence, other: float | None) -> str | None:
    """Where launch_bound holds by GPU busy < GPU_BUSY_MIN alone while most of the idle time has no cause found and
    late launches explain little of it: what the verdict does and does not say (hta/negative_queue_length_values_
    check: 58.6% idle with no cause against 0.9% behind late launches, the CPU 160 ms ahead of its GPU).

        launch idle 0.9%, no cause 58.6%  ->  "GPU idle with no cause found 58.6%, behind late launches 0.9%: …"
    """
    launch = ev.get("launch_idle_fraction")
    if verdict is not Verdict.LAUNCH_BOUND or launch is None or other is None or other < SYNC_MIN or other <= launch:
        return None
    return (f"GPU idle with no cause found {other:.1%}, behind late launches {launch:.1%}: launch_bound here says "
            "only that the GPU is busy under 60% of the step; what held it back is not recorded (a wait between "
            "streams or on an event, work outside the trace, or a clock offset between CPU and GPU): "
            "`stepscope overlap` shows whether the CPU ran ahead of the GPU (a deep queue), `stepscope gaps` "
            "every gap")


def _comm_note(calls: pl.DataFrame, excess: int, wall: int) -> str | None:
    """What one rank's trace says about waiting in its collectives, and what it cannot (see the module docstring)."""
    if calls.height == 0:
        return None
    share = f"{excess / wall:.1%} of the step" if wall else "some time"
    return (f"one rank's view: {plural(calls.height, 'collective')}; {share} is collective time above the fastest "
            "call of its kind (same collective and size) on this rank: waiting for a later rank or a slower transfer. "
            "A straggler cannot be seen from one rank: `stepscope summary RUN` on every rank's trace names it")


def _length(frame: pl.LazyFrame) -> int:
    """Summed length of disjoint (start_ns, end_ns) intervals."""
    return int(frame.select((pl.col("end_ns") - pl.col("start_ns")).sum()).collect(engine="in-memory").item() or 0)


def _idle(frame: pl.DataFrame) -> dict[str, int]:
    """cause -> idle ns from a frame with idle_<cause>_ns columns (summed over its rows)."""
    return {c.value: int(frame[f"idle_{c.value}_ns"].sum() or 0) if frame.height else 0 for c in GapCause}


def verdict(source: Source, *, gaps: GapsResult | None = None, steps: StepsResult | None = None,
            kernels: KernelsResult | None = None, limits: RooflineResult | None = None,
            serving: ServingResult | None = None, warnings: pl.DataFrame | None = None) -> SummaryResult:
    """The overall and per-step verdict (rule table `RULES`), its evidence, the top three places, and the
    trace's warnings (`info.trace_warnings`), so a damaged trace never gets an unqualified verdict.

    With ProfilerSteps (or iterations inferred without them, `iterations`) the fractions are of the step
    windows (per step, and summed over steps for the overall verdict); without, of the analysis window of
    `stepscope gaps` (first to last GPU event per device).
    `mfu_fraction` is the roofline's MFU over the steps (None without shapes, steps or a known device);
    `profile_next` the command that looks deeper where this verdict points (`profile_next_command`);
    `serving` the one-line phase summary of an inference server's engine iterations (None for other traces).
    `gaps` (`gpu_gaps`, every gap), `steps` (`step_breakdown`), `kernels` (`kernel_summary`), `limits`
    (`roofline`), `serving` (`serving_iterations`) and `warnings` (`trace_warnings`) save recomputing them where
    the caller (the bundle, `stepscope.analyze.bundle`) already has them.
    """
    frames = frames_of(source)
    trace = frames.trace
    gaps = gpu_gaps(frames) if gaps is None else gaps
    br = step_breakdown(frames, gaps=gaps) if steps is None else steps
    limits = roofline(frames) if limits is None else limits
    warnings = trace_warnings(frames) if warnings is None else warnings
    # whole-trace figures: graph-replayed, compiled, memory-bound shares; the CUPTI range profiler's kernels
    work = workload_evidence(frames, limits) | {"counter_ranges": float(
        warnings.filter(pl.col("code") == COUNTER_RANGES_ONLY)["count"].sum())}
    colls = rank_calls(trace, launches=frames.launches)
    split = comm_split(gpu_work(trace.gpu), colls.lazy())
    syncs = _sync_calls(trace)
    gpu_events = int(trace.gpu.select(pl.len()).collect(engine="in-memory").item())
    runtime_calls = int(frames.launches["launch_ts_ns"].is_not_null().sum()) + syncs.height
    if br.steps_found:
        per = _per_step(frames, br.steps, syncs).join(
            per_window(intervals.union(split.exposed, start="start_ns", end="end_ns"), br.steps, "exposed_comm_ns"),
            on="step", how="left", maintain_order="left").with_columns(pl.col("exposed_comm_ns").fill_null(0))
        idle_by_step = br.idle_by_cause
        rows = []
        for r in per.iter_rows(named=True):  # one row per step: a handful, not per event
            idle = _idle(idle_by_step.filter(pl.col("step") == r["step"]))
            ev = _evidence(r["wall_ns"], gpu_events, r["gpu_busy_ns"], r["data_loading_exposed_ns"], r["sync_ns"],
                           r["memcpy_ns"], r["pageable_ns"], r["tiny"], r["kernels"], idle,
                           r["exposed_comm_ns"], runtime_calls) | work
            rule, second, close = judge(ev)
            rows.append({"step": r["step"], "verdict": rule.verdict.value,
                         "runner_up": second.verdict.value if second else None,
                         "margin_fraction": close.margin_fraction if close else None,
                         "margin": close.text if close else None, "wall_ns": r["wall_ns"],
                         **{k: v for k, v in ev.items() if k not in ("gpu_events", "runtime_calls")
                            and k not in work}})
        per_step = pl.DataFrame(rows, infer_schema_length=None)
        tot = per.select(pl.col("wall_ns", "gpu_busy_ns", "data_loading_exposed_ns", "sync_ns", "memcpy_ns",
                                "tiny", "kernels", "exposed_comm_ns").sum(),
                         pageable_ns=pl.when(pl.col("pageable_ns").is_not_null().all())
                         .then(pl.col("pageable_ns").sum())).row(0, named=True)
        calls = int(per["sync_calls"].sum())
        wall = int(tot["wall_ns"])
        idle = _idle(idle_by_step)
        ev = _evidence(wall, gpu_events, tot["gpu_busy_ns"], tot["data_loading_exposed_ns"], tot["sync_ns"],
                       tot["memcpy_ns"], tot["pageable_ns"], tot["tiny"], tot["kernels"], idle,
                       tot["exposed_comm_ns"], runtime_calls)
    else:
        per_step = pl.DataFrame()
        g = trace.gpu.filter(pl.col("dur_ns").is_not_null()).select("kind", "name", "dur_ns").collect(
            engine="in-memory")
        memcpy = g.filter(pl.col("kind") == Kind.MEMCPY.value)
        kern = g.filter(pl.col("kind") == Kind.KERNEL.value)
        calls = syncs.height
        wall, loading = gaps.window_ns, gaps.data_loading_exposed_ns or 0
        exposed = _length(intervals.clip(split.exposed, frames.analysis_window().lazy(), by=["device"]))
        if not gpu_events:  # no GPU span: the trace from its first event to its last (as `ranks` takes it)
            first, last = trace.meta.time.first_ns, trace.meta.time.last_ns
            if first is not None and last is not None:
                whole = pl.DataFrame({"step": [0], "start_ns": [first], "end_ns": [last]})
                wall, loading = last - first, exposed_in_window(trace, first, last)
                exposed = int(per_window(intervals.union(split.exposed, start="start_ns", end="end_ns"), whole,
                                         "exposed_comm_ns")["exposed_comm_ns"].sum() or 0)  # (CPU collectives)
        by_cause = gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum())
        idle = {c.value: int(by_cause.filter(pl.col("cause") == c.value)["idle_ns"].sum() or 0) for c in GapCause}
        window = (intervals.union(frames.analysis_window().lazy(), start="start_ns") if gpu_events
                  else None)  # (without GPU work the window is the whole trace: every call is in it)
        if window is not None:  # the calls that overlap it, as `overlap` counts them
            calls = syncs.lazy().join_where(
                window.select(w_start="start_ns", w_end="end_ns"), pl.col("ts_ns") < pl.col("w_end"),
                pl.col("ts_ns") + pl.col("dur_ns") > pl.col("w_start")).select(pl.len()).collect(
                    engine="in-memory").item()
        ev = _evidence(wall, gpu_events, gaps.busy_ns, loading,
                       int(_blocked(syncs.lazy(), by=[], within=window).collect(engine="in-memory")["sync_ns"].sum()
                           or 0),
                       int(memcpy["dur_ns"].sum() or 0),
                       g.select(_pageable_ns()).item(),
                       int((kern["dur_ns"] < TINY_KERNEL_NS).sum()), kern.height, idle, exposed, runtime_calls)
    ev = ev | work
    excess = int(_excess(colls, br.steps if br.steps_found else None)["excess_ns"].sum() or 0)
    rule, second, close = judge(ev)
    rules = pl.DataFrame([{"order": i + 1, "verdict": r.verdict.value, "when": r.when, "holds": r.condition(ev),
                           "matched": r is rule, "runner_up": r is second} for i, r in enumerate(RULES)])
    return SummaryResult(
        verdict=rule.verdict, reason=rule.when, advice=rule.advice, margin=close,
        runner_up=second.verdict if second else None, runner_up_reason=second.when if second else None,
        steps_found=br.steps_found,
        wall_ns=wall,
        gpu_busy_fraction=ev["gpu_busy_fraction"], data_loading_fraction=ev["data_loading_fraction"],
        sync_fraction=ev["sync_fraction"], memcpy_fraction=ev["memcpy_fraction"],
        pageable_memcpy_fraction=ev["pageable_memcpy_fraction"], sync_idle_fraction=ev["sync_idle_fraction"],
        memcpy_idle_fraction=ev["memcpy_idle_fraction"], launch_idle_fraction=ev["launch_idle_fraction"],
        other_idle_fraction=idle["other"] / wall if gpu_events and wall else None,
        data_loading_idle_fraction=idle["data_loading"] / wall if gpu_events and wall else None,
        comm_idle_fraction=idle["communication_wait"] / wall if gpu_events and wall else None,
        tiny_kernel_fraction=ev["tiny_kernel_fraction"], sync_calls=calls, per_step=per_step,
        places=_places(frames, rule.verdict, syncs, gaps, kernels, (colls, split)), rules=rules,
        warnings=warnings, mfu_fraction=limits.mfu_fraction,
        profile_next=profile_next_command(rule.verdict, limits), exposed_comm_fraction=ev["exposed_comm_fraction"],
        comm_excess_fraction=excess / wall if wall and colls.height else None,
        comm_note=_comm_note(colls, excess, wall),
        sync_note=_sync_note(ev),
        idle_note=_idle_note(rule.verdict, ev, idle["other"] / wall if gpu_events and wall else None),
        graph_replay_fraction=work["graph_replay_fraction"], compiled_fraction=work["compiled_fraction"],
        memory_bound_fraction=work["memory_bound_fraction"],
        serving=(serving_iterations(frames) if serving is None else serving).line,
    )
