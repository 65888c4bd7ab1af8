"""Importing the capture shim costs the user's training process nothing it does not need.

`stepscope.capture` runs inside the user's training script: it must not pull in the analyzer's stack
(polars, pyarrow, msgspec: ~0.8 s and hundreds of MB of address space) nor torch before a capture starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("polars", "pyarrow", "msgspec", "torch")


def test_importing_capture_imports_no_analyzer_stack_and_no_torch() -> None:
    # GIVEN a fresh interpreter
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import stepscope.capture\n"
        "for mod in pkgutil.iter_modules(stepscope.capture.__path__):\n"
        "    importlib.import_module('stepscope.capture.' + mod.name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    # WHEN it imports the capture package and every module in it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    # THEN none of the heavy packages has been imported
    assert json.loads(out.stdout) == []
