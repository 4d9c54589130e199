"""Resync requests after a fault: only the round's own requests are asked for, each live request has its
whole window back within ceil(dirty live slots / windows per round) + 1 rounds of the first round that
reaches a healthy worker, and the engine copies each requested window once, within its byte budget."""

from __future__ import annotations

import math

import pytest

from dspark_proxy.shm import layout as shm_layout
from dspark_proxy.shm.hostflag import HostFlags
from tests.rig import Rig, full_windows, rounds_until_full, staged_slots

pytestmark = pytest.mark.timeout(60)


def test_finished_requests_are_never_asked_for_and_live_windows_come_back(seg_name):
    """M=8, W=4, 2 windows a round, one worker timeout, then the requests in slots 0
    and 1 finish. Before: the idle slots 0 and 1 filled the window budget for ever (staged every round)
    and the live requests drafted from 1 of 4 rows."""
    rig = Rig(seg_name, M=8, W=4, R=2)
    try:
        live = [(3, 2, 1), (4, 3, 1)]
        everyone = [(1, 0, 1), (2, 1, 1)] + live
        for _ in range(5):
            reply, b = rig.round(everyone)
        assert all(full_windows(rig, reply, b))
        rig.client.fail_reason = "timeout"
        reply, _ = rig.round(everyone)
        assert not reply.ok_mask.any()
        rig.client.fail_reason = None
        reply, b = rig.round(everyone)  # the first round that reaches a healthy worker: 4 dirty slots
        first_healthy = rig.t
        assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
        paced = [rig.core.pacer.resync_cap]
        staged: list[int] = []
        # the requests in slots 0 and 1 have finished
        full_at = rounds_until_full(rig, live, 200, paced, each=lambda: staged.extend(staged_slots(rig, rig.t)))
        assert 0 not in staged and 1 not in staged, f"idle slots staged {staged.count(0) + staged.count(1)} times"
        eff = min(paced)  # the fewest windows a round it took asked for (link pacing says so)
        assert rig.stats.gauge("resync_windows_per_round") is not None
        assert rig.stats.counter("resync_windows_deferred") >= 4 - eff  # the pacing says what it held back
        bound = math.ceil(4 / eff) + 1
        assert full_at is not None, "the live requests never got their whole windows back"
        assert full_at - first_healthy <= bound, (full_at, first_healthy, eff)
        assert sorted(staged) == [2, 3]  # each live window staged once
    finally:
        rig.close()


def _lose_every_window(rig: Rig, reqs: list[tuple[int, int, int]]) -> None:
    """Fill the requests' windows, then a reconnect: the worker holds nothing, every slot is dirty."""
    for _ in range(rig.W + 1):
        rig.round(reqs)
    rig.client.epoch += 1
    rig.client.new_session("reconnect")


def test_a_hung_proxy_costs_each_requested_window_one_copy(seg_name):
    """The resync request names its round and is honoured once. Before: while the
    proxy was late or hung, every enqueue copied every requested window again."""
    rig = Rig(seg_name, M=8, W=4, R=2)
    try:
        reqs = [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
        _lose_every_window(rig, reqs)
        reply, _ = rig.round(reqs)  # asks for 2 windows (R), for the next round
        asked = int(rig.core.win.req["count"][0])
        named = int(rig.core.win.req[0]["round"]) if "round" in rig.core.win.req.dtype.names else None
        assert asked == 2
        written_at = rig.t
        before = rig.shim.counters.counter("resync_windows_staged")
        flags = HostFlags(rig.seg)
        staged = []
        for _ in range(10):  # the proxy is hung: the watchdog fails every round, nothing is rewritten
            b = rig.batch(reqs)
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            staged.append(staged_slots(rig, rig.t))
            assert flags.fail(rig.t, 1) == 1
            rig.shim.read_reply(rig.t)
        assert staged[0] == [0, 1] and not any(staged[1:]), staged
        assert rig.shim.counters.counter("resync_windows_staged") - before == asked
        # the proxy comes back: the rounds it missed are skipped, then it asks again and recovers
        for t in range(rig.t - 9, rig.t + 1):
            rig.core.handle(t, 0.0)
        for _ in range(4):
            reply, b = rig.round(reqs)
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
        assert all(full_windows(rig, reply, b))
        assert named == written_at + 1  # the request named the round after the one that wrote it
    finally:
        rig.close()


@pytest.mark.parametrize("shared", [False, True], ids=["private_ring", "shared_ring"])
def test_enqueue_copies_at_most_its_byte_budget_whatever_the_proxy_asks(seg_name, monkeypatch, shared):
    """The engine bounds its own copying: a proxy asking for all R windows gets a budget's worth. With
    the shared ring (the default) a staged window is its record alone: the count is bounded the same,
    and no byte is copied."""
    monkeypatch.setattr(shm_layout, "RESYNC_ENQUEUE_BYTES", 2 * 4 * 16, raising=False)  # 2 windows of 4 x 16 B
    monkeypatch.setenv("DSPARK_SHARED_RING", "1" if shared else "0")
    per_window = 0 if shared else 4 * 16
    rig = Rig(seg_name, M=8, W=4, B=16, R=4)
    try:
        first_cap = rig.core.pacer.resync_cap  # the proxy's first request after a (re)connect fits the budget
        reqs = [(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 3, 1), (5, 4, 1)]
        _lose_every_window(rig, reqs)
        rig.core.pacer.resync_cap = rig.core.pacer.resync_max = 4  # a proxy that asks for more than the budget
        worst = 0
        for _ in range(6):
            reply, b = rig.round(reqs)
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
            worst = max(worst, len(staged_slots(rig, rig.t)))
            assert rig.shim.resync_bytes_last == len(staged_slots(rig, rig.t)) * per_window
        assert worst == 2
        got = rig.shim.counters
        assert (got.gauge("resync_bytes_max_enqueue") or 0) == 2 * per_window
        assert got.counter("resync_windows_staged") >= 2
        assert got.counter("resync_bytes_staged") == got.counter("resync_windows_staged") * per_window
        assert all(full_windows(rig, reply, b))
        assert first_cap == shm_layout.resync_windows_per_enqueue(rig.seg.params) == 2
    finally:
        rig.close()


def test_realistic_shapes_stage_one_window_an_enqueue():
    """At 71,680-byte rows and W = 128 (9.2 MB windows, R = 29 from the default staging budget) one
    enqueue copies one window, not 266 MB."""
    mr, r = shm_layout.derive_sizes(256, 5, 128, 71680, 256)
    p = shm_layout.LayoutParams(max_reqs=256, num_spec=5, window=128, row_bytes=71680, max_rows=mr,
                                resync_per_round=r)
    assert r == 29 and shm_layout.resync_windows_per_enqueue(p) == 1
