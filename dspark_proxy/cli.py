"""`dspark-proxy`: one click group; each subcommand lives in dspark_proxy/commands/.

The CLI is a thin adapter: commands parse flags into a config and call the library; the library
never imports `commands/` or this module (exit codes live in `exitcodes.py`)."""

from __future__ import annotations

import click

from . import __version__
from .ops.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_STARTUP_FAILURE, EXIT_WRONG_DRAFTS

__all__ = ["main", "cli", "EXIT_OK", "EXIT_FAILURE", "EXIT_STARTUP_FAILURE", "EXIT_WRONG_DRAFTS"]



@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dspark-proxy")
def cli() -> None:
    """Remote DSpark drafting for LLM engines, without ever stalling the engine."""


def _register() -> None:
    """One module per command (commands/); each imports its heavy parts only when it runs."""
    from .commands.bench import bench
    from .commands.chaos import chaos
    from .commands.control import status, stop
    from .commands.demo import demo
    from .commands.eval_cmd import eval_cmd
    from .commands.generate import generate
    from .commands.start import start
    from .commands.train_drafter import train_drafter
    from .commands.worker import worker

    for cmd in (start, stop, status, worker, demo, chaos, bench, train_drafter, generate, eval_cmd):
        cli.add_command(cmd)


_register()


def main() -> None:
    cli(prog_name="dspark-proxy")


if __name__ == "__main__":
    main()
