"""Rank 0's exact model of the engine's ring: the last W rows of each slot (SPEC §2, steps 2, 4, 5, 8).

The engine keeps, per slot (request-state index), the hidden-state rows of the last W positions it
finalised. The proxy never sees that ring, yet it must know, every round and for every request, which
positions the engine holds — to tell the worker when a window restarts (``NEW_GEN``), to resend a whole
window from the ring (``RESYNC``), and to judge whether a ``PARTIAL_WINDOW`` reply is genuine. So it
replays the engine's writes on position ranges only: an owner, a generation, and an inclusive range
``[lo, hi]`` per slot, plus two flags about the worker's copy (``dirty``, ``announced``).

The rules (the same ones the engine side applies to its rows, engine_shim.ring):

* A slot whose owner (request id) changes starts a new generation: generation += 1 (generations only
  grow), range cleared, dirty, not announced.
* ``valid <= 0`` clears the range and marks the slot dirty.
* A round's rows ``first_pos .. first_pos + valid - 1`` *extend* the range when ``first_pos == hi + 1``
  or the range is empty; the range keeps its last W positions.
* Any other start — a forward jump (a prefill chunk longer than W sends only its last W rows) or a
  rewind (a preempted request recomputed) — *restarts* the range as exactly this round's rows and marks
  the slot dirty, so its entry is ``NEW_GEN`` with this round's rows and no ``RESYNC``.

The anchor (the token sampled this round) sits at ``first_pos + valid``; its own row does not exist yet,
so the window the worker drafts from is the range when it ends right before the anchor.

Every method is vectorised over the round's requests: ``slots`` is an integer array in which each slot
appears at most once per call (``validate_round`` checks that; the methods trust it, since a duplicate
would make the scatters order-dependent). There is no per-request Python loop, and the per-round
temporaries live in scratch arrays allocated once.

Thread ownership: a SlotTable belongs to the one thread that runs rounds (the proxy's round loop, or
the engine thread for the engine side's copy); nothing here locks.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["NO_OWNER", "EntryPlan", "SlotTable"]

NO_OWNER = -1
"""``owner`` of a slot that no request has used yet; request ids are therefore >= 0."""

# columns of the int64 state block: one row per slot, so one gather fetches a request's whole state
_OWNER, _GEN, _LO, _HI = 0, 1, 2, 3
# columns of the bool flag block
_DIRTY, _ANNOUNCED = 0, 1


class EntryPlan(NamedTuple):
    """What step 4 needs per request, column-wise (each an array of length n).

    ``new_gen``: the worker's copy is unknown or new (dirty or never announced), so the entry restarts
    the window. ``resync``: a ``new_gen`` entry whose ring window is not exactly this round's rows, so its
    rows come from a staged ring window, not from the gather. ``first``/``n_rows``: the rows the entry
    carries (the ring window for ``resync``, this round's rows otherwise).
    """

    generation: np.ndarray
    new_gen: np.ndarray
    resync: np.ndarray
    first: np.ndarray
    n_rows: np.ndarray


class SlotTable:
    """Per-slot ring bookkeeping for ``max_slots`` slots of ``window`` (W) rows.

    Fields (public, one array per field, length ``max_slots``; views into two backing blocks so that a
    round gathers a request's state with one fancy index):

    * ``owner`` int64: request id that owns the slot, ``NO_OWNER`` (-1) if none yet.
    * ``generation`` int64: bumped each time the owner changes; never decreases.
    * ``lo``, ``hi`` int64: inclusive range of positions held; empty when ``hi < lo`` (cleared to 0, -1).
    * ``dirty`` bool: the worker's copy of this slot cannot be trusted; resend the whole window.
    * ``announced`` bool: the worker has accepted this generation at least once.

    Callers may read the fields freely; they should change them only through the methods, which keep
    the invariants (``hi - lo + 1 <= W``, generation monotonic).
    """

    def __init__(self, max_slots: int, window: int) -> None:
        if max_slots <= 0:
            raise ValueError(f"max_slots must be > 0, got {max_slots}")
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        self.max_slots = int(max_slots)
        self.window = int(window)
        self._state = np.zeros((self.max_slots, 4), dtype=np.int64)
        self._state[:, _OWNER] = NO_OWNER
        self._state[:, _HI] = -1
        self._flags = np.zeros((self.max_slots, 2), dtype=np.bool_)
        self._flags[:, _DIRTY] = True
        self.owner = self._state[:, _OWNER]
        self.generation = self._state[:, _GEN]
        self.lo = self._state[:, _LO]
        self.hi = self._state[:, _HI]
        self.dirty = self._flags[:, _DIRTY]
        self.announced = self._flags[:, _ANNOUNCED]
        # scratch, sized for the largest possible round (each slot at most once)
        m = self.max_slots
        self._arange = np.arange(m, dtype=np.int64)
        self._mark = np.full(m, -1, dtype=np.int64)
        self._st = np.empty((m, 4), dtype=np.int64)
        self._new_range = np.empty((m, 2), dtype=np.int64)
        self._i0 = np.empty(m, dtype=np.int64)
        self._i1 = np.empty(m, dtype=np.int64)
        self._b0 = np.empty(m, dtype=np.bool_)
        self._b1 = np.empty(m, dtype=np.bool_)
        self._b2 = np.empty(m, dtype=np.bool_)

    # ------------------------------------------------------------------ validation

    def validate_round(self, slots: np.ndarray, req_ids: np.ndarray | None = None) -> str | None:
        """Why this round's slots (and request ids) cannot be applied, or None if they can.

        The methods below scatter per slot, so a slot twice in one round would leave the outcome to the
        order of numpy's writes; a descriptor that says so is malformed and must fail the round instead.
        """
        slots = np.asarray(slots)
        n = slots.shape[0] if slots.ndim == 1 else -1
        if n < 0:
            return f"slots must be 1-D, got shape {slots.shape}"
        if slots.dtype.kind not in "iu":
            return f"slots must be integers, got {slots.dtype}"
        if n > self.max_slots:
            return f"{n} requests > max_slots {self.max_slots}"
        if req_ids is not None:
            req_ids = np.asarray(req_ids)
            if req_ids.shape != (n,):
                return f"req_ids shape {req_ids.shape} != ({n},)"
            if req_ids.dtype.kind not in "iu":
                return f"req_ids must be integers, got {req_ids.dtype}"
            if n and int(req_ids.min()) < 0:
                return f"negative request id {int(req_ids.min())}"
        if n == 0:
            return None
        lo, hi = int(slots.min()), int(slots.max())
        if lo < 0 or hi >= self.max_slots:
            return f"slot out of range [0, {self.max_slots}): min {lo} max {hi}"
        mark, ar = self._mark, self._arange[:n]
        mark[slots] = ar
        dup = mark[slots] != ar
        if dup.any():
            return f"slot {int(slots[int(np.argmax(dup))])} appears more than once"
        return None

    # ------------------------------------------------------------------ step 2: bookkeeping

    def begin_requests(self, slots: np.ndarray, req_ids: np.ndarray) -> np.ndarray:
        """Take ownership of ``slots`` for ``req_ids``; returns the mask of slots that started a new
        generation (their owner changed).

        A new owner means the rows in the ring (and the worker's window) belong to someone else: the range
        is cleared, the slot is dirty and not announced, and the generation grows so that the worker can
        tell a late entry for the old owner from the new one.
        """
        n = len(slots)
        cur = np.take(self.owner, slots, out=self._i0[:n])
        new = np.not_equal(cur, req_ids, out=self._b0[:n])
        if not new.any():
            return new.copy()
        s = slots[new]
        st = self._state
        st[s, _OWNER] = np.asarray(req_ids)[new]
        st[s, _GEN] += 1  # each slot once per round, so += on a fancy index is exact
        st[s, _LO] = 0
        st[s, _HI] = -1
        self._flags[s, _DIRTY] = True
        self._flags[s, _ANNOUNCED] = False
        return new.copy()

    def apply(self, slots: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
        """Replay the round's rows (positions ``first_pos .. first_pos + valid - 1``) on the ranges;
        returns ``anchor_pos = first_pos + valid`` (into ``out`` if given, int64 [n]).

        Runs whatever happens to the round afterwards (open breaker, no connection, a request that did
        not fit the staging): the engine wrote those rows into its ring regardless, and the model must
        stay exact.
        """
        n = len(slots)
        W = self.window
        if out is None:
            out = np.empty(n, dtype=np.int64)
        anchor = np.add(first_pos, valid, out=out)
        st = np.take(self._state, slots, axis=0, out=self._st[:n])
        lo, hi = st[:, _LO], st[:, _HI]
        pos = np.greater(valid, 0, out=self._b0[:n])
        # extend: the range is empty, or this round starts right after it ends
        ext = np.less(hi, lo, out=self._b1[:n])  # empty
        np.logical_or(ext, np.equal(first_pos, hi + 1), out=ext)
        np.logical_and(ext, pos, out=ext)
        nonempty_ext = np.greater_equal(hi, lo, out=self._b2[:n])
        np.logical_and(nonempty_ext, ext, out=nonempty_ext)
        rng = self._new_range[:n]
        new_lo, new_hi = rng[:, 0], rng[:, 1]
        np.subtract(anchor, 1, out=new_hi)
        # an extended non-empty range keeps its lo; everything else starts at this round's first row
        np.copyto(new_lo, first_pos)
        np.copyto(new_lo, lo, where=nonempty_ext)
        # keep the last W positions (a round never sends more than W rows, but clamp anyway)
        np.maximum(new_lo, np.subtract(new_hi, W - 1, out=self._i1[:n]), out=new_lo)
        # valid <= 0: cleared
        np.logical_not(pos, out=self._b2[:n])
        np.copyto(new_lo, 0, where=self._b2[:n])
        np.copyto(new_hi, -1, where=self._b2[:n])
        self._state[slots, _LO:_HI + 1] = rng
        # a restart (forward jump, rewind) or a clear: the worker's window cannot continue
        np.logical_not(ext, out=ext)
        self.dirty[slots[ext]] = True
        return anchor

    def restart(self, slots: np.ndarray) -> None:
        """Clear the slots' ranges and mark them dirty: for a late proxy that cannot trust a round's
        metadata (its metadata slot was already rewritten), so it cannot know what the engine wrote."""
        self._state[slots, _LO] = 0
        self._state[slots, _HI] = -1
        self.dirty[slots] = True

    def mark_dirty(self, slots: np.ndarray) -> None:
        """The worker's copy of these slots is unknown (a failed round, a request with no entry)."""
        self.dirty[slots] = True

    def mark_all_dirty(self) -> None:
        """Every worker copy is unknown (a new connection epoch, a lost claim, an internal error)."""
        self.dirty[:] = True

    # ------------------------------------------------------------------ steps 4, 5, 8: reading the model

    def window(self, slots: np.ndarray, anchor_pos: np.ndarray,
               out: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ring window each request's anchor drafts from: ``(first, n_rows)``, int64 [n] each.

        The window is the held range when it ends right before the anchor (``hi == anchor_pos - 1``),
        else empty; ``first = anchor_pos - n_rows`` in both cases, so ``first .. anchor_pos - 1`` are
        the window's positions and ``n_rows <= W``.
        """
        n = len(slots)
        if out is None:
            out = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
        first, n_rows = out
        st = np.take(self._state, slots, axis=0, out=self._st[:n])
        lo, hi = st[:, _LO], st[:, _HI]
        np.subtract(hi, lo, out=n_rows)
        n_rows += 1
        ends = np.equal(hi, np.subtract(anchor_pos, 1, out=self._i1[:n]), out=self._b0[:n])
        np.logical_not(ends, out=ends)
        np.copyto(n_rows, 0, where=ends)
        np.maximum(n_rows, 0, out=n_rows)  # an empty range (hi < lo) holds nothing, whatever anchor says
        np.subtract(anchor_pos, n_rows, out=first)
        return first, n_rows

    def rows_for_anchor(self, slots: np.ndarray, anchor_pos: np.ndarray) -> np.ndarray:
        """How many rows the ring holds for each anchor (``window``'s n_rows): a ``PARTIAL_WINDOW``
        reply is genuine when the worker has as many, and a resend otherwise."""
        return self.window(slots, anchor_pos)[1]

    def plan(self, slots: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
             anchor_pos: np.ndarray) -> EntryPlan:
        """Step 4, column-wise, after ``apply``: which entries restart the worker's window and which of
        those must carry the ring window instead of this round's rows (see ``EntryPlan``)."""
        first, n_rows = self.window(slots, anchor_pos)
        flags = self._flags[slots]
        new_gen = flags[:, _DIRTY] | ~flags[:, _ANNOUNCED]
        resync = new_gen & (n_rows > 0) & ((first != first_pos) | (n_rows != valid))
        vpos = np.maximum(valid, 0)
        first = np.where(resync, first, anchor_pos - vpos)
        n_rows = np.where(resync, n_rows, vpos)
        return EntryPlan(self.generation[slots], new_gen, resync, first, n_rows)

    def accept(self, slots: np.ndarray, anchor_pos: np.ndarray, usable: np.ndarray,
               partial: np.ndarray, worker_rows: np.ndarray) -> None:
        """Step 8 on the model: a usable reply announces the slot and leaves it clean, except a
        ``PARTIAL_WINDOW`` (``partial``) for which the ring holds more rows than the worker reports
        (``worker_rows``): those rows exist, so the window is resent. Any other status marks it dirty."""
        held = self.rows_for_anchor(slots, anchor_pos)
        usable = np.asarray(usable, dtype=np.bool_)
        short = np.asarray(partial, dtype=np.bool_) & (np.asarray(worker_rows) < held)
        self._flags[slots, _ANNOUNCED] |= usable
        self._flags[slots, _DIRTY] = ~usable | short

    # ------------------------------------------------------------------ introspection

    def snapshot(self, slot: int) -> dict[str, int | bool]:
        """One slot's state as plain Python values (logs, status, tests)."""
        s = int(slot)
        return {"slot": s, "owner": int(self.owner[s]), "generation": int(self.generation[s]),
                "lo": int(self.lo[s]), "hi": int(self.hi[s]),
                "n_rows": max(0, int(self.hi[s]) - int(self.lo[s]) + 1),
                "dirty": bool(self.dirty[s]), "announced": bool(self.announced[s])}
