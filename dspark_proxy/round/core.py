"""The round: what the proxy does for engine step t, from `gathered >= t` to `published = t`.

Nine steps, column-wise over the round's requests (no per-request Python loop on the hot path);
RoundCore keeps their order, and each job lives in its own module:

  read t's descriptor and metadata (shm/stamped.py) -> late? skip -> epoch -> ring model (ring_model.py)
  -> breaker (breaker.py) -> entries + resync rows (resync_plan.py, cut to the link's row cap:
  pacing.py) -> preempted? -> STEP (wire/step.py) -> accept reply -> pack page (reply_page.py) -> publish

Invariants kept from the seed (and why):
- The round only READS the rows (the engine's shared ring, or the staging and the resync windows of a
  private one; its mapping of the ring is read-only). The watchdog can fail round t while we
  are in it and the engine then rewrites them for t+1; a proxy that wrote there would corrupt
  a later round. A late round reads torn rows at worst, and then loses its claim: every slot is marked
  dirty so the worker's copies are rebuilt.
- The ring model is applied for every round the engine ran, whatever happens to the round (open
  breaker, no connection, rows that did not fit, skipped late rounds), so it stays exact.
- Every failure packs a failed reply (status ROUND_FAILED) and marks the round's slots dirty.
- A reply is published only if round t-1's was consumed; otherwise the hand-off's order is broken
  and the proxy dies (fail_all) rather than tear the engine's copy.
- A STEP carries no more rows than the link has shown it moves in half the deadline, once a STEP of
  that size has timed out (pacing.py): the requests past the cap get no entry, exactly like those
  whose rows did not fit the staging (no drafts, slots dirty, windows resent later).

Cost. At the batch sizes that matter (n up to a few hundred) a round's cost is the number of numpy calls
(0.3-1 µs each, whatever n is) and Python statements, not the data. So the hot path is built around the
common decode round, and everything rare sits behind one count (a resync window, a request that did
not fit, a failed status, a partial window each take the general path only when a count says they
exist). On the default (C) path the usual round is two C calls (round/fused.py): `_front` (read,
advance, sums, entries and the small rows' gather, stopping where the round stops being usual; `stage`
says where, and `_run` goes on from there) and finish_whole (ring model, page, status), with `_usual`
between them when the front went all the way (the STEP, and nothing left to decide); its latencies
are one more (round/stats.py), and what every round asks is bound once per incarnation.
scripts/bench_round.py measures it (docs/history.md, "Native hot paths", for the figures and their history).

Thread ownership: one round thread owns everything here; `stats` is shared read-only with the
heartbeat thread's snapshot.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import numpy as np

from .. import native, wire
from ..link.draft_client import DraftClient, StepReply
from ..ops.events import EventRing
from ..ops.logthrottle import LogThrottle
from ..ops.stats import Stats
from ..shm import hostflag as hf
from ..shm.hostflag import HostFlags
from ..shm.layout import (
    Word,
    resync_windows_per_enqueue,
)
from ..shm.resync import WindowAsker
from ..shm.ring_shm import RingError
from ..shm.segment import Segment
from ..shm.stamped import BadDescriptor, SlotReader
from .acceptance import Acceptance
from .breaker import BreakerState, CircuitBreaker
from .fused import FusedRound
from .gate import GateSettings
from .late import FIRST_FAILED, FIRST_NO, FIRST_OVERTAKEN, LateRounds
from .pacing import LinkPacer
from .reply_page import PagePacker
from .resync_plan import ResyncPlanner
from .ring_model import Advance, SlotTable
from .ring_rows import RingRows
from .stats import PHASES, RoundLatencies

__all__ = ["RoundCore", "RoundSettings", "BadDescriptor"]  # BadDescriptor: shm/stamped.py

log = logging.getLogger(__name__)
_ROUND_ERRORS = LogThrottle(10.0)  # an internal error of every round: one traceback per 10 s, with a count

assert wire.RS_OK == 0  # "every request OK" is then one count_nonzero of the statuses
# stats keys, built once rather than formatted every round
_STATUS_KEYS = tuple(f"req_status_{wire.REQ_STATUS_NAMES.get(c, str(c))}" for c in range(wire.RS_MAX + 1))
_STATUS_OK_KEY = _STATUS_KEYS[wire.RS_OK]
_FINISHED_KEYS = (_STATUS_OK_KEY, "rounds_ok")  # what a round finished in C adds, in one call (_accept)
_ROUNDS_KEY = {ph: f"rounds_{ph}" for ph in PHASES}
_ENTRIES_AT = wire.APP_HEADER_SIZE + wire.STEP_HDR_SIZE  # the entries' offset in a STEP prefix (FORMAT.md)
_ENTRY_SIZE = wire.ENTRY_SIZE
_CLOSED = BreakerState.CLOSED
_clock = time.perf_counter


def _slot_reader(seg: Segment, slots: SlotTable) -> SlotReader:
    """Round t's descriptor reader: the C path (the default) or the Python reference (native.py)."""
    return SlotReader(seg, slots.check_slots, slots.native, slots.check_scratch)


