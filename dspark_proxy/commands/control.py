"""`dspark-proxy stop` and `dspark-proxy status`: read and signal a running proxy through its segment."""

from __future__ import annotations

import json
import sys
import time

import click

from ..ops.exitcodes import EXIT_FAILURE
from ..ops.screen import Screen
from ..ops.status import HEALTH_EXIT, format_status, read_status, stop_proxy
from ..shm.segment import DEFAULT_NAME, SegmentError

__all__ = ["stop", "status", "read_status"]  # read_status: re-exported for older callers


@click.command("status")
@click.option("--name", default=DEFAULT_NAME, show_default=True, envvar="DSPARK_PROXY_NAME",
              help="Segment name of the proxy to inspect.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (header, words, proxy, shim, "
              "drafting); with --watch, one a line.")
@click.option("--watch", type=float, default=None, metavar="SEC", help="Refresh every SEC seconds, redrawn in "
              "place (like watch); Ctrl-C ends it.")
def status(name: str, as_json: bool, watch: float | None) -> None:
    """Show a running proxy: header, words, heartbeat, breaker, counters, latencies, watchdog events, and
    what the drafting earns (mean accepted drafts a round and by position, fallbacks by cause).

    Exit code (docs/exit-codes.md): 0 healthy, 1 no such segment, 6 dead (killed), 7 hung (heartbeat
    stale), 8 refused by every worker; the JSON's "health" says which and why.

    With --watch, a segment that is missing or unreadable for a moment (a proxy re-creating it for a
    new incarnation, or restarting) is reported and retried at the next refresh, not fatal."""
    if not watch:
        try:
            st = read_status(name)
        except SegmentError as e:
            if as_json:  # a script parsing stdout gets JSON whatever happened (the exit code says it failed)
                click.echo(json.dumps({"name": name, "error": str(e)}))
            click.echo(f"dspark-proxy status: {e}", err=True)
            sys.exit(EXIT_FAILURE)
        click.echo(json.dumps(st, default=str) if as_json else format_status(st))
        code = HEALTH_EXIT[st["health"]["state"]]
        if code:
            click.echo(f"dspark-proxy status: {name}: {st['health']['state']}: {st['health']['why']}", err=True)
            sys.exit(code)
        return
    _watch(name, as_json, watch)


def _watch(name: str, as_json: bool, every: float) -> None:
    """--watch: a frame every `every` seconds (screen.py), until Ctrl-C (exit 0)."""
    try:
        if as_json:
            while True:
                try:
                    click.echo(json.dumps(read_status(name), default=str))
                except SegmentError as e:
                    click.echo(f"dspark-proxy status: {e}; retrying in {every:g} s", err=True)
                time.sleep(every)
        with Screen(sys.stdout) as screen:
            while True:
                head = f"Every {every:g}s: dspark-proxy status --name {name}    {time.strftime('%H:%M:%S')}"
                try:
                    body = format_status(read_status(name))
                except SegmentError as e:
                    body = f"dspark-proxy status: {e}\n(retrying in {every:g} s)"
                screen.draw(head + "\n\n" + body)
                time.sleep(every)
    except KeyboardInterrupt:
        pass


@click.command("stop")
@click.option("--name", default=DEFAULT_NAME, show_default=True, envvar="DSPARK_PROXY_NAME",
              help="Segment name of the proxy to stop.")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="Seconds to wait for a clean stop before giving up.")
def stop(name: str, timeout_s: float) -> None:
    """Stop a running proxy cleanly (SIGTERM: it fails every round ahead, then unlinks its segment).

    A dead (killed) proxy's segment is removed, and the exit code is 6; 1 no such segment, 7 still
    running after --timeout, 8 another user's proxy (docs/exit-codes.md)."""
    try:
        out = stop_proxy(name, timeout_s)
    except SegmentError as e:
        click.echo(f"dspark-proxy stop: {e}", err=True)
        sys.exit(EXIT_FAILURE)
    if out.code:
        click.echo(f"dspark-proxy stop: {out.message}", err=True)
        sys.exit(out.code)
    click.echo(out.message)
