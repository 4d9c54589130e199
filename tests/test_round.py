"""The round (RoundCore) through the real shim and segment, one round at a time: every fallback reason,
the resync flow, a lost claim, a late proxy."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy import wire
from dspark_proxy.shm.hostflag import HostFlags
from dspark_proxy.shm.layout import META_SLOTS, STATUS_OK, STATUS_ROUND_FAILED, STATUS_SOME_FAILED
from tests.rig import Rig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def rig(seg_name):
    r = Rig(seg_name)
    yield r
    r.close()


def failed_with(rig: Rig, reply, reason: str, slots) -> None:
    assert reply.status == STATUS_ROUND_FAILED
    assert not reply.ok_mask.any()
    assert rig.stats.counter(f"fallback_{reason}") >= 1
    assert rig.core.slots.dirty[np.asarray(slots)].all()


def test_healthy_rounds_give_oracle_drafts(rig):
    checked = 0
    for _ in range(10):
        reply, b = rig.round([(1, 0, 1), (2, 3, 1)], first_pos=None)
        checked += rig.check_drafts(reply, b)
    assert reply.status == STATUS_OK and checked >= 18
    assert rig.stats.counter("rounds_ok") == 10
    lat = rig.stats.snapshot()["latency"]
    assert lat["proxy_cost_us"]["count"] == 10 and 0 < lat["proxy_cost_us"]["p50_us"] < lat["rank0_round_us"]["p50_us"]
    rig.client.fail_reason = "timeout"
    rig.round([(1, 0, 1)])  # a round without a reply has no rtt, so no proxy cost
    assert rig.stats.snapshot()["latency"]["proxy_cost_us"]["count"] == 10


def test_fallback_cooldown_after_breaker_trips(rig):
    rig.client.fail_reason = "timeout"
    for _ in range(3):  # threshold 3
        reply, _ = rig.round([(1, 0, 1)])
        failed_with(rig, reply, "timeout", [0])
    assert rig.breaker.state == "open"
    rig.client.fail_reason = None
    reply, _ = rig.round([(1, 0, 1)])
    failed_with(rig, reply, "cooldown", [0])
    sent = len(rig.client.sent_entries)
    for _ in range(5):
        rig.round([(1, 0, 1)])
    # cooldown 5: the probe goes out, succeeds, and the breaker closes
    assert len(rig.client.sent_entries) == sent + 1
    assert rig.breaker.state == "closed"
    reply, b = rig.round([(1, 0, 1)])
    assert reply.status == STATUS_OK and rig.check_drafts(reply, b) == 1


def test_fallback_not_ready_and_disabled(rig):
    rig.client.ready = False
    reply, _ = rig.round([(1, 0, 2)])
    failed_with(rig, reply, "not_ready", [0])
    rig.client.ready = True
    rig.client.disabled = True
    reply, _ = rig.round([(1, 0, 1)])
    failed_with(rig, reply, "disabled", [0])
    assert not rig.client.sent_entries  # nothing went out


def test_fallback_no_rows(rig):
    reply, _ = rig.round([(1, 0, 0), (2, 1, 0)])
    failed_with(rig, reply, "no_rows", [0, 1])


def test_fallback_worker_failure_and_internal_error(rig):
    rig.client.fail_reason = "connection_lost"
    reply, _ = rig.round([(1, 0, 2)])
    failed_with(rig, reply, "connection_lost", [0])
    rig.client.fail_reason = None
    rig.client.raise_next = True
    reply, _ = rig.round([(1, 0, 1)])
    failed_with(rig, reply, "internal_error", [0])
    reply, b = rig.round([(1, 0, 1)])  # and the next round is fine again
    assert reply.status == STATUS_OK and rig.check_drafts(reply, b) == 1


def test_fallback_preempted(rig):
    # the watchdog claims the round while the proxy builds it: nothing is sent
    flags = HostFlags(rig.seg)
    rig.client.before_step = None
    b = rig.batch([(1, 0, 2)])
    rig.t += 1
    rig.shim.enqueue(rig.t, **b)
    orig = rig.core._claimed  # the round binds the claimed word's load once (round/core.py)
    calls = {"n": 0}

    def claimed():  # first look (late skip) says no; the pre-STEP look says yes
        calls["n"] += 1
        if calls["n"] == 2:
            assert flags.fail(rig.t, 1) == 1
        return orig()

    rig.core._claimed = claimed
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == STATUS_ROUND_FAILED
    assert rig.stats.counter("fallback_preempted") == 1
    assert not rig.client.sent_entries
    # the lost publish marked every slot dirty
    assert rig.stats.counter("watchdog_preempted") == 1 and rig.core.slots.dirty.all()


def test_resync_flows_request_stage_send(rig):
    # slot 0 fills its window over 4 rounds (W=4), then the worker loses it (a new epoch)
    for _ in range(4):
        reply, b = rig.round([(1, 0, 1)])
    assert rig.core.slots.rows_for_anchor(np.array([0]), np.array([4])).tolist() == [4]
    rig.client.epoch += 1  # reconnect: every slot dirty, the worker lost everything
    rig.client.new_session("reconnect")
    # round 5: needs a RESYNC of its whole window, which was not staged: sent with this round's rows only
    reply, b = rig.round([(1, 0, 1)])
    assert rig.stats.counter("resync_pending") == 1
    assert rig.core.want_resync[0]
    e = rig.client.sent_entries[-1]
    assert e["flags"][0] & wire.RF_NEW_GEN and not e["flags"][0] & wire.RF_RESYNC and e["n_rows"][0] == 1
    assert reply.ok_mask[0] and rig.check_drafts(reply, b) == 1  # a usable partial window meanwhile
    assert rig.core.slots.dirty[0]
    # round 6: the engine staged slot 0's window with its gather: a RESYNC entry with W rows from the ring
    reply, b = rig.round([(1, 0, 1)])
    e = rig.client.sent_entries[-1]
    assert e["flags"][0] & wire.RF_RESYNC and e["n_rows"][0] == 4 and e["first_pos"][0] == 2
    sent = rig.client.sent_rows[-1]
    from tests.rig import row_of

    assert np.array_equal(sent, np.stack([row_of(1, p, rig.B) for p in range(2, 6)]))
    assert reply.status == STATUS_OK and rig.check_drafts(reply, b) == 1
    assert float(reply.confidence[0][0]) == 1.0  # the worker holds the whole window again
    assert not rig.core.slots.dirty[0] and not rig.core.want_resync[0]
    assert rig.stats.counter("resync_rounds") == 1


def test_requests_that_do_not_fit_the_staging(seg_name):
    rig = Rig(seg_name, max_rows=3)
    try:
        reply, b = rig.round([(1, 0, 2), (2, 1, 2), (3, 2, 1)])  # 2 + 2 > 3: requests 2 and 3 stage nothing
        assert reply.status == STATUS_SOME_FAILED
        assert reply.ok_mask.tolist() == [True, False, False]
        assert rig.check_drafts(reply, b) == 1
        assert rig.stats.counter("requests_not_staged") == 2
        assert rig.core.slots.dirty[[1, 2]].all()
        # the model still applied their rows
        assert rig.core.slots.hi[[1, 2]].tolist() == [1, 0]
    finally:
        rig.close()


def test_lost_claim_marks_every_slot_dirty(rig):
    for _ in range(2):
        rig.round([(1, 0, 1), (2, 1, 1)])
    assert not rig.core.slots.dirty[[0, 1]].any()
    flags = HostFlags(rig.seg)
    rig.client.before_step = lambda: flags.fail(rig.t, 2)  # the watchdog wins while the STEP is out
    reply, _ = rig.round([(1, 0, 1), (2, 1, 1)])
    assert reply.status == STATUS_ROUND_FAILED
    assert rig.core.slots.dirty.all()
    assert rig.stats.counter("watchdog_preempted") == 1
    assert any(e["how"] == "late_publish" for e in rig.core.events.dump())


def test_late_proxy_skips_taken_rounds_and_keeps_the_ring(rig):
    rig.round([(1, 0, 1)])
    flags = HostFlags(rig.seg)
    # three rounds failed by the watchdog before the proxy gets to them
    for _ in range(3):
        b = rig.batch([(1, 0, 1)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        assert flags.fail(rig.t, 1) == 1
        rig.shim.read_reply(rig.t)
    for t in range(rig.t - 2, rig.t + 1):
        rig.core.handle(t, 0.0)
    assert rig.stats.counter("watchdog_skipped_rounds") == 3
    assert rig.core.slots.hi[0] == 3 and rig.core.slots.lo[0] == 0  # still exact
    assert [e["how"] for e in rig.core.events.dump()] == ["skipped"] * 3


def test_proxy_more_than_64_rounds_behind_restarts_windows(rig):
    rig.round([(1, 0, 1)])
    flags = HostFlags(rig.seg)
    first = rig.t + 1
    for _ in range(META_SLOTS + 2):
        b = rig.batch([(1, 0, 1)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        flags.fail(rig.t, 1)
        rig.shim.read_reply(rig.t)
    rig.core.handle(first, 0.0)  # its metadata slot now holds round first + 64
    assert rig.stats.counter("watchdog_skipped_unknown_ring") == 1
    assert rig.core.slots.hi[0] < rig.core.slots.lo[0]  # restarted: empty, dirty
    assert rig.core.slots.dirty[0]


def test_bad_descriptor_fails_the_round_not_the_process(rig):
    b = rig.batch([(1, 0, 1)])
    rig.t += 1
    rig.shim.enqueue(rig.t, **b)
    rig.seg.meta[rig.t % META_SLOTS]["staged_rows"][0] = 3  # corrupt: staged != valid
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == STATUS_ROUND_FAILED
    assert rig.stats.counter("fallback_bad_descriptor") == 1
    reply, b = rig.round([(1, 0, 1)])
    assert rig.check_drafts(reply, b) == 1


def test_new_owner_starts_a_new_generation(rig):
    rig.round([(1, 0, 2)])
    g = int(rig.core.slots.generation[0])
    reply, b = rig.round([(9, 0, 3)])  # a new request in slot 0
    assert int(rig.core.slots.generation[0]) == g + 1
    assert rig.client.sent_entries[-1]["flags"][0] & wire.RF_NEW_GEN
    assert rig.check_drafts(reply, b) == 1


def test_resync_requests_are_capped_by_the_learned_round_rate(rig):
    """Windows are asked for no faster than the link resends them within half the deadline: a slow
    link (learned from a STEP that timed out) gets one window per round, the others wait their turn."""
    for _ in range(4):
        rig.round([(1, 0, 1), (2, 1, 1)])
    rig.client.epoch += 1  # the worker lost everything: both slots need their whole window back
    rig.client.new_session("reconnect")
    assert rig.core.pacer.resync_cap == rig.core.R == 2
    rig.core.pacer.learn_rate(1, 1e6, upper_bound=True)  # 1 row per second: half the 10 s deadline fits 5 rows
    assert rig.core.pacer.resync_cap == 1
    rig.round([(1, 0, 1), (2, 1, 1)])
    assert rig.core.want_resync[[0, 1]].all()
    req = rig.core.win.req
    assert int(req["count"][0]) == 1 and int(req["slots"][0, 0]) == 0
    reply, b = rig.round([(1, 0, 1), (2, 1, 1)])  # slot 0's window comes back; slot 1 is asked for next
    assert rig.check_drafts(reply, b) == 2
    assert not rig.core.want_resync[0] and rig.core.want_resync[1]
    assert int(req["count"][0]) == 1 and int(req["slots"][0, 0]) == 1
    rig.round([(1, 0, 1), (2, 1, 1)])
    rig.round([(1, 0, 1), (2, 1, 1)])
    assert not rig.core.slots.dirty[[0, 1]].any()


def test_a_step_that_timed_out_caps_the_rows_of_the_next_rounds(rig):
    """The link cannot carry a round's rows within the deadline (a STEP of at least a window's rows
    timed out): later STEPs carry at most half of that, a prefix of the entries, until STEPs near the
    cap show the link carries more; the requests left out get no drafts and are resent later."""
    rig.round([(1, 0, 1)])
    assert rig.core.pacer.row_cap == 0  # a link that carries its rounds is never capped
    rig.client.fail_reason = "timeout"
    rig.round([(2, 1, 2)])  # 2 rows < W = 4: says nothing about the link
    assert rig.core.pacer.row_cap == 0
    reply, _ = rig.round([(3, 2, 4), (4, 3, 4), (5, 4, 4), (6, 5, 4)])  # 16 rows
    failed_with(rig, reply, "timeout", [2, 3, 4, 5])
    assert rig.core.pacer.row_cap == 8 and rig.stats.gauge("row_cap") == 8
    rig.client.fail_reason = None
    reply, b = rig.round([(7, 4, 4), (8, 5, 4), (9, 6, 4), (10, 7, 4)])  # 16 rows, 8 fit
    e, sent = rig.client.sent_entries[-1], rig.client.sent_rows[-1]
    assert e["slot"].tolist() == [4, 5] and e["n_rows"].tolist() == [4, 4]
    assert np.array_equal(sent, np.concatenate([b["rows"][:8]]))  # the staging's prefix, nothing more
    assert reply.status == STATUS_SOME_FAILED and reply.ok_mask.tolist() == [True, True, False, False]
    assert rig.check_drafts(reply, b) == 2
    assert rig.core.slots.dirty[[6, 7]].all() and not rig.core.slots.dirty[[4, 5]].any()
    assert rig.stats.counter("requests_over_link_cap") == 2
    assert rig.core.pacer.row_cap == 16  # that STEP was quick: at most twice the cap
    reply, b = rig.round([(11, 0, 4), (12, 1, 4), (13, 2, 4), (14, 3, 4)])  # 16 rows: all fit
    assert reply.status == STATUS_OK and rig.check_drafts(reply, b) == 4
    assert rig.core.pacer.row_cap == 0 == rig.stats.gauge("row_cap")  # twice 16 reaches max_rows (M x W): gone


def test_the_row_cap_cuts_a_round_with_resync_windows(rig):
    """A capped round whose first entry resends a staged ring window: the STEP carries that window
    and the next request's staging rows, and not the rows of the request left out."""
    from tests.rig import row_of

    for _ in range(4):
        rig.round([(1, 0, 1)])
    rig.client.epoch += 1  # the worker lost everything
    rig.client.new_session("reconnect")
    rig.round([(1, 0, 1), (2, 1, 2), (3, 2, 2)])  # slot 0 asks for its window
    assert rig.core.want_resync[0]
    rig.core.pacer.row_cap = 6
    reply, b = rig.round([(1, 0, 1), (2, 1, 2), (3, 2, 2)])  # window 4 + 2 + 2 rows: 6 fit
    e, sent = rig.client.sent_entries[-1], rig.client.sent_rows[-1]
    assert e["slot"].tolist() == [0, 1] and e["flags"][0] & wire.RF_RESYNC and e["n_rows"].tolist() == [4, 2]
    want = np.stack([row_of(1, p, rig.B) for p in range(2, 6)] + [row_of(2, p, rig.B) for p in (2, 3)])
    assert np.array_equal(sent, want)
    assert reply.ok_mask.tolist() == [True, True, False] and rig.check_drafts(reply, b) == 2
    assert rig.core.slots.dirty[2] and rig.stats.counter("requests_over_link_cap") == 1
    for _ in range(4):  # the request left out catches up; every draft on the way is right
        reply, b = rig.round([(1, 0, 1), (2, 1, 2), (3, 2, 2)])
        rig.check_drafts(reply, b)
    assert reply.status == STATUS_OK and rig.core.pacer.row_cap == 24  # rounds far below it leave it be
