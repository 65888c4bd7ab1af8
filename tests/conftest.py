"""Shared fixtures: the real corpus (skipped cleanly where ../shared is absent) and the builders' path."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CORPUS = ROOT.parent / "shared" / "corpus"
TOOLS = ROOT.parent / "shared" / "tools"

if str(TESTS) not in sys.path:  # so tests can `from builders import …`
    sys.path.insert(0, str(TESTS))


@pytest.fixture
def corpus() -> Path:
    """The real trace corpus; skips the test where it is absent (a user's machine)."""
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present (real-trace tests run only in the project workspace)")
    return CORPUS


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw traces loaded without an explicit cache_dir go to a temporary cache, never ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture(autouse=True)
def _not_the_clis_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that calls `stepscope.cli.main` in this process makes it the CLI's own (`_workers.own_process`), and
    `stepscope ingest` then forks its workers from it where it looks fresh. This process has run polars queries
    (polars' thread pool, which a forked child lacks: its first parallel query waits forever), so that claim ends
    with the test that made it."""
    from stepscope.analyze import _workers

    monkeypatch.setattr(_workers, "_owns_process", False)


@pytest.fixture
def collect_engines(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The engine each polars `LazyFrame.collect` of this process names while the test runs ('auto' where it names
    none: polars' default, the streaming engine)."""
    import polars as pl

    engines: list[object] = []
    collect = pl.LazyFrame.collect

    def spied(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
        engines.append(kwargs.get("engine", "auto"))
        return collect(self, *args, **kwargs)

    monkeypatch.setattr(pl.LazyFrame, "collect", spied)
    return engines


def reference_comm() -> ModuleType:
    """../shared/tools/reference_comm.py, the slow multi-rank reference, as a module (skips where absent)."""
    spec = importlib.util.spec_from_file_location("reference_comm", TOOLS / "reference_comm.py")
    if spec is None or spec.loader is None or not (TOOLS / "reference_comm.py").is_file():
        pytest.skip("../shared/tools/reference_comm.py is not present")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cache_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the trace cache reads to hash (`cache.file_sha256`, under `cache.source_sha256`) from here on."""
    from stepscope.analyze import cache

    hashed: list[Path] = []
    real = cache.file_sha256

    def counted(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(cache, "file_sha256", counted)
    return hashed


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the console entry point expecting a usage error: exit 2 and one line on stderr, returned."""
    from stepscope.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray cluster for every test of a module (the Ray tests, which skip where Ray is not installed);
    the engine finds it running and leaves it so."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()
