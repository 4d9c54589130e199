"""Which worker serves which slot: rendezvous hashing of (slot, generation), and the owner table.

Each (slot, generation) ranks the workers by a hash of (slot, generation, worker key) and goes to the
highest-ranked worker that is available (highest random weight): a worker joining or leaving changes
the top choice only of its own share. A worker's key is a hash of its address, so the assignment does not
depend on the order of the `--worker` list, and every proxy of a pool spreads the same way.

Owners are sticky: a slot keeps its worker for as long as its generation lasts (the worker holds its
window), and is reassigned only when it starts a new generation (a new request: its window starts
afresh anyway), when its worker leaves (`move_off`), or a few at a time when a returning worker takes
its share back (`rebalance`). Whoever moves a slot must have its window resent (pool/client.py reports
the slots to the round, which marks them dirty).

Vectorised over slots; the workers (a handful) are the only Python-level loop anywhere here. Owned by
the round thread.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["NO_WORKER", "Router", "address_key"]

NO_WORKER = -1
_K_SLOT = np.uint64(0x9E3779B97F4A7C15)
_K_GEN = np.uint64(0xC2B2AE3D27D4EB4F)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def address_key(address: str) -> int:
    """A worker's 64-bit rendezvous key: a hash of its address (stable across processes and runs)."""
    return int.from_bytes(hashlib.blake2b(address.encode(), digest_size=8).digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


class Router:
    """The owner table of `max_slots` slots over workers with rendezvous keys `keys` (one per worker,
    by index). `owner[s]` is a worker index or NO_WORKER; `owner_gen[s]` the generation it was chosen for."""

    def __init__(self, max_slots: int, keys: list[int]) -> None:
        self.M = max_slots
        self.owner = np.full(max_slots, NO_WORKER, dtype=np.int64)
        self.owner_gen = np.full(max_slots, -1, dtype=np.int64)
        self._all = np.arange(max_slots, dtype=np.int64)
        self.set_keys(keys)

    def set_keys(self, keys: list[int], remap: np.ndarray | None = None) -> None:
        """The workers changed (a reload): new keys by index; `remap[old index]` = new index or NO_WORKER
        for a worker that left (its slots are then unowned: `unowned()` after this). None: same indices."""
        self.keys = np.array(keys, dtype=np.uint64)
        if remap is not None:
            owned = self.owner >= 0
            self.owner[owned] = remap[self.owner[owned]]

    def top(self, slots: np.ndarray, gens: np.ndarray, avail: np.ndarray) -> np.ndarray:
        """The highest-ranked available worker (indices `avail`, non-empty) for each (slot, generation)."""
        x = slots.astype(np.uint64) * _K_SLOT
        x ^= gens.astype(np.uint64) * _K_GEN
        w = _mix(x[:, None] ^ self.keys[avail][None, :])
        return avail[np.argmax(w, axis=1)]

    def route(self, slots: np.ndarray, gens: np.ndarray, avail: np.ndarray) -> np.ndarray:
        """The worker of each entry (slots, generations): its owner, or, for a slot new to the table or in
        a new generation, the top available worker (recorded as its owner). `avail` non-empty."""
        own = self.owner[slots]
        fresh = (own < 0) | (self.owner_gen[slots] != gens)
        if np.count_nonzero(fresh):
            s = slots[fresh]
            t = self.top(s, gens[fresh], avail)
            own[fresh] = t
            self.owner[s] = t
            self.owner_gen[s] = gens[fresh]
        return own

    def move_off(self, gone: np.ndarray, avail: np.ndarray) -> np.ndarray:
        """Slots owned by the workers `gone` (or unowned after a reload) go to the top of `avail` (none
        available: unowned, assigned when next seen); returns the slots that moved."""
        owner = self.owner
        moved = np.flatnonzero(np.isin(owner, gone) | ((owner == NO_WORKER) & (self.owner_gen >= 0)))
        if moved.shape[0]:
            if avail.shape[0]:
                owner[moved] = self.top(moved, self.owner_gen[moved], avail)
            else:
                owner[moved] = NO_WORKER
        return moved

    def owned_by(self, w: int) -> np.ndarray:
        return np.flatnonzero(self.owner == w)

    def rebalance(self, joining: np.ndarray, avail: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to `limit` slots whose top available worker is one of `joining` but which another worker
        owns move to it. Returns (slots moved, the joining workers with nothing left to take back)."""
        owned = np.flatnonzero(self.owner >= 0)
        if owned.shape[0] == 0:
            return owned, joining
        top = self.top(owned, self.owner_gen[owned], avail)
        want = (top != self.owner[owned]) & np.isin(top, joining)
        cand = np.flatnonzero(want)
        take = cand[:limit]
        moved = owned[take]
        self.owner[moved] = top[take]
        left = top[cand[limit:]]
        return moved, joining[~np.isin(joining, left)]

    def forget(self) -> None:
        """Every slot unowned (a pool that lost every worker starts over when one comes back)."""
        self.owner[:] = NO_WORKER
        self.owner_gen[:] = -1
