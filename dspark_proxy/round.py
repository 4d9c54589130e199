"""The round: what the proxy does for engine step t, from `gathered >= t` to `published = t`.

SPEC §2 steps 1-9, column-wise over the round's requests (no per-request Python loop on the hot path):

  read t's descriptor and metadata (stamped copies) -> late? skip -> epoch -> ring model -> breaker
  -> entries + resync rows -> preempted? -> STEP -> accept reply -> pack page -> publish

Invariants kept from the seed (and why):
- The round only READS the staging and the resync windows. The watchdog can fail round t while we
  are in it and the engine then refills the staging for t+1; a proxy that wrote there would corrupt
  a later round. A late round reads torn rows at worst, and then loses its claim: every slot is marked
  dirty so the worker's copies are rebuilt.
- The ring model is applied for every round the engine ran, whatever happens to the round (open
  breaker, no connection, rows that did not fit, skipped late rounds), so it stays exact.
- Every failure packs a failed reply (status ROUND_FAILED) and marks the round's slots dirty.
- A reply is published only if round t-1's was consumed; otherwise the hand-off's order is broken
  and the proxy dies (fail_all) rather than tear the engine's copy.

Thread ownership: one round thread owns everything here; `stats` is shared read-only with the
heartbeat thread's snapshot.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _hostflag, wire
from .breaker import CircuitBreaker
from .events import EventRing
from .hostflag import HostFlags
from .ring import SlotTable
from .segment import Segment
from .shm_layout import (
    META_SLOTS,
    STATUS_OK,
    STATUS_ROUND_FAILED,
    STATUS_SOME_FAILED,
    SUPPORT_K,
    Word,
)
from .stats import Stats

__all__ = ["RoundCore", "RoundSettings", "BadDescriptor"]

log = logging.getLogger(__name__)


class BadDescriptor(ValueError):
    """Round t's descriptor or metadata does not hold together: that round fails, never the process."""


@dataclass(frozen=True)
class RoundSettings:
    want_margin: bool = False
    n_out_table: tuple[int, ...] = ()  # n_out by batch size (index min(n, len-1)); empty = all N
    step_timeout_s: float | None = None  # None: what is left of the deadline since `gathered`
    min_step_timeout_s: float = 0.0005


