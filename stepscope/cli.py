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
    "steps": "steps",
    "summary": "summary",
    "gaps": "gaps",
    "overlap": "overlap",
    "transfers": "transfers",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

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
        click.echo(f"stepscope: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
