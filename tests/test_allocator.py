"""The `stepscope` command has pyarrow allocate with the system pool (see stepscope.prefer_system_allocator),
except for `capture`, whose child process is the user's program, and never over the user's own choice; and
it has malloc keep freed memory (stepscope.keep_freed_memory), which the library never does by itself."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope.analyze.ingest import ingest_trace


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


_ONE_KERNEL = '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}'


def test_analysis_commands_tune_malloc_and_capture_does_not() -> None:
    # GIVEN the `stepscope` command WHEN it starts an analysis command THEN malloc keeps freed memory for ingest;
    # capture runs the user's program in its own process, which it leaves as it is
    code = "import stepscope\nfrom stepscope.cli import main\nmain([{command!r}, '--help'])\n"
    code += "print(stepscope.freed_memory_kept())"
    assert _run(code.format(command="ingest"))[-1] == str(sys.platform.startswith("linux"))
    assert _run(code.format(command="capture"))[-1] == "False"


def test_the_library_leaves_malloc_alone(tmp_path: Path) -> None:
    # GIVEN a program that ingests a trace through the API WHEN it has not asked for the tuning THEN malloc is
    # left as it is (a library call changes nothing process-wide)
    path = tmp_path / "t.json"
    path.write_text(_ONE_KERNEL)
    code = "import sys, stepscope\nfrom pathlib import Path\nfrom stepscope.analyze.ingest import ingest_trace\n"
    code += "print(ingest_trace(Path(sys.argv[1]), Path(sys.argv[2])).n_events, stepscope.freed_memory_kept())"
    done = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == ["1", "False"]


def test_ingest_goes_on_where_malloc_cannot_be_tuned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a C library that cannot be loaded by name (not glibc: mallopt is a glibc tuning)
    def no_library(name: object) -> None:
        raise OSError("no C library by that name")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.setattr(stepscope, "_freed_memory_kept", None)
    # WHEN the tuning is asked for THEN it is skipped, and a trace is ingested all the same
    assert stepscope.keep_freed_memory() is False
    path = tmp_path / "t.json"
    path.write_text(_ONE_KERNEL)
    assert ingest_trace(path, tmp_path / "out", force=True).n_events == 1
