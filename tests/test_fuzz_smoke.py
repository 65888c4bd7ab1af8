"""The fuzz targets of fuzz/ (see fuzz/README.md), each run for a few thousand inputs from its seed corpus.

A finding (an exception other than a StepscopeError, two paths that disagree, a crash, a hang, memory past the
limit) fails the test with libFuzzer's report and the input that caused it. The seed is fixed, so the smoke
explores the same inputs on every run: it guards what the targets already cover; finding new bugs takes the
long runs the README describes.
"""

from __future__ import annotations

import importlib.util
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.analyze._columns import scanner_available

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None,
    reason="atheris is not installed (the test extra installs it on Linux x86_64, Python 3.10 and 3.11)")

# inputs per target: each takes a few seconds (the trace target decodes every input four times with polars)
_RUNS = {"fuzz_trace": 1500, "fuzz_scan_events": 4000, "fuzz_snapshot": 2000, "fuzz_unpickle": 4000}
_SEEDS = {"fuzz_trace": "trace", "fuzz_scan_events": "scan_events", "fuzz_snapshot": "snapshot",
          "fuzz_unpickle": "unpickle"}
_NEEDS_SCANNER = {"fuzz_trace", "fuzz_scan_events"}


@pytest.mark.parametrize("target", list(_RUNS))
def test_fuzz_target_finds_nothing_in_a_few_thousand_inputs(target: str, tmp_path: Path) -> None:
    if target in _NEEDS_SCANNER and not scanner_available():
        pytest.skip("the compiled scanner was not built (no C compiler when installed)")
    # GIVEN the target's seed corpus, and a fresh folder for the inputs it finds (the seeds stay as they are)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # libFuzzer's RSS is the process's peak, which Linux carries over from this (forking) process through exec:
    # the limit is 2 GiB above what this test process already holds, not 2 GiB in all
    rss_limit_mb = 2048 + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    command = [sys.executable, str(FUZZ / f"{target}.py"), str(corpus), str(FUZZ / "seeds" / _SEEDS[target]),
               f"-runs={_RUNS[target]}", "-seed=1", "-max_len=8192", "-timeout=30", f"-rss_limit_mb={rss_limit_mb}",
               f"-artifact_prefix={tmp_path}/"]
    # WHEN libFuzzer runs it for a few thousand inputs
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    # THEN it finds nothing (else: its report, and the input, which `python fuzz/TARGET.py INPUT` replays)
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    report = "\n".join(line for line in done.stderr.splitlines() if not line.startswith(("#", "INFO: Instrumenting")))
    assert done.returncode == 0 and not found, f"{target} found {found}:\n{report[-6000:]}"
    assert f"Done {_RUNS[target]} runs" in done.stderr
