"""One function per fault kind (the table is kinds.py): inject it, hold it while the engine runs, clear it (`c.cleared()`).

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

from ..ops.status import read_status
from ..shm.segment import SegmentError

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["faulty_worker"]  # the table of kinds (kinds.py) names each injector


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


def wait_proxy_served(c: Controller, timeout_s: float) -> float | None:
    """ms until the proxy's HELLO reached the worker just started (None: not within timeout_s). A
    faulty worker's fault is held from there: the proxy reconnects after a backoff, and on a busy
    machine hold_s from the spawn could pass before the proxy sent the faulty worker any STEP."""
    t0 = time.monotonic()
    while not c.system.proxy_served():
        if time.monotonic() - t0 > timeout_s:
            return None
        c.sleep(0.01)
    return round((time.monotonic() - t0) * 1e3, 1)


def faulty_worker(*flags: str) -> Callable[[Controller], None]:
    def inject(c: Controller) -> None:
        c.system.restart_worker(*flags)
        c.note(proxy_served_after_ms=wait_proxy_served(c, c.cfg.resume_timeout_s))
        c.sleep(c.hold_s)
        c.system.restart_worker()
        c.note(worker_flags=" ".join(flags))
        c.cleared()

    return inject


def slow_replies(c: Controller) -> None:
    faulty_worker("--fault-delay-ms", f"{2 * c.deadline_s * 1e3:g}")(c)


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
    """A worker with another window that it will not adopt: the proxy's client must refuse it with a clear message and the
    rounds go target-only. The client does not retry after a refused handshake, so after the right
    worker is back we first watch whether drafts resume by themselves, then restart the proxy."""
    m, n, w, b = c.system.layout
    seen = len(_DISABLED_RE.findall(c.system.proxy_log_text()))
    c.system.restart_worker("--no-adopt-shapes", layout=(m, n, w * 2, b))  # serving only its own window
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


def _breaker(c: Controller) -> tuple[dict, int]:
    """The proxy's published breaker snapshot and its segment incarnation ({} and -1 when unreadable)."""
    try:
        st = read_status(c.system.name)
    except (SegmentError, ValueError, OSError):
        return {}, -1
    return dict(((st.get("proxy") or {}).get("gauges") or {}).get("breaker") or {}), int(st["header"]["incarnation"])


def _wait_breaker(c: Controller, timeout_s: float, ok: Callable[[dict, int], bool]) -> tuple[dict, int]:
    end = time.monotonic() + timeout_s
    br, inc = _breaker(c)
    while not ok(br, inc) and time.monotonic() < end:
        c.sleep(0.05)
        br, inc = _breaker(c)
    return br, inc


def engine_restart(c: Controller) -> None:
    """The worker stops answering until the proxy's breaker opens; then the engine closes its shim and
    a new engine, numbering its rounds from 1, attaches to the same proxy; then the worker resumes.
    The proxy must count the cooldown in the new engine's rounds (before, it waited for the old
    engine's round number plus the cooldown): `breaker_opened_round` is in the new numbering."""
    trips0 = int(_breaker(c)[0].get("trips", 0))
    c.system.signal_worker(signal.SIGSTOP)
    try:
        # the breaker opened (it may be half-open already: the probe waits for a connection)
        br, inc = _wait_breaker(c, max(5.0, 100 * c.deadline_s), lambda b, i: int(b.get("trips", 0)) > trips0)
        c.note(breaker_trips_old=br.get("trips"), breaker_opened_round_old=br.get("opened_round"),
               old_engine_round=c.probe.t[-1] if c.probe.t else 0)
        restarted = c.restart_engine(10.0)
        c.note(restarted=restarted)
        if restarted:
            # the new incarnation's first snapshot (published as the new engine attaches, or after 1 s);
            # with no trip since, its breaker_opened_round is at or before the new engine's round 0
            br2, _ = _wait_breaker(c, 3.0, lambda b, i: i > inc and b.get("opened_round") is not None)
            c.note(breaker_state_new=br2.get("state"), breaker_trips_new=br2.get("trips"),
                   breaker_opened_round_new=br2.get("opened_round"),
                   new_engine_round=c.probe.t[-1] if c.probe.t else 0)
    finally:
        c.system.signal_worker(signal.SIGCONT)
    c.cleared()
