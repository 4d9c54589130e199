"""The hand-off words of one segment, named the way the round reads them.

Thin wrappers over `_hostflag` (the C extension does every atomic, wait and copy with the GIL
released); what lives here is policy: offsets, the adaptive spin, and which side calls what.
shm_layout.md has the rules each call follows.

Proxy side:  wait_gathered, taken, reply_consumed, publish, fail_all, values
Engine side: raise_gathered, wait_or_fail, wait_published, read_page, consume, fail
"""

from __future__ import annotations

import os

import numpy as np

from . import _hostflag
from .layout import Word
from .segment import Segment

__all__ = ["FAR_AHEAD", "HostFlags", "AdaptiveSpin", "spin_useful", "OutOfOrder", "WAIT_PUBLISHED", "WAIT_FAILED_BY_ME",
           "WAIT_CLAIMED_UNPUBLISHED", "WAIT_OUT_OF_ORDER", "PAGE_OK", "PAGE_NOT_THIS_ROUND",
           "PAGE_NOT_PUBLISHED", "monotonic_ns", "gil_wait_ns", "load", "load_after", "store", "store_release", "cas",
           "wait_ge"]

FAR_AHEAD = 1 << 40  # fail_all(rounds + FAR_AHEAD): every round the engine can still run is target-only

# wait_or_fail outcomes (see _hostflag.c)
WAIT_PUBLISHED = 1
WAIT_FAILED_BY_ME = 2
WAIT_CLAIMED_UNPUBLISHED = 3
WAIT_OUT_OF_ORDER = 4
# read_page outcomes
PAGE_OK = 1
PAGE_NOT_THIS_ROUND = 0
PAGE_NOT_PUBLISHED = -1

# The bare word operations, for the few callers outside this package that use a word of their own
# (the attach claim, the proxy's stop word, the deadline's clock, the hand-off benches): each is the
# C call itself (no wrapper to pay for), with the memory order shm_layout.md §2 gives it.
monotonic_ns = _hostflag.monotonic_ns  # CLOCK_MONOTONIC in ns, the clock of every *_NS word
load = _hostflag.load  # (mm, off) -> int: acquire load of a word
load_after = _hostflag.load_after  # (mm, off) -> int: an acquire fence, then the load (after a copy)
store = _hostflag.store  # (mm, off, v): release store (then a seq_cst fence), wakes futex waiters
store_release = _hostflag.store_release  # (mm, off, v): a release store and nothing else (no fence, no wake)
cas = _hostflag.cas  # (mm, off, expected, new) -> bool: seq_cst compare-and-swap
wait_ge = _hostflag.wait_ge  # (mm, off, target, timeout_s, spin_ns) -> bool: futex wait until >= target
gil_wait_ns = _hostflag.gil_wait_ns  # () -> int: this thread's last wait_or_fail's GIL reacquire (0: kept)


class OutOfOrder(RuntimeError):
    """A claim for round t while round t-1 is still unclaimed: the hand-off's ordering is broken."""


