"""One function per fault kind: inject it, hold it while the engine runs, clear it (`c.cleared()`).

Each runs on the controller thread while the engine thread keeps stepping; none of them waits on the
engine. What each clears to is the healthy system: the right worker listening on the known port and a
proxy attached. Anything worth reporting about one injection goes into `c.note(...)`.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .campaign import Controller

__all__ = ["INJECTORS"]


def worker_stall_short(c: Controller) -> None:
    stall_s = 0.4 * c.deadline_s
    end = time.monotonic() + c.hold_s
    n = 0
    while time.monotonic() < end:
        c.system.signal_worker(signal.SIGSTOP)
        time.sleep(stall_s)
        c.system.signal_worker(signal.SIGCONT)
        n += 1
        c.sleep(3 * c.deadline_s)
    c.note(stalls=n, stall_ms=round(stall_s * 1e3, 1))
    c.cleared()


def worker_stall_long(c: Controller) -> None:
    stall_s = max(0.5, 15 * c.deadline_s)
    c.system.signal_worker(signal.SIGSTOP)
    c.sleep(stall_s)
    c.system.signal_worker(signal.SIGCONT)
    c.note(stall_ms=round(stall_s * 1e3, 1))
    c.cleared()


def worker_kill(c: Controller) -> None:
    c.system.kill_worker()
    c.sleep(0.2)
    c.system.spawn_worker()
    c.cleared()


def _faulty_worker(*flags: str) -> Callable[[Controller], None]:
    def inject(c: Controller) -> None:
        c.system.restart_worker(*flags)
        c.sleep(c.hold_s)
        c.system.restart_worker()
        c.note(worker_flags=" ".join(flags))
        c.cleared()

    return inject


def slow_replies(c: Controller) -> None:
    _faulty_worker("--fault-delay-ms", f"{2 * c.deadline_s * 1e3:g}")(c)


def proxy_stop_short(c: Controller) -> None:
    stop_s = 0.4 * c.heartbeat_timeout_s
    c.system.signal_proxy(signal.SIGSTOP)
    c.sleep(stop_s)
    c.system.signal_proxy(signal.SIGCONT)
    c.note(stop_ms=round(stop_s * 1e3, 1))
    c.cleared()


def proxy_stop_long(c: Controller) -> None:
    stop_s = 2.0 * c.heartbeat_timeout_s + 0.1
    c.tally.sample()
    c.system.signal_proxy(signal.SIGSTOP)
    c.sleep(stop_s)
    c.system.signal_proxy(signal.SIGCONT)
    c.note(stop_ms=round(stop_s * 1e3, 1))
    c.cleared()


def round_loop_hang(c: Controller) -> None:
    """The proxy's round loop blocks (SIGUSR1 with --fault-round-hang-ms) while its heartbeat goes on:
    the shim must see it hung, detach and re-attach to the incarnation the proxy makes after."""
    c.tally.sample()
    c.system.signal_proxy(signal.SIGUSR1)
    c.sleep(c.system.round_hang_ms / 1e3 + 0.1)
    c.note(hang_ms=c.system.round_hang_ms)
    c.cleared()


def proxy_kill(c: Controller) -> None:
    c.tally.sample()  # the killed proxy's last counters
    c.system.kill_proxy()
    c.sleep(0.2)
    c.system.spawn_proxy()  # the engine keeps stepping (target-only) while the new one starts
    c.cleared()


def bad_descriptor(c: Controller) -> None:
    before = c.corruptor.total
    c.corruptor.every = 5
    c.sleep(c.hold_s)
    c.corruptor.every = 0
    c.note(corrupted=c.corruptor.total - before)
    c.cleared()


_DISABLED_RE = re.compile(r"\[client\] disabled: (.*)")


def worker_layout(c: Controller) -> None:
    """A worker with another window: the proxy's client must refuse it with a clear message and the
    rounds go target-only. The client does not retry after a refused handshake, so after the right
    worker is back we first watch whether drafts resume by themselves, then restart the proxy."""
    m, n, w, b = c.system.layout
    seen = len(_DISABLED_RE.findall(c.system.proxy_log_text()))
    c.system.restart_worker(layout=(m, n, w * 2, b))
    end = time.monotonic() + max(c.hold_s, 5.0)
    message = None
    while time.monotonic() < end:
        found = _DISABLED_RE.findall(c.system.proxy_log_text())
        if len(found) > seen:
            message = found[-1].strip()
            break
        c.sleep(0.05)
    c.note(refusal=message)
    c.sleep(min(c.hold_s, 0.3))
    c.system.restart_worker()
    c.cleared()
    self_recovered = c.wait_resumed(c.probe.count, c.self_recover_s) is not None
    c.note(self_recovered=self_recovered)
    if not self_recovered:
        c.tally.sample()
        c.system.stop_proxy()
        c.system.spawn_proxy()
        c.note(recovery="proxy restarted: the client stays disabled after a refused handshake")


INJECTORS: dict[str, Callable[[Controller], None]] = {
    "worker_stall_short": worker_stall_short,
    "worker_stall_long": worker_stall_long,
    "worker_kill": worker_kill,
    "conn_drop": _faulty_worker("--fault-drop-every", "4"),
    "garbage_replies": _faulty_worker("--fault-garbage-every", "3"),
    "wrong_step_id": _faulty_worker("--fault-wrong-step-every", "3"),
    "wrong_session": _faulty_worker("--fault-wrong-session-every", "3"),
    "slow_replies": slow_replies,
    "proxy_stop_short": proxy_stop_short,
    "proxy_stop_long": proxy_stop_long,
    "proxy_kill": proxy_kill,
    "round_loop_hang": round_loop_hang,
    "bad_descriptor": bad_descriptor,
    "worker_layout": worker_layout,
}
