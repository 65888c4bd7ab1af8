"""The trace cache: least recently used eviction to a size limit, entries in use never evicted, and two real
processes racing on one file (both loading it; one loading while another prunes) never see a torn entry."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import kernel, trace, write_trace
from click.testing import CliRunner

from stepscope.analyze import cache as cache_module
from stepscope.analyze.cache import cache_info, parse_size, prune
from stepscope.analyze.trace import load
from stepscope.cli import cli
from stepscope.errors import InputError, UsageError


def _traces(directory: Path, n: int, kernels: int = 3) -> list[Path]:
    return [write_trace(directory, trace(*[kernel(f"t{i}k{j}", ts=j * 10, dur=5) for j in range(kernels + i)]),
                        f"t{i}.json") for i in range(n)]


def _used_at(cache: Path, path: Path, when: float) -> str:
    """Load `path` into the cache and mark its entry last used at `when`; its sha256."""
    t = load(path, cache_dir=cache)
    sha = t.directory.name
    del t
    gc.collect()
    os.utime(cache / sha[:2] / sha, (when, when))
    return sha


def test_parse_size() -> None:
    assert parse_size("1024") == 1024
    assert parse_size("500M") == 500 * 1024**2
    assert parse_size("1.5GiB") == 3 * 1024**3 // 2
    assert parse_size("2g") == 2 * 1024**3
    with pytest.raises(UsageError, match="not a size: 'lots'"):
        parse_size("lots")


def test_prune_evicts_the_least_recently_used_first(tmp_path: Path) -> None:
    # GIVEN three cached traces used at t=100, 300, 200
    cache = tmp_path / "cache"
    a, b, c = _traces(tmp_path / "src", 3)
    shas = [_used_at(cache, p, when) for p, when in ((a, 100), (b, 300), (c, 200))]
    info = cache_info(cache)
    assert [e.sha256 for e in info.entries] == [shas[0], shas[2], shas[1]]
    assert info.oldest_use_s == 100 and info.newest_use_s == 300
    sizes = {e.sha256: e.bytes for e in info.entries}
    # WHEN pruned to the size of the two most recently used
    result = prune(cache, sizes[shas[1]] + sizes[shas[2]])
    # THEN only the one used longest ago is gone, whole
    assert result.removed == 1 and result.removed_bytes == sizes[shas[0]] and result.kept == 2
    assert {e.sha256 for e in cache_info(cache).entries} == {shas[1], shas[2]}
    assert not list(cache.rglob(".trash-*")) and not (cache / shas[0][:2] / shas[0]).exists()


def test_a_hit_counts_as_a_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a, b = _traces(tmp_path / "src", 2)
    sha_a, sha_b = _used_at(cache, a, 100), _used_at(cache, b, 200)
    load(a, cache_dir=cache)  # a is now the most recently used
    assert [e.sha256 for e in cache_info(cache).entries] == [sha_b, sha_a]


def test_an_ingest_evicts_down_to_the_limit_but_never_an_entry_in_use(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    a, b, c = _traces(tmp_path / "src", 3)
    held = load(a, cache_dir=cache)  # in use for the whole test
    _used_at(cache, b, 50)
    one = max(e.bytes for e in cache_info(cache).entries)
    monkeypatch.setenv("STEPSCOPE_CACHE_MAX", str(one + 10))
    fresh = load(c, cache_dir=cache)
    # b (not in use) was evicted; a (in use, and the oldest) and c (just ingested) stay
    assert {e.path for e in cache_info(cache).entries} == {held.directory, fresh.directory}
    assert held.events.select("name").collect().height == 3
    del held
    gc.collect()
    assert prune(cache, one + 10).removed == 1  # now a can go: c is still in use
    assert [e.path for e in cache_info(cache).entries] == [fresh.directory]


def test_the_cache_is_looked_over_only_when_it_may_be_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a cache limit far above what six small traces take, and every look over the cache counted
    looks: list[int] = []
    real = cache_module.prune

    def counted(cache_dir: Path | None = None, max_bytes: int = 0) -> cache_module.PruneResult:
        looks.append(max_bytes)
        return real(cache_dir, max_bytes)

    monkeypatch.setattr(cache_module, "prune", counted)
    monkeypatch.setattr(cache_module, "_seen", {})
    monkeypatch.setenv("STEPSCOPE_CACHE_MAX", "1G")
    cache = tmp_path / "cache"
    paths = _traces(tmp_path / "src", 6)
    # WHEN they are loaded one after another, THEN the cache is looked over once, not once per trace
    for p in paths[:3]:
        load(p, cache_dir=cache)
    assert len(looks) == 1
    # AND once the bytes it saw plus those it added pass the limit, it looks again and evicts down to it
    # (room for three entries and half of one: entries differ by some bytes, and the fourth may be the largest)
    one = max(e.bytes for e in cache_info(cache).entries)
    monkeypatch.setenv("STEPSCOPE_CACHE_MAX", str(7 * one // 2))
    gc.collect()
    load(paths[3], cache_dir=cache)
    assert len(looks) == 2 and len(cache_info(cache).entries) == 3
    # AND a look older than RESCAN_S is not trusted (other processes add entries too)
    monkeypatch.setattr(cache_module, "RESCAN_S", 0.0)
    load(paths[4], cache_dir=cache)
    assert len(looks) == 3


def test_clear_skips_entries_in_use_and_an_evicted_trace_loads_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a, b = _traces(tmp_path / "src", 2)
    held = load(a, cache_dir=cache)
    _used_at(cache, b, 10)
    result = prune(cache, 0)
    assert (result.removed, result.in_use, result.kept) == (1, 1, 1)
    assert load(b, cache_dir=cache).events.collect().height == 4  # re-ingested
    assert held.events.collect().height == 3


_RACER = r"""
import json, sys, time
from pathlib import Path
from stepscope.analyze import trace as trace_module
from stepscope.analyze.cache import prune

