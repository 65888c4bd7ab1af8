"""stepscope plot KIND TRACE -o file.png."""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from builders import cpu_op, trace, write_trace
from click.testing import CliRunner
from report_traces import gpu_doc

from stepscope.cli import cli, main


@pytest.mark.parametrize("kind", ["timeline", "steps", "ops", "kernels", "gaps", "transfers", "memory"])
def test_plot_writes_a_png(tmp_path: Path, kind: str) -> None:
    src = write_trace(tmp_path, gpu_doc())
    out = tmp_path / f"{kind}.png"
    result = CliRunner().invoke(cli, ["plot", kind, str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert mpimg.imread(out).shape[1] > 300


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Exit code and stderr lines of the real entry point (which maps errors to exit codes)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0), capsys.readouterr().err.strip().splitlines()


def test_nothing_to_plot_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A figure with nothing to draw is refused as every command refuses a request its input cannot answer: one
    line naming the file, exit code 2, no file written (a script must not go on as if the PNG were there)."""
    src = write_trace(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=20)))
    out = tmp_path / "m.png"
    assert _main(["plot", "memory", str(src), "-o", str(out)], capsys) == (2, [
        f"stepscope: error: {src}: no [memory] events with allocated totals in this trace (capture with "
        f"profile_memory=True): nothing to plot, {out} not written"])
    assert _main(["plot", "roofline", str(src), "-o", str(out)], capsys) == (2, [
        f"stepscope: error: {src}: the trace has no input shapes, so no op has FLOPs (profile with "
        f"record_shapes=True): nothing to plot, {out} not written"])
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".m.png*"))


def test_plot_snapshot(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap.png"
    snap = corpus / "snapshots" / "cs336_magma27" / "memory_snapshot.pickle"
    result = CliRunner().invoke(cli, ["plot", "snapshot", str(snap), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert mpimg.imread(out).shape[1] > 600
    # a directory holding the snapshot (a capture run's) is that snapshot, as for `stepscope snapshot`
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rank0.memory_snapshot.pickle").symlink_to(snap)
    result = CliRunner().invoke(cli, ["plot", "snapshot", str(tmp_path / "run"), "-o", str(tmp_path / "run.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run.png").read_bytes() == out.read_bytes()


def test_plot_roofline(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "roofline.png"
    src = corpus / "traces/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    result = CliRunner().invoke(cli, ["plot", "roofline", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert mpimg.imread(out).shape[1] > 600



def test_plot_maps_graph_replays_through_the_capture_profile(tmp_path: Path) -> None:
    # GIVEN the CUDA-graph sample: a replay trace and, in its run directory, a profile of the graph capture
    run = Path(__file__).resolve().parents[2] / "sample_traces" / "cuda_graph_replay_cuda"
    # WHEN the roofline is plotted THEN the replayed GEMMs are on it through their ops, as `flops` and the report
    # have them (once refused: "no op in this trace has a FLOP count (see `stepscope flops`)", which counts them)
    res = CliRunner().invoke(cli, ["plot", "roofline", str(run), "-o", str(tmp_path / "r.png")])
    assert res.exit_code == 0, res.output
    assert mpimg.imread(str(tmp_path / "r.png")).shape[0] > 100
    # AND --graph-capture names a profile as `ops` takes it
    capture = next(run.rglob("*graph_capture*.json.gz"))
    trace_file = next(p for p in run.glob("*.pt.trace.json.gz") if p != capture)
    res = CliRunner().invoke(cli, ["plot", "roofline", str(trace_file), "--graph-capture", str(capture), "-o",
                                   str(tmp_path / "r2.png")])
    assert res.exit_code == 0, res.output
    # AND the trace file takes the capture profile beside it, as its run directory does
    beside = CliRunner().invoke(cli, ["plot", "roofline", str(trace_file), "-o", str(tmp_path / "r3.png")])
    assert beside.exit_code == 0, beside.output
    # AND the replay trace alone in its folder has no FLOP op
    (tmp_path / "alone").mkdir()
    alone_file = shutil.copy(trace_file, tmp_path / "alone")
    alone = CliRunner().invoke(cli, ["plot", "roofline", str(alone_file), "-o", str(tmp_path / "r4.png")])
    assert alone.exit_code != 0 and not (tmp_path / "r4.png").exists()