@dataclass(frozen=True)
class RoundSettings:
    want_margin: bool = False
    n_out_table: tuple[int, ...] = ()  # n_out by batch size (index min(n, len-1)); empty = all N
    step_timeout_s: float | None = None  # None: what is left of the deadline since `gathered`
    min_step_timeout_s: float = 0.0005
    gate: GateSettings = GateSettings()  # acceptance-aware drafting (gate.py)


class RoundCore(LateRounds):
    """Rank-0 round logic over one attached segment (a new one per engine attach); its publishing, late
    and failed rounds (`_publish_now`, `_publish_first`, `_skip_taken`, `_fail`, ...) are in round/late.py."""

    def __init__(self, seg: Segment, client: DraftClient, stats: Stats, events: EventRing, breaker: CircuitBreaker,
                 settings: RoundSettings) -> None:
        p = seg.params
        self.seg, self.client, self.stats, self.events, self.breaker = seg, client, stats, events, breaker
        self.settings = settings
        self.M, self.N, self.W, self.R = p.max_reqs, p.num_spec, p.window, p.resync_per_round
        self.sampled = p.sampled
        self.lay = seg.layout
        self.flags = HostFlags(seg, peer_pid=seg.word(Word.ENGINE_PID))  # the spin looks at both CPU sets
        self.native = native.enabled()  # the C hot paths (the default) or the Python reference (native.py)
        self.slots = SlotTable(self.M, self.W, native=self.native)
        self.deadline_ns = int(seg.deadline_ms * 1e6)
        self.pacer = LinkPacer(window=self.W, max_rows=p.max_rows, resync_max=resync_windows_per_enqueue(p),
                               deadline_ns=self.deadline_ns, publish=stats.set)
        self._rtt_us = self._worker_us = -1.0
        self._first = FIRST_NO  # what came of publishing this round before its STEP (late.py; each round)
        self._first_rows: np.ndarray | None = None  # such a round's rows, copied (late.py `_rows_copy`)
        self.lat = RoundLatencies(stats, self.native)  # the round's latency keys, in one call a round
        self._arange = np.arange(self.M, dtype=np.intp)
        self.desc = _slot_reader(seg, self.slots)  # round t's descriptor and metadata
        self.win = WindowAsker(seg)  # the resync request we write, the windows the engine staged
        self.resync = ResyncPlanner(self.desc, self.win, self.slots, self.pacer, stats, seg.staging)
        self.want_resync = self.resync.want  # slots whose ring window we asked for
        self.ring_rows = RingRows(seg, self.native)  # the engine's shared ring, once it names one
        self._shared: bool | None = None  # rows from the shared ring (True) or the staging; None: not yet read
        self._gather_arg: tuple | None = None  # RingRows.c_gather once the ring is open (round/fused.py's gather)
        self._ring_refused = False  # the ring the engine named was refused (logged once)
        self._last_epoch: int | None = None
        self.packer = PagePacker(self.lay.reply, self.N, settings.n_out_table, self.native)  # the reply page
        self.page = self.packer.page
        self._no_entry = np.ones(self.M, dtype=np.bool_)
        self._prefix = wire.StepPrefix(self.M, self.sampled)  # the STEP, built in place (wire/step.py)
        self._entries = self._prefix.entries(self.M)  # a round's k entries are its first k
        self._entry_offs = native.entry_offsets(wire.ENTRY_DTYPE)
        self.rounds = 0  # the last round handled
        self._gathered_ns_off = self.lay.word_off(Word.GATHERED_NS)
        self._advanced = False  # round t's rows reached the ring model (set by _run)
        # drafts' effect; the gate (its throughput rule times the engine's steps by their GATHERED_NS stamps)
        self.accept = Acceptance(self.M, self.N, settings.gate, stats, self.native, self._step_clock)
        # the C path's usual round in fewer calls (round/fused.py); None on the reference path
        self.fused = FusedRound(self.slots, self.accept, self.packer, self.N, self.W) if self.native else None
        # what every round asks, bound once per incarnation (round/core.py, "Cost")
        # the claimed and consumed words' loads (flags.taken and reply_consumed, without their Python call)
        self._claimed = functools.partial(hf.load, seg.mm, self.lay.word_off(Word.CLAIMED))
        self._consumed = functools.partial(hf.load, seg.mm, self.lay.word_off(Word.CONSUMED))
        # the header and the round's n requests only (shm_layout.md §3)
        self._publish = functools.partial(self.flags.publish, rows=True)
        self._gathered_ns = functools.partial(hf.load, seg.mm, self._gathered_ns_off)
        self._gathered = functools.partial(hf.load, seg.mm, self.lay.word_off(Word.GATHERED))
        self._decode_q = self.N + 1  # a longer query than this makes the round a prefill one
        self._promised = 0  # the last round promised no drafts (PAUSED_THROUGH: late.py, `_paused`)
        self._fixed_timeout_s, self._min_timeout_s = settings.step_timeout_s, settings.min_step_timeout_s
        self._gate_on, self._no_n_out = self.accept.gate.on, self.packer.n_out_table_empty
        self._step_flags = (wire.SF_WANT_MARGIN if settings.want_margin else 0) | (wire.SF_SAMPLED if self.sampled else 0)

    def release_ring(self) -> None:
        """The incarnation ended: let the engine's shared ring go (RingRows.close); a later round of
        this core (none is expected) would open it again."""
        self.ring_rows.close()
        self._gather_arg = None
        self._shared = None

    # ------------------------------------------------------------------ entry point

    def handle(self, t: int, waited_us: float) -> None:
        """Round t, gathered. Publishes (or loses the claim); raises only when the hand-off is broken."""
        t0 = _clock()
        self.rounds = t
        self._rtt_us = -1.0  # set by a round that got its STEP's reply
        self._first = FIRST_NO
        if self._claimed() >= t and t > self._promised:  # taken (a promised round the engine answered goes on)
            self._skip_taken(t, waited_us)
            self.lat.skipped((_clock() - t0) * 1e6)
            return
        phase = "unknown"
        self._advanced = False
        try:
            if self._shared is None:  # the engine named its ring (or none) before `attached`
                self._shared = self.ring_rows.open()
                self._gather_arg = self.ring_rows.c_gather if self._shared else None
            if self.fused is not None:  # the C path: as much of the usual round's front as fits, one call
                n, pre = self._front(t)
            else:
                n, pre = self.desc.read(t), None
            phase = "prefill" if self.desc.max_q > self._decode_q else "decode"  # (_phase, inline)
            if pre is not None and pre[3] == 3:  # _front found the usual round and built its entries
                self._usual(t, n, phase, pre)
            else:
                self._run(t, n, phase, pre)
        except BadDescriptor as e:
            self.stats.inc("fallback_bad_descriptor")
            self.stats.inc("rounds_failed")
            self.slots.restart(np.arange(self.M))
            self.packer.failed(0)
            log.warning("[round] t=%d bad descriptor: %s", t, e)
        except Exception as e:  # noqa: BLE001 - the round fails closed, the loop goes on
            refused = isinstance(e, RingError)  # the ring the engine named cannot be mapped (shm_layout.md §1)
            self.stats.inc("fallback_ring_refused" if refused else "fallback_internal_error")
            self.stats.inc("rounds_failed")
            self.slots.mark_all_dirty()
            if not self._advanced:  # the engine's writes of round t never reached the model
                self.slots.restart(np.arange(self.M))
            self.packer.failed(self.desc.n_of(t))
            if not refused:
                _ROUND_ERRORS.exception(log, "[round] t=%d failed", t)
            elif not self._ring_refused:  # the peer's input: one line an incarnation, no traceback
                self._ring_refused = True
                log.warning("[round] t=%d: %s; rounds fail closed until the engine attaches anew", t, e)
        if self._first == FIRST_NO:
            self._publish_now(t, phase, waited_us)
        self.lat.done(phase, (_clock() - t0) * 1e6, self._rtt_us, self._worker_us)

    # ------------------------------------------------------------------ the round proper

    def _front(self, t: int) -> tuple[int, tuple]:
        """The C path's read of round t, with the ring model's advance, the acceptance sums and the
        entries when the round allows them (round/fused.py `front`). The connection epoch and moved
        slots are read first: while they change nothing (the usual round) the advance may follow the read
        in the same call; `_run` applies them otherwise. `fill`: nothing between the sums and the entries
        can change them (a closed breaker, no row cap, no n_out table, a gate that cannot pause a slot
        this round)."""
        client = self.client
        epoch, moved = client.connection_epoch(), client.moved_slots()
        go = moved is None and (epoch is None or epoch == self._last_epoch)
        g = self.accept.gate
        fill = go and epoch is not None and self.breaker.current is _CLOSED and not self.pacer.row_cap \
            and self._no_n_out and (not self._gate_on or g.steady(t))
        n, plan, stage = self.fused.front(t, self.seg, self.desc, go, fill, self._prefix, _ENTRIES_AT, _ENTRY_SIZE,
                                          self._entry_offs, self._gather_arg)
        self._advanced = stage > 0  # round t's rows reached the ring model (an error past here keeps it)
        return n, (epoch, moved, plan, stage)

    def _run(self, t: int, n: int, phase: str, pre: tuple | None = None) -> None:
        """`pre`: from `_front` (the C path), what it read and how far it went; None: everything here."""
        st, d, pacer = self.stats, self.desc, self.pacer
        v = d.v
        slots, valid, first_pos = v.slots, v.valid, v.first
        # 1. connection epoch, read once: every entry below is built for this connection
        epoch, moved, plan, stage = pre if pre is not None else (self.client.connection_epoch(), None, None, 0)
        if epoch is not None and epoch != self._last_epoch:
            self._last_epoch = epoch
            self.slots.mark_all_dirty()
            self.want_resync[:] = False
        if pre is None:
            moved = self.client.moved_slots()  # a pool's failover or rebalance: those windows are resent
        if moved is not None:
            self.slots.mark_dirty(moved)
            st.inc("pool_slots_resent", int(moved.shape[0]))
        st.inc(_ROUNDS_KEY[phase])
        # 2. ring model: always, so it stays exact (and step 4's flags, from the same pass)
        if plan is None and self.fused is not None:  # (a plan is there when _front did this step)
            plan = self.fused.advance(t, slots, v.req, first_pos, valid, v.valid_raw, v.k_window,
                                      phase == "decode")  # one C call
        elif plan is None:
            plan = self.slots.advance(slots, v.req, first_pos, valid)
            self.accept.round(t, slots, v.valid_raw, v.k_window, plan.new_owner, plan.n_new_owner, phase == "decode")
        self._advanced = True
        if plan.n_new_owner:
            self.want_resync[slots[plan.new_owner]] = False
        w_of = None
        if plan.n_unknown and d.n_staged:
            # the engine's windows of slots whose range we do not know: take the engine's range
            w_of = self.resync.staged_windows(t)[slots]
            plan = self.resync.adopt(t, slots, plan, w_of)
        # 3. breaker
        if not self.breaker.allow(t):
            return self._fail(slots, n, "cooldown")
        if epoch is None:
            return self._fail(slots, n, "disabled" if self.client.disabled else "not_ready")
        # 4-5. entries and rows
        staged = v.staged
        if plan.n_resync or d.n_staged or plan.n_unknown:
            have_win, pending, n_pending, idx, w_of = self.resync.entries(t, n, slots, plan, w_of)
        else:
            # no window needed or staged (the usual round): the requests with staged rows have entries
            have_win, pending, n_pending = None, None, 0
            if d.n_misfit:
                st.inc("requests_not_staged", d.n_misfit)
            if self.win.asked:
                self.resync.ask(t, None)
            # staged is valid or 0 (checked): fits and has rows
            k = self.fused.k_staged if stage else int(np.count_nonzero(staged))
            idx = None if k == n else np.flatnonzero(staged)
        # sel picks the requests with an entry: all of them (a slice: views, no gathers) or idx
        sel = slice(None) if idx is None else idx
        if have_win is None:
            e_rows, n_rows = valid[sel], d.rows_staged
        else:
            e_rows = np.where(have_win, plan.held_rows, valid)[sel]
            n_rows = int(e_rows.sum())
        if pacer.row_cap and pacer.over_cap(n_rows, e_rows.shape[0]):
            idx, n_rows = self._within_cap(idx, n, e_rows)
            sel = idx
            e_rows = e_rows[:idx.shape[0]]
        e_slots = slots[sel]
        k = int(e_slots.shape[0])
        if k == 0:
            return self._fail(slots, n, "no_rows")
        ent = self._prefix.entries(k)
        need = v.need if stage else np.not_equal(v.need_raw, 0, out=v.need)  # _front wrote it from stage 1
        # paused by the acceptance gate: rows sent, no drafts asked; none left: the reply is known now
        first = self._paused(t, slots, need)
        n_out = self.packer.n_out(n)
        if have_win is None and self.native:  # the usual round's entries in one C call (its reference: below)
            self._fill_entries(idx, slots, valid, first_pos, plan, v.need_u8, n_out)
        else:
            flags = v.need_u8 | (plan.new_gen.view(np.uint8) << 1)  # RF_NEED_DRAFT | RF_NEW_GEN
            if have_win is not None:
                flags |= have_win.view(np.uint8) << 2  # RF_RESYNC
            e_first = first_pos[sel] if have_win is None else np.where(have_win, plan.held_first, first_pos)[sel]
            ent["slot"] = e_slots
            ent["n_rows"] = e_rows
            ent["generation"] = self.slots.generation[e_slots]
            ent["first_pos"] = e_first
            ent["anchor_pos"] = plan.anchor_pos[sel]
            ent["anchor_token"] = v.anchor[sel]
            ent["flags"] = flags[sel]
            ent["k_window"] = np.minimum(v.k_window[sel], 255)
            ent["n_out"] = n_out
        if self._shared:  # straight from the engine's ring: the rows were written once, there
            e_first = first_pos[sel] if have_win is None else np.where(have_win, plan.held_first, first_pos)[sel]
            rows = self.ring_rows.views(e_slots, e_first, e_rows)
            if have_win is not None and np.count_nonzero(have_win):
                st.inc("resync_rounds")
                st.inc("resync_rows", int(e_rows[have_win[sel]].sum()))
        elif have_win is None:
            rows = [self.seg.staging[:n_rows]]  # the entries' rows: a prefix of the staging
        else:
            rows = self.resync.row_views(idx, have_win, w_of, e_first, e_rows, staged)
            if np.count_nonzero(have_win):
                st.inc("resync_rounds")
                st.inc("resync_rows", int(e_rows[have_win[sel]].sum()))
        sample_meta = self._sample_meta(k, sel)
        if first:  # published before the STEP: the engine may rewrite the rows once it has the reply
            rows = self._rows_copy(rows)  # so ours first
            self._publish_first(t, n, phase)
            if self._first == FIRST_OVERTAKEN:  # no STEP, its windows resent
                return self.slots.mark_dirty(slots)
            if self._first == FIRST_FAILED:  # no STEP (as `_step` does for a preempted round)
                return self._fail(slots, n, "preempted")
        # 6-7. preempted? then the STEP
        reply = self._step(t, n, slots, ent, n_rows, rows, sample_meta, epoch, n_out)
        if reply is not None:  # 8. accept
            st.inc("rows_sent", n_rows)
            self._accept(t, n, idx, e_slots, slots, plan, need, pending if n_pending else None, reply, n_out)

    def _usual(self, t: int, n: int, phase: str, pre: tuple) -> None:
        """Steps 2-8 of a round `_front` took to stage 3: it found the usual round (the connection's
        epoch, no moved slot, a closed breaker, no row cap, no n_out table, a gate that masks nothing, no
        window to resync, staged or of unknown range, every request with rows) and built its entries.
        What _run checks for that round is known, so this is its path with nothing left to decide, in as
        few Python calls as it takes: the round after an engine's forward runs with cold caches, where
        each call costs a few µs (docs/history.md, "Native hot paths")."""
        st, fused, v = self.stats, self.fused, self.desc.v
        st.inc(_ROUNDS_KEY[phase])
        plan, slots, n_rows = pre[2], v.slots, self.desc.rows_staged
        self._advanced = True
        if plan.n_new_owner:
            self.want_resync[slots[plan.new_owner]] = False
        if self.win.asked:
            self.resync.ask(t, None)
        if not self._shared:
            rows = [self.seg.staging[:n_rows]]  # the entries' rows: a prefix of the staging
        elif fused.n_gathered >= 0:  # _front gathered them from the engine's ring too
            rows = self.ring_rows.gathered(fused.n_gathered)
        else:
            rows = self.ring_rows.views(slots, v.first, v.valid)
        reply = self._step(t, n, slots, self._prefix.entries(n), n_rows, rows, self._sample_meta(n, slice(None)),
                           pre[0], 0)
        if reply is not None:
            st.inc("rows_sent", n_rows)
            self._accept(t, n, None, slots, slots, plan, v.need, None, reply, 0)

    def _sample_meta(self, k: int, sel: slice | np.ndarray) -> np.ndarray | None:
        """A sampled segment's seed and temperature of the k requests `sel` picks, in the STEP prefix."""
        if not self.sampled:
            return None
        v = self.desc.v
        meta = self._prefix.sample(k)
        meta["seed"] = v.seed[sel]
        meta["temperature"] = v.temperature[sel]
        return meta

    def _step(self, t: int, n: int, slots: np.ndarray, ent: np.ndarray, n_rows: int, rows: list,
              sample_meta: np.ndarray | None, epoch: int, n_out: int) -> StepReply | None:
        """Steps 6 and 7: the round's STEP unless the watchdog completed t while we built it (the staging
        may be refilling), and what its outcome teaches the link's pacing and the breaker. None: the
        round failed (and is marked so); else the reply to accept."""
        if self._first == FIRST_NO and self._claimed() >= t:  # (published first: the claim is its own)
            self._fail(slots, n, "preempted")
            return None
        pacer = self.pacer
        timeout_s = self._fixed_timeout_s  # (else what is left of the deadline since `gathered`, at least the minimum)
        if timeout_s is None:
            timeout_s = max(self._min_timeout_s, (self._gathered_ns() + self.deadline_ns - hf.monotonic_ns()) / 1e9)
        out = self.client.step(self._prefix, ent, n_rows, step_id=t, step_flags=self._step_flags, epoch=epoch,
                               rows=rows, sample_meta=sample_meta, timeout_s=timeout_s)
        if not out.ok:
            reason = out.reason or "unknown"
            if reason == "timeout":
                pacer.on_timeout(n_rows, timeout_s * 1e6)
            if reason not in ("not_ready", "disabled", "reconnected"):
                self._breaker_record(t, False, reason)
            self._fail(slots, n, reason)
            return None
        self._rtt_us, self._worker_us = out.rtt_us, out.reply.worker_us  # observed at the round's end
        if n_rows >= pacer.min_rows:  # (a smaller STEP says nothing about the link: on_reply would return)
            pacer.on_reply(n_rows, out.rtt_us)
        if n_out:
            self.stats.inc("rounds_n_out_cut")
        return out.reply

    def _fill_entries(self, idx: np.ndarray | None, slots: np.ndarray, valid: np.ndarray, first_pos: np.ndarray,
                      plan: Advance, need_u8: np.ndarray, n_out: int) -> None:
        """Step 4's entries for the requests `idx` (None: all), each with this round's rows, written into
        the STEP prefix by _fastround.fill_entries (the flags too, from need and new_gen): the reference is
        the flags and field assignments in _run."""
        native.fastround.fill_entries(self._prefix, _ENTRIES_AT, wire.ENTRY_SIZE, self._entry_offs, idx, slots,
                                      valid, self.slots.generation, first_pos, plan.anchor_pos, self.desc.v.anchor,
                                      need_u8, plan.new_gen, self.desc.v.k_window, n_out)

    # ------------------------------------------------------------------ step 8

    def _accept(self, t: int, n: int, idx: np.ndarray | None, e_slots: np.ndarray, slots: np.ndarray,
                plan: Advance, need: np.ndarray, pending: np.ndarray | None, reply: StepReply, n_out: int) -> None:
        """Step 8. `idx`: the requests with an entry (None: all n, in order); `e_slots` their slots;
        `pending`: requests sent without the window they need (None: no such request); `n_out`: the
        entries' (packer.n_out(n))."""
        st = self.stats
        if idx is None and pending is None and self.fused is not None and \
                self.fused.finish(n, e_slots, need, reply, n_out or self.N):
            # the usual round, done in one C call: below, it is the n_failed == 0 and `whole` branches
            st.inc_each(_FINISHED_KEYS, (n, 1))
            if self.breaker.current is not _CLOSED or self.breaker.consecutive_failures:
                self._breaker_record(t, True, "every request failed")  # (closed and clean: it would do nothing)
            return
        sel = slice(None) if idx is None else idx
        k = int(e_slots.shape[0])
        status = reply.status
        n_failed = int(np.count_nonzero(status))  # anything but RS_OK (0)
        if n_failed == 0:  # the common round: every entry usable with a whole window
            usable = None
            self.slots.announce(e_slots)
            st.inc(_STATUS_KEYS[wire.RS_OK], k)
        else:
            usable = wire.USABLE_STATUS_TABLE[status]
            partial = status == wire.RS_PARTIAL_WINDOW
            self.slots.accept(e_slots, plan.anchor_pos[sel], usable, partial, reply.window_rows,
                              held_rows=plan.held_rows[sel])
        # sent with this round's rows while the ring holds more: still to be resynced
        if pending is not None:
            pend = pending[sel]
            if np.count_nonzero(pend):
                self.slots.mark_dirty(e_slots[pend])
        # requests without an entry get no drafts and resend their window later
        if idx is not None:
            no_entry = self._no_entry[:n]
            no_entry[:] = True
            no_entry[idx] = False
            self.slots.mark_dirty(slots[no_entry])
        if usable is not None:
            counts = np.bincount(status, minlength=wire.RS_MAX + 1)
            for code in np.flatnonzero(counts).tolist():
                key = _STATUS_KEYS[code] if code < len(_STATUS_KEYS) else f"req_status_{code}"
                st.inc(key, int(counts[code]))
        all_ok, e_need, n_e_need = self.packer.pack(n, idx, need, usable, reply)
        if n_failed and np.count_nonzero(status == wire.RS_STALE_GENERATION):
            st.inc("stale_generation_new_sessions")
            self.client.new_session("worker reported STALE_GENERATION")
        st.inc("rounds_ok")
        if not all_ok:
            st.inc("rounds_some_failed")
        if n_e_need:
            # a round with nothing to draft never exercises drafting: neutral for the breaker
            some_ok = usable is None or bool(np.count_nonzero(usable & e_need))
            self._breaker_record(t, some_ok, "every request failed")

    def _breaker_record(self, t: int, ok: bool, why: str) -> None:
        change = self.breaker.record(ok, t)
        if change is None:
            return
        self.stats.set("breaker", self.breaker.snapshot())
        if change == "tripped":
            self.stats.inc("breaker_trips")
            log.warning("[breaker] open (%s; trip %d): no network for %d rounds, then one probe", why,
                        self.breaker.trips, self.breaker.cooldown)
        else:
            self.stats.inc("breaker_recoveries")
            log.info("[breaker] closed: the probe round succeeded")
