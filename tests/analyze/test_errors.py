"""Bad input: one clear line naming the file, a non-zero exit, nothing half-written, no traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from builders import cpu_op, kernel, trace, write_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.analyze.ingest import ingest_trace
from stepscope.cli import main
from stepscope.errors import InputError, StepscopeError, TraceFormatError

GOOD = json.dumps(trace(cpu_op("aten::mm", ts=1, dur=5, external_id=1), kernel("k", ts=7, dur=2))).encode()


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    cases = {
        "truncated_json": (GOOD[: len(GOOD) // 2], "truncated JSON"),
        "corrupt_gzip": (b"\x1f\x8b\x08\x00" + b"\x00garbage" * 20, "corrupt gzip"),
        "truncated_gzip": (gzip.compress(GOOD)[:-12], "gzip"),
        "not_a_trace": (json.dumps({"hello": "world"}).encode(), "no traceEvents"),
        "wrong_type_png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "not a JSON trace file"),
        "empty_file": (b"", "empty file"),
        "empty_trace": (json.dumps({"traceEvents": []}).encode(), "empty trace"),
        "only_metadata": (json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1,
                                                       "args": {"name": "x"}}]}).encode(), "empty trace"),
        # (inside a string such bytes are read as U+FFFD: see test_utf8.py)
        "non_utf8": (GOOD.replace(b'"aten::mm"', b'"aten::mm" \xff\xfe'), "UTF-8"),
        "events_not_objects": (json.dumps({"traceEvents": [1, 2, 3]}).encode(), "not an event object"),
        "top_level_number": (b"42", "not a JSON trace file"),
        "utf8_bom": (b"\xef\xbb\xbf" + GOOD, "byte order mark"),
    }
    out = {}
    for name, (data, needle) in cases.items():
        path = tmp / f"{name}.json"
        path.write_bytes(data)
        out[name] = (path, needle)
    return out


@pytest.mark.parametrize("case", ["truncated_json", "corrupt_gzip", "truncated_gzip", "not_a_trace",
                                  "wrong_type_png", "empty_file", "empty_trace", "only_metadata", "non_utf8",
                                  "events_not_objects", "top_level_number", "utf8_bom"])
def test_each_bad_input_is_one_clear_error_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    path, needle = _bad_files(tmp_path / "in")[case]
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        ingest_trace(path, out)
    message = str(info.value)
    assert message.startswith(str(path)) and needle in message and "\n" not in message
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_truncated_json_reports_the_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1,, "dur": 2}]}')
    with pytest.raises(TraceFormatError) as info:
        ingest_trace(path, tmp_path / "o")
    assert info.value.offset == 37 and "(byte 37)" in str(info.value)


def test_cli_prints_one_line_and_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _bad_files(tmp_path)["truncated_json"]
    with pytest.raises(SystemExit) as exit_info:
        main(["info", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepscope: error: ") and str(path) in err[0]


def test_missing_file_is_a_usage_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["info", str(tmp_path / "nope.json")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"stepscope: error: {tmp_path / 'nope.json'}: no such file or directory\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_never_crashes(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    # GIVEN a real-shaped trace with random bytes flipped, cut or inserted (plain or gzip)
    base = json.dumps(trace(*[cpu_op(f"aten::op{i}", ts=i, dur=1, external_id=i) for i in range(30)],
                            *[kernel(f"k{i}", ts=i + 0.5, dur=0.25, correlation=i) for i in range(30)])).encode()
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del raw[pos:]
            if not raw:
                break
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    blob = gzip.compress(bytes(raw)) if data.draw(st.booleans()) else bytes(raw)
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "fuzzed.json"
    path.write_bytes(blob)
    # WHEN it is ingested THEN it either works or raises a StepscopeError naming the file: never anything else
    try:
        ingest_trace(path, tmp / "out")
    except StepscopeError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        assert not (tmp / "out").exists()


def test_real_trace_corruption_never_crashes(corpus: Path, tmp_path: Path) -> None:
    good = (corpus / "traces/kineto/docs/after_fix_trace.json").read_bytes()
    for i, cut in enumerate(range(100, len(good), max(1, len(good) // 25))):
        path = tmp_path / f"cut{i}.json"
        path.write_bytes(good[:cut])
        with pytest.raises(TraceFormatError):
            ingest_trace(path, tmp_path / f"out{i}")


def test_directory_passed_as_file(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        ingest_trace(tmp_path, tmp_path / "out")


def test_good_file_still_fine(tmp_path: Path) -> None:
    path = write_trace(tmp_path, json.loads(GOOD), "ok.json")
    assert ingest_trace(path, tmp_path / "o").n_events == 2


# ----------------------------------------------------------------------------------------------- bad numbers

_EVENT = '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
_SECOND = len('{"traceEvents": [' + _EVENT + ", ")  # the byte offset of the second event
_DEEP = "[" * 5000 + "]" * 5000
_BAD_NUMBERS = {
    "metadata args 1e400": ('{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x", "v": 1e400}}',
                            "unreadable value in event args (Number out of range)", _SECOND),
    "ts of 40 digits": ('{"ph": "X", "cat": "cpu_op", "ts": 1' + "0" * 40 + "}", "ts: time", _SECOND),
    "dur of 40 digits": ('{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1' + "0" * 40 + "}", "dur: time", _SECOND),
    "ts 1e17 µs": ('{"ph": "X", "cat": "cpu_op", "ts": 1e17}', "ts: time 1e17 µs is beyond", _SECOND),
    "whole ts beyond int64 ns": ('{"ph": "X", "cat": "cpu_op", "ts": 100000000000000000}', "int64", _SECOND),
    "ts as text beyond int64 ns": ('{"ph": "X", "cat": "cpu_op", "ts": "-1e17"}', "int64", _SECOND),
    "ts + dur beyond int64 ns": ('{"ph": "X", "cat": "cpu_op", "ts": 9223372036854775, "dur": 1000}',
                                 "ts + dur: the event ends beyond", _SECOND),
    "ts 1e400": ('{"ph": "X", "cat": "cpu_op", "ts": 1e400}', "unreadable number in event field 'ts'", _SECOND),
    "pid of 5000 digits": ('{"ph": "X", "ts": 1, "pid": ' + "1" * 5000 + "}",
                           "unreadable number in event field 'pid' (Integer value out of range)", _SECOND),
    "float args of 400 digits": ('{"ph": "X", "cat": "cpu_op", "ts": 1, "args": {"flops": ' + "1" * 400 + "}}",
                                 "unreadable value in event args (Number out of range)", _SECOND),
    "args nested beyond the recursion limit": ('{"ph": "X", "ts": 1, "args": {"x": ' + _DEEP + "}}",
                                               "nested too deeply", None),
}


@pytest.mark.parametrize("case", list(_BAD_NUMBERS), ids=list(_BAD_NUMBERS))
def test_bad_numbers_and_deep_nesting_are_one_line_errors(case: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a trace whose second event holds a number the tables cannot hold exactly, or nests too deeply
    event, needle, offset = _BAD_NUMBERS[case]
    path = tmp_path / "bad.json"
    path.write_text('{"traceEvents": [' + _EVENT + ", " + event + "]}", encoding="utf-8")
    # WHEN `info` reads it THEN one line names the file (and the event's byte offset), and the exit code is 2
    with pytest.raises(SystemExit) as exit_info:
        main(["info", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    where = f"{path} (byte {offset}): " if offset is not None else f"{path}"
    assert err[0].startswith(f"stepscope: error: {where}")


@pytest.mark.parametrize("top", ['"x": 1e400', '"x": ' + _DEEP])
def test_bad_numbers_outside_trace_events_are_one_line_errors(top: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"traceEvents": [' + _EVENT + "], " + top + "}", encoding="utf-8")
    with pytest.raises(TraceFormatError, match="top-level key 'x'|nested too deeply"):
        ingest_trace(path, tmp_path / "out")


def test_huge_integers_in_text_fields_are_kept_as_their_digits(tmp_path: Path) -> None:
    # GIVEN integers beyond int64 (and beyond 128 bits) where text is expected, and a ts at int64's edge
    big = 10**40
    path = write_trace(tmp_path, {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": big, "pid": big, "tid": 2**64, "ts": 9223372036854774, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
         "args": {"correlation": 10**30, "blocks per SM": 2**70}},
    ]}, "big.json")
    ingest_trace(path, tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "events.parquet").to_pylist()
    # THEN the digits are kept exactly, an int column leaves the value null, and the ts is exact
    assert (rows[0]["name"], rows[0]["pid"], rows[0]["tid"]) == (str(big), str(big), str(2**64))
    assert rows[0]["ts_ns"] == 9223372036854774000 and rows[0]["dur_ns"] == 1000
    assert rows[1]["correlation"] is None and rows[1]["blocks_per_sm"] == float(2**70)
