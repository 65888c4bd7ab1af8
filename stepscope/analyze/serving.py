"""`stepscope serving`: the engine iterations of an inference server's trace, their kind (prefill, decode, mixed,
idle), batch size and tokens, and per phase the latency percentiles, GPU busy share and tokens per second.

An LLM server runs one model forward per scheduler iteration ("engine step"), and the engines name each one in
the trace. These names are recognized (first match wins, one family per trace):

    family              example name                                                       engine   read
    vLLM annotation     execute_8192_context_9(sq8155sk8430…)_generation_37(sq37sk34489…)  vllm     all
                        execute_context_1(888_788544)_generation_0(0)                      vllm     all
                        execute_new_2_cached_30                                            vllm     batch
    SGLang annotation   step[EXTEND bs=15 toks=15360] / step[DECODE bs=32] / step[MIXED …]  sglang   all
                        step[prefill bs=4 toks=512] / step[mixed bs=6 ext=256 dec=4]        sglang   all
    user annotation     prefill / decode_step_3 / decode bs=8                              generic  kind
    SGLang Python frame sglang/…/model_runner.py(812): forward_decode                      sglang   kind
    vLLM Python frame   vllm/v1/worker/gpu_model_runner.py(3380): execute_model            vllm     span

vLLM's profiler wraps each ``execute_model`` in a record_function named after the scheduler output: requests
still in their prefill ("context", chunked-prefill chunks included) and those generating ("generation"), each
with its scheduled tokens: a bare number, ``T_Σq²`` in some ROCm builds, or the detailed ``sqT skK sqsqA sqskB``
(Σ query tokens, Σ KV length, Σ query², Σ query·KV) after the total scheduled tokens. The oldest form says only
how many requests were new and how many cached (running), so a chunked prefill's later chunks read as decode
there. SGLang names each ``ModelRunner.forward`` after its ``ForwardMode``: EXTEND is a prefill (``toks`` its
tokens), DECODE one new token per request, MIXED both (with roofline annotations ``c``/``g`` requests and
``c_sq``/``g_sq`` tokens per phase); TARGET_VERIFY (speculative decoding) counts as decode with its tokens
unknown. Python frames give a kind (SGLang's ``forward_extend`` also runs MIXED batches: read as prefill) or, for
vLLM's ``execute_model``, only the span.

The spans go through the one step-window rule (`window.step_windows`): GPU work belongs to the iteration whose
CPU span launched it (graph replays included: ``cudaGraphLaunch`` runs inside the span), and an iteration's
window ends at the later of its CPU end and its last GPU work. Per iteration, wall is the window and GPU busy
the union of its GPU work (kernels, copies, memsets; all devices) inside it:

    execute_…(mixed) CPU [0, 26.4 ms), hipGraphLaunch at 10 ms -> 240 kernels ending at 27 ms
    -> one mixed iteration, wall 27 ms, GPU busy = union of those kernels within [0, 27 ms)

Where an iteration's first GPU work starts long after its launch call (more than WAIT_SHARE of its wall: the GPU
still busy with work queued before it, or a GPU clock offset), its wall holds that wait and the note says so.

Per phase: iterations, latency p50/p95/p99 (linear interpolation, numpy's default) and mean of the walls, GPU busy
share (busy / wall, summed), tokens and tokens per second (tokens / summed wall; null where an iteration of the
phase does not say its tokens).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from stepscope.analyze import intervals
from stepscope.analyze import window as _window
from stepscope.analyze._text import duration, plural
from stepscope.analyze.frames import Source, TraceFrames, frames_of
from stepscope.analyze.schema import Kind
from stepscope.analyze.trace import Trace


class Engine(str, enum.Enum):
    """Which engine's names the iterations came from."""

    VLLM = "vllm"
    SGLANG = "sglang"
    GENERIC = "generic"


