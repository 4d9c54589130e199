"""Idle TCP connections at a worker that never send a byte: the `connection_flood` fault, and the test
of the worker's handshake budget. Loopback only, bounded in count, rate and time."""

from __future__ import annotations

import errno
import select
import socket
import threading
import time

from ..worker.server import is_loopback

__all__ = ["IdleFlood"]


class IdleFlood:
    """Keeps up to `count` idle connections open to host:port from one thread, reopening each one the
    server closes (at most `per_tick` a 5 ms tick, about 1000 a second), until stop() or `max_s`.
    `opened` and `closed_by_peer` say what happened."""

    def __init__(self, host: str, port: int, *, count: int = 300, max_s: float = 10.0, per_tick: int = 5) -> None:
        if not is_loopback(host):
            raise ValueError(f"an idle-socket flood goes to loopback addresses only, not {host!r}")
        if not 1 <= count <= 2000:
            raise ValueError(f"count={count}: 1..2000")
        self.addr = (host, port)
        self.count, self.max_s, self.per_tick = count, max_s, per_tick
        self.opened = 0
        self.closed_by_peer = 0
        self.open_now = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> IdleFlood:
        self._thread = threading.Thread(target=self._run, name="dspark-chaos-flood", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> IdleFlood:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_open(self, n: int, timeout_s: float) -> bool:
        """True once at least n connections are open at the same time."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.open_now >= n:
                return True
            time.sleep(0.005)
        return False

    def _run(self) -> None:
        socks: dict[int, socket.socket] = {}
        poller = select.poll()
        end = time.monotonic() + self.max_s
        initial = True
        tick = time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                now = time.monotonic()
                budget = 0
                if now >= tick:
                    budget = self.count if initial else self.per_tick
                    initial = False
                    tick = now + 0.005
                while len(socks) < self.count and budget > 0:
                    budget -= 1
                    s = socket.socket(socket.AF_INET6 if ":" in self.addr[0] else socket.AF_INET)
                    s.setblocking(False)
                    rc = s.connect_ex(self.addr)
                    if rc not in (0, errno.EINPROGRESS):
                        s.close()
                        break
                    socks[s.fileno()] = s
                    poller.register(s.fileno(), select.POLLIN)
                    self.opened += 1
                self.open_now = len(socks)
                wait_ms = max(1, int((tick - time.monotonic()) * 1000) + 1)
                for fd, _ev in poller.poll(wait_ms):  # readable: EOF, RST or an ERROR frame
                    poller.unregister(fd)
                    socks.pop(fd).close()
                    self.closed_by_peer += 1
        finally:
            for s in socks.values():
                s.close()
            self.open_now = 0
