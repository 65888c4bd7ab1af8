"""The `stepscope` command has pyarrow allocate with the system pool (see stepscope.prefer_system_allocator),
except for `capture`, whose child process is the user's program, and never over the user's own choice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _run(code: str, pool: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return done.stdout.split()


_AFTER_HELP = """
import os
from stepscope.cli import main
main([{command!r}, "--help"])
import pyarrow as pa
print(os.environ.get("ARROW_DEFAULT_MEMORY_POOL", "-"), pa.default_memory_pool().backend_name)
"""


@pytest.mark.parametrize("command", ["ingest", "info", "report"])
def test_analysis_commands_allocate_with_the_system_pool(command: str) -> None:
    assert _run(_AFTER_HELP.format(command=command))[-2:] == ["system", "system"]


def test_capture_leaves_the_environment_of_the_users_program_alone() -> None:
    assert _run(_AFTER_HELP.format(command="capture"))[-2] == "-"


def test_the_users_own_pool_wins() -> None:
    # (the variable as the user set it: whether this pyarrow build has jemalloc is pyarrow's business)
    assert _run(_AFTER_HELP.format(command="ingest"), pool="jemalloc")[-2] == "jemalloc"


def test_too_late_once_pyarrow_is_imported() -> None:
    code = "import pyarrow, stepscope\nprint(stepscope.prefer_system_allocator())"
    assert _run(code) == ["False"]
    code = "import stepscope\nprint(stepscope.prefer_system_allocator())\nimport pyarrow as pa\n"
    code += "print(pa.default_memory_pool().backend_name)"
    assert _run(code) == ["True", "system"]
