"""stepscope plot KIND TRACE -o file.png."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest
from builders import cpu_op, trace, write_trace
from click.testing import CliRunner
from report_traces import gpu_doc

from stepscope.cli import cli


@pytest.mark.parametrize("kind", ["timeline", "steps", "ops", "kernels", "gaps", "transfers", "memory"])
def test_plot_writes_a_png(tmp_path: Path, kind: str) -> None:
    src = write_trace(tmp_path, gpu_doc())
    out = tmp_path / f"{kind}.png"
    result = CliRunner().invoke(cli, ["plot", kind, str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert mpimg.imread(out).shape[1] > 300


def test_nothing_to_plot_is_said_plainly(tmp_path: Path) -> None:
    src = write_trace(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=20)))
    result = CliRunner().invoke(cli, ["plot", "memory", str(src), "-o", str(tmp_path / "m.png")])
    assert result.exit_code == 0
    assert "no [memory] events" in result.output and not (tmp_path / "m.png").exists()


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
    cpu = write_trace(tmp_path, trace(cpu_op("aten::mm", ts=0, dur=20)))
    none = CliRunner().invoke(cli, ["plot", "roofline", str(cpu), "-o", str(tmp_path / "r.png")])
    assert none.exit_code == 0 and "nothing to plot" in none.output and not (tmp_path / "r.png").exists()
