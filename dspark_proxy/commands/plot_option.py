"""`--plot` for bench, eval and chaos, checked before anything is measured (dspark_proxy/plotting.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..ops.deps import MissingDependency
from ..ops.exitcodes import EXIT_MISSING_DEPENDENCY

__all__ = ["plot_option"]


def plot_option(command: str, value: str | None, *, legacy_png: bool = False) -> tuple[Path | None, str | None]:
    """plotting.plot_target, its errors as one line: without matplotlib exit code 5, a path that cannot
    be used a usage error naming it."""
    from ..plotting import plot_target

    try:
        return plot_target(command, value, legacy_png=legacy_png)
    except MissingDependency as e:
        click.echo(f"dspark-proxy {command}: {e}", err=True)
        sys.exit(EXIT_MISSING_DEPENDENCY)
    except (ValueError, OSError) as e:
        raise click.BadParameter(str(e), param_hint="--plot") from None
