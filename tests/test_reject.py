"""One rejected enqueue costs exactly that round, attached or not."""

from __future__ import annotations

import numpy as np
import pytest

from engine_shim.shim import Shim, ShimError
from tests.rig import Rig

pytestmark = pytest.mark.timeout(60)

REQS = [(10, 0, 1), (11, 1, 1), (12, 2, 1)]


def _bad(b: dict, W: int) -> dict:
    return {**b, "valid": np.array([1, W + 1, 1])}


def test_a_rejected_round_costs_that_round_only(seg_name):
    rig = Rig(seg_name)
    try:
        for _ in range(6):
            rig.round(REQS)
        rig.t += 1
        with pytest.raises(ShimError, match="valid"):
            rig.shim.enqueue(rig.t, **_bad(rig.batch(REQS), rig.W))
        rig.core.handle(rig.t, 0.0)  # the proxy reaches round t: already failed, nothing applied
        reply = rig.shim.read_reply(rig.t)
        assert reply.status == 2 and not reply.ok_mask.any() and reply.n == 3
        assert reply.reason.startswith("bad_input: valid"), reply.reason
        assert rig.shim.counters.counter("rounds_rejected") == 1
        assert rig.stats.counter("fallback_bad_descriptor") == 0  # the proxy trusted no staging
        # it read round t's own stamped metadata ("no requests"): no restart of every slot
        assert rig.stats.counter("watchdog_skipped_rounds") == 1
        assert rig.stats.counter("watchdog_skipped_unknown_ring") == 0
        checked = 0
        for _ in range(rig.W + 4):
            reply, b = rig.round(REQS)
            assert reply.status != 2
            checked += rig.check_drafts(reply, b)
        # every request drafts again, from rows it really wrote (the integrity oracle checks each)
        last, b = rig.round(REQS)
        assert last.ok_mask.all() and rig.check_drafts(last, b) == 3 and checked > 0
    finally:
        rig.close()


def test_a_rejected_round_with_the_proxy_late_is_skipped_by_it(seg_name):
    """The proxy reaches round t only after the engine has read its reply and enqueued t+1."""
    rig = Rig(seg_name)
    try:
        rig.round(REQS)
        rig.t += 1
        with pytest.raises(ShimError):
            rig.shim.enqueue(rig.t, **{**rig.batch(REQS), "slots": np.array([0, 0, 9])})
        assert rig.shim.read_reply(rig.t).reason.startswith("bad_input: slots")
        rig.t += 1
        rig.shim.enqueue(rig.t, **rig.batch(REQS))
        rig.core.handle(rig.t - 1, 0.0)
        rig.core.handle(rig.t, 0.0)
        assert rig.shim.read_reply(rig.t).status != 2
    finally:
        rig.close()


def test_a_rejected_round_detached_and_unconvertible_input():
    shim = Shim(None, max_reqs=4, num_spec=3, window=4, row_bytes=16, start_watchdog=False)
    try:
        ok = dict(req_ids=np.arange(2), slots=np.arange(2), qsl=np.arange(3), need_draft=np.ones(2, bool),
                  k_window=np.zeros(2, np.int64), rows=np.zeros((2, 16), np.uint8), valid=np.ones(2, np.int64),
                  first_pos=np.zeros(2, np.int64), anchor=np.zeros(2, np.int64))
        with pytest.raises(ShimError, match="req_ids"):
            shim.enqueue(1, **{**ok, "req_ids": [[1], [2]]})  # unhashable ids: still a ShimError
        assert shim.read_reply(1).reason.startswith("bad_input: ")
        with pytest.raises(ShimError, match="qsl"):
            shim.enqueue(2, **{**ok, "qsl": np.arange(2)})
        r = shim.read_reply(2)
        assert r.reason.startswith("bad_input: qsl") and r.n == 2
        shim.enqueue(3, **ok)
        assert shim.read_reply(3).reason == "detached"
        with pytest.raises(ShimError, match="the next round is 4"):  # numbering errors change nothing
            shim.enqueue(5, **ok)
        shim.enqueue(4, **ok)
        shim.read_reply(4)
    finally:
        shim.close()
