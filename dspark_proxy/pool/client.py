"""`PoolClient`: one `DraftClient` over several draft workers (docs/deploy.md, "A pool of workers").

Per round, on the round's thread:

1. ``moved_slots()`` (start of the round): each member's link and breaker are looked at (member.py);
   a worker that went DOWN has its slots moved to the available ones, a worker that reconnected keeps
   its slots, a JOINING one takes back a few of its share (route.py). The slots that moved are returned
   and the round marks them dirty: their next entries are new generations carrying whole windows (the
   resync path), so drafts for them resume within the bound of any fault.
2. ``step()``: the entries are routed (route.py: rendezvous hashing of slot and generation), grouped by
   worker (one stable argsort), each worker's entries and rows gathered into its own STEP (numpy takes:
   no per-request Python loop), cut to that worker's row cap, and sent to every worker before any reply
   is read; the replies are then read as they arrive (poll over the sockets), each worker waited for at
   most its step timeout, which leaves a margin of the round's for merging and publishing. What came
   back is merged into one `StepReply` in the round's entry order; the entries of a worker that did
   not answer in time (or failed) carry RS_INTERNAL, not usable, and count as its `missed`.
   A round whose entries all go to one worker sends the round's own prefix and rows to it untouched.

The epoch the round sees (`connection_epoch`) is the pool's: it changes only when the pool goes from
no connected worker to some, so one worker's reconnect never marks another's slots dirty.

Threads: everything runs on the round's thread except `start`/`stop`, `reload` (a SIGHUP: the file is
read on a short thread and handed over under a lock, applied at the next round) and `links()`/`counters`
(the heartbeat's snapshot, which reads without locking, as for the plain client).
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import wire
from ..link.client import TcpDraftClient
from ..link.draft_client import StepOutcome
from ..round.breaker import CircuitBreaker
from ..round.pacing import LinkPacer
from .addresses import ConfigError, parse_hostport, read_address_file
from .member import Member, MemberEvent, MemberState
from .route import NO_WORKER, Router, address_key

__all__ = ["PoolClient"]

log = logging.getLogger(__name__)

_NOT_READY = StepOutcome(False, "not_ready", None, 0.0)
_RECONNECTED = StepOutcome(False, "reconnected", None, 0.0)
_MISSED = wire.RS_INTERNAL  # the status of an entry whose worker did not answer


# a split round sends its rows straight from the round's buffer (one iovec per run of a worker's
# consecutive rows) when its requests carry this many bytes each on average; below, gathering them into
# one buffer per worker (a numpy take) costs less than building the iovecs
_ZERO_COPY_BYTES = 4096


def _runs(flat: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[np.ndarray]:
    """Views of flat's rows [start[j], end[j]) for every j, consecutive ranges merged: the iovecs of a
    zero-copy send (the only Python iteration, over runs, is making the views sendmsg needs)."""
    brk = np.ones(start.shape[0], dtype=np.bool_)
    np.not_equal(start[1:], end[:-1], out=brk[1:])
    first = np.flatnonzero(brk)
    last = np.append(first[1:] - 1, start.shape[0] - 1)
    return [flat[a:b] for a, b in zip(start[first].tolist(), end[last].tolist(), strict=True)]


class PoolClient:
    """A `DraftClient` over the workers at `addresses` (see the module docstring).

    `make_client(host, port)` builds each worker's `TcpDraftClient` (tests inject their own); breaker
    threshold and cooldown are per worker, in pool rounds; `rebalance_per_round` bounds the slots a
    returning worker takes back a round; `margin` is the share of a split round's step timeout kept for
    merging and publishing (at most `max_margin_s`)."""

    def __init__(self, addresses: Sequence[str], *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                 max_rows: int, deadline_ms: float, sampled: bool = False,
                 make_client: Callable[[str, int], TcpDraftClient] | None = None,
                 breaker: tuple[int, int] = (3, 50), rebalance_per_round: int = 4, margin: float = 0.25,
                 max_margin_s: float = 0.01, file: str | None = None) -> None:
        self.M, self.N, self.W, self.B = max_reqs, num_spec, window, row_bytes
        self.max_rows, self.sampled = max_rows, sampled
        self.deadline_ns = int(deadline_ms * 1e6)
        self._make = make_client or (lambda h, p: TcpDraftClient(h, p, max_reqs=max_reqs, num_spec=num_spec,
                                                                 window=window, row_bytes=row_bytes,
                                                                 sampled=sampled))
        self.breaker_args = breaker
        self.rebalance_per_round = max(1, rebalance_per_round)
        self.margin, self.max_margin_s = margin, max_margin_s
        self.file = file
        self.watchers: list[Any] = []  # pool/dns.py's DnsWatcher for dns:NAME:PORT: started and stopped with it
        self.pool_counters: Counter[str] = Counter()
        self._target_id: str | None = None  # set_target_id's: a worker that joins later names it too
        self.members: list[Member] = [self._member(a) for a in addresses]
        self.router = Router(max_reqs, [m.key for m in self.members])
        self._t = 0  # pool rounds (moved_slots calls): the members' breakers count these
        self._epoch = 0
        self._had_worker = False
        self._started = False
        self._pending: tuple[str, ...] | None = None  # a reloaded address list, applied at the next round
        self._lock = threading.Lock()
        self._stale: set[int] = set()  # members that reported STALE_GENERATION in the last round
        # the merged reply's arrays (views [:k] each round)
        M, N, K = max_reqs, num_spec, wire.TOP_K
        self._status = np.zeros(M, np.uint8)
        self._wrows = np.zeros(M, np.uint32)
        self._ids = np.zeros((M, N), np.int32)
        self._conf = np.zeros((M, N), np.float32)
        self._margin = np.zeros((M, N), np.float32)
        self._smask = np.zeros(M, np.uint8) if sampled else None
        self._sup = np.zeros((M, N, K), np.int32) if sampled else None
        self._q = np.zeros((M, N, K), np.float32) if sampled else None
        self._scratch = np.empty((0, row_bytes), np.uint8)  # a split round's rows, grouped by worker

    def _member(self, address: str) -> Member:
        host, port = parse_hostport(address, field="worker")
        thr, cool = self.breaker_args
        client = self._make(host, port)
        if self._target_id is not None:
            client.set_target_id(self._target_id)
        return Member(address, client, breaker=CircuitBreaker(thr, cool),
                      pacer=LinkPacer(window=self.W, max_rows=self.max_rows, resync_max=1,
                                      deadline_ns=self.deadline_ns, publish=lambda k, v: None),
                      key=address_key(address), max_reqs=self.M, sampled=self.sampled)

    # ------------------------------------------------------------------ DraftClient: lifecycle

    def set_target_id(self, target_id: str) -> None:
        """The engine's target reaches every worker's HELLO (client.py), those that join later too."""
        self._target_id = target_id
        for m in list(self.members):
            m.client.set_target_id(target_id)

    @property
    def disabled(self) -> bool:
        return bool(self.members) and all(m.client.disabled for m in self.members)

    @property
    def counters(self) -> dict[str, int]:
        """Every worker's client counters summed, plus the pool's own (`pool_*`)."""
        out: Counter[str] = Counter()
        for m in list(self.members):
            out.update(m.client.counters)
            out.update({f"pool_{k}": v for k, v in m.counters.items()})
        out.update(self.pool_counters)
        return dict(out)

    def start(self) -> None:
        self._started = True
        for m in self.members:
            m.client.start()
        for w in self.watchers:
            w.start()

    def stop(self) -> None:
        for w in self.watchers:
            w.stop()
        for m in list(self.members):
            m.client.stop()

    def connection_epoch(self) -> int | None:
        """The pool's epoch: raised each time the pool goes from no connected worker to some."""
        up = any(m.client.connection_epoch() is not None for m in self.members)
        if up and not self._had_worker:
            self._epoch += 1
        self._had_worker = up
        return self._epoch if up else None

    def new_session(self, reason: str) -> None:
        """A worker that reported STALE_GENERATION in the last round starts a new session; otherwise
        (an engine attached) every worker does."""
        stale, self._stale = self._stale, set()
        for i, m in enumerate(self.members):
            if not stale or i in stale:
                m.client.new_session(reason)

    def links(self, round_breaker: CircuitBreaker | None = None) -> list[dict[str, Any]]:
        """Each worker's link for `status` (member.link_of), in `--worker` order; a pool of one shows
        `round_breaker`, the one that guards it."""
        members = list(self.members)
        owner = self.router.owner.copy()
        counts = np.bincount(owner[(owner >= 0) & (owner < len(members))], minlength=len(members))
        out = []
        for i, m in enumerate(members):
            link = m.link()
            link["slots"] = int(counts[i])
            if len(members) == 1 and round_breaker is not None:
                link["breaker"], link["breaker_trips"] = round_breaker.state, round_breaker.trips
            out.append(link)
        return out

    # ------------------------------------------------------------------ reload (SIGHUP)

    def reload(self) -> None:
        """Re-read the worker file on a short thread (signal-safe to call: it only starts the thread);
        the new list is applied at the start of the next round. A file that does not parse is logged
        and changes nothing."""
        if self.watchers:
            for w in self.watchers:
                w.kick()
            return
        if self.file is None:
            log.warning("[pool] reload asked, but the workers were not given as @FILE: nothing to re-read")
            return
        threading.Thread(target=self._read_file, name="dspark-pool-reload", daemon=True).start()

    def _read_file(self) -> None:
        assert self.file is not None
        try:
            addrs = read_address_file(self.file)
        except ConfigError as e:
            self.pool_counters["pool_reload_errors"] += 1
            log.error("[pool] reload of %s refused, keeping %d workers: %s", self.file, len(self.members), e)
            return
        self.set_addresses(addrs)

    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Any thread: the pool's workers from the next round on."""
        with self._lock:
            self._pending = tuple(addresses)

    def _apply_pending(self) -> np.ndarray | None:
        with self._lock:
            new, self._pending = self._pending, None
        if new is None:
            return None
        old = {m.address: i for i, m in enumerate(self.members)}
        if tuple(old) == new:
            return None
        members = [self.members[old[a]] if a in old else self._member(a) for a in new]
        remap = np.full(len(self.members), NO_WORKER, dtype=np.int64)
        for i, m in enumerate(members):
            if m.address in old:
                remap[old[m.address]] = i
        gone = [m for m in self.members if m.address not in new]
        added = [m for m in members if m.address not in old]
        self.members = members
        self.router.set_keys([m.key for m in members], remap)
        for m in added:
            if self._started:
                m.client.start()
        for m in gone:  # stop() joins the connect thread: not on the round's thread
            threading.Thread(target=m.client.stop, name="dspark-pool-stop", daemon=True).start()
        self.pool_counters["pool_reloads"] += 1
        log.info("[pool] workers now %s (added %s, removed %s)", ", ".join(new),
                 [m.address for m in added] or "none", [m.address for m in gone] or "none")
        return np.array([], dtype=np.int64)  # their slots are unowned now: move_off picks them up

    # ------------------------------------------------------------------ DraftClient: the round

    def _avail(self) -> np.ndarray:
        return np.array([i for i, m in enumerate(self.members) if m.available], dtype=np.int64)

    def moved_slots(self) -> np.ndarray | None:
        """Start of a round: look at every worker, move the slots of those that went down, give a
        returning one some of its share back. The slots that moved (their windows must be resent)."""
        self._t += 1
        t = self._t
        reloaded = self._apply_pending()
        lost: list[int] = []
        fresh: list[int] = []
        several = len(self.members) > 1  # a pool of one is guarded by the round's breaker alone
        for i, m in enumerate(self.members):
            ev = m.observe(t, several)
            if ev is MemberEvent.LINK_LOST:
                lost.append(i)
                log.warning("[pool] worker %s down (%s): its slots move to the others", m.address,
                            m.link().get("reason") or f"breaker {m.breaker.state}")
            elif ev is MemberEvent.RECONNECTED:
                fresh.append(i)
            elif ev is MemberEvent.LINK_UP:
                log.info("[pool] worker %s available: taking its share back", m.address)
        if not lost and not fresh and reloaded is None and not any(
                m.state is MemberState.JOINING for m in self.members):
            return None  # the usual round: one attribute look per worker
        avail = self._avail()
        parts: list[np.ndarray] = []
        if lost or reloaded is not None:
            parts.append(self.router.move_off(np.array(lost, dtype=np.int64), avail))
        for i in fresh:
            parts.append(self.router.owned_by(i))
        joining = np.array([i for i, m in enumerate(self.members) if m.state is MemberState.JOINING],
                           dtype=np.int64)
        if joining.shape[0]:
            moved, done = self.router.rebalance(joining, avail, self.rebalance_per_round)
            parts.append(moved)
            for i in done.tolist():
                self.members[i].apply(MemberEvent.SHARE_BACK)
        moved = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if moved.shape[0] == 0:
            return None
        self.pool_counters["pool_slots_moved"] += int(moved.shape[0])
        return moved

    def step(self, prefix: Any, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int, epoch: int,
             rows: Sequence, sample_meta: np.ndarray | None = None, timeout_s: float) -> StepOutcome:
        t0 = time.perf_counter()
        if epoch != self._epoch:
            return _RECONNECTED
        avail = self._avail()
        if avail.shape[0] == 0:
            return _NOT_READY
        k = int(entries.shape[0])
        own = self.router.route(entries["slot"], entries["generation"], avail)
        counts = np.bincount(own, minlength=len(self.members))
        nz = np.flatnonzero(counts)
        if nz.shape[0] == 1:
            m = self.members[int(nz[0])]
            if len(self.members) == 1 or not m.pacer.over_cap(n_rows, k):  # the whole round to one worker, as it is
                out = m.client.step(prefix, entries, n_rows, step_id=step_id, step_flags=step_flags, epoch=m.epoch,
                                    rows=rows, sample_meta=sample_meta, timeout_s=timeout_s)
                self._account(m, out, k, n_rows, timeout_s)
                if out.ok and np.count_nonzero(out.reply.status == wire.RS_STALE_GENERATION):
                    self._stale.add(int(nz[0]))
                return out
        return self._split(entries, own, counts, nz, n_rows, rows, sample_meta, step_id=step_id,
                           step_flags=step_flags, timeout_s=timeout_s, t0=t0)

    # ------------------------------------------------------------------ a split round

    def _split(self, entries: np.ndarray, own: np.ndarray, counts: np.ndarray, nz: np.ndarray, n_rows: int,
               rows: Sequence, sample_meta: np.ndarray | None, *, step_id: int, step_flags: int,
               timeout_s: float, t0: float) -> StepOutcome:
        k = int(entries.shape[0])
        order = np.argsort(own, kind="stable")  # entries grouped by worker, entry order within each
        e_rows = entries["n_rows"].astype(np.int64)
        s_rows = e_rows[order]
        ends = np.cumsum(e_rows)
        s_ends = np.cumsum(s_rows)
        flat = self._rows_2d(rows, n_rows)
        s_start = (ends - e_rows)[order]
        zero_copy = len(rows) == 1 and n_rows * self.B >= _ZERO_COPY_BYTES * k
        if not zero_copy:
            # row r of the grouped rows is row src[r] of the round's: one gather for every worker
            src = np.repeat(s_start - (s_ends - s_rows), s_rows) + np.arange(n_rows, dtype=np.int64)
            if self._scratch.shape[0] < n_rows:
                self._scratch = np.empty((max(n_rows, self._scratch.shape[0] * 2), self.B), np.uint8)
            grouped = self._scratch[:n_rows]
            np.take(flat, src, axis=0, out=grouped)
        e_off = np.concatenate(([0], np.cumsum(counts)))
        r_off = np.concatenate(([0], s_ends))
        sampled = bool(step_flags & wire.SF_SAMPLED)
        tmo = timeout_s - min(self.margin * timeout_s, self.max_margin_s)
        sent: list[tuple[int, np.ndarray, int]] = []  # (member, entry positions, rows)
        failed: list[tuple[Member, StepOutcome, int, int]] = []
        for i in nz.tolist():
            m = self.members[i]
            a, b = int(e_off[i]), int(e_off[i + 1])
            pos = order[a:b]
            ra = int(r_off[a])
            m_rows = int(r_off[b]) - ra
            if m.pacer.over_cap(m_rows, b - a):
                keep, m_rows = m.pacer.keep(s_rows[a:b])
                m.counters["over_row_cap"] += b - a - keep
                m.counters["missed"] += b - a - keep
                m.counters["entries"] += b - a - keep
                pos = pos[:keep]
            kk = int(pos.shape[0])
            ent = m.prefix.entries(kk)
            np.take(entries, pos, out=ent)
            sm = None
            if sampled and sample_meta is not None:
                sm = m.prefix.sample(kk)
                np.take(sample_meta, pos, out=sm)
            if zero_copy:
                m_views = _runs(flat, s_start[a:a + kk], s_start[a:a + kk] + s_rows[a:a + kk])
            else:
                m_views = [grouped[ra:ra + m_rows]]
            out = m.client.send_step(m.prefix, ent, m_rows, step_id=step_id, step_flags=step_flags, epoch=m.epoch,
                                     rows=m_views, sample_meta=sm, timeout_s=tmo, defer=True)
            if out is None:
                sent.append((i, pos, m_rows))
            else:
                failed.append((m, out, kk, m_rows))
        outs = self._collect([i for i, _, _ in sent])
        # merge, in the round's entry order
        status = self._status[:k]
        status[:] = _MISSED
        self._wrows[:k] = 0
        ids, conf = self._ids[:k], self._conf[:k]
        want_margin = bool(step_flags & wire.SF_WANT_MARGIN)
        header = None
        worker_us = 0.0
        reason = None
        for (i, pos, m_rows), out in zip(sent, outs, strict=True):
            m = self.members[i]
            self._account(m, out, int(pos.shape[0]), m_rows, tmo)
            if not out.ok:
                reason = reason or out.reason
                continue
            r = out.reply
            header = header or r.header
            worker_us = max(worker_us, r.worker_us)
            status[pos] = r.status
            self._wrows[pos] = r.window_rows
            ids[pos] = r.draft_ids
            conf[pos] = r.confidence
            if want_margin and r.margin is not None:
                self._margin[pos] = r.margin
            if self._smask is not None and r.sampled_mask is not None:
                self._smask[pos] = r.sampled_mask
                self._sup[pos] = r.support_ids
                self._q[pos] = r.proposal_q
            if np.count_nonzero(r.status == wire.RS_STALE_GENERATION):
                self._stale.add(i)
        for m, out, kk, m_rows in failed:
            self._account(m, out, kk, m_rows, tmo)
            reason = reason or out.reason
        rtt = (time.perf_counter() - t0) * 1e6
        if header is None:
            return StepOutcome(False, reason or "timeout", None, rtt)
        missed = status == _MISSED
        if np.count_nonzero(missed):  # cleared as a fresh REPLY's are (ids -1, the rest 0)
            ids[missed] = -1
            conf[missed] = 0.0
            if want_margin:
                self._margin[:k][missed] = 0.0
            if self._smask is not None:
                self._smask[:k][missed] = 0
                self._sup[:k][missed] = -1
                self._q[:k][missed] = 0.0
        smask = sup = q = None
        if sampled and self._smask is not None:
            smask, sup, q = self._smask[:k], self._sup[:k], self._q[:k]
        reply = wire.StepReply(header, step_flags, status, self._wrows[:k], ids, conf,
                               self._margin[:k] if want_margin else None, smask, sup, q, worker_us)
        return StepOutcome(True, None, reply, rtt)

    def _rows_2d(self, rows: Sequence, n_rows: int) -> np.ndarray:
        """The round's rows as one [n_rows, row_bytes] array: a view of the one part of the usual round;
        a resync round's several parts are joined (a copy, only in that round)."""
        parts = [np.asarray(r, dtype=np.uint8).reshape(-1, self.B) for r in rows]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros((n_rows, self.B), np.uint8)

    def _collect(self, idx: list[int]) -> list[StepOutcome]:
        """Every sent STEP's outcome: the sends still going go on as the sockets take them, the replies
        are read as they arrive; each member's own deadline bounds it."""
        outs: dict[int, StepOutcome] = {}
        waiting = list(idx)
        while waiting:
            p = select.poll()
            first = math.inf
            for i in waiting:
                f = self.members[i].client.inflight()
                if f is not None:
                    p.register(f[0], select.POLLOUT if f[2] else select.POLLIN)
                    first = min(first, f[1])
            left = first - time.monotonic()
            if 0 < left < math.inf:
                p.poll(math.ceil(left * 1000.0))
            still = []
            for i in waiting:
                out = self.members[i].client.collect(False)
                if out is None:
                    still.append(i)
                else:
                    outs[i] = out
            waiting = still
        return [outs[i] for i in idx]

    def _account(self, m: Member, out: StepOutcome, k: int, n_rows: int, timeout_s: float) -> None:
        c = m.counters
        c["steps"] += 1
        c["entries"] += k
        several = len(self.members) > 1  # alone, a worker's link is paced by the round's own row cap
        if out.ok:
            usable = int(np.count_nonzero(wire.USABLE_STATUS_TABLE[out.reply.status]))
            c["usable"] += usable
            if several:
                m.pacer.on_reply(n_rows, out.rtt_us)
        else:
            c["steps_failed"] += 1
            c["missed"] += k
            c[f"fallback_{out.reason}"] += 1
            if out.reason == "timeout" and several:
                m.pacer.on_timeout(n_rows, timeout_s * 1e6)
        if not several:
            return  # alone, the round's breaker is the worker's
        change = m.record(self._t, None if out.ok else out.reason)
        if change == "tripped":
            self.pool_counters["pool_breaker_trips"] += 1
            log.warning("[pool] worker %s: breaker open after %s (trip %d)", m.address, out.reason, m.breaker.trips)
