"""The shim's watchdog thread: late rounds, lost proxies, new incarnations (shm_layout.md §7-§8).

Three jobs, escalating:
1. The round in flight: from `gathered`, wait (in C, GIL released) until it is published or its
   deadline passes; at the deadline claim it and publish a failed reply. The claim is made inside
   the C call, so engine threads holding the GIL cannot make it late. (read_reply makes the same
   claim when the engine gets there first; the CAS lets exactly one of them win.)
2. The proxy: pid gone, heartbeat stale, round loop stuck (a gathered round not begun for the
   heartbeat timeout), state stopping/dead, segment abandoned or replaced by a new incarnation under
   the same name: fail every round far ahead and hand the engine thread a detach. Checked every
   `check_every_s()` (2.5 looks, at most a quarter of the heartbeat timeout); the proxy's death wakes
   the wait at once (its pidfd, liveness.py). Few wakes: an idle engine pays for each (docs/performance.md, "Idle, state by state").
3. Detached: look for a ready incarnation every `look_every_s` (100 ms), validate it against the
   engine's parameters in this thread (not the engine's), and offer it; the engine thread attaches
   at its next round.

The last resort is injectable (`on_dead=`), as PyTorch's heartbeat monitor's terminate is, so
tests can observe it.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Protocol

from dspark_proxy.ops.events import EventRing
from dspark_proxy.ops.stats import Stats
from dspark_proxy.shm.hostflag import FAR_AHEAD, WAIT_FAILED_BY_ME, HostFlags, monotonic_ns
from dspark_proxy.shm.layout import State, Word
from dspark_proxy.shm.segment import LayoutMismatch, Segment, SegmentError, owner_alive, shm_name

from .attach import AttachState
from .liveness import OwnerWatch
from .placement import watcher_cpus

__all__ = ["WatchedShim", "Watchdog"]

log = logging.getLogger(__name__)

_STATS_EVERY_S = 0.5  # while rounds run (or anything else the snapshot shows changes)
_STATS_IDLE_EVERY_S = 5.0  # otherwise: an unchanged snapshot is not re-encoded ten times a second


class WatchedShim(Protocol):
    """What the watchdog needs of its shim (engine_shim/shim.py), and nothing else. The shim's engine
    thread owns the rest; what is called here from the watchdog's thread is safe from it: `offer` and
    `lose` hand over under its attachment's lock (attachment.py), `note_watchdog` records an event, the
    rest is read."""

    name: str | None
    max_reqs: int
    num_spec: int
    window: int
    row_bytes: int
    sampled: bool
    look_every_s: float
    heartbeat_timeout_ns: int
    counters: Stats
    events: EventRing

    @property
    def state(self) -> AttachState: ...
    @property
    def segment(self) -> Segment | None: ...
    def deadline_ms(self) -> float: ...
    def round_in_flight(self) -> tuple[int, int]: ...
    def abandoned(self, incarnation: int) -> bool: ...
    def offer(self, seg: Segment) -> bool: ...
    def lose(self, why: str) -> None: ...
    def note_watchdog(self, t: int, n: int, how: str) -> None: ...


class Watchdog:
    """A named daemon thread with start/stop/join; stop() wakes it at once."""

    def __init__(self, shim: WatchedShim, on_dead: Callable[[Segment, str], None] | None = None) -> None:
        self.shim = shim
        self.on_dead = on_dead or self._fail_far_ahead
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dspark-watchdog", daemon=True)
        self._flags: HostFlags | None = None
        self._flags_seg: Segment | None = None
        self._watcher = None  # the C thread making the deadline claims for the attached segment
        self._watcher_seg: Segment | None = None
        self._wlock = threading.Lock()  # the two fields above: set by this thread and the engine's
        self.started = False
        self._next_look = 0.0
        self._next_stats = 0.0
        self._since_ns = 0  # when this thread first saw the attached segment
        self._stats_seen: tuple | None = None  # what the last snapshot showed (see _publish_stats)
        self._owner = OwnerWatch()  # the attached proxy's liveness (liveness.py)
        self._rejected: tuple[int, int] | None = None  # (inode, ctime) of a segment refused for good
        self._wake_fds: tuple[int, int] | None = None  # a pipe: stop() ends the attached wait at once
        self._fds_lock = threading.Lock()
        self._kick = threading.Event()  # stop(), or the engine thread attached: end a pending wait
        self._poller: tuple[tuple[int, ...], select.poll] | None = None  # for _sleep_attached
        self._mismatch_logged: set[int] = set()
        self._lost_incarnation: int | None = None  # on_dead ran for it: once per incarnation
        self._next_name_check = 0.0
        self._stall: tuple[Segment, int, int] | None = None  # (segment, proxy_round, since ns): see _stalled
        self.claims = 0  # rounds this thread failed at their deadline
        self.lateness_ns: list[int] = []  # claim time minus deadline, for the GIL-isolation report
        self.asleep_since_ns = 0  # see _nap

    def start(self) -> None:
        self.started = True
        self._wake_fds = os.pipe()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        with self._fds_lock:
            if self._wake_fds is not None:
                try:
                    os.write(self._wake_fds[1], b"x")
                except OSError:
                    pass  # the pipe is full: a wake is already there

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._tick()
                except Exception:  # noqa: BLE001 - the watchdog must outlive any one bad tick
                    log.exception("[watchdog] tick failed")
                    self._nap(self._stop.wait, 0.05)
        finally:
            self._stop_watcher()
            self._owner.close()
            with self._fds_lock:
                fds, self._wake_fds = self._wake_fds, None
            for fd in fds or ():
                os.close(fd)

    def _tick(self) -> None:
        self._kick.clear()  # before the state is read: a kick from here on ends the pending wait
        shim = self.shim
        seg = shim.segment
        if seg is None or shim.state is not AttachState.ATTACHED:
            self._stop_watcher(unless_attached=True)
            self._look_for_proxy()
            # pending: nothing to do until the engine thread attaches at its next round (it then
            # starts the deadline watcher itself): the attached checks' cadence, not a faster one
            if shim.state is AttachState.PENDING:
                self._nap(self._kick.wait, self.check_every_s())  # watch() kicks it as the engine attaches
            else:
                self._nap(self._stop.wait, shim.look_every_s)
            return
        if self._flags_seg is not seg:
            self._flags, self._flags_seg = HostFlags(seg), seg
            self._since_ns = monotonic_ns()  # the heartbeat's age counts from here (see _proxy_lost)
        flags = self._flags
        assert flags is not None
        try:
            if self._lost_incarnation == seg.incarnation:
                # already failed ahead and handed over: the engine thread detaches at its next round
                self._nap(self._stop.wait, shim.look_every_s)
                return
            why = self._proxy_lost(seg)
            if why is not None:
                self._lost_incarnation = seg.incarnation
                self._stop_watcher()
                self.on_dead(seg, why)
                shim.lose(why)
                self._nap(self._stop.wait, 0.01)
                return
            self._publish_stats(seg)
            self._watch(seg, flags)
            self._sleep_attached(seg)
        except ValueError:
            # the engine thread detached and unmapped this segment under us: next tick sees it
            self._flags = self._flags_seg = None

    def _nap(self, wait: Callable, timeout: float) -> None:
        """Block in `wait(timeout)` (the GIL released), with `asleep_since_ns` set meanwhile: nonzero,
        this thread holds no GIL and has not since then (timing tools: docs/chaos.md)."""
        self.asleep_since_ns = monotonic_ns()
        try:
            wait(timeout)
        finally:
            self.asleep_since_ns = 0  # set with the GIL held again

    def check_every_s(self) -> float:
        """The attached checks' cadence: 2.5 looks, at most a quarter of the heartbeat timeout
        (0.25 s by default). A hung proxy is then seen within 1.25 heartbeat timeouts; a dead one at
        once (its pidfd wakes the wait); a late round does not wait for this thread at all (the C
        watcher claims it)."""
        shim = self.shim
        return min(2.5 * shim.look_every_s, shim.heartbeat_timeout_ns / 4e9)

    def _sleep_attached(self, seg: Segment) -> None:
        """Until the next checks, the owner's exit or stop(), whichever comes first."""
        fds = [fd for fd in (self._owner.fd(seg), self._wake_fds[0] if self._wake_fds else -1) if fd >= 0]
        if not fds or self._stop.is_set():
            self._nap(self._stop.wait, self.check_every_s())
            return
        key = tuple(fds)
        if self._poller is None or self._poller[0] != key:
            p = select.poll()
            for fd in fds:
                p.register(fd, select.POLLIN)
            self._poller = (key, p)
        self._nap(self._poller[1].poll, max(1, int(self.check_every_s() * 1e3)))

    def _watch(self, seg: Segment, flags: HostFlags) -> None:
        """Keep a C watcher thread on the attached segment and turn what it did into events.

        The deadline claims themselves happen on that thread, which never takes the GIL, so engine
        threads keeping the GIL busy cannot make them late; this Python thread only reports them."""
        self.watch(seg, flags)
        self.report()

    def watch(self, seg: Segment, flags: HostFlags) -> None:
        """Start the C watcher on `seg` unless it already watches it. The engine thread calls this as
        it attaches, so the first rounds of an incarnation are watched at once: waiting for this
        thread's next tick meant waiting for the GIL, and busy engine threads let round t0 go
        unclaimed for tens of ms (tests/test_watchdog.py, lateness)."""
        with self._wlock:
            if self._watcher_seg is seg:
                return
            old = self._watcher
            # off the engine's CPUs when it is pinned (placement.py): its wakes would stall the engine's step
            self._watcher = flags.watcher(flags.load(Word.CLAIMED), int(self.shim.deadline_ms() * 1e6),
                                          watcher_cpus())
            self._watcher_seg = seg
        self._kick.set()  # the attached checks begin now, not at the end of a pending wait
        if old is not None:
            self._retire(old)

    def report(self) -> None:
        """Turn the watcher's claims into events. Called by this thread every tick and by read_reply
        after a failed round (so its event is there when read_reply returns); the C side's drain is
        locked, and each record comes out once."""
        w = self._watcher
        if w is None:
            return
        for t, outcome, n, claim_ns, deadline_ns in w.drain():
            if outcome == WAIT_FAILED_BY_ME:
                self.claims += 1
                self.lateness_ns.append(claim_ns - deadline_ns)
                del self.lateness_ns[:-4096]
                self.shim.note_watchdog(t, n, "watchdog")

    def _stop_watcher(self, unless_attached: bool = False) -> None:
        """With `unless_attached`, keep a watcher on the segment the shim is attached to now: this thread
        saw the shim unattached, and the engine thread may have attached and started that watcher
        since (stopped, the first rounds went unclaimed until this thread's next tick, which busy
        engine threads delayed by hundreds of ms)."""
        with self._wlock:
            if unless_attached and self._watcher is not None and self.shim.state is AttachState.ATTACHED \
                    and self._watcher_seg is self.shim.segment:
                return
            w, self._watcher, self._watcher_seg = self._watcher, None, None
        if w is not None:
            self._retire(w)

    def _retire(self, w) -> None:
        w.stop()
        for t, outcome, n, _claim_ns, _deadline_ns in w.drain():
            if outcome == WAIT_FAILED_BY_ME:
                self.claims += 1
                self.shim.note_watchdog(t, n, "watchdog")

    def _proxy_lost(self, seg: Segment) -> str | None:
        shim = self.shim
        state = seg.word(Word.STATE)
        if state in (State.STOPPING, State.DEAD):
            return "proxy_stopping"
        if seg.word(Word.ABANDONED):
            return "abandoned"
        if not self._owner.alive(seg):
            return "proxy_dead"
        # from the attach on: a proxy waiting for an engine beats only once a second (proxy.py)
        age = monotonic_ns() - max(seg.word(Word.HEARTBEAT_NS), self._since_ns)
        if age > shim.heartbeat_timeout_ns:
            return "proxy_hung"
        if self._stalled(seg):
            return "round_loop_hung"
        if self._replaced(seg):
            return "proxy_replaced"
        return None

    def _stalled(self, seg: Segment) -> bool:
        """The round loop is stuck while the heartbeat thread goes on: a round is gathered that the
        proxy has not begun (`proxy_round`, written as it begins each round, is behind `gathered`) and
        `proxy_round` has not moved for `heartbeat_timeout_s`. A slow worker does not count: the proxy
        still begins every round (the watchdog fails the late ones and the proxy skips them), so
        `proxy_round` moves at least once per STEP timeout."""
        g, pr = seg.word(Word.GATHERED), seg.word(Word.PROXY_ROUND)
        if g <= pr:
            self._stall = None
            return False
        now = monotonic_ns()
        st = self._stall
        if st is None or st[0] is not seg or st[1] != pr:
            self._stall = (seg, pr, now)
            return False
        return now - st[2] > self.shim.heartbeat_timeout_ns

    def _replaced(self, seg: Segment) -> bool:
        """The name now points at another incarnation (a new proxy took it over): every look_every_s."""
        now = time.monotonic()
        if now < self._next_name_check:
            return False
        self._next_name_check = now + self.shim.look_every_s
        if not seg.name_moved():
            return False  # one stat: the common case costs no open, map or header read
        try:
            cur = Segment.open(self.shim.name)
        except SegmentError:
            return False  # unlinked, or a new one half-created: the mapped segment still works
        try:
            return cur.incarnation != seg.incarnation
        finally:
            cur.close()

    def _fail_far_ahead(self, seg: Segment, why: str) -> None:
        """Every round the engine may still run on this segment is target-only at once."""
        t, n = self.shim.round_in_flight()
        if self._flags is not None:
            self._flags.fail_all(t + FAR_AHEAD)
        self.shim.note_watchdog(t, n, why)
        log.warning("[watchdog] proxy lost why=%s incarnation=%d round=%d: failing ahead, detaching", why,
                    seg.incarnation, t)

    # ------------------------------------------------------------------ detached

    def _look_for_proxy(self) -> None:
        shim = self.shim
        now = time.monotonic()
        if shim.state is not AttachState.DETACHED or now < self._next_look:
            return
        self._next_look = now + shim.look_every_s
        # one stat per look while nothing new is there: no name, or the same object we refused for
        # good last time (abandoned, another layout, a dead owner): a leftover of a killed proxy was
        # opened, mapped and read ten times a second (docs/performance.md, "Idle, state by state")
        try:
            st = os.stat("/dev/shm" + shm_name(shim.name))
        except (OSError, ValueError):
            return
        ident = (st.st_ino, st.st_ctime_ns)
        if ident == self._rejected:
            return
        try:
            seg = Segment.open(shim.name)
        except SegmentError:
            return
        ok = False
        final = True  # refused for good unless a return below says otherwise
        try:
            inc = seg.incarnation
            if shim.abandoned(inc):
                return
            try:
                seg.check_params(max_reqs=shim.max_reqs, num_spec=shim.num_spec, window=shim.window,
                                 row_bytes=shim.row_bytes, sampled=shim.sampled,
                                 segment_rows=None if shim.shared_ring else True)  # a private ring needs them
            except LayoutMismatch as e:
                if inc not in self._mismatch_logged:
                    self._mismatch_logged.add(inc)
                    log.error("[watchdog] %s: staying target-only", e)
                    shim.counters.inc("attach_mismatch")
                return
            if seg.word(Word.ABANDONED):
                return
            h = seg.header
            if not owner_alive(int(h["owner_pid"]), int(h["owner_start_ticks"])):
                return
            if seg.word(Word.STATE) != State.READY:
                final = False  # being created: READY comes next
                return
            engine = seg.word(Word.ENGINE_PID)
            if engine != 0:
                # taken (engine_pid is the attach claim, set before anything else), by an engine that
                # is gone (or by us, earlier): the proxy must start afresh, since its words cannot be
                # re-based backwards. A live engine's, mid-attach or not, is left alone.
                if not owner_alive(engine, 0) or engine == _getpid():
                    seg.set_word(Word.ABANDONED, 1)
                else:
                    final = False  # a live engine's: looked at again, it may die and leave it
                return
            ok = shim.offer(seg)
            final = False
        finally:
            if not ok:
                self._rejected = ident if final else None
                seg.close()

    def _publish_stats(self, seg: Segment) -> None:
        """Every 0.5 s while what the snapshot shows changes (a round, a claim, an event, the state),
        else every 5 s: encoding an unchanged snapshot was most of an idle engine's watchdog cost."""
        now = time.monotonic()
        if now < self._next_stats:
            return
        shim = self.shim
        seen = (seg, shim.state, shim.round_in_flight(), self.claims, shim.events.total)
        if seen == self._stats_seen and now < self._next_stats + _STATS_IDLE_EVERY_S:
            return
        self._next_stats, self._stats_seen = now + _STATS_EVERY_S, seen
        st = shim.counters
        try:
            st.set("state", shim.state.value)
            st.set("round", shim.round_in_flight()[0])
            st.set("watchdog_events", shim.events.dump())
            st.set("watchdog_claims", self.claims)
            seg.write_block("shim", st.snapshot_bytes(seg.layout.regions["shim_stats"][1] - 8))
        except (ValueError, TypeError, RuntimeError) as e:
            # RuntimeError: the engine thread added a counter while we iterated; next time
            log.debug("[watchdog] shim stats not published: %s", e)


def _getpid() -> int:
    import os

    return os.getpid()
