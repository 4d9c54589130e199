"""Drafting stopped where it earns nothing, or costs more than it earns (docs/design.md,
"Acceptance-aware drafting"); acceptance.py measures what the drafts earn.

A request whose drafts keep being rejected
costs every round (the STEP's drafting, the engine's verification) for nothing. Per slot, a state
machine over its verified rounds:

    ACTIVE --(patience rounds seen, mean accepted < break_even)--> PAUSED (pause rounds)
    PAUSED --(pause over)--> PROBING (drafts asked again)
    PROBING --(probe rounds verified, mean >= break_even)--> ACTIVE (pause back to its base)
    PROBING --(probe rounds verified, mean < break_even)--> PAUSED (pause doubled, at most pause_max)
    any --(a new request in the slot)--> ACTIVE

The mean is over the slot's block: the verified rounds since it was last judged (ACTIVE slots are
judged together every `patience` rounds once they have `patience` verified rounds; a probe when its
`probe` rounds are verified). A PAUSED slot's entry goes out without NEED_DRAFT: its rows are still
sent, so its window stays whole, and drafting resumes at once when a probe succeeds. The whole batch
has the same machine over its mean accepted per request-round: paused, no entry asks for drafts, and
the round's reply is published before its STEP (round/late.py, `_publish_first`).

The batch's throughput rule (`tps_every` > 0; gate_tps.py measures): acceptance says what drafts earn,
not what they cost, so the batch's blocks also learn tokens per request-second of the engine's steps,
with drafts (its ACTIVE and PROBING blocks) and without (its PAUSED ones):

    ACTIVE --(block whole, plain rate older than tps_every rounds, or none yet tps_every / 4 rounds
             after the gate's first)--> PAUSED, a plain sample (patience rounds) --(over)--> ACTIVE
    ACTIVE --(a slow block: drafting rate < plain rate, the plain one older than the last judgement but
             one)--> PAUSED, a plain sample (as above), the slow count kept
    ACTIVE --(a 2nd slow block in a row, or one below half the plain rate, the plain rate newer than
             that)--> PAUSED (pause rounds)
    PAUSED --(over)--> PROBING, a whole block (patience verified rounds at least), looked at first after
             MIN_SAMPLES: below half its bar it fails there
    PROBING --(drafting rate >= plain rate * (1 + tps_margin))--> ACTIVE (pause back to its base)
    PROBING --(drafting rate below that)--> PAUSED (pause doubled, at most pause_max)

Both rates are medians over a block (decode rounds only), a pause needs two slow blocks in a row against
a plain rate measured just before them (a machine's load drifts), and the way back the margin, so noise
does not flap it (and noise around break-even settles paused); every pause refreshes the plain rate,
every block the drafting one; low acceptance pauses first, as above.

Per batch size (the throughput rule only; gate_tps.py, `bucket`): a target step's cost grows with the
tokens it verifies, so each bucket of sizes keeps its plain rate and what the rule last found there
(`b_recall`): a pause, once a probe there failed (the batch pauses again at once on coming back,
`accept_batch_tps_recalled`),
PAYS (a throughput pause, sample or probe under way ends on coming there), or nothing yet (the batch
goes on as it was). A size counts after SWITCH_AFTER rounds in a row, and a batch pause is promised to
the engine PROMISE_AHEAD rounds at a time so that such a change can end it.

The gate only ever clears NEED_DRAFT; the engine's own "no drafts" always wins. Everything is per-slot
numpy over the round's requests: no per-request Python. The per-round sums it reads (`sum`, `cnt`,
`left`) may be added by the C path (acceptance.py); every state change stays here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..ops.stats import Stats
from .gate_tps import MIN_SAMPLES, StepRates, bucket, size_label

__all__ = ["AcceptGate", "GateSettings", "Effect", "ACTIVE", "PAUSED", "PROBING", "STATE_NAMES", "PAYS",
           "PROMISE_AHEAD", "SWITCH_AFTER"]


class Effect(Protocol):
    """What the batch machine reads of the drafts' effect (acceptance.py's DraftEffect, which imports
    this module): request-rounds that verified drafts, and the accepted drafts so far."""

    drafts: int

    def accepted_total(self) -> int: ...


ACTIVE, PAUSED, PROBING = 0, 1, 2
STATE_NAMES = ("active", "paused", "probing")
PAYS = -1  # AcceptGate.b_recall: drafting was found to pay at that batch size (> 0: the pause it was given)
PROMISE_AHEAD = 32  # rounds past the one handled that a batch pause promises the engine (shm_layout.md §3)
SWITCH_AFTER = 4  # rounds in a row at another batch-size bucket before the throughput rule moves to it


@dataclass(frozen=True)
class GateSettings:
    """break_even: accepted drafts per verified round below which drafting is not worth it (0: the
    gate is off); patience: verified rounds before a slot (or the batch) may be paused; pause: rounds
    paused, doubled after each failed probe up to pause_max; probe: verified rounds a probe lasts;
    tps_every, tps_margin: the batch's throughput rule (module docstring; off here by default, the
    proxy's --accept-tps-every sets it)."""

    break_even: float = 0.3
    patience: int = 16
    pause: int = 64
    pause_max: int = 1024
    probe: int = 2
    tps_every: int = 0  # the throughput rule: rounds between the batch's plain samples (0: off; gate_tps.py)
    tps_margin: float = 0.1  # what a throughput probe must beat the plain rate by to resume drafting

    def __post_init__(self) -> None:
        if self.break_even < 0 or self.patience < 1 or self.pause < 1 or self.pause_max < self.pause \
                or self.probe < 1 or self.tps_every < 0 or self.tps_margin < 0:
            raise ValueError(f"acceptance gate settings out of range: {self}")


