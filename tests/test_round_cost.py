"""The round's shortcuts give what the general paths give, and the round benchmark keeps running.

RoundCore takes shortcuts on the common round, for cost: ``SlotTable.advance`` instead of
``begin_requests`` + ``apply`` + ``window`` + ``plan``, ``announce`` (or ``accept`` with the held rows
passed in) instead of ``accept``, ``check_slots`` instead of ``validate_round``, and a reply page that
is zeroed only where an earlier round wrote. These tests pin each shortcut to the general method (which
test_ring.py pins to a plain reference ring) and check the page the engine reads. scripts/bench_round.py
is run for a few rounds so that it keeps working; no timing is asserted.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.round.ring_model import SlotTable
from dspark_proxy.shm.layout import STATUS_OK, STATUS_ROUND_FAILED
from tests.rig import Rig
from tests.test_ring import M, RefRing, _draw_round, arr, window_size

pytestmark = pytest.mark.timeout(60)

FIELDS = ("owner", "generation", "lo", "hi", "dirty", "announced")


def assert_tables_equal(a: SlotTable, b: SlotTable) -> None:
    for f in FIELDS:
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(W=window_size(), data=st.data())
def test_advance_announce_and_held_rows_match_the_general_methods(W: int, data) -> None:
    fast, general, ref = SlotTable(M, W), SlotTable(M, W), RefRing(M, W)
    next_req = [0]
    for _ in range(data.draw(st.integers(1, 25), label="rounds")):
        slots_l, req_l, fp_l, v_l = _draw_round(data, ref, next_req)
        v_l = [min(max(v, 0), W) for v in v_l]  # advance's precondition (the proxy checks it)
        ref.round(slots_l, req_l, fp_l, v_l)  # the reference only steers the next draws
        slots, req_ids, first_pos, valid = arr(*slots_l), arr(*req_l), arr(*fp_l), arr(*v_l)

        adv = fast.advance(slots, req_ids, first_pos, valid)
        new = general.begin_requests(slots, req_ids)
        anchors = general.apply(slots, first_pos, valid)
        first, n_rows = general.window(slots, anchors)
        plan = general.plan(slots, first_pos, valid, anchors)
        assert adv.anchor_pos.tolist() == anchors.tolist()
        assert adv.new_owner.tolist() == new.tolist() and adv.n_new_owner == int(new.sum())
        assert adv.new_gen.tolist() == plan.new_gen.tolist()
        assert adv.resync.tolist() == plan.resync.tolist() and adv.n_resync == int(plan.resync.sum())
        assert adv.held_first.tolist() == first.tolist() and adv.held_rows.tolist() == n_rows.tolist()
        assert_tables_equal(fast, general)

        n = len(slots_l)
        fate = data.draw(st.sampled_from(["reply", "all_ok", "failed"]), label="fate")
        if fate == "reply":
            usable = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
            partial = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
            wrows = arr(*data.draw(st.lists(st.integers(0, W + 1), min_size=n, max_size=n)))
            fast.accept(slots, anchors, usable, partial, wrows, held_rows=adv.held_rows)
            general.accept(slots, anchors, usable, partial, wrows)
        elif fate == "all_ok":
            fast.announce(slots)
            general.accept(slots, anchors, np.ones(n, bool), np.zeros(n, bool), arr(*[W] * n))
        else:
            fast.mark_dirty(slots)
            general.mark_dirty(slots)
        assert_tables_equal(fast, general)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.integers(-3, M + 2), max_size=M))
def test_check_slots_agrees_with_validate_round(slots_l: list[int]) -> None:
    t = SlotTable(M, 4)
    slots = arr(*slots_l)
    assert t.check_slots(slots) == t.validate_round(slots)


def test_page_rows_of_an_earlier_larger_round_are_cleared(seg_name):
    """The round's page is cleared (n_drafts 0, ids -1, conf 0) only where an earlier round wrote: what
    the engine reads must not show it. That is the round's own copy (RoundCore.page): the segment's page
    gets a round's header and its n requests only (publish with rows), the rest keeps older bytes unread."""
    rig = Rig(seg_name, M=8, N=3, W=4)
    try:
        N, L = rig.N, rig.seg.layout.reply
        big = [(r, r, 1) for r in range(8)]
        for _ in range(4):  # windows fill: every request OK, every row of the page written
            reply, b = rig.round(big)
        assert reply.status == STATUS_OK and reply.ok_mask.all() and rig.check_drafts(reply, b) == 8
        page, shared = rig.core.page, rig.seg.page
        assert page[L.o_ids:L.o_ids + 8 * N].any()
        reply, b = rig.round([(1, 1, 1), (5, 5, 1)])  # a smaller round, all slices
        assert reply.status == STATUS_OK and rig.check_drafts(reply, b) == 2
        assert (shared[:L.o_ok + 2] == page[:L.o_ok + 2]).all() and shared[L.o_ok + 2:L.o_ok + 8].all()
        assert not page[L.o_ok + 2:L.o_ok + 8].any()
        assert (page[L.o_ids + 2 * N:L.o_ids + 8 * N] == -1).all()
        assert not page[L.o_conf + 2 * N:L.o_conf + 8 * N].any()
        reply, b = rig.round([(1, 1, 1), (5, 5, 0)])  # request 5 has no entry: the general path
        assert reply.ok_mask.tolist() == [True, False]
        assert (page[L.o_ids + N:L.o_ids + 8 * N] == -1).all()
        rig.client.fail_reason = "timeout"
        reply, _ = rig.round(big)
        assert reply.status == STATUS_ROUND_FAILED
        assert not page[L.o_ok:L.o_ok + 8].any()
        rig.client.fail_reason = None
        reply, b = rig.round([(3, 3, 1)])
        assert reply.ok_mask.tolist() == [True] and rig.check_drafts(reply, b) == 1
        assert (page[L.o_ids + N:L.o_ids + 8 * N] == -1).all()
    finally:
        rig.close()


def _bench_module():
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench_round.py")
    spec = importlib.util.spec_from_file_location("bench_round", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mix", ["decode", "prefill", "resync"])
def test_bench_round_runs(mix: str) -> None:
    r = _bench_module().measure(8, 16, mix, rounds=40, warmup=10, row_bytes=32)
    assert r["rounds_ok"] == 50 and r["rounds_failed"] == 0
    assert r["handle_p50_us"] > 0 and r["own_p50_us"] <= r["handle_p50_us"]
    if mix == "resync":
        assert r["resync_rounds"] > 0
