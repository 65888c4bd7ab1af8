"""The `stepscope` command: a thin click group. Each subcommand lives in `stepscope/commands/<name>.py`.

Commands are imported lazily (only the one being run), so `stepscope --help` is fast and the CLI works
on a machine without torch: only `capture` touches it, and only when it runs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from stepscope import __version__, keep_freed_memory, prefer_system_allocator
from stepscope.errors import StepscopeError

# command name -> module under stepscope.commands that defines `command: click.Command`
COMMANDS: dict[str, str] = {
    "ingest": "ingest",
    "cache": "cache",
    "fleet": "fleet",
    "report": "report",
    "plot": "plot",
    "diff": "diff",
    "info": "info",
    "ops": "ops",
    "memory": "memory",
    "capture": "capture",
    "snapshot": "snapshot",
    "memory-timeline": "memory_timeline",
    "kernels": "kernels",
    "flops": "flops",
    "counters": "counters",
    "graphs": "graphs",
    "steps": "steps",
    "summary": "summary",
    "gaps": "gaps",
    "overlap": "overlap",
    "transfers": "transfers",
    "comm": "comm",
    "ranks": "ranks",
    "critical-path": "critical_path",
    "whatif": "whatif",
    "serving": "serving",
    "export": "export",
}


# command name -> its line in `stepscope --help`, so the list needs no command imported (each command's own
# --help has its whole text; tests/commands/test_cli_start.py keeps the two tables' names the same)
SUMMARIES: dict[str, str] = {
    "cache": "The cache of traces ingested on the fly: where, how big; evict the least recently used.",
    "capture": "Run a training/inference script under the profiler: traces, snapshots, a manifest.",
    "critical-path": "The chain of dependent work that sets each step's time: CPU, launch, kernels, syncs, idle.",
    "counters": "GPU hardware counters per kernel (CUPTI range profiler) with the op that launched it, FLOPs.",
    "comm": "Collectives across ranks: matched calls, aligned clocks, arrival skew, waits, busbw, straggler.",
    "diff": "Did my change help? Verdicts, step time, idle by cause, ops and kernels: BEFORE -> AFTER.",
    "export": "The trace plus the answers (steps, idle gaps by cause, verdict) as one file for Perfetto.",
    "fleet": "One row per trace and rank over many traces: steps, GPU busy, verdict, idle cause, MFU, memory.",
    "flops": "FLOPs per op, achieved TFLOP/s and GB/s against the roofline, MFU per step.",
    "graphs": "CUDA/HIP graph replays: kernels per replay, GPU share, Python line; ops via the capture profile.",
    "gaps": "Why is the GPU idle? Every idle gap, its cause, and the CPU op and Python line behind it.",
    "info": "What a trace holds (devices, ranks, steps, events) and what is odd about it.",
    "ingest": "Parse traces into a Parquet dataset, once (in parallel; unchanged files skipped).",
    "kernels": "GPU time by kernel name and by category (GEMM, convolution, attention, ...).",
    "memory": "Memory over time from a trace's [memory] events: the peak, the op at it, never freed.",
    "memory-timeline": "Bytes per category (parameters, optimizer state, activations, ...) over time.",
    "ops": "Per-op totals as torch's key_averages().table() prints them, from the trace alone.",
    "overlap": "CPU/GPU overlap, launch queue depth and the sync points.",
    "plot": "Write one figure of the report as a PNG.",
    "ranks": "Ranks side by side per step: compute, exposed comm, idle, imbalance, straggler and its cause.",
    "report": "One self-contained HTML report: a trace, a capture run, or a batch.",
    "serving": "Inference engine iterations: prefill/decode/mixed, batch, tokens; per phase p50/p95/p99, tokens/s.",
    "snapshot": "What held CUDA memory at the peak of a memory snapshot, by allocating line.",
    "steps": "Per step: wall, GPU busy and idle, data loading / forward / backward / optimizer.",
    "summary": "One verdict per step and overall (GPU-, launch-, data-loading-, sync-, transfer-bound).",
    "whatif": "Predicted step time if data loading vanished, kernels sped up, launches or syncs went away.",
    "transfers": "Host/device copies: bytes, GB/s, pageable vs pinned, exposed time.",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from `SUMMARIES`: `stepscope --help` imports no command (and so no polars)."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUMMARIES.get(name, "")) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None:
            return None
        if cmd_name != "capture":  # (capture runs the user's program: in this process, with this environment)
            prefer_system_allocator()
            keep_freed_memory()
        module = importlib.import_module(f"stepscope.commands.{module_name}")
        command: click.Command = module.command
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stepscope")
def cli() -> None:
    """Offline analysis of PyTorch profiler traces: where each step's time and memory go, and why the GPU
    sits idle. Capture on the GPU box, analyze anywhere (no GPU, no torch needed)."""


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: run the CLI and turn every StepscopeError into one line and an exit code."""
    from stepscope.analyze._workers import own_process

    own_process()  # this process is the CLI's: batch ingest may fork its workers from it
    try:
        return cli.main(args=argv, prog_name="stepscope", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except StepscopeError as exc:
        from stepscope.analyze.remote import as_given

        click.echo(f"stepscope: error: {as_given(str(exc))}", err=True)  # (a URL input named as given)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
