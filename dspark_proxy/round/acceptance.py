"""What the drafts earn, read from the engine's own rounds, and drafting stopped where they earn nothing.

The measure. A decode request's `valid` rows are its accepted drafts + 1 (the bonus token), and its
`k_window` is how many drafts the engine verified; so each round's descriptor says, per request that
verified drafts, how many were accepted: `min(valid - 1, k_window)`. `DraftEffect` counts them under
vLLM's spec_decode names (num_drafts: request-rounds that verified drafts; num_draft_tokens; and
num_accepted_tokens, also per draft position), so `status` and Prometheus read like vLLM's.

The gate (gate.py) reads them and stops drafting where they earn nothing. The per-round sums
(accepted drafts, their histogram, the gate's scatter-adds and the probes that are due) are one C call
on the default path (`_fastround.accept_round`, about 1 µs where the numpy reference took 12 at any n);
every state change stays in the gate, in the reference's order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import native
from ..ops.stats import Stats
from .gate import AcceptGate, GateSettings

__all__ = ["Acceptance", "DraftEffect", "accepted_drafts"]


def accepted_drafts(valid: np.ndarray, k_window: np.ndarray, num_spec: int, ver: np.ndarray | None = None,
                    acc: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(verified mask, accepted drafts per request) of a round: accepted = valid - 1 where drafts were
    verified (k_window > 0), within [0, min(k_window, N)]; 0 elsewhere (k_window 0 caps it there).
    `ver`, `acc`: where to write them (the round's preallocated buffers), else new arrays."""
    ver = np.greater(k_window, 0, out=ver)
    if acc is None:
        acc = np.empty(valid.shape[0], dtype=np.int32)
    np.subtract(valid, 1, out=acc)
    np.minimum(acc, k_window, out=acc)
    np.minimum(acc, num_spec, out=acc)  # an engine that says it verified more than N
    np.maximum(acc, 0, out=acc)  # valid 0
    return ver, acc


class DraftEffect:
    """The spec_decode counters. Each round adds one histogram of accepted drafts per request (all the
    sums are read off it later: a Stats.inc per key a round would cost more than the rest); the totals
    go into the proxy's Stats every `flush_every` rounds and on `flush()`."""

    def __init__(self, stats: Stats, num_spec: int, flush_every: int = 32) -> None:
        self.stats, self.N, self.flush_every = stats, num_spec, flush_every
        self.pos_keys = tuple(f"spec_decode_num_accepted_tokens_per_pos_{j}" for j in range(num_spec))
        self.hist = np.zeros(num_spec + 1, dtype=np.int64)  # request-rounds by drafts accepted (0 also unverified)
        self.drafts = self.tokens = 0  # request-rounds that verified drafts; drafts verified
        self._flushed = np.zeros(num_spec + 1, dtype=np.int64)
        self._flushed_drafts = self._flushed_tokens = 0
        self._rounds = 0

    def observe(self, n_ver: int, acc: np.ndarray, k_window: np.ndarray) -> None:
        """One round: n_ver requests verified drafts, `acc` accepted (0 where none were verified)."""
        if n_ver:
            self.hist += np.bincount(acc, minlength=self.N + 1)
        self.count(n_ver, int(np.add.reduce(k_window)) if n_ver else 0)

    def count(self, n_ver: int, tokens: int) -> None:
        """observe() past the histogram (the C path adds to `hist` itself): n_ver request-rounds that
        verified `tokens` drafts."""
        if n_ver:
            self.drafts += n_ver
            self.tokens += tokens
        self._rounds += 1
        if self._rounds >= self.flush_every:
            self.flush()

    def accepted_total(self) -> int:
        return int(self.hist @ np.arange(self.N + 1))

    def flush(self) -> None:
        self._rounds = 0
        d = self.drafts - self._flushed_drafts
        if not d:
            return
        st = self.stats
        delta = self.hist - self._flushed
        st.inc("spec_decode_num_drafts", d)
        st.inc("spec_decode_num_draft_tokens", self.tokens - self._flushed_tokens)
        st.inc("spec_decode_num_accepted_tokens", int(delta @ np.arange(self.N + 1)))
        at_least = np.cumsum(delta[::-1])[::-1][1:]  # accepted at position j: more than j accepted
        for j in np.flatnonzero(at_least).tolist():
            st.inc(self.pos_keys[j], int(at_least[j]))
        self._flushed[:] = self.hist
        self._flushed_drafts, self._flushed_tokens = self.drafts, self.tokens


