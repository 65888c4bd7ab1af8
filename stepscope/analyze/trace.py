"""The Trace API: one ingested trace as metadata plus lazy frames by kind, and the launch links.

`load(path)` accepts a raw trace (.json / .json.gz, ingested on the fly into a cache keyed by the file's
sha256) or a directory written by `stepscope ingest` (one trace). Analyses take a `Trace` (or its frames)
and never see JSON.

The analyses collect these frames with `engine="in-memory"`: polars' default, the streaming engine, spends much
of a query this size handing work between threads (docs/performance.md, "The analyses on polars' in-memory
engine"; tests/analyze/test_bundle.py holds a report's queries to it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from stepscope.analyze._workers import usable_cores
from stepscope.analyze.cache import Lease, default_cache_dir, open_entry, source_sha256
from stepscope.analyze.ingest import ingest_trace
from stepscope.analyze.inputs import IngestedTrace, Input, expect_trace, resolve, trace_id_for
from stepscope.analyze.meta import TraceMeta, read_meta
from stepscope.analyze.schema import CPU_KINDS, GPU_KINDS, Kind

if TYPE_CHECKING:
    from stepscope.analyze.nesting import Nested

STEP_NAME_PATTERN = r"^ProfilerStep#(\d+)$"


@dataclass(frozen=True)
class Trace:
    """An ingested trace: `meta` (meta.json, typed) and lazy frames over events.parquet / flows.parquet."""

    directory: Path
    meta: TraceMeta = field(repr=False)
    # a cached trace's hold on its cache entry: no prune removes it while this Trace lives (analyze/cache.py)
    lease: Lease | None = field(default=None, repr=False, compare=False)
    #: the frames that enclosing-event lookups read, nested once and kept (`blame.nested`): name -> nesting
    nestings: dict[str, Nested] = field(default_factory=dict, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ identity
    @property
    def trace_id(self) -> str:
        """Readable stable id: file stem + 8 hex digits of the file's sha256."""
        return self.meta.trace_id or self.directory.name

    @property
    def source_name(self) -> str:
        """The original trace file's name."""
        return self.meta.source.name or self.directory.name

    @property
    def rank(self) -> int | None:
        """Rank from distributedInfo (or the file name), None when unknown."""
        return self.meta.rank

    # ------------------------------------------------------------------ frames
    @property
    def events(self) -> pl.LazyFrame:
        """Every X / instant event, one row each (see the README's schema)."""
        return pl.scan_parquet(self.directory / "events.parquet")

    @property
    def flows(self) -> pl.LazyFrame:
        """Flow points (s/t/f): launch -> GPU (ac2g / async) and forward -> backward (fwdbwd)."""
        return pl.scan_parquet(self.directory / "flows.parquet")

    def of_kind(self, *kinds: Kind) -> pl.LazyFrame:
        """Events of the given kinds."""
        return self.events.filter(pl.col("kind").is_in([k.value for k in kinds]))

    @property
    def kernels(self) -> pl.LazyFrame:
        """GPU kernels."""
        return self.of_kind(Kind.KERNEL)

    @property
    def gpu(self) -> pl.LazyFrame:
        """All GPU timeline work: kernels, memcpy, memset."""
        return self.of_kind(*GPU_KINDS)

    @property
    def memcpy(self) -> pl.LazyFrame:
        """GPU memcpy events."""
        return self.of_kind(Kind.MEMCPY)

    @property
    def memset(self) -> pl.LazyFrame:
        """GPU memset events."""
        return self.of_kind(Kind.MEMSET)

    @property
    def cpu_ops(self) -> pl.LazyFrame:
        """CPU operators (aten ops, autograd nodes, …)."""
        return self.of_kind(Kind.CPU_OP)

    @property
    def cpu(self) -> pl.LazyFrame:
        """Everything that occupies a CPU thread: ops, Python frames and user annotations."""
        return self.of_kind(*CPU_KINDS)

    @property
    def python(self) -> pl.LazyFrame:
        """Python frames (with_stack)."""
        return self.of_kind(Kind.PYTHON_FUNCTION)

    @property
    def runtime(self) -> pl.LazyFrame:
        """CUDA/HIP runtime and driver API calls."""
        return self.of_kind(Kind.RUNTIME, Kind.DRIVER)

    @property
    def memory(self) -> pl.LazyFrame:
        """[memory] allocation/free instants."""
        return self.of_kind(Kind.MEMORY)

    @property
    def annotations(self) -> pl.LazyFrame:
        """CPU-side user annotations (record_function, ProfilerStep#N in newer traces, DataLoader, …)."""
        return self.of_kind(Kind.USER_ANNOTATION)

    @property
    def gpu_annotations(self) -> pl.LazyFrame:
        """GPU-side user annotations (gpu_user_annotation)."""
        return self.of_kind(Kind.GPU_USER_ANNOTATION)

    @property
    def syncs(self) -> pl.LazyFrame:
        """cuda_sync events (stream/event/device synchronization seen by CUPTI)."""
        return self.of_kind(Kind.SYNC)

    @property
    def steps(self) -> pl.LazyFrame:
        """`ProfilerStep#N` spans: step (int), ts_ns, dur_ns, end_ns, pid, tid, event_id; sorted by start.

        Older traces mark them as cpu ops, newer ones as user annotations; either counts. When the same
        step appears on several threads the longest span wins. Newer Kineto also copies each ProfilerStep onto
        the GPU timeline (`gpu_user_annotation`: from the first to the last GPU work of it that it saw); that
        copy is not the step and never counts, even where it is the longer (a GPU-bound loop, whose CPU runs
        steps ahead of the GPU).
        """
        cpu_side = pl.col("kind").is_in([k.value for k in CPU_KINDS])
        return (
            self.events.filter(pl.col("name").str.contains(STEP_NAME_PATTERN) & pl.col("dur_ns").is_not_null()
                               & cpu_side)
            .select(
                step=pl.col("name").str.extract(STEP_NAME_PATTERN).cast(pl.Int64),
                ts_ns="ts_ns",
                dur_ns="dur_ns",
                end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                pid="pid",
                tid="tid",
                event_id="event_id",
            )
            .sort("dur_ns", "ts_ns", "event_id", descending=[True, False, False])
            .unique(subset="step", keep="first")
            .sort("ts_ns")
        )

    def launches(self) -> pl.LazyFrame:
        """GPU work joined to the runtime call that launched it and the CPU op that issued that call.

        One row per kernel/memcpy/memset: gpu_event_id, kind, name, device, stream, ts_ns, dur_ns,
        correlation, runtime_event_id, runtime_name, launch_ts_ns, launch_dur_ns, launch_pid, launch_tid,
        external_id, op_event_id, op_name. Links use the correlation id (runtime <-> GPU); where a GPU
        event has no correlation, its launch flow (ac2g / async) leads to the runtime call. The op is the
        CPU op whose External id the runtime call (or the GPU event) carries.

            kernel(correlation=7)  <- cudaLaunchKernel(correlation=7, External id=3) <- aten::mm(External id=3)
        """
        gpu = self.gpu.select(
            gpu_event_id="event_id", kind="kind", name="name", device="device", stream="stream",
            ts_ns="ts_ns", dur_ns="dur_ns", correlation="correlation", gpu_external_id="external_id",
            pid="pid", tid="tid",
        )
        gpu = self._correlation_from_flows(gpu).drop("pid", "tid")
        runtime = (
            self.runtime.filter(pl.col("correlation").is_not_null())
            .sort(pl.col("kind") != Kind.RUNTIME.value, "ts_ns")  # prefer the runtime call over a driver call
            .unique(subset="correlation", keep="first")
            .select(
                correlation="correlation", runtime_event_id="event_id", runtime_name="name",
                launch_ts_ns="ts_ns", launch_dur_ns="dur_ns", launch_pid="pid", launch_tid="tid",
                runtime_external_id="external_id",
            )
        )
        ops = (
            self.cpu_ops.filter(pl.col("external_id").is_not_null())
            .sort("dur_ns")  # innermost (shortest) op wins if an id repeats
            .unique(subset="external_id", keep="first")
            .select(external_id="external_id", op_event_id="event_id", op_name="name")
        )
        linked = gpu.join(runtime, on="correlation", how="left", maintain_order="left").with_columns(
            external_id=pl.coalesce("runtime_external_id", "gpu_external_id")
        )
        return linked.join(ops, on="external_id", how="left",
                           maintain_order="left").drop("runtime_external_id", "gpu_external_id")

    def _correlation_from_flows(self, gpu: pl.LazyFrame) -> pl.LazyFrame:
        """Fill a GPU event's missing correlation from its launch flow (ac2g / async / async_cpu_to_gpu).

        The flow's finish binds to the GPU event (same pid, tid and ts); its start sits on the runtime
        call (same pid, tid and ts). The runtime call's correlation is then used:

            f(id=5) at (0, 7, 30 µs) on the kernel  ->  s(id=5) at (1000, 1, 10 µs)  ->  runtime correlation 7
        """
        launch_cats = ["ac2g", "async", "async_cpu_to_gpu"]
        flows = self.flows.filter(pl.col("cat").is_in(launch_cats))
        finishes = flows.filter(pl.col("ph") == "f").select("cat", "flow_id", "pid", "tid", f_ts="ts_ns")
        starts = flows.filter(pl.col("ph") == "s").select("cat", "flow_id", s_pid="pid", s_tid="tid", s_ts="ts_ns")
        runtime = self.runtime.filter(pl.col("correlation").is_not_null()).select(
            s_pid="pid", s_tid="tid", s_ts="ts_ns", flow_correlation="correlation"
        ).unique(subset=["s_pid", "s_tid", "s_ts"], keep="first")
        via_flows = (
            gpu.filter(pl.col("correlation").is_null())
            .select("gpu_event_id", "pid", "tid", f_ts="ts_ns")
            .join(finishes, on=["pid", "tid", "f_ts"], how="inner")
            .join(starts, on=["cat", "flow_id"], how="inner")
            .join(runtime, on=["s_pid", "s_tid", "s_ts"], how="inner")
            .unique(subset="gpu_event_id", keep="first")
            .select("gpu_event_id", "flow_correlation")
        )
        return (
            gpu.join(via_flows, on="gpu_event_id", how="left", maintain_order="left")
            .with_columns(correlation=pl.coalesce("correlation", "flow_correlation"))
            .drop("flow_correlation")
        )

    @cached_property
    def thread_names(self) -> dict[tuple[str, str], str]:
        """(pid, tid) -> thread name from the trace's metadata events."""
        return self.meta.thread_names


