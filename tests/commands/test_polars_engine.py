"""Every command's queries run on polars' in-memory engine (see stepscope/analyze/trace.py): the commands beyond a
report's sections (`comm`, `ranks`, a run's `critical-path`, `summary` and `whatif`, `fleet`, `graphs`, `serving`),
on the bundled samples. tests/analyze/test_bundle.py holds a report's own queries to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import cli

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
RUN = SAMPLES / "late_rank"
GRAPHS = SAMPLES / "cuda_graph_replay_cuda"


@pytest.mark.parametrize("args", [
    ["comm", str(RUN)],
    ["ranks", str(RUN)],
    ["critical-path", str(RUN)],
    ["summary", str(RUN)],
    ["whatif", str(RUN), "--no-data-loading"],
    ["fleet", str(RUN), "--jobs", "1"],  # (its rows computed here, where the spy sees them)
    ["graphs", str(GRAPHS)],
    ["serving", str(GRAPHS)],
], ids=lambda args: args[0])
def test_the_command_collects_on_the_in_memory_engine(args: list[str], collect_engines: list[object]) -> None:
    if not (RUN.is_dir() and GRAPHS.is_dir()):
        pytest.skip("sample_traces/ is not present")
    engines = collect_engines
    # WHEN the command runs on a bundled sample
    out = CliRunner().invoke(cli, [*args, "--json"])
    # THEN it answered, and every query it ran here named the in-memory engine
    assert out.exit_code == 0, out.output
    assert engines and set(engines) == {"in-memory"}