def _cpus(pid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (AttributeError, OSError):  # non-Linux, or the peer is gone
        return None


def spin_useful(peer_pid: int | None = None) -> bool:
    """Whether spinning can pay: not when this process and its peer can only share one core (the
    spin would hold the very core the answer must come from). Each pinned to its own core is the
    best case for spinning, so with the peer known the decision looks at both CPU sets; without it,
    at ours alone (pinned to one core: assume the peer may be there too)."""
    mine = _cpus(0)
    if mine is None:
        return (os.cpu_count() or 1) > 1
    theirs = _cpus(peer_pid) if peer_pid else None
    if theirs is None:
        return len(mine) > 1
    return len(mine | theirs) > 1


class AdaptiveSpin:
    """How long to spin before sleeping in the futex, learned from recent waits.

    Spinning answers in ~0.1 µs when the other side replies quickly and has its own core; sleeping
    costs tens of µs to wake. But a spin that never succeeds only burns a core (and on one shared
    core it delays the very process we wait for). So: grow the spin towards twice the waits that
    were satisfied quickly, halve it after each wait that had to sleep, never above `max_ns`, and
    not at all when this process and its peer can only share one core (`spin_useful`). A wait's
    length is best measured to when the answer came, where the caller knows it (`wait_gathered`,
    `wait_or_fail`): a wait that slept otherwise counts its own wake-up too.
    """

    def __init__(self, max_ns: int = 100_000, min_ns: int = 0, peer_pid: int | None = None) -> None:
        self.cap_ns, self.floor_ns, self.peer_pid = max_ns, min_ns, peer_pid  # what `relook` decides from
        mx = max_ns if spin_useful(peer_pid) else 0
        # [spin_ns, max_ns, min_ns]: the rounds' waits (wait_gathered, wait_or_fail) pass it to their C
        # call, which learns in place by the rule `update` spells out (_hostflag.c spin_learn)
        self.state = np.array([mx, mx, min(min_ns, mx)], dtype=np.int64)

    def relook(self) -> bool:
        """Decide again whether spinning can pay (`spin_useful`): a thread either side re-pinned after
        the decision at construction would otherwise keep it for good (a spin lost, or a spin on the
        one core the answer must come from). True when it changed: the spin starts afresh from the
        new bound, as a new one would. Only the thread that waits with this spin may call it (the C
        waits learn in `state` without a lock)."""
        mx = self.cap_ns if spin_useful(self.peer_pid) else 0
        if mx == int(self.state[1]):
            return False
        self.state[:] = (mx, mx, min(self.floor_ns, mx))
        return True

    spin_ns = property(lambda self: int(self.state[0]), lambda self, v: self.state.__setitem__(0, v))
    max_ns = property(lambda self: int(self.state[1]), lambda self, v: self.state.__setitem__(1, v))
    min_ns = property(lambda self: int(self.state[2]), lambda self, v: self.state.__setitem__(2, v))

    def update(self, waited_ns: int, ok: bool) -> None:
        """The rule, for the waits that learn in Python (`_wait_ge`), and the C rule's reference."""
        if ok and waited_ns < self.max_ns:
            self.spin_ns = min(self.max_ns, max(self.spin_ns, 2 * waited_ns, 2_000))
        else:
            self.spin_ns = max(self.min_ns, self.spin_ns // 2)


class HostFlags:
    """The four round words of a segment plus the reply page. One instance per side per thread."""

    def __init__(self, seg: Segment, spin: AdaptiveSpin | None = None, peer_pid: int | None = None) -> None:
        self.seg = seg
        self.mm = seg.mm
        lay = seg.layout
        self.words_off = lay.words
        self.page_off = lay.page
        self.zero_bytes = lay.reply.fail_zero_bytes
        self.page_bytes = lay.reply.nbytes
        self._rows = lay.reply.rows_spec
        self._off = [lay.word_off(i) for i in range(Word.COUNT)]
        self.spin = spin or AdaptiveSpin(peer_pid=peer_pid)

    # ------------------------------------------------------------------ common

    def load(self, word: int) -> int:
        return _hostflag.load(self.mm, self._off[word])

    def values(self) -> dict[str, int]:
        """The round words, for logs and error messages."""
        m, o = self.mm, self._off
        return {"gathered": _hostflag.load(m, o[Word.GATHERED]), "claimed": _hostflag.load(m, o[Word.CLAIMED]),
                "published": _hostflag.load(m, o[Word.PUBLISHED]),
                "consumed": _hostflag.load(m, o[Word.CONSUMED])}

    def _wait_ge(self, word: int, target: int, timeout_s: float) -> bool:
        t0 = _hostflag.monotonic_ns()
        ok = _hostflag.wait_ge(self.mm, self._off[word], target, timeout_s, self.spin.spin_ns)
        self.spin.update(_hostflag.monotonic_ns() - t0, ok)
        return ok

    # ------------------------------------------------------------------ proxy side

    def wait_gathered(self, t: int, timeout_s: float) -> bool:
        """True once the engine finished round t's gather (acquire: its staging is visible). The spin
        learns from when the round came (`gathered_ns`, stamped by the engine just before `gathered`),
        not from when this wait returned: after a sleep that includes the wake, tens of µs in a VM, which
        would keep the spin at zero for an engine whose rounds come back to back (AdaptiveSpin)."""
        return _hostflag.wait_ge(self.mm, self._off[Word.GATHERED], t, timeout_s, 0, self.spin.state,
                                 self._off[Word.GATHERED_NS])

    def taken(self, t: int) -> bool:
        """Round t already claimed (by the watchdog, a fail_all, or us)."""
        return _hostflag.load(self.mm, self._off[Word.CLAIMED]) >= t

    def reply_consumed(self, t: int) -> bool:
        return _hostflag.load(self.mm, self._off[Word.CONSUMED]) >= t

    def promise_paused(self, t: int) -> None:
        """Every round up to t will get no drafts (the gate paused the batch through it): the engine may
        answer them itself, without waiting (shm_layout.md §3, "Paused rounds"). Only ever raised."""
        _hostflag.raise_to(self.mm, self._off[Word.PAUSED_THROUGH], t)

    def overtaken(self, t: int) -> bool:
        """After reading round t's rows: did the engine begin a later enqueue meanwhile? (acquire fence,
        then the load: pairs with `begin_enqueue`'s release fence, so rows read torn are seen here.)"""
        return _hostflag.load_after(self.mm, self._off[Word.ENQUEUING]) > t

    def publish(self, t: int, page: np.ndarray, rows: bool = False) -> bool:
        """Claim t, copy `page` (int32, the page's size) into the reply page, release published = t:
        one GIL-free C call. False when someone claimed t first (the reply is discarded). `rows`: copy
        only what the page's own round covers, its header and the first page[1] requests of each block
        (ReplyPageLayout.rows_spec): all that read_page(t, dst, n) reads. The round publishes so."""
        if rows:
            r = _hostflag.publish(self.mm, self.words_off, self.page_off, t, page, self._rows)
        else:
            r = _hostflag.publish(self.mm, self.words_off, self.page_off, t, page)
        if r < 0:
            raise OutOfOrder(f"publish({t}) while round {t - 1} is unclaimed (words {self.values()})")
        return r == 1

    def fail_all(self, T: int) -> bool:
        """Every round up to T becomes target-only at once (monotonic far-ahead release)."""
        return _hostflag.fail_all(self.mm, self.words_off, self.page_off, self.zero_bytes, T)

    # ------------------------------------------------------------------ engine side

    def begin_enqueue(self, t: int) -> None:
        """Round t's enqueue begins: said before any of its rows is written (store, then a release fence;
        the proxy's `overtaken` pairs with it)."""
        _hostflag.begin_write(self.mm, self._off[Word.ENQUEUING], t)

    def paused_through(self) -> int:
        """The last round the proxy promised no drafts (`promise_paused`)."""
        return _hostflag.load(self.mm, self._off[Word.PAUSED_THROUGH])

    def raise_gathered(self, t: int, n: int = 0) -> int:
        """Round t's staging, metadata and descriptor are complete (release; wakes the proxy). Its
        start time and request count go first: the watchdog reads them after `gathered` (acquire).
        Returns that start time (GATHERED_NS), which round t's deadline counts from."""
        return _hostflag.raise_gathered(self.mm, self.words_off, self._off[Word.GATHERED_NS],
                                        self._off[Word.ROUND_N], t, n)

    def watcher(self, after_t: int, delta_ns: int, cpus: set[int] | None = None) -> _hostflag.Watcher:
        """A started C thread that fails every round gathered after `after_t` not published by
        GATHERED_NS + delta_ns, without ever taking the GIL (see _hostflag.c, "the watcher thread"),
        on `cpus` (None: the caller's), set without moving the caller."""
        w = _hostflag.Watcher(self.mm, self.words_off, self.page_off, self.zero_bytes, self._off[Word.GATHERED_NS],
                              self._off[Word.ROUND_N], after_t, delta_ns)
        w.start(sorted(cpus) if cpus else None)
        return w

    def fail(self, t: int, n: int) -> int:
        """The watchdog's claim of round t with a failed reply: 1 won, 0 lost, -1 out of order."""
        return _hostflag.fail_round(self.mm, self.words_off, self.page_off, self.zero_bytes, t, n)

    def wait_or_fail(self, t: int, n: int, deadline_ns: int) -> int:
        """Wait for round t's publish until deadline_ns; at the deadline claim and fail it (in C, so
        the claim is on time whatever holds the GIL). Returns a WAIT_* outcome."""
        return _hostflag.wait_or_fail(self.mm, self.words_off, self.page_off, self.zero_bytes, t, n, deadline_ns, 0,
                                      self.spin.state)  # (learns from the proxy's publish's stamp)

    def wait_published(self, t: int, timeout_s: float) -> bool:
        return self._wait_ge(Word.PUBLISHED, t, timeout_s)

    def read_page(self, t: int, dst: np.ndarray, n: int | None = None) -> int:
        """Copy the page into dst under the seqlock rule: PAGE_OK only if claimed == t before and after.
        `n`: round t's request count; only the header and each block's first n are copied (publish's
        `rows`), and the caller checks the page's own n against it."""
        if n is None:
            return _hostflag.read_page(self.mm, self.words_off, self.page_off, t, dst)
        return _hostflag.read_page(self.mm, self.words_off, self.page_off, t, dst, self._rows, n)

    def consume(self, t: int) -> None:
        """The engine is done with round t's page (release; the proxy may write round t+1's)."""
        _hostflag.raise_to(self.mm, self._off[Word.CONSUMED], t)

    def rebase(self, t0: int) -> None:
        """The attach handshake: words = t0 - 1 so the first round is t0 (never moves a word back)."""
        for w in (Word.GATHERED, Word.CLAIMED, Word.PUBLISHED, Word.CONSUMED):
            _hostflag.raise_to(self.mm, self._off[w], t0 - 1)
