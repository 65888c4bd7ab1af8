"""Worker processes that die (`_workers.surviving_map`): the job that kills its worker is found and reported, every
other job gives its result, as a plain map would."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest
from dying_jobs import die_on_seven, square_or_die

from stepscope.analyze._workers import died_how, surviving_map
from stepscope.errors import StepscopeError


def _lost(args: tuple[int, int], how: str) -> tuple[int, str]:
    return args[0], how


def test_a_job_that_kills_its_worker_is_reported_and_the_others_finish() -> None:
    # GIVEN 12 jobs on 2 workers, job 5 killing whichever process runs it (SIGKILL, as the out-of-memory killer)
    # WHEN the pool breaks (every job in flight fails with it) THEN each of those is run again alone: job 5 is lost,
    # the others give their results, and the jobs not yet started run in a new pool
    results = list(surviving_map(square_or_die, [(i, 5) for i in range(12)], processes=2, lost=_lost))
    lost = [r for r in results if isinstance(r, tuple)]
    assert lost == [(5, "its worker process was killed by SIGKILL (what the out-of-memory killer sends: try fewer "
                        "--jobs, or more memory)")]
    assert sorted(r for r in results if isinstance(r, int)) == [i * i for i in range(12) if i != 5]


def test_this_process_takes_jobs_too_and_a_worker_s_exit_status_is_told() -> None:
    # GIVEN one worker and this process taking jobs (`here`): the first two jobs go to the worker, job 1 exits 3
    taken_here: list[int] = []

    def here(args: tuple[int, int]) -> int:
        taken_here.append(args[0])
        return square_or_die(*args)

    results = list(surviving_map(square_or_die, [(i, -1) for i in range(6)], processes=1, lost=_lost, here=here))
    assert (1, "its worker process exited with status 3") in results
    assert sorted(r for r in results if isinstance(r, int)) == [0, 4, 9, 16, 25] and taken_here


def test_no_death_is_a_plain_map() -> None:
    results = surviving_map(square_or_die, [(i, 100) for i in range(20)], processes=2, lost=_lost)
    assert sorted(results) == [i * i for i in range(20)]  # type: ignore[type-var]


def test_how_a_worker_died() -> None:
    assert died_how(-11) == "its worker process was killed by SIGSEGV"
    assert died_how(None) == "its worker process died" and died_how(0) == "its worker process died"


def test_a_run_s_worker_that_dies_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a run's per-trace work on worker processes, one job killing its worker THEN one line, not a traceback
    from stepscope.analyze import _comm_run

    monkeypatch.setattr(_comm_run, "usable_cores", lambda: 2)
    assert _comm_run.parallel_map(die_on_seven, range(5)) == [0, 1, 4, 9, 16]  # (below PARALLEL_FROM: here)
    with pytest.raises(StepscopeError, match=r"^the run's traces could not all be analysed: a worker process was "
                                             r"killed by SIGKILL \(what the out-of-memory killer sends"):
        _comm_run.parallel_map(die_on_seven, range(_comm_run.PARALLEL_FROM + 4))


def test_a_pool_that_breaks_while_jobs_are_handed_to_it_runs_them_in_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a pool that breaks as the third job is handed to it (a worker killed between two submits: CI once saw
    # the kill test's pool break there and the whole map raise) THEN that job and the rest run in a new pool, the
    # jobs already in flight give their results, and none is lost or run twice
    from stepscope.analyze import _workers

    real = _workers.worker_pool
    pools: list[int] = []

    def flaky(processes: int, **kwargs: Any) -> Any:
        pool = real(processes, **kwargs)
        pools.append(processes)
        if len(pools) == 1:
            submit, calls = pool.submit, [0]

            def breaks_at_third(*args: Any, **kw: Any) -> Any:
                calls[0] += 1
                if calls[0] == 3:
                    raise BrokenProcessPool("a worker died")
                return submit(*args, **kw)

            pool.submit = breaks_at_third  # type: ignore[method-assign]
        return pool

    monkeypatch.setattr(_workers, "worker_pool", flaky)
    results = list(surviving_map(square_or_die, [(i, 100) for i in range(8)], processes=2, lost=_lost))
    assert sorted(results) == [i * i for i in range(8)]  # type: ignore[type-var]
    assert len(pools) == 2


PARENT = """
import sys
from stepscope.analyze._workers import start_fork_server, worker_pool
start_fork_server(["exit_marker"])
with worker_pool(1) as pool:  # a worker forked from it, which ends through os._exit as before
    assert pool.submit(abs, -3).result() == 3
print("parent done")
"""
MARKER = """
import atexit, os
open(os.environ["MARKER"] + ".imported", "w").close()
atexit.register(lambda: open(os.environ["MARKER"] + ".shutdown", "w").close())
"""


def test_the_fork_server_ends_without_python_s_shutdown(tmp_path: Path) -> None:
    # GIVEN a process that starts the fork server with a module preloaded that marks its import and, at exit,
    # Python's shutdown (an atexit handler, as polars' and matplotlib's own)
    (tmp_path / "exit_marker.py").write_text(MARKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "MARKER": str(tmp_path / "m")}
    # WHEN it exits, and its output pipes close (the fork server holds them until it ends)
    done = subprocess.run([sys.executable, "-c", PARENT], env=env, capture_output=True, text=True, timeout=120)
    # THEN the fork server imported the module and ended without the shutdown (what a pipe waited for)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "parent done\n"
    assert (tmp_path / "m.imported").exists()
    assert not (tmp_path / "m.shutdown").exists()


def test_imported_anywhere_else_the_fork_server_exit_does_nothing(tmp_path: Path) -> None:
    code = "import stepscope.analyze._fork_server as f, atexit; assert not f._in_fork_server(); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
