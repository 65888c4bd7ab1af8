"""A trace's derived frames, computed once: the launch links, the step spans, the step windows.

Every analysis below the verdict needs some of these, and each is a join or a sort over the whole trace
(`Trace.launches()` alone is three joins). `TraceFrames` computes each on first use and keeps it, so an
analysis run after another (as in a report, or the bundle in `stepscope.analyze.bundle`) reuses them. An
analysis takes `Trace | TraceFrames` (`Source`) and calls `frames_of` first, so the Python API still
accepts a plain `Trace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import polars as pl

from stepscope.analyze import window as _window
from stepscope.analyze.blame import innermost, nested
from stepscope.analyze.iterations import Iterations, iterations
from stepscope.analyze.trace import Trace
from stepscope.analyze.window import WindowKind

#: the CPU ops a graph capture attributes to replayed kernels (`graphs.GraphMappedFrames.graph_ops`): one row per
#: captured op per replay, under its own thread (`tid` names the replay), so nesting never mixes replays
GRAPH_OPS_SCHEMA: dict[str, pl.DataType] = {
    "event_id": pl.Int64(), "name": pl.String(), "kind": pl.String(), "pid": pl.String(), "tid": pl.String(),
    "ts_ns": pl.Int64(), "dur_ns": pl.Int64(), "input_dims": pl.String(), "input_types": pl.String(),
    "concrete_inputs": pl.String(), "input_strides": pl.String(), "flops": pl.Float64(), "capture_event_id": pl.Int64(),
    "replay_correlation": pl.Int64(),
}


@dataclass(frozen=True, eq=False)
class TraceFrames:
    """One trace plus its derived frames, each collected on first use and kept."""

    trace: Trace
    _analysis_windows: dict[str, pl.DataFrame] = field(default_factory=dict, init=False, repr=False)

    @cached_property
    def launches(self) -> pl.DataFrame:
        """`Trace.launches()`, collected: every GPU event with its launch call and issuing op (`ops_by_nesting`
        where the External ids do not name it)."""
        return ops_by_nesting(self.trace, self.trace.launches().collect(engine="in-memory"))

    @property
    def graph_ops(self) -> pl.DataFrame:
        """CPU ops that launched graph-replayed kernels at capture time (`GRAPH_OPS_SCHEMA`); none here: a trace
        alone does not say them (`graphs.with_graph_capture` does, from a profile of the capture)."""
        return pl.DataFrame(schema=GRAPH_OPS_SCHEMA)

    @cached_property
    def iterations(self) -> Iterations:
        """The step spans and where they come from: the ProfilerStep spans, else iterations inferred from the
        loop's repeating structure, the set-up iteration set aside (`iterations.iterations`)."""
        return iterations(self.trace, self.trace.steps.collect(engine="in-memory"))

    @cached_property
    def _launched(self) -> pl.DataFrame:
        """`window.gpu_by_step` over the steady spans, the tail included (it holds none of their rows)."""
        return _window.gpu_by_step(self.launches, self.iterations.steady.sort("ts_ns"))

    @cached_property
    def tail(self) -> pl.DataFrame:
        """The trailing step spans left out because they launched no GPU work while an earlier one did
        (`window.idle_tail`: the span a last prof.step() opens until the profiler stops); none in most traces."""
        steady = self.iterations.steady
        if steady.height < 2 or not self.trace.gpu.select(pl.len()).collect(engine="in-memory").item():
            return steady.clear()
        return _window.idle_tail(steady, self._launched)

    @cached_property
    def profiler_steps(self) -> pl.DataFrame:
        """The step spans every analysis uses: step, ts_ns, dur_ns, end_ns, pid, tid, event_id (CPU spans, by
        start). `Trace.steps` where the trace has ProfilerStep#N, else the inferred iterations without the set-up
        one (`iterations.steady`; `iterations.source` says which); in both cases without the idle tail (`tail`)."""
        steady = self.iterations.steady.sort("ts_ns")
        tail = self.tail
        return steady.filter(~pl.col("step").is_in(tail["step"].implode())) if tail.height else steady

    @property
    def left_out(self) -> list[str]:
        """One sentence per kind of step span the analyses leave out: the set-up iteration (`iterations.Warmup`) and
        the idle tail (`tail`); empty in most traces."""
        warmup = self.iterations.warmup
        return ([warmup.text] if warmup is not None else []) + ([_window.tail_text(self.tail)] if self.tail.height
                                                                 else [])

    @cached_property
    def gpu_by_step(self) -> pl.DataFrame:
        """GPU events with the step whose CPU span launched them (`window.gpu_by_step`)."""
        return self._launched

    @cached_property
    def step_windows(self) -> pl.DataFrame:
        """The step windows (`window.step_windows`): the one rule every analysis uses."""
        return _window.step_windows(self.profiler_steps, self.gpu_by_step,
                                    queued_until_ns=_window.queued_until(self.launches, self.setup_span))

    @cached_property
    def setup_span(self) -> tuple[int, int] | None:
        """The CPU span (start, end ns) of the set-up iteration left out of the inferred steps
        (`iterations.Warmup`), whose GPU work the first step waits for; None where none was left out."""
        warmup = self.iterations.warmup
        if warmup is None:
            return None
        row = self.iterations.spans.filter(pl.col("step") == warmup.step).row(0, named=True)
        return int(row["ts_ns"]), int(row["end_ns"])

    def analysis_window(self, window: WindowKind = "steps") -> pl.DataFrame:
        """device, start_ns, end_ns: where GPU idle time counts (`window.analysis_window`)."""
        if window not in self._analysis_windows:
            self._analysis_windows[window] = _window.analysis_window(
                self.trace, self.step_windows, window=window).collect(engine="in-memory")
        return self._analysis_windows[window]

    @cached_property
    def main_thread(self) -> tuple[str, str] | None:
        """(pid, tid) of the thread holding the most step spans (ProfilerStep or inferred); None without steps."""
        steps = self.profiler_steps
        if steps.height == 0:
            return None
        top = steps.group_by("pid", "tid").agg(n=pl.len()).sort("n", "pid", "tid", descending=[True, False, False])
        return str(top["pid"][0]), str(top["tid"][0])


