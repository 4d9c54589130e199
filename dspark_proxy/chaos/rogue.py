"""Faults from hostile peers at the worker: a flood of idle unauthenticated sockets while the proxy
reconnects (`connection_flood`), and a peer that speaks the real protocol and asks for slots and
sessions beyond the worker's bounds while the proxy drafts (`worker_memory`). Both loopback only and
bounded in count and time."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from .. import wire
from ..worker.testing import RawPeer, make_entries
from .flood import IdleFlood

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["connection_flood", "worker_memory"]

FLOOD_SOCKETS = 300
ROGUE_CONNECTIONS = 6
ROGUE_SESSIONS = 6  # per connection: past the worker's 4, and together past its memory budget


def connection_flood(c: Controller) -> None:
    """The worker restarted (the proxy must reconnect) and, as soon as it listens, hundreds of idle
    sockets at it, held past the worker's handshake timeout; drafts must come back during the flood."""
    hold = max(c.hold_s, 1.5)
    c.system.kill_worker()
    c.system.spawn_worker()
    idx = c.probe.count
    with IdleFlood("127.0.0.1", c.system.port, count=FLOOD_SOCKETS, max_s=hold + 5.0) as flood:
        t0 = time.monotonic()
        first = c.wait_resumed(idx, hold)
        resumed_ms = None if first is None else round((time.monotonic() - t0) * 1e3, 1)
        c.sleep(max(0.0, hold - (time.monotonic() - t0)))
        c.note(sockets=FLOOD_SOCKETS, opened=flood.opened, closed_by_worker=flood.closed_by_peer,
               open_at_end=flood.open_now, resumed_during_flood=int(first is not None),
               resumed_after_ms=resumed_ms)
    c.cleared()


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def worker_memory(c: Controller) -> None:
    """Rogue connections, each stepping new sessions with every slot it may use and as many past its
    agreed max_reqs, while the proxy drafts: every slot past the bound is BAD_ENTRY, every session past
    the per-connection limit or the memory budget is refused, and the proxy's session stays."""
    m, n, w, b = c.system.layout
    lay = wire.WireLayout(num_spec=n, window=w, row_bytes=b, max_reqs=m)
    worker = c.system.worker
    assert worker is not None
    rss0 = _rss_mb(worker.pid)
    half = max(1, m // 2)
    slots = list(range(half)) + list(range(m, m + half))  # half inside the bound, half past it
    e = make_entries([dict(slot=s, first_pos=0, n_rows=w, generation=1, flags=wire.RF_NEW_GEN | wire.RF_NEED_DRAFT)
                      for s in slots])
    rows = np.full((len(slots) * w, b), 0x5A, np.uint8)
    refused: Counter[str] = Counter()
    bad_slots = served = 0
    peers: list[RawPeer] = []
    end = time.monotonic() + c.hold_s
    try:
        for _ in range(ROGUE_CONNECTIONS):
            p = RawPeer(c.system.port, lay, session=secrets.randbits(62) | 1)
            peers.append(p)
            if not isinstance(p.handshake(), wire.Welcome):
                refused["handshake"] += 1
                continue
            for k in range(ROGUE_SESSIONS):
                r = p.step(e, rows, k + 1, session=secrets.randbits(62) | 1)
                if isinstance(r, wire.ErrorMsg):
                    refused[r.code] += 1
                elif isinstance(r, wire.StepReply):
                    served += 1
                    bad_slots += int(np.count_nonzero(r.status == wire.RS_BAD_ENTRY))
        c.sleep(max(0.0, end - time.monotonic()))  # hold every rogue session while the proxy drafts
        rss1 = _rss_mb(worker.pid)
    finally:
        for p in peers:
            p.close()
    c.note(rogue_sessions_served=served, rogue_refused=sum(refused.values()), refused_by_code=dict(refused),
           slots_past_max_reqs_refused=bad_slots, worker_rss_mb_before=rss0, worker_rss_mb_during=rss1,
           rss_growth_mb=None if rss0 is None or rss1 is None else round(rss1 - rss0, 1))
    c.cleared()