class Phase(str, enum.Enum):
    """What one engine iteration did (in the order the phase table lists them)."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"
    UNKNOWN = "unknown"


_ENGINE_LABEL = {Engine.VLLM: "vLLM", Engine.SGLANG: "SGLang", Engine.GENERIC: "generic"}

VLLM_CONTEXT_PATTERN = (r"^execute_(?:(?P<total>\d+)_)?context_(?P<ctx>\d+)\((?P<ctx_detail>[^)]*)\)"
                        r"_generation_(?P<gen>\d+)\((?P<gen_detail>[^)]*)\)$")
VLLM_NEW_CACHED_PATTERN = r"^execute_new_(?P<new>\d+)_cached_(?P<cached>\d+)$"
SGLANG_STEP_PATTERN = r"^step\[(?P<mode>[A-Za-z][A-Za-z0-9_]*)(?P<rest>[^\]]*)\]$"
GENERIC_PATTERN = r"(?i)^(?P<mode>prefill|extend|decode|mixed)(?:$|[^a-z])"
SGLANG_FRAME_PATTERN = r"sglang/.*model_runner\.py\(\d+\): (?P<mode>forward_(?:extend|decode|idle|split_prefill))$"
VLLM_FRAME_PATTERN = r"vllm/.*model_runner\.py\(\d+\): (?P<mode>execute_model)$"
#: vLLM start-up work that is not a served request (the only engine frames of a graph-capture profile)
VLLM_STARTUP_PATTERN = r"vllm/.*model_runner\.py\(\d+\): (capture_model|_dummy_run|profile_run)$"

#: an iteration whose first GPU work starts more than this share of its wall after its launch gets a note
WAIT_SHARE = 0.25

_DETAIL_FIELDS = r"(sqsq|sqsk|sq|sk)(\d+)"
_SGLANG_PREFILL = {"EXTEND", "PREFILL", "SPLIT_PREFILL"}
_SGLANG_DECODE = {"DECODE", "TARGET_VERIFY", "VERIFY"}
_FRAME_KIND = {"forward_extend": Phase.PREFILL, "forward_split_prefill": Phase.PREFILL,
               "forward_decode": Phase.DECODE, "forward_idle": Phase.IDLE, "execute_model": Phase.UNKNOWN}

#: one engine iteration as its name describes it (null: the name does not say)
PARSED_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String(), "kind": pl.String(), "mode": pl.String(), "batch_size": pl.Int64(),
    "prefill_requests": pl.Int64(), "decode_requests": pl.Int64(), "prefill_tokens": pl.Int64(),
    "decode_tokens": pl.Int64(), "total_tokens": pl.Int64(),
}

ITERATIONS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(), "kind": pl.String(), "mode": pl.String(), "batch_size": pl.Int64(),
    "prefill_requests": pl.Int64(), "decode_requests": pl.Int64(), "prefill_tokens": pl.Int64(),
    "decode_tokens": pl.Int64(), "total_tokens": pl.Int64(), "offset_ns": pl.Int64(), "wall_ns": pl.Int64(),
    "cpu_ns": pl.Int64(), "gpu_busy_ns": pl.Int64(), "gpu_busy_fraction": pl.Float64(), "annotation": pl.String(),
}

PHASES_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.String(), "iterations": pl.Int64(), "p50_ns": pl.Float64(), "p95_ns": pl.Float64(),
    "p99_ns": pl.Float64(), "mean_ns": pl.Float64(), "wall_ns": pl.Int64(), "gpu_busy_fraction": pl.Float64(),
    "mean_batch_size": pl.Float64(), "tokens": pl.Int64(), "tokens_per_s": pl.Int64(),
}


# ------------------------------------------------------------------------------------------- reading names
def _total(prefill: int | None, decode: int | None) -> int | None:
    return prefill + decode if prefill is not None and decode is not None else None


def _row(name: str, kind: Phase, mode: str, *, batch: int | None = None, prefill_requests: int | None = None,
         decode_requests: int | None = None, prefill_tokens: int | None = None, decode_tokens: int | None = None,
         total: int | None = None) -> dict[str, object]:
    return {"name": name, "kind": kind.value, "mode": mode, "batch_size": batch,
            "prefill_requests": prefill_requests, "decode_requests": decode_requests,
            "prefill_tokens": prefill_tokens, "decode_tokens": decode_tokens,
            "total_tokens": total if total is not None else _total(prefill_tokens, decode_tokens)}


def _by_requests(prefill: int, decode: int) -> Phase:
    """The kind of a batch of `prefill` and `decode` requests: both -> mixed, neither -> idle."""
    if prefill and decode:
        return Phase.MIXED
    if prefill:
        return Phase.PREFILL
    return Phase.DECODE if decode else Phase.IDLE


def _vllm_tokens(detail: str) -> int | None:
    """The scheduled tokens in one group of a vLLM annotation.

        "8155"                                  -> 8155   (tokens)
        "888_788544"                            -> 888    (tokens_Σq²)
        "sq8155sk8430sqsq7475785sqsk7671310"    -> 8155   (Σq, Σkv, Σq², Σq·kv)
    """
    if re.fullmatch(r"\d+(?:_\d+)*", detail):
        return int(detail.split("_")[0])
    if re.fullmatch(rf"(?:{_DETAIL_FIELDS})+", detail):
        fields = dict(re.findall(_DETAIL_FIELDS, detail))
        return int(fields["sq"]) if "sq" in fields else None
    return None


def parse_vllm(name: str) -> dict[str, object] | None:
    """One vLLM ``execute_…`` annotation as an iteration row (`PARSED_SCHEMA`), None for another name.

        execute_8192_context_9(sq8155…)_generation_37(sq37…)  -> mixed, 46 requests, 8155 + 37 = 8192 tokens
        execute_new_0_cached_32                                -> decode, 32 requests, tokens unknown
    """
    if m := re.match(VLLM_CONTEXT_PATTERN, name):
        ctx, gen = int(m["ctx"]), int(m["gen"])
        total = int(m["total"]) if m["total"] is not None else None
        return _row(name, _by_requests(ctx, gen), "context/generation", batch=ctx + gen, prefill_requests=ctx,
                    decode_requests=gen, prefill_tokens=_vllm_tokens(m["ctx_detail"]),
                    decode_tokens=_vllm_tokens(m["gen_detail"]), total=total)
    if m := re.match(VLLM_NEW_CACHED_PATTERN, name):
        new, cached = int(m["new"]), int(m["cached"])
        return _row(name, _by_requests(new, cached), "new/cached", batch=new + cached, prefill_requests=new,
                    decode_requests=cached)
    return None


def parse_sglang(name: str) -> dict[str, object] | None:
    """One SGLang ``step[…]`` span name as an iteration row (`PARSED_SCHEMA`), None for another name.

        step[EXTEND bs=15 toks=15360]                   -> prefill, 15 requests, 15360 tokens
        step[DECODE bs=32]                              -> decode, 32 requests, 32 tokens
        step[MIXED bs=66 c=2 g=64 c_sq=2048 g_sq=64 …]  -> mixed, 2 + 64 requests, 2048 + 64 tokens
        step[IDLE bs=0]                                 -> idle
    """
    m = re.match(SGLANG_STEP_PATTERN, name)
    if m is None:
        return None
    mode = m["mode"]
    fields = {k.lower(): int(v) for k, v in re.findall(r"(\w+)=(\d+)", m["rest"])}
    bs = fields.get("bs")
    upper = mode.upper()
    if upper in _SGLANG_PREFILL:
        tokens = fields.get("toks", fields.get("c_sq"))
        return _row(name, Phase.PREFILL, mode, batch=bs, prefill_requests=bs, decode_requests=0,
                    prefill_tokens=tokens, decode_tokens=0)
    if upper in _SGLANG_DECODE:
        # DECODE adds one token per request; a speculative verify checks several per request, count not recorded
        tokens = fields.get("g_sq", bs) if upper == "DECODE" else None
        return _row(name, Phase.DECODE, mode, batch=bs, prefill_requests=0, decode_requests=bs,
                    prefill_tokens=0, decode_tokens=tokens)
    if upper == "MIXED":
        return _row(name, Phase.MIXED, mode, batch=bs, prefill_requests=fields.get("c"),
                    decode_requests=fields.get("g"), prefill_tokens=fields.get("c_sq", fields.get("ext")),
                    decode_tokens=fields.get("g_sq", fields.get("dec")))
    if upper == "IDLE":
        return _row(name, Phase.IDLE, mode, batch=bs or 0, prefill_requests=0, decode_requests=0,
                    prefill_tokens=0, decode_tokens=0)
    return _row(name, Phase.UNKNOWN, mode, batch=bs)


def parse_generic(name: str) -> dict[str, object] | None:
    """A user's ``prefill`` / ``decode…`` annotation as an iteration row (`PARSED_SCHEMA`): its kind, and batch
    size and tokens where the name says them (``bs=8``, ``batch_size=8``, ``toks=512``, ``tokens=512``).

        decode_step_3          -> decode, batch and tokens unknown
        prefill bs=4 toks=512  -> prefill, 4 requests, 512 tokens
    """
    m = re.match(GENERIC_PATTERN, name)
    if m is None:
        return None
    mode = m["mode"].lower()
    kind = {"prefill": Phase.PREFILL, "extend": Phase.PREFILL, "decode": Phase.DECODE}.get(mode, Phase.MIXED)
    fields = {k.lower(): int(v) for k, v in re.findall(r"([A-Za-z_]+)=(\d+)", name)}
    bs = fields.get("bs", fields.get("batch_size"))
    tokens = fields.get("toks", fields.get("tokens"))
    if kind is Phase.PREFILL:
        return _row(name, kind, mode, batch=bs, prefill_tokens=tokens, decode_tokens=0 if tokens is not None else None)
    if kind is Phase.DECODE:
        return _row(name, kind, mode, batch=bs, decode_tokens=tokens, prefill_tokens=0 if tokens is not None else None)
    return _row(name, kind, mode, batch=bs, total=tokens)


def _frame_reader(pattern: str) -> Callable[[str], dict[str, object] | None]:
    """A reader for engine forward frames matching `pattern`: the kind their function says, nothing else.

        sglang/srt/model_executor/model_runner.py(812): forward_decode  -> decode
    """
    def read(name: str) -> dict[str, object] | None:
        m = re.search(pattern, name)
        return None if m is None else _row(name, _FRAME_KIND[m["mode"]], m["mode"])

    return read


@dataclass(frozen=True)
class _Family:
    """One way engines name their iterations: the events to look in, a pattern to find them, their reader."""

    engine: Engine
    source: str
    kinds: tuple[Kind, ...]
    pattern: str
    read: Callable[[str], dict[str, object] | None]

    @property
    def from_frames(self) -> bool:
        return self.kinds == (Kind.PYTHON_FUNCTION,)


_ANNOTATION_KINDS = (Kind.USER_ANNOTATION, Kind.CPU_OP)  # record_function: cpu_op in older traces
#: the families, in the order they are tried: the first one with a span in the trace gives the iterations
FAMILIES: tuple[_Family, ...] = (
    _Family(Engine.VLLM, "vLLM execute_… annotations", _ANNOTATION_KINDS,
            f"{VLLM_CONTEXT_PATTERN}|{VLLM_NEW_CACHED_PATTERN}", parse_vllm),
    _Family(Engine.SGLANG, "SGLang step[…] annotations", _ANNOTATION_KINDS, SGLANG_STEP_PATTERN, parse_sglang),
    _Family(Engine.GENERIC, "prefill/decode annotations", (Kind.USER_ANNOTATION,), GENERIC_PATTERN, parse_generic),
    _Family(Engine.SGLANG, "SGLang ModelRunner forward_* Python frames", (Kind.PYTHON_FUNCTION,),
            SGLANG_FRAME_PATTERN, _frame_reader(SGLANG_FRAME_PATTERN)),
    _Family(Engine.VLLM, "vLLM execute_model Python frames", (Kind.PYTHON_FUNCTION,), VLLM_FRAME_PATTERN,
            _frame_reader(VLLM_FRAME_PATTERN)),
)


def _outermost(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans (pid, tid, ts_ns, dur_ns) not inside an earlier-starting one on their thread: a span nested in
    another of its family (a forward frame called from another) is not an iteration of its own.

        step[DECODE] [0, 10) holds step[TARGET_VERIFY] [2, 8); step[DECODE] [10, 20)  ->  [0, 10), [10, 20)
    """
    ends = pl.col("ts_ns") + pl.col("dur_ns")
    return (spans.sort(["pid", "tid", "ts_ns", "dur_ns"], descending=[False, False, False, True])
            .filter(~(pl.col("ts_ns") < ends.shift(1).cum_max().over("pid", "tid")).fill_null(False)))


