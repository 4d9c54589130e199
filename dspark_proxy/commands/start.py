"""`dspark-proxy start`: the proxy process, in the foreground (the library's `proxy.run_proxy`)."""

from __future__ import annotations

import logging
import sys

import click

from ..config import ProxyConfig, format_settings
from ..config_flags import build_config, click_options
from ..ops.deps import MissingDependency, proxy_needs
from ..ops.exitcodes import EXIT_MISSING_DEPENDENCY, EXIT_STARTUP_FAILURE
from ..ops.metrics import MetricsBindError
from ..ops.runtime import TokenFileError, read_token, setup_logging
from ..shm.segment import SegmentError

__all__ = ["start", "setup_logging", "read_token", "token_or_bad_parameter"]


def token_or_bad_parameter(path: str | None) -> bytes | None:
    """`read_token`, with an unreadable or empty file reported as a bad --token-file (exit 2)."""
    try:
        return read_token(path)
    except TokenFileError as e:
        raise click.BadParameter(str(e), param_hint="--token-file") from None


@click.command("start")
@click_options(ProxyConfig)
@click.pass_context
def start(ctx: click.Context, **_: object) -> None:
    """Run the proxy beside the engine (foreground; SIGTERM/SIGINT stop it cleanly)."""
    from ..proxy import run_proxy

    cfg, sources = build_config(ProxyConfig, ctx)
    setup_logging(cfg.log_level)
    logging.getLogger("dspark_proxy").info("[proxy] settings %s", format_settings(cfg, sources))
    token = token_or_bad_parameter(cfg.token_file)
    try:
        proxy_needs(cfg)  # before anything starts: a missing extra is one line, not a traceback
        run_proxy(cfg, token=token, sources=dict(sources))
    except MissingDependency as e:
        click.echo(f"dspark-proxy start: {e}", err=True)
        sys.exit(EXIT_MISSING_DEPENDENCY)
    except (SegmentError, MetricsBindError) as e:
        click.echo(f"dspark-proxy start: {e}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)
