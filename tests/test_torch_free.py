"""The torch line is physical: analysis, reports and the CLI import and run with torch unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from builders import cpu_op, kernel, runtime, step, trace, write_trace


def _blocker(tmp_path: Path) -> str:
    """A `torch` package first on sys.path whose import fails, as on a machine without torch."""
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("torch is not installed (blocked for this test)")\n')
    return f"import sys\nsys.path.insert(0, {str(fake.parent)!r})\n"


def test_analysis_reports_and_cli_work_without_torch(tmp_path: Path) -> None:
    path = write_trace(tmp_path, trace(step(1, ts=0, dur=50), cpu_op("aten::mm", ts=1, dur=20, external_id=1),
                                       runtime("cudaLaunchKernel", ts=2, dur=3, correlation=5, external_id=1),
                                       kernel("sgemm", ts=10, dur=30, correlation=5)), "t.json")
    script = _blocker(tmp_path) + f"""
import importlib, pkgutil
try:
    import torch
    raise SystemExit("torch was importable")
except ImportError:
    pass
import stepscope.analyze, stepscope.reports, stepscope.cli
for pkg in (stepscope.analyze, stepscope.reports):
    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(pkg.__name__ + "." + mod.name)
for name, module in stepscope.cli.COMMANDS.items():
    importlib.import_module("stepscope.commands." + module)
from stepscope.cli import main
sys.argv = ["stepscope", "info", {str(path)!r}, "--json"]
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
assert "torch" not in sys.modules or sys.modules["torch"] is None
"""
    env_cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={"XDG_CACHE_HOME": str(env_cache), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["steps_found"] == 1 and info["events"] == 4
