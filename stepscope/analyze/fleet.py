"""The fleet table: one row per trace and rank over many traces (a dataset, a directory, a capture run), each
row computed from the trace's analysis bundle by the chosen engine (processes here, or Ray tasks).

    run         rank  host  device  steps  step_p50_ns  step_p95_ns  gpu_busy_fraction  verdict      top_idle_cause …
    nightly_12  0     gpu7  H100    20     101e6        130e6        0.62               launch_bound launch_overhead …

The figures are the trace's own: `verdict`, `gpu_busy_fraction`, `exposed_comm_fraction` and `mfu_fraction` are
what `stepscope summary` says of it, step times the wall times of `stepscope steps`, the idle cause the one
with the largest share of the analysis window (`stepscope gaps`), the peak memory that of `stepscope memory`.
`run` is the capture run's directory, else the directory that holds the trace file (a `rank<N>` directory is
skipped: it is the run's). A trace that cannot be read or analysed is a row with its one-line `error`. A
profile of a CUDA/HIP graph capture under a directory (`capture_traces/`, `*graph_capture*`:
`inputs.is_capture_file`) is no row: it profiles the capture, not the workload.

`--where` filters (`where`) are a closed little language parsed here, never evaluated as code:

    verdict=gpu_bound    gpu_busy<0.5    step_p95>=120ms    peak_memory>20G    host!=gpu7    error=null
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from stepscope.analyze._workers import surviving_map, usable_cores
from stepscope.analyze.engines import Engine, import_ray, ray_map
from stepscope.analyze.inputs import Input, RunDir, resolve, workload_traces
from stepscope.analyze.meta import DeviceProperties, devices_by_id
from stepscope.errors import StepscopeError, UsageError, failure_line

FLEET_SCHEMA: dict[str, type[pl.DataType]] = {
    "run": pl.String,
    "trace": pl.String,
    "rank": pl.Int64,
    "host": pl.String,
    "device": pl.String,
    "steps": pl.Int64,
    "step_p50_ns": pl.Float64,
    "step_p95_ns": pl.Float64,
    "gpu_busy_fraction": pl.Float64,
    "verdict": pl.String,
    "top_idle_cause": pl.String,
    "top_idle_share": pl.Float64,
    "exposed_comm_fraction": pl.Float64,
    "mfu_fraction": pl.Float64,
    "peak_memory_bytes": pl.Int64,
    "path": pl.String,
    "error": pl.String,
}

_RANK_DIR = re.compile(r"rank[-_]?\d+", re.IGNORECASE)
_HOST_KEYS = ("hostname", "hostName", "host_name", "host")


@dataclass(frozen=True, kw_only=True)
class FleetResult:
    """The fleet table (`fleet`, one row per trace and rank, FLEET_SCHEMA) and how many traces failed."""

    source: str
    traces: int
    failed: int
    fleet: pl.DataFrame


# -------------------------------------------------------------------------------------------------- one row


def fleet_row(path: str, run: str | None = None, host: str | None = None,
              cache_dir: str | None = None) -> dict[str, Any]:
    """The fleet row of one trace (a raw file or an ingested directory). Never raises for a bad trace: its row
    carries the one-line failure in `error` (errors.failure_line) and nulls elsewhere."""
    try:
        return _row(path, run, host, cache_dir)
    except Exception as exc:  # noqa: BLE001 - one bad trace is reported; the rest go on
        return failed_row(path, run, host, exc)


def _device_name(devices: Sequence[DeviceProperties], launches: pl.DataFrame) -> str | None:
    """The name of the listed GPU that ran the most kernel time (`peaks.busiest_gpu`, the one whose peaks the MFU
    takes; `meta.devices_by_id`), else of the first listed GPU: Kineto lists every GPU the process could see (the
    vLLM trace lists eight and ran on device 2)."""
    from stepscope.analyze.peaks import busiest_gpu  # (with the trace's frames, as `_row` imports them)

    busiest = busiest_gpu(launches)
    used = launches.filter(pl.col("device").is_not_null())["device"].unique().to_list()
    listed = devices_by_id(devices, used)
    return next((d.name for d in ([listed[busiest]] if busiest in listed else devices)), None)


def failed_row(path: str, run: str | None, host: str | None, exc: BaseException) -> dict[str, Any]:
    """The row of a trace that could not be analysed: its names and its one-line failure."""
    row: dict[str, Any] = dict.fromkeys(FLEET_SCHEMA)
    where = Path(path)
    partition = where.name.startswith("rank=") and where.parent.name.startswith("trace=")
    if partition:  # a dataset's trace=<id>/rank=<r>: its trace id and rank, not the folders' names
        rank = where.name.removeprefix("rank=")
        row.update(trace=where.parent.name.removeprefix("trace="), rank=int(rank) if rank.isdigit() else None,
                   run=run or where.parent.parent.name or None)
    else:
        row.update(run=run or _run_of(path), trace=where.name)
    row.update(host=host, path=path, error=failure_line(exc, path))
    return row


def _row(path: str, run: str | None, host: str | None, cache_dir: str | None) -> dict[str, Any]:
    from stepscope.analyze.bundle import TraceAnalysis
    from stepscope.analyze.trace import load

    trace = load(Path(path), cache_dir=Path(cache_dir) if cache_dir else None)
    bundle = TraceAnalysis.of(trace)
    summary = bundle.verdict
    wall = bundle.steps.steps["wall_ns"] if bundle.steps.steps.height else None
    cause, share = _top_idle(bundle)
    meta = trace.meta
    mfu = summary.mfu_fraction if summary.mfu_fraction is not None else bundle.roofline.mfu_fraction
    return {
        "run": run or _run_of(meta.source.path or path),
        "trace": trace.trace_id,
        "rank": trace.rank,
        "host": host or _host_of(meta.distributed, meta.top_level),
        "device": _device_name(meta.devices, bundle.frames.launches),
        "steps": bundle.steps.steps_found,
        "step_p50_ns": _finite(wall.quantile(0.5, "linear")) if wall is not None else None,
        "step_p95_ns": _finite(wall.quantile(0.95, "linear")) if wall is not None else None,
        "gpu_busy_fraction": _finite(summary.gpu_busy_fraction),
        "verdict": summary.verdict.value,
        "top_idle_cause": cause,
        "top_idle_share": share,
        "exposed_comm_fraction": _finite(summary.exposed_comm_fraction),
        "mfu_fraction": _finite(mfu),
        "peak_memory_bytes": bundle.memory.peak_allocated_bytes,
        "path": path,
        "error": None,
    }


def _top_idle(bundle: Any) -> tuple[str | None, float | None]:
    """The gap cause with the most idle time, and its share of the analysis window (as the index's idle_causes)."""
    gaps = bundle.gaps
    if gaps.window_ns <= 0 or not gaps.idle_by_cause.height:
        return None, None
    top = gaps.idle_by_cause.group_by("cause").agg(pl.col("idle_ns").sum()).sort(["idle_ns", "cause"],
                                                                                    descending=[True, False])
    cause, idle_ns = top.row(0)
    return (str(cause), float(idle_ns) / gaps.window_ns) if idle_ns else (None, None)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def _run_of(source: str) -> str | None:
    parent = Path(source).parent
    if _RANK_DIR.fullmatch(parent.name):
        parent = parent.parent
    return parent.name or None


def _host_of(*docs: Any) -> str | None:
    for doc in docs:
        if isinstance(doc, dict) or hasattr(doc, "get"):
            for key in _HOST_KEYS:
                value = doc.get(key)
                if isinstance(value, str) and value:
                    return value
    return None


# ----------------------------------------------------------------------------------------------- many rows


@dataclass(frozen=True, kw_only=True)
class _Job:
    path: str
    run: str | None
    host: str | None


def _jobs(inp: Input) -> list[_Job]:
    paths = workload_traces(inp)
    if isinstance(inp, RunDir):
        hosts = _manifest_hosts(inp.manifests)
        return [_Job(path=str(p), run=inp.path.name, host=hosts.get(p.resolve())) for p in paths]
    return [_Job(path=str(p), run=None, host=None) for p in paths]


def _manifest_hosts(manifests: Sequence[Path]) -> dict[Path, str]:
    """Each trace a capture manifest lists -> the host it was captured on (`command.host`)."""
    hosts: dict[Path, str] = {}
    for m in manifests:
        try:
            doc = json.loads(m.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        host = (doc.get("command") or {}).get("host") if isinstance(doc, dict) else None
        if not isinstance(host, str):
            continue
        for entry in doc.get("files") or []:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                hosts[(m.parent / entry["name"]).resolve()] = host
    return hosts


def fleet(path: str | Path, *, engine: Engine = "local", address: str | None = None, jobs: int | None = None,
          cache_dir: Path | None = None, on_row: Callable[[dict[str, Any]], None] | None = None) -> FleetResult:
    """The fleet table of every trace under `path` (a dataset, a directory of traces, a capture run, or one
    trace), rows in input order. `engine`: where each row is computed (processes here, `jobs` of them; or a
    Ray task each on the cluster at `address`, see engines.ray_map). `on_row` sees each row as it is done."""
    inp = resolve(path, batch=True)
    jobs_list = _jobs(inp)
    if not jobs_list:
        raise UsageError("holds no trace for a fleet table", path=path)
    if engine == "ray":
        import_ray()
    cache = str(cache_dir) if cache_dir is not None else None
    rows: dict[str, dict[str, Any]] = {}
    for row in _rows(jobs_list, engine, address, jobs, cache):
        rows[row["path"]] = row
        if on_row is not None:
            on_row(row)
    ordered = [rows[j.path] for j in jobs_list]
    table = pl.DataFrame(ordered, schema=FLEET_SCHEMA)
    return FleetResult(source=str(path), traces=len(ordered), failed=sum(r["error"] is not None for r in ordered),
                       fleet=table)


def _rows(jobs: list[_Job], engine: Engine, address: str | None, n: int | None,
          cache: str | None) -> Iterator[dict[str, Any]]:
    args = [(j.path, j.run, j.host, cache) for j in jobs]
    if engine == "ray":
        yield from ray_map(fleet_row, args, on_error=lambda a, exc: failed_row(a[0], a[1], a[2], exc),
                           address=address, num_cpus=n)
        return
    processes = min(n or usable_cores(), len(args))
    if processes <= 1:
        for a in args:
            yield fleet_row(*a)
        return
    # a worker lost (killed, out of memory) fails the trace it was analysing; the others go on
    yield from surviving_map(fleet_row, args, processes=processes,
                             lost=lambda a, how: failed_row(a[0], a[1], a[2], StepscopeError(how, path=a[0])))


# --------------------------------------------------------------------------------------------- sort, filter

_CONDITION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|!=|==|=|<|>)\s*(.*?)\s*")
_SUFFIXES = ("", "_fraction", "_share", "_ns", "_bytes")
_SCALE = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def column_name(name: str) -> str:
    """A fleet column from its name or its name less the unit suffix (`gpu_busy` -> gpu_busy_fraction);
    else a UsageError listing the columns."""
    for suffix in _SUFFIXES:
        if name + suffix in FLEET_SCHEMA:
            return name + suffix
    raise UsageError(f"no column {name!r} in the fleet table; choose one of: {', '.join(FLEET_SCHEMA)}")


def parse_condition(text: str) -> pl.Expr:
    """One --where condition, `COLUMN OP VALUE` (OP: = == != < <= > >=), as a polars expression.

    VALUE: a number; for *_fraction/*_share columns a fraction from 0 to 1 or a percentage (50%); for *_ns a
    duration with its unit (120ms, 2s); for *_bytes a size (20G); for text columns the text itself (for verdict
    and top_idle_cause one of their values); `null` for a missing value (with = or !=). Rows whose value is
    missing never satisfy an order comparison. Anything else is a UsageError."""
    m = _CONDITION.fullmatch(text)
    if m is None or not m.group(3):
        raise UsageError(f"--where {text!r}: expected COLUMN OP VALUE, e.g. verdict=gpu_bound or gpu_busy<0.5")
    name, op, raw = column_name(m.group(1)), m.group(2), m.group(3)
    col = pl.col(name)
    if raw.lower() == "null":
        if op in ("=", "=="):
            return col.is_null()
        if op == "!=":
            return col.is_not_null()
        raise UsageError(f"--where {text!r}: null compares with = or != only")
    value = _value(name, raw, text)
    compare = {"=": col == value, "==": col == value, "!=": col != value, "<": col < value, "<=": col <= value,
               ">": col > value, ">=": col >= value}[op]
    return compare.fill_null(False)


def _value(name: str, raw: str, text: str) -> float | str:
    kind = FLEET_SCHEMA[name]
    if kind is pl.String:
        word = raw.strip("'\"")
        known = _known_values(name)
        if known and word not in known:  # a typo would silently select nothing
            raise UsageError(f"--where {text!r}: {word!r} is no {name}; one of: {', '.join(known)}")
        return word
    try:
        value = _number(name, raw)
    except (ValueError, UsageError):
        raise UsageError(f"--where {text!r}: {raw!r} is not a value for {name}") from None
    fraction = name.endswith(("_fraction", "_share"))
    if fraction and not raw.endswith("%") and abs(value) > 1:  # 50 would be 5000%: every row is below it
        raise UsageError(f"--where {text!r}: {name} is a fraction from 0 to 1: write {raw}% or {value / 100:g}")
    if name.endswith("_ns") and re.fullmatch(r"[0-9]*\.?[0-9]+(?:e[0-9]+)?", raw) and value != 0:
        raise UsageError(f"--where {text!r}: {name} is a duration: give its unit (ns, us, ms or s), e.g. {raw}ms")
    return value


def _number(name: str, raw: str) -> float:
    """A --where value of a numeric column as a number (`parse_condition`'s units); ValueError where it is none."""
    if name.endswith(("_fraction", "_share")) and raw.endswith("%"):
        return float(raw[:-1]) / 100
    if name.endswith("_ns"):
        unit = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*(ns|us|µs|ms|s)?", raw)
        if unit is not None:
            return float(unit.group(1)) * _SCALE[unit.group(2) or "ns"]
    if name.endswith("_bytes") and not re.fullmatch(r"[0-9.]+", raw):
        from stepscope.analyze.cache import parse_size

        return float(parse_size(raw))
    return float(raw)


def _known_values(name: str) -> list[str]:
    """The values a text column can hold where they are a fixed set (verdict, top_idle_cause); [] otherwise."""
    if name == "verdict":
        from stepscope.analyze.summary import Verdict

        return [v.value for v in Verdict]
    if name == "top_idle_cause":
        from stepscope.analyze.gaps import GapCause

        return [c.value for c in GapCause]
    return []


def select_rows(result: FleetResult, *, where: Sequence[str] = (), sort: str | None = None,
                descending: bool = False) -> FleetResult:
    """The rows that satisfy every `where` condition, sorted by `sort` (nulls last) when given."""
    table = result.fleet
    for text in where:
        table = table.filter(parse_condition(text))
    if sort is not None:
        table = table.sort(column_name(sort), descending=descending, nulls_last=True, maintain_order=True)
    return FleetResult(source=result.source, traces=result.traces, failed=result.failed, fleet=table)
