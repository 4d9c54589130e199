"""What drafting earns in the engine's time: tokens per request-second with drafts and without.

Acceptance alone says nothing about cost: on a loaded machine a round that verifies 5 drafts (and waits
for the STEP that drafted them) can take longer than the ~3.4 tokens it earns are worth, and serving is
then slower than not drafting at all. The engine says when each step starts (`GATHERED_NS`, stamped just
before `gathered`): the interval from round t-1's stamp to round t's is the engine's step t, which
includes its wait for round t-1's reply. Round t's descriptor says what that step produced: requests that
verified drafts made accepted + 1 tokens, the others 1. So per round, one interval, classed by whether
round t-1 asked drafts (the step that drafting made longer, verified or come too late) or not; decode rounds only (a step with prefill
chunks is long with drafts or without).

`StepRates` keeps the intervals of the batch gate's current block (gate.py, `AcceptGate`): at most
`CAP` a class, a ring, so a long pause keeps its last ones. A block's rate is tokens per request-round
over the median interval (a busy machine's intervals are noisy and heavy-tailed: a median of a block, not
a mean): with drafts `(1 + accepted / requests) / median`, without `1 / median`. Per request rather than
per batch, so a block at another batch size compares like with like at the small batch sizes where
drafting's cost shows. The gate compares the two (docs/design.md, "Acceptance-aware drafting"). What a
target step costs grows with the tokens it verifies, so drafting can pay at 1 request and not at 8: the
plain rate is kept per batch-size bucket (`bucket`, `switch`). Per
round: one clock read and a few scalars; the medians only when a block is judged. A clock read of -1
says the engine is already rounds ahead (it answers paused rounds itself, without waiting for the
proxy: its stamp may be a later round's), and leaves a gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["StepRates", "MIN_SAMPLES", "bucket", "size_label"]

CAP = 64  # intervals kept a class and block
MIN_SAMPLES = 4  # a block with fewer intervals of a class gives no rate of it


def bucket(n: int) -> int:
    """The batch-size bucket of a round of n requests: 1, 2, 3-4, 5-8, 9-16, ... (0: none)."""
    return (n - 1).bit_length() + 1 if n > 0 else 0


def size_label(b: int) -> str:
    """The batch sizes of bucket b, as status shows them: "1", "2", "3-4", "5-8", ..."""
    hi = 1 << max(b - 1, 0)
    lo = (1 << (b - 2)) + 1 if b >= 2 else 1
    return str(hi) if lo == hi else f"{lo}-{hi}"


class StepRates:
    """The current block's step intervals by class, and the last rates learnt from them.

    `plain` and `drafting`: the last rates learnt (tokens per request-second; None: not yet);
    `plain_at`: the round `plain` was learnt at (its age decides when a plain sample is due)."""

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self.clock = clock or time.monotonic_ns
        # intervals (ns) of drafting rounds, and of rounds that were not: lists, a scalar store
        # into one costs less than into an array, every round
        self._d: list[int] = [0] * CAP
        self._p: list[int] = [0] * CAP
        self.n_d = self.n_p = 0  # intervals of each class in the block (the ring holds the last CAP)
        self.req_d = 0  # requests of the block's drafting rounds (sampled or not)
        self._last_t, self._last_ns = -2, 0
        self.first_t = -1  # the first round seen (the engine numbers rounds, not this incarnation)
        self.plain: float | None = None
        self.drafting: float | None = None
        self.plain_at = 0
        self._plains: dict[int, tuple[float | None, int]] = {}  # bucket -> (plain, plain_at), but the current's

    def round(self, t: int, n: int, drafted: int | bool, decode: bool = True) -> None:
        """Round t (n requests; drafted: round t-1 asked drafts, so step t is drafting's whether they came
        in time or not; decode: no prefill rows), judged now: its interval since round t-1, when t-1 was
        seen too (a skipped round leaves a gap, not a sample) and the step was a decode one (a prefill
        chunk's step is long with drafts or without: it would only add noise; its requests still count
        in `req_d`). A drafting round whose drafts missed the deadline is a drafting interval (the
        engine's wait for them is in it) that earned 1 token a request: counted as plain, it made not
        drafting look as slow as drafting late, and the rule never paused a drafter that missed them all."""
        now = self.clock()
        if drafted:
            self.req_d += n
        if self.first_t < 0:
            self.first_t = t
        if now < 0:  # no stamp of round t's own (the engine is rounds ahead): a gap, not a sample
            self._last_t = -2
            return
        if t == self._last_t + 1 and n and decode:
            dt = now - self._last_ns
            if dt > 0:
                if drafted:
                    self._d[self.n_d % CAP] = dt
                    self.n_d += 1
                else:
                    self._p[self.n_p % CAP] = dt
                    self.n_p += 1
        self._last_t, self._last_ns = t, now

    def begin(self) -> None:
        """A new block: its intervals start afresh."""
        self.n_d = self.n_p = self.req_d = 0

    def switch(self, old: int, new: int) -> None:
        """The batch moved from bucket `old` to `new`: the plain rate becomes the one last learnt there
        (where none was, old's stands in). The block's intervals go on (the gate does not restart it)."""
        if self.plain is not None:
            self._plains[old] = (self.plain, self.plain_at)
        self.plain, self.plain_at = self._plains.get(new, (self.plain, self.plain_at))

    def learn_plain(self, t: int) -> float | None:
        """The block's rate without drafts, when it has enough intervals (then kept as `plain`)."""
        if self.n_p < MIN_SAMPLES:
            return None
        self.plain = 1e9 / float(np.median(self._p[:min(self.n_p, CAP)]))
        self.plain_at = t
        return self.plain

    def learn_drafting(self, accepted: int) -> float | None:
        """The block's rate with drafts (`accepted`: the block's accepted drafts), when it has enough
        intervals (then kept as `drafting`)."""
        if self.n_d < MIN_SAMPLES:
            return None
        self.drafting = (1.0 + accepted / self.req_d) * 1e9 / float(np.median(self._d[:min(self.n_d, CAP)]))
        return self.drafting

    def snapshot(self) -> dict:
        r = self.plain, self.drafting
        return {"tps_plain": None if r[0] is None else round(r[0], 2),
                "tps_drafting": None if r[1] is None else round(r[1], 2)}