def load(path: str | Path | Input, *, cache_dir: Path | None = None) -> Trace:
    """Open one trace for analysis: an ingested directory, or a raw trace file (ingested into the cache).

    What the path is comes from `inputs.resolve`: a run, dataset or directory that holds exactly one trace
    is accepted too; anything else is a one-line InputError / UsageError naming the path.
    """
    one = expect_trace(path if isinstance(path, Input) else resolve(path))
    if isinstance(one, IngestedTrace):
        return Trace(directory=one.path, meta=read_meta(one.path))
    cache = cache_dir or default_cache_dir()
    sha = source_sha256(cache, one.path)
    source = one.path
    # the cache is keyed by content: a hit needs no read of the trace (its hash remembered against its stat); two
    # processes loading one file ingest it once, and the entry stays whole while this Trace lives (analyze/cache.py)
    target, lease = open_entry(cache, sha,
                               lambda entry: ingest_trace(source, entry, force=True, jobs=usable_cores(), sha256=sha))
    return Trace(directory=target, meta=_meta_as_given(read_meta(target), source, sha), lease=lease)


def _meta_as_given(meta: TraceMeta, source: Path, sha: str) -> TraceMeta:
    """`meta` of a cache entry as the file `source` names it: the entry is keyed by content, so its meta.json names
    whichever file of that content was read first (a copy in another run's directory, a file since renamed);
    `info`, `fleet` and the report name the file given, and its trace id."""
    here = str(source.resolve())
    if meta.source.path == here:
        return meta
    try:
        mtime: float | None = source.stat().st_mtime
    except OSError:
        mtime = meta.source.mtime
    return replace(meta, trace_id=trace_id_for(source, sha),
                   source=replace(meta.source, path=here, name=source.name, mtime=mtime))
