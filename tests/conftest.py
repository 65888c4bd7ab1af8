"""Shared fixtures: the real corpus (skipped cleanly where ../shared is absent) and the builders' path."""

from __future__ import annotations

import sys
from pathlib import Path

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