def recognize(trace: Trace) -> tuple[_Family | None, pl.DataFrame]:
    """The first family of `FAMILIES` with spans in `trace`, and its iterations: step (1, 2, … by start), ts_ns,
    dur_ns, end_ns, pid, tid, event_id and the `PARSED_SCHEMA` columns. (None, no rows) where none has any.

    Names are read once per distinct name (a trace's engine steps repeat a few hundred shapes at most)."""
    for family in FAMILIES:
        spans = (
            trace.events.filter(pl.col("kind").is_in([k.value for k in family.kinds]) & pl.col("dur_ns").is_not_null()
                                & pl.col("name").str.contains(family.pattern))
            .select("name", "ts_ns", "dur_ns", "pid", "tid", "event_id").collect(engine="in-memory")
        )
        rows = [r for r in (family.read(n) for n in spans["name"].unique().sort()) if r is not None]
        if not rows:
            continue
        parsed = pl.DataFrame(rows, schema=PARSED_SCHEMA)
        its = (_outermost(spans.join(parsed, on="name")).sort("ts_ns", "event_id")
               .with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"), pid=pl.col("pid").cast(pl.String),
                             tid=pl.col("tid").cast(pl.String))
               .with_row_index("step", offset=1).with_columns(pl.col("step").cast(pl.Int64)))
        return family, its
    return None, pl.DataFrame()