role, src, cache, go, log, rounds = sys.argv[1:7]
real = trace_module.ingest_trace
def counted(*args, **kwargs):
    with open(log, "a") as fh:
        fh.write("ingest\n")
    return real(*args, **kwargs)
trace_module.ingest_trace = counted
while not Path(go).exists():
    time.sleep(0.001)
seen = []
if role == "load":
    try:
        for _ in range(int(rounds)):
            t = trace_module.load(src, cache_dir=Path(cache))
            time.sleep(0.02)  # a prune that ignored readers would strike here
            seen.append(t.events.select("name").collect().height)
            del t  # (the entry may go now)
            time.sleep(0.02)
    finally:
        Path(go + ".done").touch()
else:  # evict everything, again and again, until the loader is done
    deadline = time.monotonic() + 60
    while not Path(go + ".done").exists() and time.monotonic() < deadline:
        seen.append(prune(Path(cache), 0).removed)
print(json.dumps(seen))
"""


def _race(tmp_path: Path, roles: list[str], rounds: int) -> tuple[list[list[int]], int]:
    src = _traces(tmp_path / "src", 1, kernels=2000)[0]
    cache, go, log = tmp_path / "cache", tmp_path / "go", tmp_path / "ingests.log"
    log.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [str(src), str(cache), str(go), str(log), str(rounds)]
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, role, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for role in roles]
    time.sleep(1.5)  # both imported and waiting
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs], log.read_text().count("ingest")


def test_two_processes_loading_one_file_at_once_ingest_it_once(tmp_path: Path) -> None:
    seen, ingests = _race(tmp_path, ["load", "load"], rounds=1)
    assert seen == [[2000], [2000]]
    assert ingests == 1  # the second waited for the first's entry instead of writing its own
    assert len(cache_info(tmp_path / "cache").entries) == 1
    assert not [p for p in (tmp_path / "cache").rglob(".*") if not p.name.endswith(".lock")]


def test_a_prune_racing_loads_never_tears_an_entry(tmp_path: Path) -> None:
    seen, ingests = _race(tmp_path, ["load", "prune"], rounds=25)
    assert seen[0] == [2000] * 25  # every load read a whole entry
    evicted = sum(seen[1])
    assert evicted >= 1 and evicted <= ingests <= evicted + 1  # evicted between loads, and loaded again
    assert not list((tmp_path / "cache").rglob(".trash-*"))


def test_cache_cli_info_prune_clear(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i, p in enumerate(_traces(tmp_path / "src", 3)):
        _used_at(cache, p, 1_000_000 + i)
    runner = CliRunner()
    out = runner.invoke(cli, ["cache", "info", "--dir", str(cache), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["entries"] == 3 and doc["bytes"] == cache_info(cache).total_bytes
    assert doc["oldest_use"] == "1970-01-12 13:46:40 UTC" and doc["newest_use"] == "1970-01-12 13:46:42 UTC"
    text = runner.invoke(cli, ["cache", "info", "--dir", str(cache)]).output
    assert f"location:   {cache}" in text and "entries:    3" in text
    one = max(e.bytes for e in cache_info(cache).entries)
    out = runner.invoke(cli, ["cache", "prune", "--dir", str(cache), "--max-size", str(one), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["removed"] == 2
    out = runner.invoke(cli, ["cache", "clear", "--dir", str(cache)])
    assert out.exit_code == 0 and "removed 1" in out.output
    assert cache_info(cache).entries == ()
    bad = runner.invoke(cli, ["cache", "prune", "--dir", str(cache), "--max-size", "lots"])
    assert isinstance(bad.exception, UsageError)
    # a --dir that is not there is said to be so (once an empty cache of 0 entries, exit 0)
    missing = runner.invoke(cli, ["cache", "info", "--dir", str(tmp_path / "typo")])
    assert isinstance(missing.exception, InputError) and "no cache there" in str(missing.exception)


def test_a_cached_trace_pickles_without_its_hold(tmp_path: Path) -> None:
    import pickle

    (src,) = _traces(tmp_path / "src", 1)
    held = load(src, cache_dir=tmp_path / "cache")
    copy = pickle.loads(pickle.dumps(held))
    assert copy.directory == held.directory and copy.events.collect().height == 3
    assert prune(tmp_path / "cache", 0).in_use == 1  # the original still holds its entry


def test_one_process_loads_a_file_again_while_its_first_trace_lives(tmp_path: Path) -> None:
    """(flock is per open file: a second load that asked for the lock exclusively would wait on itself forever)"""
    import threading

    (src,) = _traces(tmp_path / "src", 1)
    first = load(src, cache_dir=tmp_path / "cache")
    again: list[int] = []
    worker = threading.Thread(target=lambda: again.append(load(src, cache_dir=tmp_path / "cache").events.collect()
                                                          .height), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert again == [3] and first.events.collect().height == 3


def test_a_cached_sources_hash_is_remembered_against_its_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              cache_hashes: list[Path]) -> None:
    """The second load of an unchanged file reads none of it to find its entry; a file rewritten (same size, even
    its old mtime put back) is hashed again and loads its new content; a file changed just now is not remembered;
    `cache clear` forgets every hash."""
    import hashlib

    cache = tmp_path / "cache"
    (src,) = _traces(tmp_path / "src", 1)
    hashed = cache_hashes
    # a file changed within RACY_S: hashed each time, never remembered
    for _ in range(2):
        assert load(src, cache_dir=cache).directory.name == hashlib.sha256(src.read_bytes()).hexdigest()
    assert len(hashed) == 2 and not (cache / cache_module.HASHES).exists()
    # an older file: hashed once, then found by its stat
    monkeypatch.setattr(cache_module, "RACY_S", 0.0)
    first = load(src, cache_dir=cache).directory.name
    assert load(src, cache_dir=cache).directory.name == first and len(hashed) == 3
    # rewritten with the same size and its old mtime put back: ctime moved, so hashed again, the new content loaded
    before = src.stat()
    src.write_bytes(src.read_bytes().replace(b'"t0k0"', b'"t0kX"'))
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert src.stat().st_size == before.st_size
    again = load(src, cache_dir=cache)
    assert len(hashed) == 4 and again.directory.name == hashlib.sha256(src.read_bytes()).hexdigest() != first
    assert "t0kX" in again.events.collect()["name"].to_list()
    # a memo that cannot be read costs only the hash
    for memo in (cache / cache_module.HASHES).iterdir():
        memo.write_text("{not json")
    assert load(src, cache_dir=cache).directory.name == again.directory.name and len(hashed) == 5
    prune(cache, 0)
    assert not (cache / cache_module.HASHES).exists()


def test_a_copy_of_a_cached_file_is_named_as_given(tmp_path: Path) -> None:
    # GIVEN one trace's content in two runs' directories, under two names (the cache holds it once, by content)
    first = write_trace(tmp_path / "run_a", trace(kernel("k", ts=0, dur=5)), "worker0.pt.trace.json")
    copy = tmp_path / "run_b" / "rank0.pt.trace.json"
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())
    cache = tmp_path / "cache"
    a, b = load(first, cache_dir=cache), load(copy, cache_dir=cache)
    # THEN each is named after the file given (once both after whichever was read first), on one entry
    assert a.directory == b.directory
    assert (a.meta.source.path, a.source_name) == (str(first.resolve()), "worker0.pt.trace.json")
    assert (b.meta.source.path, b.source_name) == (str(copy.resolve()), "rank0.pt.trace.json")
    assert a.trace_id.startswith("worker0-") and b.trace_id.startswith("rank0-")


def test_mirrored_url_inputs_count_toward_the_cache_and_are_evicted(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    # GIVEN two traces loaded as file:// URLs: each is mirrored under CACHE/remote, then ingested into an entry
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = tmp_path / "xdg" / "stepscope"
    for i, path in enumerate(_traces(tmp_path / "src", 2)):
        load(f"file://{path}")
        gc.collect()  # (the Trace lets go of its entry)
        os.utime(cache / "remote" / "file" / path.relative_to("/").parent / f".{path.name}.remote",
                 (1_000 + i, 1_000 + i))
    # THEN cache info counts the mirrored files (once invisible to it, and never evicted): the slow sum of the files
    # under remote/, markers included
    on_disk = sum(f.stat().st_size for f in (cache / "remote").rglob("*") if f.is_file())
    info = cache_info(cache)
    assert len(info.mirrors) == 2 and info.mirror_bytes == on_disk > 0
    assert info.total_bytes == sum(e.bytes for e in info.entries) + on_disk
    assert [m.source for m in info.mirrors] == [f"file://{p.relative_to('/')}" for p in
                                                sorted((tmp_path / "src").glob("*"))][:2]
    text = CliRunner().invoke(cli, ["cache", "info", "--dir", str(cache)]).output
    assert "mirrored:   2 files of URL inputs" in text
    # AND a prune evicts them by last use with the entries, and clear removes them all
    prune(cache, info.total_bytes - 1)
    assert [m.last_used_s for m in cache_info(cache).mirrors] == [1_001]  # the one used at 1,000 went first
    CliRunner().invoke(cli, ["cache", "clear", "--dir", str(cache)])
    assert cache_info(cache).mirrors == () and not [f for f in (cache / "remote").rglob("*") if f.is_file()]
