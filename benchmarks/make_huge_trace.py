"""A trace larger than memory allows to hold comfortably, for the bounded-memory ingest benchmark (never committed).

    python benchmarks/make_huge_trace.py benchmarks/.data/large_cpu.pt.trace.json --copies 6 \
        -o benchmarks/.data/huge_cpu.pt.trace.json

Writes the base trace (a real capture: make_large_trace.py) with its traceEvents array repeated `--copies` times
in one array: the same top-level keys, `copies` times the events (each copy's events as recorded, so the copies
overlap in time: ingest reads them all the same, and the benchmark times only ingest). Streams the base file in
blocks: memory stays small whatever the size. `--gzip` compresses the output (level 1) as it is written.
"""

from __future__ import annotations

import argparse
import gzip
import mmap
import time
from pathlib import Path
from typing import IO

from stepscope.analyze._read import locate_events

_BLOCK = 64 << 20


def _events_span(data: mmap.mmap, path: Path) -> tuple[int, int]:
    """(just after the '[' of traceEvents, just after its last event) in the base trace."""
    start, end, _, _ = locate_events(data, path)  # '[' at start, ']' just before end
    close = data.rfind(b"]", start, end)
    body_end = close
    while data[body_end - 1:body_end].isspace():
        body_end -= 1
    return start + 1, body_end


def _copy(data: mmap.mmap, a: int, b: int, out: IO[bytes]) -> None:
    for pos in range(a, b, _BLOCK):
        out.write(data[pos:min(pos + _BLOCK, b)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="a plain JSON trace (make_large_trace.py writes one)")
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--gzip", action="store_true", help="write gzip (level 1)")
    args = parser.parse_args()
    started = time.perf_counter()
    with open(args.base, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        first, body_end = _events_span(data, args.base)
        opener = gzip.open(args.output, "wb", compresslevel=1) if args.gzip else open(args.output, "wb")
        with opener as out:
            _copy(data, 0, body_end, out)
            for _ in range(args.copies - 1):
                out.write(b",\n")
                _copy(data, first, body_end, out)
            _copy(data, body_end, len(data), out)
    size = args.output.stat().st_size
    print(f"{args.output}: {size / 1e6:,.0f} MB ({args.copies} x the events of {args.base.name}) "
          f"in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
