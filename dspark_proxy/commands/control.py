"""`dspark-proxy stop` and `dspark-proxy status`: read and signal a running proxy through its segment."""

from __future__ import annotations

import json
import sys
import time

import click

from ..exitcodes import EXIT_FAILURE
from ..shm.segment import DEFAULT_NAME, SegmentError
from ..status import format_status, read_status, stop_proxy

__all__ = ["stop", "status", "read_status"]  # read_status: re-exported for older callers


@click.command("status")
@click.option("--name", default=DEFAULT_NAME, show_default=True, envvar="DSPARK_PROXY_NAME",
              help="Segment name of the proxy to inspect.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (header, words, proxy, shim).")
@click.option("--watch", type=float, default=None, metavar="SEC", help="Refresh every SEC seconds.")
def status(name: str, as_json: bool, watch: float | None) -> None:
    """Show a running proxy: header, words, heartbeat, breaker, counters, latencies, watchdog events.

    With --watch, a segment that is missing or unreadable for a moment (a proxy re-creating it for a
    new incarnation, or restarting) is reported and retried at the next refresh, not fatal."""
    while True:
        try:
            st = read_status(name)
        except SegmentError as e:
            click.echo(f"dspark-proxy status: {e}", err=True)
            if not watch:
                sys.exit(EXIT_FAILURE)
            click.echo(f"dspark-proxy status: retrying in {watch:g} s (--watch)", err=True)
            time.sleep(watch)
            continue
        if as_json:
            click.echo(json.dumps(st, default=str))
        else:
            if watch:
                click.echo("\x1b[2J\x1b[H", nl=False)
            click.echo(format_status(st))
        if not watch:
            return
        time.sleep(watch)


@click.command("stop")
@click.option("--name", default=DEFAULT_NAME, show_default=True, envvar="DSPARK_PROXY_NAME",
              help="Segment name of the proxy to stop.")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="Seconds to wait for a clean stop before giving up.")
def stop(name: str, timeout_s: float) -> None:
    """Stop a running proxy cleanly (SIGTERM: it fails every round ahead, then unlinks its segment)."""
    try:
        out = stop_proxy(name, timeout_s)
    except SegmentError as e:
        click.echo(f"dspark-proxy stop: {e}", err=True)
        sys.exit(EXIT_FAILURE)
    if not out.ok:
        click.echo(f"dspark-proxy stop: {out.message}", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(out.message)
