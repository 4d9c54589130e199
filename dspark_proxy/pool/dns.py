"""`--worker dns:NAME:PORT`: a pool whose members are every address a DNS name resolves to, re-resolved
every few seconds (a Kubernetes headless service has one address per ready pod).

The watcher only turns answers into address lists and hands a changed list to the pool
(`PoolClient.set_addresses`, applied at the next round), so members join and leave through the same
path as a re-read `@FILE`: a member that goes away has its slots moved to the others, one that comes
gets its share. A failed or empty answer keeps the members the pool has (a DNS hiccup must not empty a
running pool; members that are really gone fail over as any dead worker does), and is logged once per
minute with a count.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence

__all__ = ["DnsWatcher", "resolve_all", "DEFAULT_EVERY_S"]

log = logging.getLogger(__name__)

DEFAULT_EVERY_S = 5.0
_LOG_EVERY_S = 60.0


def resolve_all(name: str, port: int) -> tuple[str, ...]:
    """Every address of `name` as sorted ``HOST:PORT`` strings (IPv6 bracketed); OSError if none."""
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    hosts = sorted({str(info[4][0]) for info in infos})
    return tuple(f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts)


class DnsWatcher:
    """Re-resolves `name` every `every_s` seconds on a daemon thread and calls `apply(addresses)` when the
    answer changes. `resolve` is replaceable (tests pass a stub)."""

    def __init__(self, name: str, port: int, apply: Callable[[Sequence[str]], None], *,
                 every_s: float = DEFAULT_EVERY_S,
                 resolve: Callable[[str, int], Sequence[str]] = resolve_all) -> None:
        self.name, self.port, self.every_s = name, port, every_s
        self._apply = apply
        self._resolve = resolve
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: tuple[str, ...] = ()
        self.failures = 0  # answers refused (an error, or no address) since start
        self._held = 0  # failures not logged since the last one that was
        self._next_log = 0.0

    def resolve_now(self) -> tuple[str, ...] | None:
        """One resolution: the new address list when it changed (and was applied), else None."""
        try:
            got = tuple(self._resolve(self.name, self.port))
            if not got:
                raise OSError("no address")
        except OSError as e:
            self.failures += 1
            self._log_failure(e)
            return None
        if got == self.current:
            return None
        self.current = got
        self._apply(got)
        return got

    def _log_failure(self, e: OSError) -> None:
        import time

        now = time.monotonic()
        if now < self._next_log:
            self._held += 1
            return
        more = f" (and {self._held} more failures in the last {_LOG_EVERY_S:g} s)" if self._held else ""
        self._held, self._next_log = 0, now + _LOG_EVERY_S
        log.warning("[pool] dns:%s:%d did not resolve (%s); keeping %d workers%s", self.name, self.port,
                    getattr(e, "strerror", None) or e, len(self.current), more)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dspark-pool-dns", daemon=True)
            self._thread.start()

    def kick(self) -> None:
        """Resolve again now (SIGHUP; signal-safe: sets an Event)."""
        self._kick.set()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.every_s)
            self._kick.clear()
            if not self._stop.is_set():
                self.resolve_now()
