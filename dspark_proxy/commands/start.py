"""`dspark-proxy start`: the proxy process, in the foreground."""

from __future__ import annotations

import logging
import sys

import click

from ..config import ProxyConfig, build_config, click_options, format_settings
from ..shm.segment import SegmentError

__all__ = ["start", "setup_logging", "read_token"]


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def read_token(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as e:
        raise click.BadParameter(f"cannot read token file {path}: {e}", param_hint="--token-file") from None
    if not token:
        raise click.BadParameter(f"token file {path} is empty", param_hint="--token-file")
    return token


@click.command("start")
@click_options(ProxyConfig)
@click.pass_context
def start(ctx: click.Context, **_: object) -> None:
    """Run the proxy beside the engine (foreground; SIGTERM/SIGINT stop it cleanly)."""
    from ..cli import EXIT_STARTUP_FAILURE
    from ..proxy import run_proxy

    cfg, sources = build_config(ProxyConfig, ctx)
    setup_logging(cfg.log_level)
    logging.getLogger("dspark_proxy").info("[proxy] settings %s", format_settings(cfg, sources))
    token = read_token(cfg.token_file)
    try:
        run_proxy(cfg, token=token, sources=dict(sources))
    except SegmentError as e:
        click.echo(f"dspark-proxy start: {e}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