Source = Trace | TraceFrames


def frames_of(source: Source) -> TraceFrames:
    """The derived frames of `source`: itself when it already is a `TraceFrames`, else new ones."""
    return source if isinstance(source, TraceFrames) else TraceFrames(source)


def ops_by_nesting(trace: Trace, links: pl.DataFrame) -> pl.DataFrame:
    """`links` (`Trace.launches()`) with the issuing op found by nesting where its External id found none:
    the innermost CPU op enclosing the launch call on the call's thread.

    Some Kineto versions give a runtime call and its kernel the correlation id as External id, a number the
    ops' own External ids never take (PARAM's DLRM traces), so no kernel links to an op by id; the launch
    call still runs inside the op that issued it:

        aten::mm(External id=112) > cudaLaunchKernel(External id=40875, correlation=40875) -> aten::mm
    """
    missing = links["op_event_id"].is_null() & links["launch_ts_ns"].is_not_null()
    if not missing.any():
        return links
    points = links.filter(missing).select(pid="launch_pid", tid="launch_tid", ts_ns="launch_ts_ns")
    found = innermost(nested(trace, "cpu_ops"), points)
    index = links.with_row_index("_row").filter(missing)["_row"]
    fill = pl.DataFrame({"_row": index, "_op": found["event_id"], "_name": found["name"]})
    return (
        links.with_row_index("_row").join(fill, on="_row", how="left", maintain_order="left")
        .with_columns(op_event_id=pl.coalesce("op_event_id", "_op"), op_name=pl.coalesce("op_name", "_name"))
        .drop("_row", "_op", "_name")
    )
