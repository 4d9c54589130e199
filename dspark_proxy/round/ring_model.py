"""Rank 0's exact model of the engine's ring: the last W rows of each slot (round/core.py: steps 2, 4, 5, 8).

The engine keeps, per slot (request-state index), the hidden-state rows of the last W positions it
finalised. The proxy never sees that ring, yet it must know, every round and for every request, which
positions the engine holds — to tell the worker when a window restarts (``NEW_GEN``), to resend a whole
window from the ring (``RESYNC``), and to judge whether a ``PARTIAL_WINDOW`` reply is genuine. So it
replays the engine's writes on position ranges only: an owner, a generation, and an inclusive range
``[lo, hi]`` per slot, plus two flags about the worker's copy (``dirty``, ``announced``).

The rules (the same ones the engine side applies to its rows, engine_shim.row_ring):

* A slot whose owner (request id) changes starts a new generation: generation += 1 (generations only
  grow), range cleared, dirty, not announced.
* ``valid <= 0`` clears the range and marks the slot dirty.
* A round's rows ``first_pos .. first_pos + valid - 1`` *extend* the range when ``first_pos == hi + 1``
  or the range is empty; the range keeps its last W positions.
* Any other start — a forward jump (a prefill chunk longer than W sends only its last W rows) or a
  rewind (a preempted request recomputed) — *restarts* the range as exactly this round's rows and marks
  the slot dirty, so its entry is ``NEW_GEN`` with this round's rows and no ``RESYNC``.
* A slot the proxy cannot know (a fresh proxy table may meet a full engine ring; ``restart`` after
  rounds it could not read) is *unknown*: its range is the rows seen since, a suffix of the engine's,
  and the proxy asks for its window. It is known again by ``adopt`` (the engine's staged window ends at
  this round's last row and covers the range: the engine's ring is the source of truth), or when the
  range holds W rows or starts at position 0, is cleared, or really changes owner (the engine cannot
  hold more). ``n_unknown`` counts unknown slots in use (``restart`` also drops the owner), so the hot
  path pays for none it does not meet.

The anchor (the token sampled this round) sits at ``first_pos + valid``; its own row does not exist yet,
so the window the worker drafts from is the range when it ends right before the anchor.

Every method is vectorised over the round's requests: ``slots`` is an integer array in which each slot
appears at most once per call (``validate_round`` checks that; the methods trust it, since a duplicate
would make the scatters order-dependent). There is no per-request Python loop. At these sizes (n up
to a few hundred) the cost is numpy's per-call overhead (0.3-1 us a call), not the data, so the code
minimises the number of numpy calls: fields are separate 1-D arrays (a 1-D gather is several times
cheaper than a 2-D one), temporaries are plain expressions (``np.take(..., out=)`` measured slower than
a fresh gather), rare cases (clears, restarts, new owners, resyncs) sit behind one ``np.count_nonzero``
test, and an empty range is always stored as ``(0, -1)`` so that ``hi - lo + 1`` needs no clamp and an
empty range "continues" at position 0 like any other (so extending needs no emptiness test).
``advance`` is the proxy's steps 2 and 4 in one pass: it reuses what ``apply`` just computed instead of
gathering the ranges again for ``plan``. Measured on a continuing decode batch at W = 128 (hot loop,
shared 2-core machine): begin_requests + apply + plan 16 us at n = 256, 28 us at n = 1024;
advance 11 us and 18 us.

Thread ownership: a SlotTable belongs to the one thread that runs rounds (the proxy's round loop, or
the engine thread for the engine side's copy); nothing here locks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _fastround as fastround

__all__ = ["NO_OWNER", "EntryPlan", "Advance", "SlotTable"]

NO_OWNER = -1
"""``owner`` of a slot that no request has used yet; request ids are therefore >= 0."""

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


class Advance(NamedTuple):
    """``SlotTable.advance``'s result: steps 2 and 4 for the round's own requests (arrays of length n).

    ``anchor_pos``: ``first_pos + valid``. ``new_owner`` / ``n_new_owner``: the slots whose owner changed
    (``begin_requests``). ``new_gen``, ``resync`` / ``n_resync``: as in ``EntryPlan``. ``held_first``,
    ``held_rows``: the ring window each anchor drafts from (``window(slots, anchor_pos)``, which is also
    what ``rows_for_anchor`` gives ``accept`` as long as the ranges do not change in between).
    ``n_unknown``: how many of the round's slots have a range the proxy does not know (``unknown``).
    """

    anchor_pos: np.ndarray
    new_owner: np.ndarray
    n_new_owner: int
    new_gen: np.ndarray
    resync: np.ndarray
    n_resync: int
    held_first: np.ndarray
    held_rows: np.ndarray
    n_unknown: int = 0


class _Count:
    """An attribute of SlotTable kept in its `counts` array, where the C advance reads and writes it."""

    def __init__(self, i: int, kind: type) -> None:
        self.i, self.kind = i, kind

    def __get__(self, table: SlotTable, owner: type | None = None) -> Any:
        return self.kind(table.counts[self.i])

    def __set__(self, table: SlotTable, v: int) -> None:
        table.counts[self.i] = v


class SlotTable:
    """Per-slot ring bookkeeping for ``max_slots`` slots of ``window`` (``W``) rows.

    Fields (public numpy arrays, one per field, length ``max_slots``):

    * ``owner`` int64: request id that owns the slot, ``NO_OWNER`` (-1) if none yet.
    * ``generation`` int64: bumped each time the owner changes; never decreases.
    * ``lo``, ``hi`` int64: inclusive range of positions held. An empty range is always stored as
      ``(0, -1)``, so ``hi - lo + 1`` is the number of rows held in every case.
    * ``dirty`` bool: the worker's copy of this slot cannot be trusted; resend the whole window.
    * ``announced`` bool: the worker has accepted this generation at least once.
    * ``unknown`` bool: the engine may hold more of this slot than the range says (see the module's
      rules); ``n_unknown`` counts the unknown slots that have an owner (in use).

    Callers may read the fields freely and should change them only through the methods, which keep the
    invariants (``0 <= hi - lo + 1 <= W``, empty = ``(0, -1)``, generation monotonic).

    Array arguments are numpy arrays of length n (the round's requests). Pass ``slots`` as int64 (intp):
    numpy indexes with any integer dtype, but casts the index first, which costs more than the rest.
    Positions and counts are int64 too. Every method assumes each slot at most once (validate_round).
    """

    n_unknown = _Count(0, int)  # unknown slots with an owner; the hot path tests this count only
    _any_unknown = _Count(1, bool)  # some slot's range may be unknown (the unknown bookkeeping runs only then)

    def __init__(self, max_slots: int, window: int, *, known: bool = False, native: bool = False) -> None:
        if max_slots <= 0:
            raise ValueError(f"max_slots must be > 0, got {max_slots}")
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        self.max_slots = int(max_slots)
        self.W = int(window)
        m = self.max_slots
        self.owner = np.full(m, NO_OWNER, dtype=np.int64)
        self.generation = np.zeros(m, dtype=np.int64)
        self.lo = np.zeros(m, dtype=np.int64)
        self.hi = np.full(m, -1, dtype=np.int64)
        self.dirty = np.ones(m, dtype=np.bool_)
        self.announced = np.zeros(m, dtype=np.bool_)
        # the proxy's table starts unknown (it may meet an engine whose ring is full); the engine side's
        # copy, which is the ring, passes known=True
        self.unknown = np.full(m, not known, dtype=np.bool_)
        # n_unknown and _any_unknown (_Count attributes) live in here, where the C advance reads and
        # writes them: nothing to copy across its call (a hot caller tests counts[0] without the lookup)
        self.counts = np.zeros(2, dtype=np.int64)
        self.n_unknown = 0
        self._any_unknown = not known
        # scratch for validate_round, sized for the largest possible round (each slot at most once)
        self._arange = np.arange(m, dtype=np.int64)
        self._mark = np.full(m, -1, dtype=np.int64)
        self.check_scratch = self._mark  # check_slots' scratch, for a C reader that does the same checks
        # `advance` in one C call (_fastround.advance, dspark_proxy/native.py); the methods here are its
        # reference. Its results are views of scratch made once, valid until the next advance.
        self.native = native
        self._adv_scratch = tuple(np.zeros(m, dt) for dt in (np.int64, np.bool_, np.bool_, np.bool_, np.int64,
                                                               np.int64))
        self._adv_views: dict[int, tuple[np.ndarray, ...]] = {}
        self._usual_plans: dict[int, Advance] = {}  # native_plan_of's, by n
        self._held = None  # a _fastround.Held of the tables, the counts and the scratch: made at the first advance

    # ------------------------------------------------------------------ validation

    def validate_round(self, slots: np.ndarray, req_ids: np.ndarray | None = None) -> str | None:
        """Why this round's slots (and request ids) cannot be applied, or None if they can.

        The methods below scatter per slot, so a slot twice in one round would leave the outcome to the
        order of numpy's writes; a descriptor that says so is malformed and must fail the round instead.
        """
        if not isinstance(slots, np.ndarray) or slots.ndim != 1:
            return f"slots must be a 1-D array, got {type(slots).__name__} {np.shape(slots)}"
        if slots.dtype.kind not in "iu":
            return f"slots must be integers, got {slots.dtype}"
        n = slots.shape[0]
        if n > self.max_slots:
            return f"{n} requests > max_slots {self.max_slots}"
        if req_ids is not None:
            if not isinstance(req_ids, np.ndarray) or req_ids.shape != (n,):
                return f"req_ids must be an array of shape ({n},), got {np.shape(req_ids)}"
            if req_ids.dtype.kind not in "iu":
                return f"req_ids must be integers, got {req_ids.dtype}"
            if n and np.count_nonzero(req_ids < 0):
                return f"negative request id {int(req_ids.min())}"
        return self.check_slots(slots.astype(np.int64, copy=False))

    def check_slots(self, slots: np.ndarray) -> str | None:
        """``validate_round``'s range and uniqueness checks alone, for a caller that already holds the
        slots as a 1-D int64 array of at most ``max_slots`` (the proxy, every round): six numpy calls."""
        n = slots.shape[0]
        if n == 0:
            return None
        # one comparison catches both ends: a negative int64 viewed as uint64 is huge
        if np.count_nonzero(slots.view(np.uint64) >= self.max_slots):
            return f"slot out of range [0, {self.max_slots}): min {int(slots.min())} max {int(slots.max())}"
        mark, ar = self._mark, self._arange[:n]
        mark[slots] = ar
        dup = mark[slots] != ar
        if np.count_nonzero(dup):
            return f"slot {int(slots[int(np.argmax(dup))])} appears more than once"
        return None

    # ------------------------------------------------------------------ step 2: bookkeeping

    def begin_requests(self, slots: np.ndarray, req_ids: np.ndarray) -> np.ndarray:
        """Take ownership of ``slots`` for ``req_ids``; returns the mask (bool [n]) of the slots that
        started a new generation because their owner changed.

        A new owner means the rows in the ring (and the worker's window) belong to someone else: the range
        is cleared, the slot is dirty and not announced, and the generation grows so that the worker can
        tell an entry for the new owner from a late one for the old.
        """
        return self._begin(slots, req_ids)[0]

    def _begin(self, slots: np.ndarray, req_ids: np.ndarray) -> tuple[np.ndarray, int]:
        new = self.owner[slots] != req_ids
        n_new = int(np.count_nonzero(new))
        if n_new:
            s = slots[new]
            if self._any_unknown:
                self._activate(s)
            self.owner[s] = req_ids[new]
            self.generation[s] += 1  # each slot once per round, so += on a fancy index is exact
            self.lo[s] = 0
            self.hi[s] = -1
            self.dirty[s] = True
            self.announced[s] = False
        return new, n_new

    def _activate(self, s: np.ndarray) -> None:
        """Before slots ``s`` take new owners: an unknown slot without owner (fresh, or restarted) comes
        into use still unknown; an unknown slot whose owner really changes is known again (the engine saw
        the same change, every round between having been applied, and cleared its range too)."""
        was = self.unknown[s]
        if np.count_nonzero(was):
            dormant = self.owner[s] == NO_OWNER
            changed = was > dormant
            n_changed = int(np.count_nonzero(changed))
            if n_changed:
                self.unknown[s[changed]] = False
            self.n_unknown += int(np.count_nonzero(was & dormant)) - n_changed

    def apply(self, slots: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
        """Replay the round's rows (positions ``first_pos .. first_pos + valid - 1``) on the ranges;
        returns ``anchor_pos = first_pos + valid`` (written into ``out`` if given, int64 [n]).

        Run it for every round the engine ran, whatever happens to the round afterwards (open breaker,
        no connection, a request that did not fit the staging): the engine wrote those rows into its
        ring regardless, and the model must stay exact.
        """
        return self._apply(slots, first_pos, valid, out)[0]

    def _apply(self, slots: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
               out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
        """``apply``, also returning the new ``lo`` of each request's slot, the cleared mask (None
        when no request cleared its slot) and how many of the slots are still unknown, for ``advance``."""
        anchor = first_pos + valid if out is None else np.add(first_pos, valid, out=out)
        lo = self.lo[slots]
        hi = self.hi[slots]
        new_hi = anchor - 1
        # a round extends the held range when it starts right after it; an empty range is (0, -1), so it
        # "extends" at 0 too, and keeping its lo of 0 is then the same as starting at first_pos
        keep = hi + 1 == first_pos
        if np.count_nonzero(keep) == keep.shape[0]:  # the common case: every request continues
            new_lo = lo
            restarted = None
        else:
            # a restart (forward jump, rewind), or an empty range, starts at this round's rows
            restarted = (hi >= lo) > keep  # held something, and this round does not continue it
            new_lo = np.where(keep, lo, first_pos)
        # keep the last W positions (a round never sends more than W rows, but clamp anyway)
        np.maximum(new_lo, new_hi - (self.W - 1), out=new_lo)
        cleared = valid <= 0
        if np.count_nonzero(cleared):
            new_lo[cleared] = 0
            new_hi[cleared] = -1
            restarted = cleared if restarted is None else restarted | cleared
        else:
            cleared = None
        self.lo[slots] = new_lo
        self.hi[slots] = new_hi
        # the worker's window cannot continue across a restart (forward jump, rewind) or a clear
        if restarted is not None and np.count_nonzero(restarted):
            self.dirty[slots[restarted]] = True
        n_unknown = 0
        if self.n_unknown:
            unk = self.unknown[slots]
            n_unknown = int(np.count_nonzero(unk))
            if n_unknown:
                # exact again: W rows (the engine holds no more), or from position 0 (a clear is (0, -1))
                known = unk & ((new_lo == 0) | (new_hi - new_lo >= self.W - 1))
                n_known = int(np.count_nonzero(known))
                if n_known:
                    self.unknown[slots[known]] = False
                    self.n_unknown -= n_known
                    n_unknown -= n_known
        return anchor, new_lo, cleared, n_unknown

    def restart(self, slots: np.ndarray) -> None:
        """Forget the slots: for a proxy that cannot read a round's metadata (a bad descriptor, or a late
        round whose metadata slot was already rewritten), so it cannot know what the engine wrote. The
        ranges are cleared and *unknown*, not empty: the slots are dirty and lose their owner, so their
        next round starts a new generation, and the proxy asks for their windows (``adopt``)."""
        self.owner[slots] = NO_OWNER
        self.lo[slots] = 0
        self.hi[slots] = -1
        self.dirty[slots] = True
        self.unknown[slots] = True
        self._any_unknown = True
        self.n_unknown = int(np.count_nonzero(self.unknown & (self.owner != NO_OWNER)))

    def adopt(self, slots: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The engine's ring holds ``[lo, hi]`` of these slots (windows it staged after writing this
        round's rows): where a slot is unknown and the window ends at the model's last row and covers
        the model's range, take its last W positions as the range; the slot is known again, and dirty
        if the range grew (the worker lacks the added rows). Returns the mask of slots adopted."""
        ok = (self.unknown[slots] & (self.owner[slots] != NO_OWNER) & (hi == self.hi[slots])
              & (lo <= self.lo[slots]) & (lo <= hi))
        s = slots[ok]
        if s.shape[0]:
            new_lo = np.maximum(lo[ok], hi[ok] - (self.W - 1))
            grew = new_lo < self.lo[s]
            self.lo[s] = new_lo
            self.unknown[s] = False
            self.n_unknown -= int(s.shape[0])
            self.dirty[s[grew]] = True
        return ok

    def mark_dirty(self, slots: np.ndarray) -> None:
        """The worker's copy of these slots is unknown (a failed round, a request with no entry)."""
        self.dirty[slots] = True

    def mark_all_dirty(self) -> None:
        """Every worker copy is unknown (a new connection epoch, a lost claim, an internal error)."""
        self.dirty[:] = True

    # ------------------------------------------------------------------ steps 4, 5, 8: reading the model

    def window(self, slots: np.ndarray, anchor_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ring window each request's anchor drafts from: ``(first, n_rows)``, int64 [n] each.

        The window is the held range when it ends right before the anchor (``hi == anchor_pos - 1``),
        else empty; ``first = anchor_pos - n_rows`` in both cases, so ``first .. anchor_pos - 1`` are
        the window's positions, and ``0 <= n_rows <= W``.
        """
        hi1 = self.hi[slots] + 1
        n_rows = hi1 - self.lo[slots]  # 0 for an empty range, which is stored as (0, -1)
        np.copyto(n_rows, 0, where=hi1 != anchor_pos)
        return anchor_pos - n_rows, n_rows

    def rows_for_anchor(self, slots: np.ndarray, anchor_pos: np.ndarray) -> np.ndarray:
        """How many rows the ring holds for each anchor (``window``'s n_rows): a ``PARTIAL_WINDOW``
        reply is genuine when the worker has as many, and calls for a resend otherwise."""
        hi1 = self.hi[slots] + 1
        n_rows = hi1 - self.lo[slots]
        np.copyto(n_rows, 0, where=hi1 != anchor_pos)
        return n_rows

    def plan(self, slots: np.ndarray, first_pos: np.ndarray, valid: np.ndarray,
             anchor_pos: np.ndarray) -> EntryPlan:
        """Step 4, column-wise, after ``apply``: which entries restart the worker's window, and which of
        those must carry the ring window instead of this round's rows (see ``EntryPlan``).

        Whether a resync window was actually staged this round is the caller's business (step 5): an
        unstaged one is sent with this round's rows (``first_pos``, ``valid``) and stays dirty.
        """
        first, n_rows = self.window(slots, anchor_pos)
        new_gen = self.dirty[slots] >= self.announced[slots]  # dirty or not announced, in one op on bools
        # the window ends at the anchor like this round's rows, so it differs from them exactly when it
        # starts elsewhere (an empty window is no resync: there is nothing in the ring to resend)
        resync = (first != first_pos) & (n_rows > 0) & new_gen
        if np.count_nonzero(resync):
            first = np.where(resync, first, first_pos)
            n_rows = np.where(resync, n_rows, np.maximum(valid, 0))
        else:
            first = first_pos.astype(np.int64)  # a copy: the plan must not alias the caller's input
            n_rows = np.maximum(valid, 0)
        return EntryPlan(self.generation[slots], new_gen, resync, first, n_rows)

    def advance(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray,
                valid: np.ndarray) -> Advance:
        """``begin_requests``, then ``apply``, then ``window`` and ``plan``'s flags at the round's own
        anchors, in one pass (see ``Advance``): the proxy's steps 2 and 4.

        Requires ``0 <= valid <= W`` (the proxy has checked it while reading the descriptor). Then,
        after ``apply``, each request's range ends right before its anchor (or is empty after a clear),
        so the window is the range just written and needs no second gather; and the window holds at
        least this round's rows, so it "starts elsewhere" (``plan``'s resync test) exactly when it
        holds more.
        """
        if self.native:
            return self._advance_native(slots, req_ids, first_pos, valid)
        new_owner, n_new_owner = self._begin(slots, req_ids)
        anchor, held_first, cleared, n_unknown = self._apply(slots, first_pos, valid, None)
        held_rows = anchor - held_first
        if cleared is not None:
            held_rows[cleared] = 0
            held_first = np.where(cleared, anchor, held_first)
        new_gen = self.dirty[slots] >= self.announced[slots]  # dirty or not announced, in one op on bools
        resync = (held_rows > valid) & new_gen
        return Advance(anchor, new_owner, n_new_owner, new_gen, resync, int(np.count_nonzero(resync)),
                       held_first, held_rows, n_unknown)

    def _advance_native(self, slots: np.ndarray, req_ids: np.ndarray, first_pos: np.ndarray,
                        valid: np.ndarray) -> Advance:
        held = self.native_held()
        n_new, n_resync, n_unknown = fastround.advance(held, slots, req_ids, first_pos, valid, self.W)
        return self.native_plan(self.native_views(slots.shape[0]), n_new, n_resync, n_unknown)

    def native_held(self) -> object:
        """The C advance's Held (the tables, the counts and the scratch), the same object at every call:
        for _advance_native and the fused calls (round/fused.py)."""
        held = self._held
        if held is None:  # the tables and the scratch, their buffers taken once (_fastround_held.c)
            held = self._held = fastround.Held((self.owner, self.generation, self.lo, self.hi, self.dirty,
                                                self.announced, self.unknown, self.counts, *self._adv_scratch))
        return held

    def native_views(self, n: int) -> tuple[np.ndarray, ...]:
        """The C advance's results for n requests: [:n] views of its scratch, made once per n."""
        out = self._adv_views.get(n)
        if out is None:
            out = self._adv_views[n] = tuple(a[:n] for a in self._adv_scratch)
        return out

    def native_plan_of(self, n: int, n_new: int, n_resync: int, n_unknown: int) -> Advance:
        """native_plan over native_views(n); the usual round's (no new owner, no resync, no unknown range)
        made once per n, its arrays being the same views every time."""
        if n_new or n_resync or n_unknown:
            return self.native_plan(self.native_views(n), n_new, n_resync, n_unknown)
        plan = self._usual_plans.get(n)
        if plan is None:
            plan = self._usual_plans[n] = self.native_plan(self.native_views(n), 0, 0, 0)
        return plan

    def native_plan(self, out: tuple[np.ndarray, ...], n_new: int, n_resync: int, n_unknown: int) -> Advance:
        """After a C advance: the plan over `out`."""
        anchor, new_owner, new_gen, resync, held_first, held_rows = out
        return Advance(anchor, new_owner, n_new, new_gen, resync, n_resync, held_first, held_rows, n_unknown)

    def accept(self, slots: np.ndarray, anchor_pos: np.ndarray, usable: np.ndarray,
               partial: np.ndarray, worker_rows: np.ndarray, held_rows: np.ndarray | None = None) -> None:
        """Step 8 on the model, for the requests that had an entry: a usable status (``usable``) announces
        the slot and leaves it clean, except a ``PARTIAL_WINDOW`` (``partial``) for which the ring holds
        more rows than the worker reports (``worker_rows``): those rows exist, so the window is resent.
        Any other status marks the slot dirty. ``held_rows``: ``rows_for_anchor(slots, anchor_pos)``
        if the caller has it already (``Advance.held_rows``, the ranges unchanged since)."""
        bad = ~usable
        if np.count_nonzero(partial):
            if held_rows is None:
                held_rows = self.rows_for_anchor(slots, anchor_pos)
            bad |= partial & (worker_rows < held_rows)
        self.announced[slots[usable]] = True
        self.dirty[slots] = bad

    def announce(self, slots: np.ndarray) -> None:
        """``accept`` when every request got a usable, whole-window status (all ``RS_OK``, the common
        case): announced and clean, without building the masks."""
        self.announced[slots] = True
        self.dirty[slots] = False

    # ------------------------------------------------------------------ introspection

    def snapshot(self, slot: int) -> dict[str, int | bool]:
        """One slot's state as plain Python values (logs, status, tests)."""
        s = int(slot)
        lo, hi = int(self.lo[s]), int(self.hi[s])
        return {"slot": s, "owner": int(self.owner[s]), "generation": int(self.generation[s]),
                "lo": lo, "hi": hi, "n_rows": hi - lo + 1,
                "dirty": bool(self.dirty[s]), "announced": bool(self.announced[s]),
                "unknown": bool(self.unknown[s])}