class RoundCore:
    """Rank-0 round logic over one attached segment (a new one per engine attach)."""

    def __init__(self, seg: Segment, client: Any, stats: Stats, events: EventRing, breaker: CircuitBreaker,
                 settings: RoundSettings) -> None:
        p = seg.params
        self.seg, self.client, self.stats, self.events, self.breaker = seg, client, stats, events, breaker
        self.settings = settings
        self.M, self.N, self.W, self.R = p.max_slots, p.num_spec, p.window, p.resync_per_round
        self.sampled = p.sampled
        self.lay = seg.layout
        self.flags = HostFlags(seg)
        self.slots = SlotTable(self.M, self.W)
        self.want_resync = np.zeros(self.M, dtype=np.bool_)  # slots whose ring window we asked for
        self._resync_req = np.zeros(1, self.lay.resync_req_dtype)
        self._resync_sent = np.full(self.M + 1, -2, dtype=np.int32)  # last request written (to skip rewrites)
        self._last_epoch: int | None = None
        self.page = np.zeros(self.lay.reply.size, dtype=np.int32)
        self._desc = np.zeros(1, self.lay.desc_dtype)  # private copies of round t's slots ...
        self._meta = np.zeros(1, self.lay.meta_dtype)
        d, m = self._d, self._m = self._desc[0], self._meta[0]  # ... and views of their fields, made once
        self._d_slot64 = np.zeros(self.M, dtype=np.int64)
        self._d_slot, self._d_req, self._d_qsl = d["slot"], d["req_id"], d["qsl"]
        self._d_need, self._d_k = d["need_draft"], d["k_window"]
        self._m_valid, self._m_staged, self._m_first = m["valid"], m["staged_rows"], m["first_pos"]
        self._m_anchor, self._m_seed, self._m_temp = m["anchor"], m["seed"], m["temperature"]
        self._no_entry = np.ones(self.M, dtype=np.bool_)
        self._prefix = bytearray(wire.step_prefix_bytes(self.M, self.sampled))
        self._slot_of_window = np.full(self.M, -1, dtype=np.int64)  # staged window index per slot
        self.rounds = 0  # the last round handled
        self.deadline_ns = int(seg.deadline_ms * 1e6)
        self._n_out_table = np.asarray(settings.n_out_table, dtype=np.int64)

    # ------------------------------------------------------------------ entry point

    def handle(self, t: int, waited_us: float) -> None:
        """Round t, gathered. Publishes (or loses the claim); raises only when the hand-off is broken."""
        t0 = time.perf_counter()
        self.rounds = t
        if self.flags.taken(t):
            self._skip_taken(t, waited_us)
            self.stats.observe("rank0_round_us", (time.perf_counter() - t0) * 1e6)
            return
        phase = "unknown"
        try:
            n = self._read_round(t)
            phase = self._phase()
            self._run(t, n, phase)
        except BadDescriptor as e:
            self.stats.inc("fallback_bad_descriptor")
            self.stats.inc("rounds_failed")
            self.slots.restart(np.arange(self.M))
            self._pack_failed(0)
            log.warning("[round] t=%d bad descriptor: %s", t, e)
        except Exception:  # noqa: BLE001 - the round fails closed, the loop goes on
            self.stats.inc("fallback_internal_error")
            self.stats.inc("rounds_failed")
            self.slots.mark_all_dirty()
            self._pack_failed(int(self._desc["n"][0]) if self._desc["t"][0] == t else 0)
            log.exception("[round] t=%d failed", t)
        if not self.flags.reply_consumed(t - 1):
            raise RuntimeError(f"round {t}: the engine has not consumed round {t - 1}'s reply "
                               f"(words {self.flags.values()})")
        if not self.flags.publish(t, self.page):
            # the watchdog failed t first: the worker may hold rows we now treat as unsent
            self.slots.mark_all_dirty()
            self.stats.inc("watchdog_preempted")
            self._event(t, "late_publish", phase, waited_us)
        done_us = (time.perf_counter() - t0) * 1e6
        self.stats.observe("rank0_round_us", done_us)
        self.stats.observe(f"proxy_parked_us_{phase}", done_us)

    # ------------------------------------------------------------------ reading the round

    def _read_round(self, t: int) -> int:
        """Copy round t's descriptor and metadata out of their slots under the stamp rule, validate.

        Checks are counted, not branched on per field: each numpy call costs ~1 µs whatever n is."""
        seg, lay = self.seg, self.lay
        slot = t % META_SLOTS
        if not self._copy_stamped(t, lay.desc_off(t), lay.desc_dtype, seg.desc[slot:slot + 1], self._desc):
            raise BadDescriptor(f"descriptor slot {slot} is not round {t}'s (stamps)")
        if not self._copy_stamped(t, lay.meta_off(t), lay.meta_dtype, seg.meta[slot:slot + 1], self._meta):
            raise BadDescriptor(f"metadata slot {slot} is not round {t}'s (stamps)")
        d, m = self._d, self._m
        n = int(d["n"])
        if not 0 <= n <= self.M or int(m["n"]) != n:
            raise BadDescriptor(f"n={n} (meta n={int(m['n'])}) outside [0, {self.M}]")
        why = self.slots.validate_round(self._d_slot[:n])
        if why:
            raise BadDescriptor(why)
        valid, staged = self._m_valid[:n], self._m_staged[:n]
        qsl = self._d_qsl[:n + 1]
        bad = int(np.count_nonzero((valid < 0) | (valid > self.W) | ((staged != 0) & (staged != valid))
                                   | (self._m_first[:n] < 0)))
        bad += int(np.count_nonzero(qsl[1:] < qsl[:-1]))
        if bad:
            raise BadDescriptor(f"{bad} request fields out of range (valid, staged_rows, first_pos or qsl)")
        rows = int(m["rows_staged"])
        if int(staged.sum()) != rows or rows > seg.params.max_rows or int(d["rows_gathered"]) != rows:
            raise BadDescriptor(f"rows_staged={rows} disagrees with the per-request counts or max_rows")
        if not 0 <= int(d["n_staged"]) <= self.R:
            raise BadDescriptor(f"n_staged={int(d['n_staged'])} outside [0, {self.R}]")
        return n

    def _copy_stamped(self, t: int, off: int, dtype: np.dtype, src: np.ndarray, dst: np.ndarray) -> bool:
        mm = self.seg.mm
        if _hostflag.load(mm, off + dtype.fields["stamp_end"][1]) != t:
            return False
        dst[...] = src
        return _hostflag.load_after(mm, off) == t

    def _phase(self) -> str:
        return "prefill" if int(self._d["max_q"]) > self.N + 1 else "decode"

    # ------------------------------------------------------------------ the round proper

    def _run(self, t: int, n: int, phase: str) -> None:
        st, d, m = self.stats, self._d, self._m
        slots = self._d_slot64[:n]
        slots[:] = self._d_slot[:n]
        valid = self._m_valid[:n].astype(np.int64)
        first_pos = self._m_first[:n]
        # 1. connection epoch, read once: every entry below is built for this connection
        epoch = self.client.connection_epoch()
        if epoch is not None and epoch != self._last_epoch:
            self._last_epoch = epoch
            self.slots.mark_all_dirty()
            self.want_resync[:] = False
        st.inc(f"rounds_{phase}")
        # 2. ring model: always, so it stays exact
        new_owner = self.slots.begin_requests(slots, self._d_req[:n])
        if np.count_nonzero(new_owner):
            self.want_resync[slots[new_owner]] = False
        anchor_pos = self.slots.apply(slots, first_pos, valid)
        # 3. breaker
        if not self.breaker.allow(t):
            return self._fail(slots, n, "cooldown")
        if epoch is None:
            return self._fail(slots, n, "disabled" if self.client.disabled else "not_ready")
        # 4-5. entries and rows
        plan = self.slots.plan(slots, first_pos, valid, anchor_pos)
        staged_rows = self._m_staged[:n].astype(np.int64)
        win_idx = self._staged_windows(t, d)
        w_of = win_idx[slots]  # staged window index per request, -1 = none
        wants = plan.resync
        have_win = wants & (w_of >= 0)
        if np.count_nonzero(have_win):
            have_win &= self._window_covers(w_of, plan.first, plan.n_rows)
        pending = wants & ~have_win  # needs its window; goes out with this round's rows only
        fits = staged_rows == valid
        has_entry = have_win | ((valid > 0) & fits)
        n_pending, n_win = int(np.count_nonzero(pending)), int(np.count_nonzero(have_win))
        if n_pending:
            self.want_resync[slots[pending]] = True
            st.inc("resync_pending", int(np.count_nonzero(pending & has_entry)))
        if n_win:
            self.want_resync[slots[have_win]] = False
        nofit = int(np.count_nonzero(~fits)) - n_win
        if nofit > 0:
            st.inc("requests_not_staged", int(np.count_nonzero(~fits & ~have_win)))
        if n_pending or n_win or self._resync_sent[0]:
            self._write_resync_request()
        idx = np.flatnonzero(has_entry)
        k = int(idx.shape[0])
        if k == 0:
            return self._fail(slots, n, "no_rows")
        ent = wire.entries_view(self._prefix, k)
        e_first = np.where(have_win, plan.first, first_pos)[idx]
        e_rows = np.where(have_win, plan.n_rows, valid)[idx]
        ent["slot"] = slots[idx]
        ent["n_rows"] = e_rows
        ent["generation"] = plan.generation[idx]
        ent["first_pos"] = e_first
        ent["anchor_pos"] = anchor_pos[idx]
        ent["anchor_token"] = self._m_anchor[idx]
        need = self._d_need[:n].astype(np.bool_)
        ent["flags"] = (need[idx] * wire.RF_NEED_DRAFT + plan.new_gen[idx] * wire.RF_NEW_GEN
                        + have_win[idx] * wire.RF_RESYNC)
        ent["k_window"] = np.minimum(self._d_k[idx], 255)
        n_out = self._n_out(n)
        ent["n_out"] = n_out
        n_rows = int(e_rows.sum())
        rows = self._row_views(idx, have_win, w_of, e_first, e_rows, staged_rows, int(m["rows_staged"]))
        if np.count_nonzero(have_win):
            st.inc("resync_rounds")
            st.inc("resync_rows", int(e_rows[have_win[idx]].sum()))
        sample_meta = None
        step_flags = wire.SF_WANT_MARGIN if self.settings.want_margin else 0
        if self.sampled:
            step_flags |= wire.SF_SAMPLED
            sample_meta = wire.sample_view(self._prefix, k)
            sample_meta["seed"] = self._m_seed[idx]
            sample_meta["temperature"] = self._m_temp[idx]
        # 6. preempted: the watchdog completed t while we built it; the staging may be refilling
        if self.flags.taken(t):
            return self._fail(slots, n, "preempted")
        # 7. STEP
        out = self.client.step(self._prefix, ent, n_rows, step_id=t, step_flags=step_flags, epoch=epoch,
                               rows=rows, sample_meta=sample_meta, timeout_s=self._step_timeout())
        if not out.ok:
            reason = out.reason or "unknown"
            if reason not in ("not_ready", "disabled", "reconnected"):
                self._breaker_record(t, False, reason)
            return self._fail(slots, n, reason)
        st.observe("rtt_us", out.rtt_us)
        st.observe(f"rtt_us_{phase}", out.rtt_us)
        st.observe("worker_us", out.reply.worker_us)
        st.inc("rows_sent", n_rows)
        if n_out:
            st.inc("rounds_n_out_cut")
        # 8. accept
        self._accept(t, n, idx, slots, anchor_pos, need, pending, out.reply)

    def _fail(self, slots: np.ndarray, n: int, reason: str) -> None:
        self.slots.mark_dirty(slots)
        self.stats.inc(f"fallback_{reason}")
        self.stats.inc("rounds_failed")
        self._pack_failed(n)

    def _pack_failed(self, n: int) -> None:
        b = self.page
        b[: self.lay.reply.o_ids] = 0
        b[0] = STATUS_ROUND_FAILED
        b[1] = n

    def _n_out(self, n: int) -> int:
        tab = self._n_out_table
        if tab.shape[0] == 0:
            return 0
        c = int(tab[min(n, tab.shape[0] - 1)])
        return 0 if c >= self.N else max(1, c)

    def _step_timeout(self) -> float:
        s = self.settings
        if s.step_timeout_s is not None:
            return s.step_timeout_s
        left_ns = self.seg.word(Word.GATHERED_NS) + self.deadline_ns - _hostflag.monotonic_ns()
        return max(s.min_step_timeout_s, left_ns / 1e9)

    # ------------------------------------------------------------------ resync windows

    def _staged_windows(self, t: int, d: np.void) -> np.ndarray:
        """Window index per slot for the windows the engine staged with round t (else -1)."""
        w = self._slot_of_window
        w[:] = -1
        k = int(d["n_staged"])
        if k:
            staged = d["staged_slots"][:k].astype(np.int64)
            ok = (staged >= 0) & (staged < self.M)
            win = self.seg.windows
            hdr_ok = (win["stamp"][:k] == t) & (win["slot"][:k] == staged)
            good = np.flatnonzero(ok & hdr_ok)
            w[staged[good]] = good
            # a staged slot we no longer need (clean again, or a new owner) stops being asked for
            self.want_resync[staged[ok]] &= self.slots.dirty[staged[ok]]
        return w

    def _window_covers(self, w_of: np.ndarray, first: np.ndarray, n_rows: np.ndarray) -> np.ndarray:
        """The staged window holds every position the entry needs (the engine's ring agrees with ours)."""
        win = self.seg.windows
        wi = np.maximum(w_of, 0)
        lo, hi = win["lo"][wi], win["hi"][wi]
        return (w_of >= 0) & (lo <= first) & (hi >= first + n_rows - 1)

    def _write_resync_request(self) -> None:
        want = np.flatnonzero(self.want_resync)
        k = int(want.shape[0])
        sent = self._resync_sent
        if sent[0] == k and np.array_equal(sent[1:k + 1], want):
            return
        r = self._resync_req
        r["count"][0] = k
        r["slots"][0, :k] = want
        sent[0] = k
        sent[1:k + 1] = want
        lay = self.lay
        _hostflag.seq_write(self.seg.mm, lay.word_off(Word.RESYNC_SEQ), lay.resync_req, r.view(np.uint8))

    def _row_views(self, idx: np.ndarray, have_win: np.ndarray, w_of: np.ndarray, e_first: np.ndarray,
                   e_rows: np.ndarray, staged_rows: np.ndarray, rows_staged: int) -> list[np.ndarray]:
        """The STEP's rows as views, in entry order: runs of the staging, split where a RESYNC entry
        takes its rows from a staged window instead. Python loops only over RESYNC entries (<= R)."""
        staging = self.seg.staging
        resync_pos = np.flatnonzero(have_win[idx])
        if resync_pos.shape[0] == 0:
            return [staging[:rows_staged]]
        soff = np.cumsum(staged_rows) - staged_rows  # each request's first staging row
        views: list[np.ndarray] = []
        cur = 0
        W = self.W
        windows = self.seg.windows
        for j in resync_pos.tolist():
            i = int(idx[j])
            start = int(soff[i])
            if start > cur:
                views.append(staging[cur:start])
            rows = windows[int(w_of[i])]["rows"]
            f, c = int(e_first[j]) % W, int(e_rows[j])
            if f + c <= W:
                views.append(rows[f:f + c])
            else:
                views.append(rows[f:])
                views.append(rows[:f + c - W])
            cur = start + int(staged_rows[i])
        if rows_staged > cur:
            views.append(staging[cur:rows_staged])
        return views

    # ------------------------------------------------------------------ step 8

    def _accept(self, t: int, n: int, idx: np.ndarray, slots: np.ndarray, anchor_pos: np.ndarray,
                need: np.ndarray, pending: np.ndarray, reply: Any) -> None:
        st, L, N = self.stats, self.lay.reply, self.N
        status = reply.status
        usable = wire.USABLE_STATUS_TABLE[status]
        partial = status == wire.RS_PARTIAL_WINDOW
        e_slots = slots[idx]
        self.slots.accept(e_slots, anchor_pos[idx], usable, partial, reply.window_rows)
        # sent with this round's rows while the ring holds more: still to be resynced
        pend = pending[idx]
        if np.count_nonzero(pend):
            self.slots.mark_dirty(e_slots[pend])
        # requests without an entry get no drafts and resend their window later
        if idx.shape[0] != n:
            no_entry = self._no_entry[:n]
            no_entry[:] = True
            no_entry[idx] = False
            self.slots.mark_dirty(slots[no_entry])
        counts = np.bincount(status, minlength=wire.RS_MAX + 1)
        for code in np.flatnonzero(counts).tolist():
            st.inc(f"req_status_{wire.REQ_STATUS_NAMES.get(code, str(code))}", int(counts[code]))
        b = self.page
        b[: L.o_sample_mask if L.sampled else L.size] = 0
        b[1] = n
        give = usable & need[idx]
        gi = idx[give]
        b[L.o_ok + gi] = 1
        ids = b[L.o_ids:L.o_ids + n * N].reshape(n, N)
        conf = b[L.o_conf:L.o_conf + n * N].view(np.float32).reshape(n, N)
        ids[gi] = reply.draft_ids[give]
        conf[gi] = reply.confidence[give]
        if L.sampled:
            K = SUPPORT_K
            b[L.o_sample_mask:L.o_sample_mask + n] = 0
            if reply.sampled_mask is None or reply.support_ids is None or reply.proposal_q is None:
                raise RuntimeError("sampled reply without its support ids and q")
            b[L.o_sample_mask + gi] = reply.sampled_mask[give]
            b[L.o_qids:L.o_qids + n * N * K].reshape(n, N, K)[gi] = reply.support_ids[give]
            b[L.o_q:L.o_q + n * N * K].view(np.float32).reshape(n, N, K)[gi] = reply.proposal_q[give]
        if np.count_nonzero(status == wire.RS_STALE_GENERATION):
            st.inc("stale_generation_new_sessions")
            self.client.new_session("worker reported STALE_GENERATION")
        all_ok = int(np.count_nonzero(give)) == int(np.count_nonzero(need))
        b[0] = STATUS_OK if all_ok else STATUS_SOME_FAILED
        st.inc("rounds_ok")
        if not all_ok:
            st.inc("rounds_some_failed")
        needed = need[idx]
        if np.count_nonzero(needed):
            # a round with nothing to draft never exercises drafting: neutral for the breaker
            self._breaker_record(t, bool(np.count_nonzero(usable & needed)), "every request failed")

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

    # ------------------------------------------------------------------ late rounds

    def _skip_taken(self, t: int, waited_us: float) -> None:
        """Round t was failed (watchdog, fail_all) before we reached it. The engine may already be
        writing a later round's rows, so no row is read and nothing is sent; the ring model is still
        advanced from round t's own metadata slot if the stamps show it is still t's, else the
        round's slots (or, without a trustworthy descriptor, every slot) restart their windows."""
        st = self.stats
        st.inc("watchdog_preempted")
        st.inc("watchdog_skipped_rounds")
        phase = "unknown"
        try:
            n = self._read_round(t)
        except BadDescriptor:
            self.slots.restart(np.arange(self.M))
            self.want_resync[:] = False
            st.inc("watchdog_skipped_unknown_ring")
        else:
            phase = self._phase()
            slots = self._d_slot[:n].astype(np.int64)
            new_owner = self.slots.begin_requests(slots, self._d_req[:n])
            self.want_resync[slots[new_owner]] = False
            self.slots.apply(slots, self._m_first[:n], self._m_valid[:n].astype(np.int64))
            self.slots.mark_dirty(slots)
        self._event(t, "skipped", phase, waited_us)

    def _event(self, t: int, how: str, phase: str, waited_us: float) -> None:
        d = self._d
        same = int(d["t"]) == t
        n = int(d["n"]) if same else 0
        self.events.record(round=t, time=round(time.time(), 3), how=how, phase=phase, n=n,
                           rows=int(d["rows_gathered"]) if same else 0,
                           longest_query=int(d["max_q"]) if same else 0,
                           proxy_wait_ms=round(waited_us / 1e3, 3))
        self.stats.set("watchdog_events", self.events.dump())