_NEVER = np.iinfo(np.int64).max // 2  # `left` of a slot that is not probing


class AcceptGate:
    """The per-slot and whole-batch state machines (module docstring). Owned by the round thread.

    Per slot: `state`, the accepted drafts `sum` and verified rounds `cnt` since its block began,
    `left` (PROBING: verified rounds before the probe is judged), `until` (PAUSED: the round the pause
    ends) and `pause` (the next pause's length). A round costs two scatter-adds; ACTIVE slots are
    judged together every `patience` rounds (those with at least `patience` verified rounds in their
    block), probes as they complete, pauses as they end: each a few numpy calls over the slots concerned."""

    def __init__(self, max_slots: int, settings: GateSettings, stats: Stats, effect: Effect,
                 clock: Callable[[], int] | None = None) -> None:
        self.s, self.stats, self.M, self.effect = settings, stats, max_slots, effect
        self.on = settings.break_even > 0
        self.state = np.zeros(max_slots, dtype=np.uint8)
        self.sum = np.zeros(max_slots, dtype=np.int64)
        self.cnt = np.zeros(max_slots, dtype=np.int64)
        self.left = np.full(max_slots, _NEVER, dtype=np.int64)
        self.until = np.zeros(max_slots, dtype=np.int64)
        self.pause = np.full(max_slots, settings.pause, dtype=np.int64)
        self.n_paused = self.n_probing = 0  # slots PAUSED / PROBING now: their paths cost nothing while 0
        self.next_wake = 0  # the earliest round a PAUSED slot's pause ends
        self.next_tick = settings.patience  # the next round the ACTIVE slots are judged
        # the batch: the same machine over the mean accepted per verified request-round, its block's
        # sums read off the effect's totals (accepted, verified request-rounds) at the block's start
        self.b_state, self.b_left, self.b_from = ACTIVE, settings.patience, (0, 0)
        self.b_until, self.b_pause = 0, settings.pause
        # the throughput rule (None: off): the block's step intervals; b_sample: the batch's PAUSED block
        # is a plain sample; b_tps: its PAUSED / PROBING block came from the throughput rule
        self.tps = StepRates(clock) if self.on and settings.tps_every else None
        self.b_sample = self.b_tps = False
        self.b_slow = 0  # ACTIVE blocks in a row whose drafting rate was below the plain one
        self.b_judged = (-1, -1)  # the rounds of the batch's last two ACTIVE judgements (the throughput rule)
        self.b_more = 0  # a throughput probe's verified rounds past its first look
        self._asked = True  # the last round's mask asks drafts of the batch (not PAUSED, not a promised round)
        # the throughput rule per batch size (gate_tps.py, `bucket`): the rounds' bucket, and per bucket what
        # the rule last found there: the pause it gave drafting, PAYS (drafting beat the plain rate by the
        # margin), 0 (not judged yet)
        self.b_bucket = self.b_next = self.b_next_n = 0  # b_next: another bucket seen b_next_n rounds in a row
        self.b_recall = [0] * (bucket(max_slots) + 1)
        self.b_recall_other = False  # a bucket but this one has a pause to recall: a change of size may pause
        self.b_promised = 0  # the engine's paused_through: rounds up to it ask no drafts whatever the state

    # ------------------------------------------------------------------ per round

    def observe(self, t: int, slots: np.ndarray, new_owner: np.ndarray, n_new_owner: int, n_ver: int,
                ver: np.ndarray, acc: np.ndarray, decode: bool = True) -> None:
        """Round t's requests: new owners start ACTIVE; pauses that ended become probes; the verified
        requests' accepted drafts fill their slots' (and the batch's) blocks, judged when due."""
        if not self.on:
            return
        self.begin(t, slots, new_owner, n_new_owner)
        ready = None
        if n_ver:
            self.sum[slots] += acc
            self.cnt[slots] += ver
            if self.n_probing:
                self.left[slots] -= ver
                due = self.left[slots] <= 0
                if due.any():
                    ready = slots[due]
        self.end(t, n_ver, ready, slots.shape[0], decode)

    def begin(self, t: int, slots: np.ndarray, new_owner: np.ndarray, n_new_owner: int) -> None:
        """observe() before the round's sums: new owners start ACTIVE, pauses that ended become probes."""
        if n_new_owner:
            self._reset(slots[new_owner])
        if self.n_paused and t >= self.next_wake:
            self._wake(t)

    def end(self, t: int, n_ver: int, ready: np.ndarray | None, n: int, decode: bool = True) -> None:
        """observe() after the round's sums (n requests; decode: no prefill rows): the round's step
        interval (the throughput rule), the batch's pause ends, then `ready` (the probing slots whose probe is complete, None:
        none), the batch's block and the ACTIVE slots are judged when due."""
        asked = self._asked  # round t-1 went out asking drafts: step t is what that cost, verified or not
        if self.tps is not None:
            if n and bucket(n) != self.b_bucket:
                self._seen_size(t, bucket(n))
            elif self.b_next_n:
                self.b_next_n = 0
            self.tps.round(t, n, asked, decode)
        if self.b_state == PAUSED and t >= self.b_until:
            self._batch_pause_over(t)
        if n_ver and ready is not None:
            self._judge_probes(t, ready)
        # with the throughput rule a round whose drafts came late (none verified) still fills the block:
        # a drafter that misses every deadline must be judged, not wait for verified rounds that never come
        if n_ver or (asked and self.tps is not None):
            self.b_left -= 1
            if self.b_left <= 0 and self.b_state != PAUSED:
                self._judge_batch(t)
        if t >= self.next_tick:
            self.next_tick = t + self.s.patience
            self._judge_active(t)
        if self.b_state == PAUSED:  # promised a round at a time, so a change of size may end a pause
            self.b_promised = max(self.b_promised, min(self.b_until - 1, t + PROMISE_AHEAD))
        self._asked = self.b_state != PAUSED and t > self.b_promised  # round t's mask: the class of step t+1

    def steady(self, t: int) -> bool:
        """Nothing in round t's end() can pause drafting (no slot paused or probing, the batch ACTIVE with its
        block not due, no bucket to recall a pause from): its entries may be filled before it (round/core.py)."""
        return not self.on or (self.n_paused == 0 and self.n_probing == 0 and self.b_state != PAUSED
                               and t < self.next_tick and self.b_left > 1 and not self.b_recall_other
                               and t > self.b_promised)

    def mask(self, slots: np.ndarray, need: np.ndarray) -> int:
        """Clear `need` (the round's NEED_DRAFT flags, in place) where the slot or the batch is PAUSED, or
        all of it in a round promised paused; how many it cleared."""
        if not self.on or (self.n_paused == 0 and self._asked):
            return 0
        before = int(np.count_nonzero(need))
        if not self._asked:  # the batch PAUSED, or the round promised paused (b_promised)
            need[:] = False
        else:
            need &= self.state[slots] != PAUSED
        cleared = before - int(np.count_nonzero(need))
        if cleared:
            self.stats.inc("accept_drafts_not_asked", cleared)
        return cleared

    def snapshot(self) -> dict:
        """For status: the slots in each state now and the batch's state; with the throughput rule, the
        rates it learnt (tokens per request-second, None: not yet) and what it found at each batch size
        judged (`tps_by_size`: "pays", or the pause it gave drafting there, in rounds)."""
        snap = {"enabled": self.on, "slots_paused": self.n_paused, "slots_probing": self.n_probing,
                "batch": STATE_NAMES[self.b_state], "break_even": self.s.break_even, "tps_rule": self.tps is not None}
        if self.tps is not None:
            snap.update(self.tps.snapshot())
            snap["tps_by_size"] = {size_label(b): "pays" if f == PAYS else f for b, f in enumerate(self.b_recall) if f}
        return snap

    # ------------------------------------------------------------------ transitions

    def _judge_active(self, t: int) -> None:
        """ACTIVE slots with a whole block: below break-even pause, the rest start a new block."""
        s = self.s
        due = np.flatnonzero((self.cnt >= s.patience) & (self.state == ACTIVE))
        if not due.shape[0]:
            return
        low = self.sum[due] < s.break_even * self.cnt[due]
        self.sum[due], self.cnt[due] = 0, 0
        if low.any():
            self._pause(t, due[low], "accept_paused")

    def _judge_probes(self, t: int, k: np.ndarray) -> None:
        """Probes that completed: earning, ACTIVE again (pause back to its base); not, PAUSED again
        with the pause doubled (at most pause_max)."""
        s = self.s
        low = self.sum[k] < s.break_even * self.cnt[k]
        self.n_probing -= int(k.shape[0])
        self.left[k] = _NEVER
        self.sum[k], self.cnt[k] = 0, 0
        ok, failed = k[~low], k[low]
        if ok.shape[0]:
            self.state[ok], self.pause[ok] = ACTIVE, s.pause
            self.stats.inc("accept_resumed", int(ok.shape[0]))
        if failed.shape[0]:
            self.pause[failed] = np.minimum(self.pause[failed] * 2, s.pause_max)
            self._pause(t, failed, "accept_probe_failed")

    def _reset(self, k: np.ndarray) -> None:
        st = self.state[k]
        self.n_paused -= int(np.count_nonzero(st == PAUSED))
        self.n_probing -= int(np.count_nonzero(st == PROBING))
        self.state[k], self.sum[k], self.cnt[k], self.left[k], self.pause[k] = ACTIVE, 0, 0, _NEVER, self.s.pause

    def _pause(self, t: int, k: np.ndarray, counter: str) -> None:
        self.state[k] = PAUSED
        self.until[k] = t + self.pause[k]
        self.n_paused += int(k.shape[0])
        self.next_wake = int(self.until[self.state == PAUSED].min())
        self.stats.inc(counter, int(k.shape[0]))

    def _wake(self, t: int) -> None:
        paused = self.state == PAUSED
        due = paused & (self.until <= t)
        n = int(np.count_nonzero(due))
        self.state[due], self.sum[due], self.cnt[due], self.left[due] = PROBING, 0, 0, self.s.probe
        self.n_paused -= n
        self.n_probing += n
        self.next_wake = int(self.until[paused & ~due].min()) if self.n_paused else 0
        self.stats.inc("accept_probes", n)

    def _batch_block(self, state: int, rounds: int) -> None:
        self.b_state, self.b_left = state, rounds
        self.b_from = (self.effect.accepted_total(), self.effect.drafts)
        if self.tps is not None:
            self.tps.begin()

    def _batch_pause_over(self, t: int) -> None:
        """The batch's PAUSED block is over: its plain rounds teach the plain rate; a plain sample goes
        back to ACTIVE, a pause to PROBING. A throughput probe is judged first after MIN_SAMPLES verified
        rounds (a probe that earns less than half the bar fails there: drafting that costs many plain
        steps is not paid for a whole block each probe), else after a whole block (`patience`)."""
        if self.tps is not None:
            self.tps.learn_plain(t)
        if self.b_sample:
            self.b_sample = False
            self._batch_block(ACTIVE, self.s.patience)
            return
        self._probe_block()
        self.stats.inc("accept_batch_probes")

    def _probe_block(self) -> None:
        first = max(self.s.probe, MIN_SAMPLES) if self.b_tps else self.s.probe
        self._batch_block(PROBING, first)
        self.b_more = max(self.s.probe, self.s.patience) - first if self.b_tps else 0

    def _judge_batch(self, t: int) -> None:
        """The batch's block is whole: low acceptance pauses it; with the throughput rule, the block's
        rates may too (`_tps_verdict`)."""
        s = self.s
        acc0, ver0 = self.b_from
        accepted = self.effect.accepted_total() - acc0
        low = accepted < s.break_even * (self.effect.drafts - ver0)
        slow = False
        if not low and self.tps is not None:
            verdict = self._tps_verdict(t, accepted)
            if verdict == "more":  # a probe's first look, not conclusive: on to its whole block
                self.b_left, self.b_more = self.b_more, 0
                return
            if verdict == "sample":
                self.b_sample, self.b_tps = True, False
                self._batch_paused(t, t + s.patience, "accept_batch_tps_samples")
                return
            slow = verdict == "slow"
        self.b_more = 0
        if not (low or slow):
            if self.b_state == PROBING:
                self.b_pause = s.pause
                self.stats.inc("accept_batch_tps_resumed" if self.b_tps else "accept_batch_resumed")
                if self.b_tps:
                    self.b_recall[self.b_bucket] = PAYS
            self.b_tps = False
            self._batch_block(ACTIVE, s.patience)
            return
        # what the size remembers: a pause once a probe confirmed the slow blocks (one verdict on a busy
        # machine may be noise, and a remembered pause costs every return to the size); nothing before
        if self.b_state == PROBING:
            self.b_pause = min(self.b_pause * 2, s.pause_max)
            counter = "accept_batch_tps_probe_failed" if slow else "accept_batch_probe_failed"
            if slow:
                self.b_recall[self.b_bucket] = self.b_pause
        else:
            counter = "accept_batch_tps_paused" if slow else "accept_batch_paused"
            if slow:
                self.b_recall[self.b_bucket] = 0
        self.b_tps, self.b_slow = slow, 0
        self._batch_paused(t, t + self.b_pause, counter)

    def _tps_verdict(self, t: int, accepted: int) -> str:
        """The throughput rule on a whole block whose acceptance is fine: "slow" (pause), "sample" (a plain
        sample first), "more" (a probe's first look was not conclusive) or "ok".

        PROBING: slow below plain * (1 + tps_margin), the plain rate being the pause's, just before it.
        ACTIVE: a pause needs a second slow block (drafting below plain) in a row, one noisy block does
        not pause (unless below half the plain rate: drafting that costs that much is not paid a second
        block); and a plain rate measured since the judgement before the last, a machine's load
        drifts: a slow block against an older one samples it again first, as does any block once the
        plain rate is tps_every rounds old (or, none yet, from round tps_every / 4 on)."""
        s, tps = self.s, self.tps
        assert tps is not None
        drafting, plain = tps.learn_drafting(accepted), tps.plain
        if self.b_state == PROBING:
            if drafting is None or plain is None:
                return "more" if self.b_more else "ok"
            bar = plain * (1.0 + s.tps_margin)
            if self.b_more and drafting >= 0.5 * bar:
                return "more"
            return "slow" if drafting < bar else "ok"
        # the first sample once a quarter of tps_every rounds have drafted: a short run (a smoke test, a
        # few requests) drafts throughout, a long one learns where drafting pays within seconds
        stale = t - tps.first_t >= s.tps_every // 4 if plain is None else t - tps.plain_at >= s.tps_every
        fresh = plain is not None and tps.plain_at > self.b_judged[0]
        self.b_judged = (self.b_judged[1], t)
        if drafting is not None and plain is not None:
            self.b_slow = self.b_slow + 1 if drafting < plain else 0
            if fresh and drafting >= plain * (1.0 + s.tps_margin):
                self.b_recall[self.b_bucket] = PAYS
            if fresh and (self.b_slow >= 2 or drafting < 0.5 * plain):
                return "slow"
            stale = stale or (self.b_slow > 0 and not fresh)
        return "sample" if stale else "ok"

    def _seen_size(self, t: int, new: int) -> None:
        """Round t's batch is in another bucket: moved there once it has stayed SWITCH_AFTER rounds (a
        batch that hovers at a boundary next to a size found slow does not pause every few rounds), at
        once the first time."""
        if new != self.b_next:
            self.b_next, self.b_next_n = new, 0
        self.b_next_n += 1
        if self.b_bucket == 0 or self.b_next_n >= SWITCH_AFTER:
            self.b_next_n = 0
            self._switch(t, new)

    def _switch(self, t: int, new: int) -> None:
        """The batch's size moved to another bucket, where what drafting is worth is its own (gate_tps.py).
        Where the throughput rule last paused drafting and a probe confirmed it, the batch pauses again
        at once, for that pause
        (a throughput pause under way goes on), rather than drafting blocks to learn it anew (load that
        moves between few requests and many); where drafting was found to pay, a throughput pause,
        sample or probe under way ends and the batch drafts (the rounds the engine was promised still
        ask no drafts: `b_promised`). Anywhere else, and under a pause for low acceptance, everything
        goes on as it was: the block is not restarted (a batch whose size moves every few rounds would
        never have one judged) and is judged against the plain rate at hand."""
        old, self.b_bucket = self.b_bucket, new
        assert self.tps is not None
        self.tps.switch(old, new)
        self.b_recall_other = any(p > 0 for i, p in enumerate(self.b_recall) if i != new)
        found, state = self.b_recall[new], self.b_state
        if old == 0 or found == 0 or not (state == ACTIVE or self.b_tps or self.b_sample):
            return
        if found > 0:
            if state == PAUSED:  # a throughput pause goes on; a plain sample becomes one
                if self.b_sample:
                    self.b_sample, self.b_tps, self.b_pause = False, True, found
                    self.b_until = max(self.b_until, t + found)
                    self.stats.inc("accept_batch_tps_recalled")
                return
            self.b_slow, self.b_judged, self.b_more = 0, (t, t), 0
            self.b_sample, self.b_tps, self.b_pause = False, True, found
            self._batch_paused(t, t + found, "accept_batch_tps_recalled")
        elif state != ACTIVE:  # PAYS: drafting pays here
            self.b_slow, self.b_judged, self.b_more = 0, (t, t), 0
            self.b_sample, self.b_tps, self.b_pause = False, False, self.s.pause
            self._batch_block(ACTIVE, self.s.patience)

    def _batch_paused(self, t: int, until: int, counter: str) -> None:
        self.b_state, self.b_until = PAUSED, until
        if self.tps is not None:
            self.tps.begin()  # the pause's plain rounds
        self.stats.inc(counter)