# ------------------------------------------------------------------------------------------------ result
@dataclass(frozen=True, kw_only=True)
class ServingResult:
    """The engine iterations of a trace and their per-phase figures.

    `engine` (vllm, sglang, generic; None where no iteration was found) and `source` say which names were read.
    `iterations`: one row per engine step (`ITERATIONS_SCHEMA`: step, kind, the engine's own mode, batch size
    and requests and tokens per phase where the name says them, offset from the trace's first event, wall and
    CPU time, GPU busy in its window, the annotation). `phases`: per kind (prefill, decode, mixed, idle,
    unknown, then "all" where there are several) iterations, wall p50/p95/p99/mean, summed wall, GPU busy share,
    mean batch size, tokens and tokens/s (null where an iteration of the phase does not say its tokens).
    """

    engine: Engine | None
    source: str
    iterations_found: int
    mixed_iterations: int
    wall_ns: int | None  # None without iterations (no wall to speak of, not 0 ns)
    gpu_busy_fraction: float | None
    tokens: int | None
    tokens_per_s: int | None
    note: str
    phases: pl.DataFrame
    iterations: pl.DataFrame
    #: the GPU's start after the first launch, summed over the iterations that waited long; None without iterations
    gpu_wait_ns: int | None = 0

    @property
    def line(self) -> str | None:
        """One line for `stepscope summary`; None without iterations.

            "vLLM, 1 iteration: 1 mixed (p50 26.4 ms); 8,192 tokens, 310,303 tokens/s; GPU busy 81.0% of their wall"
        """
        if not self.iterations_found or self.engine is None:
            return None
        kinds = self.phases.filter(pl.col("kind") != "all")
        parts = ", ".join(f"{r['iterations']:,} {r['kind']} (p50 {duration(r['p50_ns'])})"
                          for r in kinds.iter_rows(named=True))
        noun = "iteration" if self.iterations_found == 1 else "iterations"
        text = f"{_ENGINE_LABEL[self.engine]}, {self.iterations_found:,} {noun}: {parts}"
        if self.tokens is not None:
            text += f"; {self.tokens:,} tokens"
            if self.tokens_per_s is not None:
                text += f", {self.tokens_per_s:,} tokens/s"
        if self.gpu_busy_fraction is not None:
            text += f"; GPU busy {100 * self.gpu_busy_fraction:.1f}% of their wall"
            if self.gpu_wait_ns:  # (why it can be far below a GPU-span figure beside it)
                text += (f", {duration(self.gpu_wait_ns)} of it before the GPU started their work (queued work or "
                         "a clock offset)")
        if self.mixed_iterations:
            text += "; mixed = prefill and decode in one batch"
        return text


