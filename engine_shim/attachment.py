"""The shim's attach/detach handling: which proxy segment the engine's rounds go through.

Apart from shim.py because it is the one part of the shim two threads touch: the watchdog finds a
ready incarnation (`offer`) or notices it died (`lose`), and hands it over under `_lock` (held for a
few instructions, never across a wait); the engine thread applies it at the start of a round
(`boundary`), the only place the attach state moves (attach.py has the table). `seg`, `flags`,
`writer` and `state` are the engine thread's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from dspark_proxy.ops.events import EventRing, watchdog_event
from dspark_proxy.ops.stats import Stats
from dspark_proxy.shm import hostflag as hf
from dspark_proxy.shm.hostflag import AdaptiveSpin, HostFlags
from dspark_proxy.shm.layout import Word
from dspark_proxy.shm.ring_shm import write_ring_name
from dspark_proxy.shm.segment import Segment, owner_alive
from dspark_proxy.shm.target import write_engine_target

from .attach import AttachEvent, AttachState, next_state
from .row_ring import EngineRing
from .writer import RoundWriter

__all__ = ["Attachment", "reply_spin", "ENV_REPLY_SPIN_US"]

log = logging.getLogger("engine_shim.shim")  # the shim's one logger: attach lines read as the shim's

ENV_REPLY_SPIN_US = "DSPARK_PROXY_REPLY_SPIN_US"
REPLY_SPIN_US = 100.0  # AdaptiveSpin's own bound


def reply_spin(peer_pid: int) -> AdaptiveSpin:
    """How long `read_reply` may spin for the reply before it sleeps in the futex: up to
    DSPARK_PROXY_REPLY_SPIN_US (default 100), learned from when recent replies came (AdaptiveSpin). An engine
    whose thread has nothing else to do while its drafts come (its own CPU, as vLLM's demo placement
    gives it) can spin through the proxy's whole round: a sleeping vCPU took ~130 us to wake here
    (docs/performance.md, "Keeping the proxy's CPUs awake"). Never when engine and proxy share one CPU."""
    raw = os.environ.get(ENV_REPLY_SPIN_US, "")
    us = REPLY_SPIN_US
    if raw:
        try:
            us = float(raw)
            if not 0.0 <= us <= 1e6:
                raise ValueError(raw)
        except ValueError:
            log.warning("[shim] %s=%r: not a number of us in 0..1000000; %g used", ENV_REPLY_SPIN_US, raw,
                        REPLY_SPIN_US)
            us = REPLY_SPIN_US
    return AdaptiveSpin(max_ns=int(us * 1000), peer_pid=peer_pid)


class Attachment:
    """The attached segment (or the pending one, or none) and the incarnations given up on."""

    def __init__(self, ring: EngineRing, counters: Stats, events: EventRing, sampled: bool,
                 on_attached: Callable[[Segment, HostFlags], None], deadline_ms: Callable[[], float],
                 target_id: str = "", ring_name: str = "") -> None:
        self._ring, self._counters, self._events, self._sampled = ring, counters, events, sampled
        self._ring_name = ring_name  # the shared ring's object, named to each proxy ("" = private ring)
        self._target_id = target_id  # named to the proxy at each claim (dspark_proxy/shm/target.py)
        self._on_attached = on_attached  # the shim's watchdog watches round t's deadline from attach on
        self._deadline_ms = deadline_ms  # for the log line only
        self._lock = threading.Lock()
        self.state = AttachState.DETACHED
        self.seg: Segment | None = None
        self.flags: HostFlags | None = None
        self.writer: RoundWriter | None = None  # the attached segment's round writer
        self.pending: Segment | None = None  # found by the watchdog, attached by the engine thread
        self._lost: str | None = None  # set by the watchdog: detach at the next round boundary
        self._abandoned_incarnations: set[int] = set()
        self.incarnation = 0  # of the last segment attached to (events of later rounds name it)

    def _move(self, event: AttachEvent) -> None:
        self.state = next_state(self.state, event)

    def abandoned(self, incarnation: int) -> bool:
        """This shim gave up on that incarnation (detached, or refused its claim): never offer it again."""
        return incarnation in self._abandoned_incarnations

    def offer(self, seg: Segment) -> bool:
        """Watchdog: a ready incarnation with our parameters; attached at the next round boundary."""
        with self._lock:
            if self.state is not AttachState.DETACHED or self.pending is not None:
                return False
            self.pending = seg
            self._move(AttachEvent.FOUND)
            return True

    def lose(self, why: str) -> None:
        """Watchdog: the attached (or pending) proxy is gone; detach at the next round boundary."""
        with self._lock:
            if self._lost is None:
                self._lost = why

    def boundary(self, t: int) -> None:
        """Engine thread, start of enqueue(t): apply what the watchdog handed over. Nothing handed over
        (almost every round) is seen without the lock: a hand-over that lands just after this look is
        applied at the next boundary, as one that lands just after the locked read below would be."""
        if self._lost is None and self.pending is None:
            return
        with self._lock:
            lost, self._lost = self._lost, None
            pending = self.pending
        if lost is not None and self.state in (AttachState.ATTACHED, AttachState.PENDING):
            self._detach(lost)
        if self.state is AttachState.PENDING and pending is not None:
            self._try_attach(pending, t)

    def _try_attach(self, seg: Segment, t: int) -> None:
        with self._lock:
            self.pending = None
        # the claim is the pid itself (CAS engine_pid: 0 -> pid), then attached = t: nobody ever sees
        # an incarnation that is taken while its engine's pid is still 0 (shm_layout.md §7)
        if hf.cas(seg.mm, seg.layout.word_off(Word.ENGINE_PID), 0, os.getpid()):
            write_engine_target(seg.mm, self._target_id)  # before `attached`: the proxy reads it after
            write_ring_name(seg.mm, self._ring_name)  # likewise (shm/ring_shm.py)
            hf.store(seg.mm, seg.layout.word_off(Word.ATTACHED), t)
            owner = int(seg.header["owner_pid"])
            flags = HostFlags(seg, spin=reply_spin(owner), peer_pid=owner)
            flags.rebase(t)  # the handshake: the proxy's first round is t
            self.seg, self.flags = seg, flags
            self._on_attached(seg, flags)
            self.writer = RoundWriter(seg, self._ring, self._counters, self._sampled, bool(self._ring_name))
            self._move(AttachEvent.ATTACH_OK)
            self._counters.inc("attaches")
            self.incarnation = seg.incarnation
            self._events.record(**watchdog_event(round=t, how="attached", incarnation=seg.incarnation))
            log.info("[shim] attached name=%s incarnation=%d at round %d deadline_ms=%.3f", seg.name,
                     seg.incarnation, t, self._deadline_ms())
        else:
            # someone attached first. A live engine (two engines given one name): its proxy is left
            # alone, or the two would abandon each other's incarnations for ever. A gone one (or
            # this process, earlier): the incarnation cannot be re-based backwards, so it is abandoned
            # and the proxy starts afresh. The CAS failed, so the pid is the winner's, never 0.
            engine = seg.word(Word.ENGINE_PID)
            live_other = engine != os.getpid() and owner_alive(engine, 0)
            if live_other:
                log.error("[shim] %s is attached to engine pid %d: two engines share this name; this one "
                          "stays target-only until a new proxy incarnation appears", seg.name, engine)
                self._counters.inc("attach_refused_live_engine")
            else:
                seg.set_word(Word.ABANDONED, 1)
            self._abandoned_incarnations.add(seg.incarnation)
            seg.close()
            self._move(AttachEvent.ATTACH_REFUSED)
            self._counters.inc("attach_refused")

    def _detach(self, why: str) -> None:
        seg = self.seg if self.seg is not None else self.pending
        with self._lock:
            self.pending = None
        if seg is not None:
            self._abandoned_incarnations.add(seg.incarnation)
            _abandon(seg)
        self.seg = self.flags = None
        self._move(AttachEvent.LOST)
        self._counters.inc(f"detach_{why}")
        log.warning("[shim] detached why=%s: target-only until a new proxy incarnation appears", why)

    def close(self) -> None:
        """Abandon the attached and the pending segment (the proxy then makes a fresh one), unmap."""
        seg = self.seg
        with self._lock:
            pending, self.pending = self.pending, None
        for s in (seg, pending):
            if s is not None:
                _abandon(s)
        self.seg = self.flags = None
        self._move(AttachEvent.CLOSE)


def _abandon(seg: Segment) -> None:
    """Tell the proxy to make a fresh incarnation (best effort: an already unmapped segment raises
    ValueError), then unmap."""
    try:
        seg.set_word(Word.ABANDONED, 1)
    except ValueError:
        pass
    seg.close()
