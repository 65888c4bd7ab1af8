"""The CLI answers at once: `stepscope --help` and every command's `--help` load no polars, pyarrow,
matplotlib, torch or ray (checked in a fresh interpreter), and the command list names every command."""

from __future__ import annotations

import json
import subprocess
import sys

from stepscope.cli import COMMANDS, SUMMARIES

_PROBE = """
import json, sys
from stepscope.cli import COMMANDS, cli
heavy = ("polars", "pyarrow", "matplotlib", "numpy", "torch", "ray", "fsspec")
loaded = {}
for args in [[]] + [[name] for name in sorted(COMMANDS)]:
    try:
        cli.main([*args, "--help"], standalone_mode=False)
    except SystemExit:
        pass
    loaded[" ".join(args) or "(group)"] = [m for m in heavy if m in sys.modules]
print(json.dumps(loaded))
"""


def test_help_loads_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded == {name: [] for name in loaded}, {k: v for k, v in loaded.items() if v}
    assert len(loaded) == len(COMMANDS) + 1


def test_the_command_list_names_every_command() -> None:
    assert set(SUMMARIES) == set(COMMANDS)
    assert all(text.endswith(".") and len(text) < 100 for text in SUMMARIES.values())