class Acceptance:
    """The round's one door to both: `round()` once its ring model has advanced, `mask()` where its
    entries' NEED_DRAFT flags are built, `flush()` when the engine goes.

    `round()` has two paths (native.py chooses, when the Acceptance is built): the reference, numpy
    over the round (accepted_drafts, DraftEffect.observe, AcceptGate.observe), and the C one, which does
    the same sums in one call (`_fastround.accept_round`) between the gate's own `begin` and `end`;
    tests/test_native_diff_accept.py holds them to the same arrays and counters."""

    def __init__(self, max_slots: int, num_spec: int, settings: GateSettings, stats: Stats,
                 native_path: bool | None = None, clock: Callable[[], int] | None = None) -> None:
        self.N = num_spec
        self.effect = DraftEffect(stats, num_spec)
        self.gate = AcceptGate(max_slots, settings, stats, self.effect, clock)
        self.native = native.enabled() if native_path is None else native_path
        self._ver = np.zeros(max_slots, dtype=np.bool_)
        self._acc = np.zeros(max_slots, dtype=np.int32)
        self._ready = np.zeros(max_slots, dtype=np.int64)  # the C path's probes that are due
        self._held = None  # a _fastround.Held of the arrays the C path adds to, made at its first round

    def round(self, t: int, slots: np.ndarray, valid: np.ndarray, k_window: np.ndarray, new_owner: np.ndarray,
              n_new_owner: int, decode: bool = True) -> None:
        """slots: int64; valid, k_window: the engine's int32 arrays of the round; decode: no prefill rows
        in it (only a decode round's step times the throughput rule, gate_tps.py)."""
        if not self.native:
            n = slots.shape[0]
            ver, acc = accepted_drafts(valid, k_window, self.N, self._ver[:n], self._acc[:n])
            n_ver = int(np.count_nonzero(ver))
            self.effect.observe(n_ver, acc, k_window)
            self.gate.observe(t, slots, new_owner, n_new_owner, n_ver, ver, acc, decode)
            return
        g = self.gate
        if g.on:
            g.begin(t, slots, new_owner, n_new_owner)
        n_ver, tokens, n_ready = native.fastround.accept_round(slots, valid, k_window, self.N, self.native_held(), g.on,
                                                               g.n_probing > 0)
        self.summed(t, slots.shape[0], n_ver, tokens, n_ready, decode)

    def native_held(self) -> object:
        """The C sums' Held (hist, the gate's sum, cnt, left, and the due probes): here and in the fused
        call (round/fused.py)."""
        held = self._held
        if held is None:  # the sums' arrays, their buffers taken once (_fastround_held.c)
            g, e = self.gate, self.effect
            held = self._held = native.fastround.Held((e.hist, g.sum, g.cnt, g.left, self._ready))
        return held

    def summed(self, t: int, n: int, n_ver: int, tokens: int, n_ready: int, decode: bool = True) -> None:
        """After the C sums of round t's n requests: the counts, then the gate's end of the round (its
        judgements)."""
        g = self.gate
        self.effect.count(n_ver, tokens)
        if g.on:
            g.end(t, n_ver, self._ready[:n_ready] if n_ready else None, n, decode)

    def sums_may_fuse(self, t: int) -> bool:
        """Whether the C sums may run right after the advance without the gate's begin(): it has nothing
        to do there unless a request has a new owner (the fused call checks that itself) or a pause ends."""
        g = self.gate
        return not (g.on and g.n_paused and t >= g.next_wake)

    def mask(self, slots: np.ndarray, need: np.ndarray) -> int:
        return self.gate.mask(slots, need)

    def flush(self) -> None:
        self.effect.flush()