def _empty(trace: Trace) -> ServingResult:
    startup = trace.python.filter(pl.col("name").str.contains(VLLM_STARTUP_PATTERN)).select(pl.len()).collect(
        engine="in-memory").item()
    note = ("no engine iterations: no vLLM execute_… or SGLang step[…] annotation, no prefill/decode annotation, "
            "no engine forward frame in this trace")
    if startup:
        note += (" (it holds vLLM's start-up dummy runs and graph capture, not served requests: profile the "
                 "serving run, e.g. with --profiler-config)")
    return ServingResult(engine=None, source="none", iterations_found=0, mixed_iterations=0, wall_ns=None,
                         gpu_wait_ns=None, gpu_busy_fraction=None, tokens=None, tokens_per_s=None, note=note,
                         phases=pl.DataFrame(schema=PHASES_SCHEMA), iterations=pl.DataFrame(schema=ITERATIONS_SCHEMA))


def _gpu(frames: TraceFrames, its: pl.DataFrame) -> pl.DataFrame:
    """step, start_ns, wall_ns, cpu_ns, gpu_busy_ns, gpu_wait_ns: each iteration's window (`window.step_windows`),
    the union of the GPU work it launched inside that window (null in a trace with no GPU work at all), and how
    long its first GPU work waited after its launch call (null: no launch link)."""
    spans = its.select("step", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "event_id")
    launched = _window.gpu_by_step(frames.launches, spans)
    windows = _window.step_windows(spans, launched, queued_until_ns=_window.queued_until(frames.launches))
    first = (launched.filter(pl.col("launch_ts_ns").is_not_null()).sort("ts_ns").group_by("step", maintain_order=True)
             .agg(gpu_wait_ns=(pl.col("ts_ns") - pl.col("launch_ts_ns")).first()))
    busy = (
        intervals.clip(launched.lazy().select("step", start_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")),
                       windows.lazy().select("step", "start_ns", "end_ns"), by=["step"])
        .group_by("step").agg(gpu_busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
        .collect(engine="in-memory")
    )
    return (windows.select("step", "start_ns", "wall_ns", "cpu_ns").join(busy, on="step", how="left",
                                                                         maintain_order="left")
            .join(first, on="step", how="left", maintain_order="left")
            .with_columns(pl.col("gpu_busy_ns").fill_null(0).cast(pl.Int64) if frames.launches.height
                          else pl.lit(None, pl.Int64).alias("gpu_busy_ns")))


def _phase_rows() -> list[pl.Expr]:
    """The phase table's aggregates over a group of iterations (one kind, or all of them)."""
    wall = pl.col("wall_ns")
    known = pl.col("total_tokens").is_not_null().all()
    tokens = pl.when(known).then(pl.col("total_tokens").sum())
    return [
        pl.len().cast(pl.Int64).alias("iterations"),
        wall.quantile(0.5, "linear").alias("p50_ns"), wall.quantile(0.95, "linear").alias("p95_ns"),
        wall.quantile(0.99, "linear").alias("p99_ns"), wall.mean().alias("mean_ns"),
        wall.sum().cast(pl.Int64).alias("wall_ns"),
        (pl.when(pl.col("gpu_busy_ns").is_not_null().any()).then(pl.col("gpu_busy_ns").sum())
         / pl.when(wall.sum() > 0).then(wall.sum())).alias("gpu_busy_fraction"),
        pl.col("batch_size").mean().alias("mean_batch_size"),
        tokens.cast(pl.Int64).alias("tokens"),
        (tokens * 1e9 / pl.when(wall.sum() > 0).then(wall.sum())).round(0).cast(pl.Int64).alias("tokens_per_s"),
    ]


def _phases(its: pl.DataFrame) -> pl.DataFrame:
    """One row per kind present (in `Phase` order), then "all" where there are several kinds."""
    order = {p.value: i for i, p in enumerate(Phase)}
    per = (its.group_by("kind").agg(_phase_rows())
           .sort(pl.col("kind").replace_strict(order, return_dtype=pl.Int64)))
    if per.height > 1:
        per = pl.concat([per, its.select(pl.lit("all").alias("kind"), *_phase_rows())], how="vertical_relaxed")
    return per.select(list(PHASES_SCHEMA)).cast(PHASES_SCHEMA)  # type: ignore[arg-type]


#: an iteration whose first GPU work started long after its first launch (`_note`)
_waited_long = pl.col("gpu_wait_ns") > WAIT_SHARE * pl.col("wall_ns")


def _note(family: _Family, its: pl.DataFrame) -> str:
    """What the reader should know: mixed batches, unknown tokens, the kind a frame cannot say."""
    notes = []
    mixed = its.filter(pl.col("kind") == Phase.MIXED.value).height
    if mixed:
        notes.append(f"{mixed:,} mixed iteration{'' if mixed == 1 else 's'}: prefill and decode requests in one "
                     "batch (chunked prefill), so their latency is neither a prefill's nor a decode's")
    waited = its.filter(_waited_long).sort("gpu_wait_ns", descending=True, maintain_order=True)
    if waited.height:
        top = waited.row(0, named=True)
        wait = "waits long for the GPU to start its" if waited.height == 1 else "wait long for the GPU to start their"
        notes.append(f"{plural(waited.height, 'iteration')} {wait} work (step "
                     f"{top['step']}: {duration(top['gpu_wait_ns'])} from its first launch to its first GPU work, "
                     f"of a {duration(top['wall_ns'])} wall): work queued before it (an earlier iteration's, or "
                     "work outside the profile), or a GPU clock offset")
    if family.from_frames:
        notes.append(f"iterations from {family.source} only: batch sizes and tokens are not recorded (enable the "
                     "engine's profiler annotations for them)")
    elif its["total_tokens"].null_count():
        unsaid = its["total_tokens"].null_count()
        say = "does not say its" if unsaid == 1 else "do not say their"
        notes.append(f"{plural(unsaid, 'iteration')} {say} tokens: tokens/s is left out for their phase")
    return "; ".join(notes)


def serving_iterations(source: Source) -> ServingResult:
    """The engine iterations of `source` and per-phase latency, GPU busy and tokens/s (module docstring); no rows
    and a note saying so where the trace names no engine iteration."""
    frames = frames_of(source)
    trace = frames.trace
    family, its = recognize(trace)
    if family is None:
        return _empty(trace)
    origin = trace.meta.time.first_ns or 0
    timed = (
        its.join(_gpu(frames, its), on="step", how="left", maintain_order="left")
        .with_columns(offset_ns=pl.col("start_ns") - origin,
                      gpu_busy_fraction=pl.col("gpu_busy_ns") / pl.when(pl.col("wall_ns") > 0).then("wall_ns"),
                      annotation="name")
        .sort("step")
    )
    its = timed.select(list(ITERATIONS_SCHEMA)).cast(ITERATIONS_SCHEMA)  # type: ignore[arg-type]
    wall = int(its["wall_ns"].sum())
    busy = int(its["gpu_busy_ns"].sum()) if its["gpu_busy_ns"].null_count() < its.height else None
    tokens = int(its["total_tokens"].sum()) if not its["total_tokens"].null_count() else None
    return ServingResult(
        engine=family.engine, source=family.source, iterations_found=its.height,
        mixed_iterations=its.filter(pl.col("kind") == Phase.MIXED.value).height, wall_ns=wall,
        gpu_busy_fraction=busy / wall if busy is not None and wall else None, tokens=tokens,
        tokens_per_s=round(tokens * 1e9 / wall) if tokens is not None and wall else None,
        note=_note(family, timed), phases=_phases(its), iterations=its,
        gpu_wait_ns=int(timed.select(pl.col("gpu_wait_ns").filter(_waited_long).sum()).item() or 0),
    )


__all__ = ["Engine", "Phase", "ServingResult", "parse_generic", "parse_sglang", "parse_vllm", "recognize",
           "serving_iterations"]
