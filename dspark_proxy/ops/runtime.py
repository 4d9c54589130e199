"""Process setup shared by the proxy and the worker entry points: logging and the shared token."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging", "read_token", "TokenFileError"]


class TokenFileError(ValueError):
    """The token file cannot be read or is empty (the CLI reports it as a bad --token-file)."""


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def read_token(path: str | None) -> bytes | None:
    """The shared token from `path` (surrounding whitespace stripped), or None without a path."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as e:
        raise TokenFileError(f"cannot read token file {path}: {e}") from None
    if not token:
        raise TokenFileError(f"token file {path} is empty")
    return token
