"""The engine side of the hand-off: enqueue a round's gather, read its published reply, never wait
past the deadline.

The engine calls `enqueue(t, ...)` then `read_reply(t)` once per step, on one thread. Everything that
can take time without the engine asking (finding a proxy, noticing it died, claiming late rounds,
publishing our statistics) is the watchdog thread's (watchdog.py). Attaching and detaching happen
only at a round boundary, on the engine thread (attachment.py; attach.py has the table).

Thread ownership: the ring, the staging and the attachment's segment are the engine thread's; what
the watchdog hands over goes through the attachment's lock (attachment.py).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from dspark_proxy import native
from dspark_proxy.ops.events import EventRing, watchdog_event
from dspark_proxy.ops.stats import Stats
from dspark_proxy.shm import ring_shm
from dspark_proxy.shm.hostflag import (
    FAR_AHEAD,
    PAGE_OK,
    WAIT_CLAIMED_UNPUBLISHED,
    WAIT_FAILED_BY_ME,
    WAIT_OUT_OF_ORDER,
    WAIT_PUBLISHED,
    HostFlags,
    monotonic_ns,
)
from dspark_proxy.shm.layout import META_SLOTS, STATUS_NAMES, STATUS_ROUND_FAILED, ReplyPageLayout
from dspark_proxy.shm.segment import DEFAULT_NAME, Segment
from dspark_proxy.shm.target import check_target_id

from . import one_per_name
from .attach import AttachState
from .attachment import Attachment
from .inputs import EnqueueInputs, ShimError, _as_numpy
from .reply import Reply, ReplyReader
from .row_ring import EngineRing

__all__ = ["Shim", "ShimError"]

log = logging.getLogger(__name__)
WAIT_ANSWERED_PAUSED = 100  # `last_wait` of a round the engine answered itself (paused: no wait at all)
_REPLY_KEYS = {code: f"replies_{name}" for code, name in STATUS_NAMES.items()}  # built once, not per reply


class Shim:
    """One engine's connection to a proxy segment (or, detached, a target-only stand-in)."""

    def __init__(self, name: str | None, *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                 sampled: bool = False, deadline_ms: float | None = None, grace_ms: float = 2.0,
                 heartbeat_timeout_s: float = 1.0, look_every_s: float = 0.1, start_watchdog: bool = True,
                 events_kept: int = 64, target_id: str | None = None) -> None:
        one_per_name.check_free(name)  # before anything is made (one_per_name.py)
        self.name = name
        self.max_reqs, self.num_spec, self.window, self.row_bytes = max_reqs, num_spec, window, row_bytes
        self.sampled = sampled
        self.deadline_override_ms = deadline_ms
        self.grace_ns = int(grace_ms * 1e6)
        self.heartbeat_timeout_ns = int(heartbeat_timeout_s * 1e9)
        self.look_every_s = look_every_s
        self.counters = Stats()  # the shim's own counters and events; stats() is the snapshot
        self.events = EventRing(events_kept)
        self.native = native.enabled()  # the C hot paths (the default) or the Python reference model
        # everything that can refuse comes before the ring (shm_layout.md §1): a refused Shim() leaves nothing
        for field, v in (("max_reqs", max_reqs), ("num_spec", num_spec), ("window", window), ("row_bytes", row_bytes)):
            if isinstance(v, bool) or not hasattr(v, "__index__") or operator.index(v) <= 0:
                raise ShimError(f"{field} must be an int > 0, got {v!r}")
        self.target_id = check_target_id(target_id or "")  # the target model, told to the proxy's HELLO
        self._inputs = EnqueueInputs(max_reqs, window, row_bytes, sampled, self.native)  # validated, as numpy
        self._reader = ReplyReader(ReplyPageLayout(max_reqs, num_spec, sampled), self.native)
        self._shared = self._shared_ring(max_reqs * window * row_bytes)  # None: the ring is private
        self.shared_ring = self._shared is not None
        self.watchdog = None
        try:
            self.ring = EngineRing(max_reqs, window, row_bytes, self.native,
                                   None if self._shared is None else self._shared.array)
            self._att = Attachment(self.ring, self.counters, self.events, sampled, self._watch, self.deadline_ms,
                                   self.target_id, "" if self._shared is None else self._shared.shm_name)
            self._t = 0  # last round enqueued
            self._n = 0  # its number of requests
            self._round_attached = False  # round _t went through the segment
            self._rejected = ""  # round _t had a bad input: why (read_reply's reason)
            self._awaiting_reply = False  # round _t was enqueued and its read_reply has not come yet
            self._deadline_ns = 0
            # the last read_reply's wait, for timing tools (the chaos campaign): (WAIT_* outcome, when the
            # wait returned with the GIL held again, monotonic ns); (0, 0) when it did not wait
            self.last_wait: tuple[int, int] = (0, 0)
            self._deadline_delta_ns = -1  # the attached segment's deadline in ns (-1: read it at the next enqueue)
            self._deadline_ov: float | None = None  # the override it was worked out with
            # per round t (slot t % 64): (t, n, rows staged, longest query, incarnation), so an event about
            # a round reported rounds later (the watcher's claims are drained later) carries its own fields
            self._rounds_seen: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)] * META_SLOTS
            self.on_close: list = []  # callables run by close() after detaching (thread mode stops its proxy)
            self.proxy = None  # thread mode: the in-process Proxy
            from .watchdog import Watchdog  # a cycle only at import time

            one_per_name.claim(name, self)  # again, under its lock: another thread's may have won meanwhile
            self.watchdog = Watchdog(self)
            if start_watchdog:
                self.watchdog.start()
        except BaseException:
            self._undo()
            raise

    def _undo(self) -> None:
        """A construction that failed after the ring was made: free the name, stop what started, let the
        ring go."""
        one_per_name.release(self.name, self)
        if self.watchdog is not None and self.watchdog.started:
            self.watchdog.stop()
            self.watchdog.join(timeout=2.0)
        if self._shared is not None:
            self._shared.close()

    # ------------------------------------------------------------------ attach / detach

    @property
    def state(self) -> AttachState:
        return self._att.state

    @property
    def attached(self) -> bool:
        return self._att.state is AttachState.ATTACHED

    @property
    def segment(self) -> Segment | None:
        return self._att.seg

    @property
    def _seg(self) -> Segment | None:  # the attached segment and its flags: the engine thread's reads
        return self._att.seg

    @property
    def _flags(self) -> HostFlags | None:
        return self._att.flags

    def deadline_ms(self) -> float:
        if self.deadline_override_ms is not None:
            return float(self.deadline_override_ms)
        seg = self._att.seg
        return seg.deadline_ms if seg is not None else 5.0

    def round_in_flight(self) -> tuple[int, int]:
        """The last round enqueued and its number of requests (the watchdog reads it unlocked: a
        round boundary may be passing, and an event may then name the round before)."""
        return self._t, self._n

    def abandoned(self, incarnation: int) -> bool:
        """This shim gave up on that incarnation (detached, or refused its claim): never offer it again."""
        return self._att.abandoned(incarnation)

    def offer(self, seg: Segment) -> bool:
        """Watchdog: a ready incarnation with our parameters; attached at the next round boundary."""
        return self._att.offer(seg)

    def lose(self, why: str) -> None:
        """Watchdog: the attached (or pending) proxy is gone; detach at the next round boundary."""
        self._att.lose(why)

    def _watch(self, seg: Segment, flags: HostFlags) -> None:
        """Just attached: round t's deadline is watched from now, GIL or not."""
        self._deadline_delta_ns = -1  # this segment's deadline, read at the next enqueue
        if self.watchdog.started:
            self.watchdog.watch(seg, flags)

    # ------------------------------------------------------------------ enqueue

    def enqueue(self, t: int, *, req_ids: Sequence[Any] | np.ndarray, slots: Any, qsl: Any, need_draft: Any,
                k_window: Any, rows: Any, valid: Any, first_pos: Any, anchor: Any, sampled: Any = None,
                seed: Any = None, temperature: Any = None) -> None:
        """Copy round t's rows into the engine ring and the staging, write its metadata and descriptor,
        stage the resync windows the proxy asked for, and raise `gathered`. Validates everything first:
        bad input raises ShimError (a ValueError) with nothing written."""
        if self._att.state is AttachState.CLOSED:
            raise ShimError("enqueue on a closed shim")
        if t != self._t + 1 and self._t != 0:
            raise ShimError(f"enqueue({t}): the next round is {self._t + 1}")
        if self._awaiting_reply:
            raise ShimError(f"enqueue({t}): read_reply({self._t}) must come first")
        if t < 1:
            raise ShimError(f"enqueue({t}): rounds are numbered from 1")
        try:
            n, a = self._inputs.check(req_ids, slots, qsl, need_draft, k_window, rows, valid, first_pos, anchor,
                                  sampled, seed, temperature)
        except (TypeError, ValueError, RuntimeError) as e:  # RuntimeError: torch's word for a bad tensor
            err = e if isinstance(e, ShimError) else ShimError(f"bad input: {e}")
            self._reject(t, slots, err)
            raise err from (None if err is e else e)
        self._att.boundary(t)
        if self._att.state is AttachState.ATTACHED:  # said before any row of t is written: the proxy may still be
            self._att.flags.begin_enqueue(t)  # reading round t-1's if we answered that round ourselves (read_reply)
        self.ring.write_checked(a["slots"], a["req_ids"], a["first_pos"], a["valid"], a["rows"])
        self._t, self._n = t, n
        self._rejected = ""
        self._round_attached = False
        self._awaiting_reply = True
        if self._att.state is not AttachState.ATTACHED:
            self.counters.inc("rounds_detached")
            return
        att = self._att  # (its seg and flags: the engine thread's, read here without the properties)
        seg, flags = att.seg, att.flags
        assert seg is not None and flags is not None
        self._write_round(seg, t, n, a)
        gathered_ns = flags.raise_gathered(t, n)  # (the GATHERED_NS it stamped)
        ov = self.deadline_override_ms  # the deadline in ns, worked out again only when it may have changed
        if self._deadline_delta_ns < 0 or ov != self._deadline_ov:
            self._deadline_ov, self._deadline_delta_ns = ov, int(self.deadline_ms() * 1e6)
        self._deadline_ns = gathered_ns + self._deadline_delta_ns
        self._round_attached = True

    def _reject(self, t: int, slots: Any, err: ShimError) -> None:
        """Round t had a bad input: it costs exactly that round. It is in flight as failed (read_reply(t)
        says why) and round t+1 comes next as usual. Attached, the proxy is told so without trusting
        anything staged: round t's metadata and descriptor say "no requests" (the engine ring was not
        written for t, so the proxy's model must apply nothing either), and the shim claims and fails
        t itself before raising `gathered`, so the proxy skips it as it skips a round the watchdog took."""
        try:
            sa = _as_numpy(slots, None, "slots")
            n = int(sa.shape[0]) if sa.ndim == 1 and sa.shape[0] <= self.max_reqs else 0
        except (TypeError, ValueError, RuntimeError):
            n = 0
        self._att.boundary(t)
        self._t, self._n = t, n
        self._rejected = f"bad_input: {err}"
        self._round_attached = False
        self._awaiting_reply = True
        self.counters.inc("rounds_rejected")
        # the engine has the exception; the log says it once (then the count, rounds_rejected, does)
        (log.warning if self.counters.counter("rounds_rejected") == 1 else log.debug)(
            "[shim] enqueue(%d) rejected, the round is target-only (logged once; counted as rounds_rejected): %s",
            t, err)
        if self._att.state is not AttachState.ATTACHED:
            return
        seg, flags = self._seg, self._flags
        assert seg is not None and flags is not None
        assert self._att.writer is not None
        self._att.writer.write_nothing(t)
        flags.fail(t, n)
        flags.raise_gathered(t, 0)

    def _write_round(self, seg: Segment, t: int, n: int, a: dict[str, np.ndarray]) -> None:
        """Round t into the attached segment (writer.py); `seg` is it (chaos hooks this step)."""
        writer = self._att.writer
        assert writer is not None and writer.seg is seg
        rows_staged, max_q = writer.write(t, n, a)
        self._rounds_seen[t % META_SLOTS] = (t, n, rows_staged, max_q, self._att.incarnation)

    @property
    def resync_bytes_last(self) -> int:
        """Ring-window bytes the last attached enqueue copied (chaos: the worst enqueue)."""
        writer = self._att.writer
        return writer.stager.bytes_last if writer is not None else 0

    # ------------------------------------------------------------------ read_reply

    def read_reply(self, t: int) -> Reply:
        """Round t's reply, within the deadline whatever happens; then `consumed = t`."""
        if t != self._t:
            raise ShimError(f"read_reply({t}): the round in flight is {self._t}")
        n = self._n
        self._awaiting_reply = False
        if self._rejected:
            if self._flags is not None and self._seg is not None:
                try:
                    self._flags.consume(t)  # ours: we claimed and failed it in enqueue
                except ValueError:
                    pass
            return self._reader.failed(t, n, self._rejected)
        if not self._round_attached:
            return self._reader.failed(t, n, "detached")
        self._round_attached = False
        att = self._att
        flags = att.flags
        assert flags is not None and att.seg is not None
        if flags.paused_through() >= t and flags.fail(t, n) == 1:
            # the proxy promised round t no drafts (its gate paused the batch): the answer is known, so it
            # is ours at once, and the engine waits for no process (shm_layout.md §3, "Paused rounds")
            flags.consume(t)
            self.last_wait = (WAIT_ANSWERED_PAUSED, monotonic_ns())
            self.counters.inc("rounds_answered_paused")
            return self._reader.none(t, n)
        r = flags.wait_or_fail(t, n, self._deadline_ns)
        self.last_wait = (r, monotonic_ns())
        reason = ""
        if r == WAIT_CLAIMED_UNPUBLISHED:
            # the proxy claimed t but has not published: it is copying, or stopped mid-copy
            if not flags.wait_published(t, self.grace_ns / 1e9):
                self._hung(t, n)
                return self._reader.failed(t, n, "proxy_hung")
            r = WAIT_PUBLISHED
        if r == WAIT_OUT_OF_ORDER:
            self.lose("out_of_order")
            flags.consume(t)
            return self._reader.failed(t, n, "out_of_order")
        if r == WAIT_FAILED_BY_ME:
            self.note_watchdog(t, n, "watchdog")
            reason = "deadline"
        got = flags.read_page(t, self._reader.buf, n)  # the header and requests [0, n): all parse reads
        flags.consume(t)
        if got != PAGE_OK:
            self.counters.inc("pages_not_this_round")
            return self._reader.failed(t, n, reason or "failed_ahead")
        reply = self._reader.parse(t, n)
        key = _REPLY_KEYS.get(reply.status)
        self.counters.inc(key or f"replies_{reply.status_name}")
        if reply.status == STATUS_ROUND_FAILED:  # (not reply.ok)
            self.watchdog.report()  # the watcher thread may have failed it: its event, now
        return reply

    def _hung(self, t: int, n: int) -> None:
        """A round claimed but not published by deadline + grace: the proxy hung mid-publish. The page
        is never read again; fail everything ahead and detach at the next boundary."""
        self.note_watchdog(t, n, "proxy_hung")
        self.lose("proxy_hung")

    def note_watchdog(self, t: int, n: int, how: str) -> None:
        """An event about round t, with round t's own fields (events.py documents each)."""
        self.counters.inc(f"watchdog_{how}")
        seen_t, seen_n, rows, max_q, inc = self._rounds_seen[t % META_SLOTS]
        if seen_t == t:
            phase = "prefill" if max_q > self.num_spec + 1 else "decode"
            ev = watchdog_event(round=t, how=how, phase=phase, n=seen_n, rows=rows, longest_query=max_q,
                                incarnation=inc)
        else:  # not a round that went through a segment, or 64 rounds ago
            ev = watchdog_event(round=t, how=how, n=n, incarnation=self._att.incarnation)
        self.events.record(**ev)

    # ------------------------------------------------------------------ lifecycle

    def _shared_ring(self, nbytes: int) -> ring_shm.SharedRing | None:
        """The engine's ring in shared memory, so rows cross the engine side once (shm/ring_shm.py);
        None when switched off or when /dev/shm cannot hold it: the engine then keeps a private ring
        and copies each round's rows into the staging as well (slower, nothing lost)."""
        if not ring_shm.enabled():
            return None
        try:
            return ring_shm.SharedRing(self.name or DEFAULT_NAME, nbytes)
        except (ring_shm.RingError, OSError) as e:
            log.warning("[shim] %s: keeping the ring private (rows copied twice)", e)
            self.counters.inc("shared_ring_refused")
            return None

    def stats(self) -> dict:
        """The shim's statistics: counters, latencies, attach state, the round, the last 64 events."""
        snap = self.counters.snapshot()
        snap["state"] = self._att.state.value
        snap["round"] = self._t
        snap["watchdog_events"] = self.events.dump()
        return snap

    def close(self) -> None:
        """Stop the watchdog, abandon the segment (the proxy then makes a fresh one), unmap. Idempotent."""
        if self._att.state is AttachState.CLOSED:
            return
        if self._flags is not None:
            # every round ahead is target-only: wakes the watchdog if it waits on a round in flight
            # (else join would sit out that round's deadline) and tells the proxy we are gone
            try:
                self._flags.fail_all(self._t + FAR_AHEAD)
            except ValueError:
                pass
        self.watchdog.stop()
        self.watchdog.join(timeout=2.0)
        self._att.close()
        one_per_name.release(self.name, self)
        if self._shared is not None:
            self._shared.close()
        for fn in self.on_close:
            fn()

    def __enter__(self) -> Shim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort; close() is the real path
        try:
            if self._att.state is not AttachState.CLOSED:
                self.watchdog.stop()
        except Exception:
            pass

