"""One line and an exit code from the one table (exitcodes.py): how a command reports what a person must fix."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

__all__ = ["fail"]


def fail(command: str, message: str, code: int) -> NoReturn:
    """`dspark-proxy COMMAND: MESSAGE` on stderr, then exit `code` (no usage block, no traceback)."""
    click.echo(f"dspark-proxy {command}: {message}", err=True)
    sys.exit(code)
