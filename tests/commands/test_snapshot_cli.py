"""`stepscope snapshot` and `stepscope memory-timeline` from the command line."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from stepscope.cli import cli, main


def test_snapshot_table_json_and_activations(corpus: Path) -> None:
    path = corpus / "snapshots/decomfl/memory.pickle"
    runner = CliRunner()
    res = runner.invoke(cli, ["snapshot", str(path), "--top", "3"])
    assert res.exit_code == 0 and "live at peak:" in res.stdout and "1.66 GiB" in res.stdout
    data = json.loads(runner.invoke(cli, ["snapshot", str(path), "--json"]).stdout)
    assert data["peak_allocated_bytes"] == 1786608896
    act = runner.invoke(cli, ["snapshot", str(path), "--activations"])
    assert act.exit_code == 0 and "checkpoint saving estimate" in act.stdout


def test_memory_timeline_cli(corpus: Path) -> None:
    res = CliRunner().invoke(cli, ["memory-timeline", str(corpus / "traces/hta/memory_analysis/memory_timeline.raw.gz"),
                                   "--csv"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0] == "category,size_bytes,share_fraction"


def test_malicious_snapshot_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c"
                     b"\x04echo\x94\x85\x94R\x94.")
    with pytest.raises(SystemExit) as info:
        main(["snapshot", str(path)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to load os.system" in err[0]
    assert pickle  # the payload above is what pickle.dumps would write for os.system("echo")
