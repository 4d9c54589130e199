"""A proxy that cannot know what the engine's ring holds (a new proxy incarnation meets an engine whose
ring is full; a bad descriptor) takes the engine's range from the windows it asks for (shm_layout.md §5,
"Unknown ranges"): every live request drafts from its whole window again within
ceil(live slots / windows per round) + 1 rounds of the first round that reaches a healthy worker, and
every draft meanwhile is computed from rows the engine really wrote."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_proxy.ops.events import EventRing
from dspark_proxy.round.core import RoundCore, RoundSettings
from dspark_proxy.shm.layout import META_SLOTS, STATUS_ROUND_FAILED
from tests.rig import Rig, full_windows, rounds_until_full, staged_slots

pytestmark = pytest.mark.timeout(60)

W = 16
LIVE = [(1, 0, 1), (2, 2, 1), (3, 5, 1), (4, 7, 1)]  # (request, slot, rows a round): decoding


def _forget(rig: Rig, fault: str) -> None:
    if fault == "new_proxy":
        # a new proxy incarnation: an empty ring model, a new connection, the engine's ring untouched
        rig.client.epoch += 1
        rig.client.new_session("a new proxy")
        rig.core = RoundCore(rig.seg, rig.client, rig.stats, EventRing(64), rig.breaker, RoundSettings())
    else:
        b = rig.batch(LIVE)
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        rig.seg.meta[rig.t % META_SLOTS]["staged_rows"][0] = 3  # corrupt: staged != valid
        rig.core.handle(rig.t, 0.0)
        assert rig.shim.read_reply(rig.t).status == STATUS_ROUND_FAILED
        assert rig.stats.counter("fallback_bad_descriptor") == 1


@pytest.mark.parametrize("fault", ["new_proxy", "bad_descriptor"])
def test_whole_windows_come_back_after_the_proxy_forgot_the_ring(seg_name, fault):
    """Before: the model restarted each slot from one round's rows and nothing asked for the engine's
    window, so the requests drafted from 1, 2, ... of the 16 rows the engine held: full again only
    after W - 1 = 15 rounds, against a bound of ceil(4 / 2) + 1 = 3."""
    rig = Rig(seg_name, M=8, W=W, R=2)
    try:
        for _ in range(W + 2):
            reply, b = rig.round(LIVE)
        assert all(full_windows(rig, reply, b))
        # a fresh model over a fresh engine: every request started at position 0, nothing was asked for
        assert rig.shim.counters.counter("resync_windows_staged") == 0
        fresh_unknown = getattr(rig.core.slots, "n_unknown", None)
        _forget(rig, fault)
        first_healthy = rig.t + 1  # the next round reaches the worker
        paced: list[int] = []
        full_at = rounds_until_full(rig, LIVE, 3 * W, paced)
        bound = math.ceil(len(LIVE) / min(paced)) + 1
        assert full_at is not None, "the live requests never got their whole windows back"
        assert full_at - first_healthy <= bound, (full_at, first_healthy, bound)
        assert fresh_unknown == 0 and rig.core.slots.n_unknown == 0
        assert rig.stats.counter("ring_ranges_adopted") == len(LIVE)
        held = [rig.core.slots.snapshot(s) for _, s, _ in LIVE]
        assert all(h["n_rows"] == W and not h["unknown"] for h in held), held
    finally:
        rig.close()


def test_a_new_proxy_asks_only_for_what_it_cannot_know(seg_name):
    """A new proxy meets a request deep into decoding, one that starts at position 0 and one whose
    prefill sends W rows: only the first has a range the engine may hold more of, so only its window is
    staged, once."""
    rig = Rig(seg_name, M=8, W=W, R=2)
    try:
        for _ in range(W + 2):
            rig.round([(1, 0, 1)])
        _forget(rig, "new_proxy")
        staged: list[int] = []
        for i in range(6):
            reqs = [(1, 0, 1), (2, 3, 1), (3, 4, W if i == 0 else 1)]
            reply, b = rig.round(reqs, first_pos={3: 100} if i == 0 else None)
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
            staged += staged_slots(rig, rig.t)
        assert staged == [0]
        assert all(full_windows(rig, reply, b))
        assert np.count_nonzero(rig.core.slots.unknown[[0, 3, 4]]) == 0
    finally:
        rig.close()
