"""CLI start-up benchmark: how long `stepscope --help` and a command's `--help` take, paired against
`python -c "import click"` (the floor: an interpreter plus click) in the same run.

    python benchmarks/cli_start.py          # 15 runs of each, interleaved
    python benchmarks/cli_start.py -n 30

Each run is a fresh process (wall time around `subprocess.run`), the commands in turn, so a busy moment of
the machine hits all of them alike. Prints the min and median of each and its ratio to the floor (target
from issue 23: within 2x).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    'python -c "import click"': [sys.executable, "-c", "import click"],
    "stepscope --help": [sys.executable, "-m", "stepscope", "--help"],
    "stepscope summary --help": [sys.executable, "-m", "stepscope", "summary", "--help"],
    "stepscope report --help": [sys.executable, "-m", "stepscope", "report", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=15, help="runs of each command")
    args = parser.parse_args()
    if shutil.which("stepscope") is None:
        print("note: the `stepscope` script is not on PATH; timing `python -m stepscope`", file=sys.stderr)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.n):
        for name, argv in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - start)
    floor = min(times['python -c "import click"'])
    print(f"{'command':<28} {'min s':>7} {'median s':>9} {'min / floor':>12}")
    for name, runs in times.items():
        print(f"{name:<28} {min(runs):>7.3f} {statistics.median(runs):>9.3f} {min(runs) / floor:>11.2f}x")


if __name__ == "__main__":
    main()
