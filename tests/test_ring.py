"""SlotTable (rank 0's ring model) against a plain reference ring, rule by rule and under random rounds.

The reference below is deliberately naive — a Python list of the positions each slot holds, updated one
request at a time — so that it states the ring rules (docs/design.md, step 2) and nothing else; the
property test checks that the vectorised model agrees with it after every round and every reply.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy.round.ring_model import NO_OWNER, SlotTable

I64 = np.int64


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=I64)


def held(t: SlotTable, s: int) -> list[int]:
    return list(range(int(t.lo[s]), int(t.hi[s]) + 1))


# ---------------------------------------------------------------------------- the reference ring


class RefSlot:
    def __init__(self) -> None:
        self.owner = NO_OWNER
        self.generation = 0
        self.positions: list[int] = []
        self.dirty = True
        self.announced = False
        self.unknown = True  # the proxy's table starts not knowing what the engine holds
        self.forgotten = NO_OWNER  # the owner a restart forgot (its request may go on in the slot)
        self.truth_owner = NO_OWNER  # the engine's own ring, which never forgets
        self.truth: list[int] = []


def _held_after(held: list[int], fp: int, v: int, W: int) -> tuple[list[int], bool]:
    """The positions a slot holds after a round's rows, and whether the round restarted them."""
    if v <= 0:
        return [], True
    rows = list(range(fp, fp + v))
    if not held or held[-1] + 1 == fp:
        return (held + rows)[-W:], False
    return rows[-W:], True


class RefRing:
    """docs/design.md step 2 (and step 8's model update) one request at a time, plus the engine's own ring
    (``truth``) and the unknown-range rules: the model is always a suffix of the truth, and equal to it
    when known."""

    def __init__(self, max_slots: int, window: int) -> None:
        self.W = window
        self.slots = [RefSlot() for _ in range(max_slots)]

    def round(self, slots: list[int], req_ids: list[int], first_pos: list[int], valid: list[int]) -> list[int]:
        for s, r in zip(slots, req_ids, strict=True):
            sl = self.slots[s]
            if sl.owner != r:
                if sl.unknown and sl.owner != NO_OWNER:
                    sl.unknown = False  # a real change of owner: the engine clears the slot too
                sl.owner, sl.generation, sl.positions = r, sl.generation + 1, []
                sl.dirty, sl.announced = True, False
            if sl.truth_owner != r:
                sl.truth_owner, sl.truth = r, []
        for s, fp, v in zip(slots, first_pos, valid, strict=True):
            sl = self.slots[s]
            sl.truth = _held_after(sl.truth, fp, v, self.W)[0]
            sl.positions, restarted = _held_after(sl.positions, fp, v, self.W)
            sl.dirty |= restarted
            if sl.unknown and (not sl.positions or sl.positions[0] == 0 or len(sl.positions) == self.W):
                sl.unknown = False
        return [fp + v for fp, v in zip(first_pos, valid, strict=True)]

    def restart(self, s: int) -> None:
        sl = self.slots[s]
        if sl.owner != NO_OWNER:
            sl.forgotten = sl.owner
        sl.owner, sl.positions, sl.dirty, sl.unknown = NO_OWNER, [], True, True

    def adopt(self, s: int) -> bool:
        """The engine staged slot s's window (its truth) after this round's rows."""
        sl = self.slots[s]
        pos, tr = sl.positions, sl.truth
        if not (sl.unknown and sl.owner != NO_OWNER and pos and tr and tr[-1] == pos[-1] and tr[0] <= pos[0]):
            return False
        sl.dirty |= len(tr) > len(pos)
        sl.positions, sl.unknown = tr[-self.W:], False
        return True

    def window(self, s: int, anchor: int) -> tuple[int, int]:
        pos = self.slots[s].positions
        if pos and pos[-1] == anchor - 1:
            return pos[0], len(pos)
        return anchor, 0

    def accept(self, s: int, anchor: int, usable: bool, partial: bool, worker_rows: int) -> None:
        sl = self.slots[s]
        if usable:
            sl.announced = True
            sl.dirty = partial and worker_rows < self.window(s, anchor)[1]
        else:
            sl.dirty = True

    def plan(self, s: int, fp: int, v: int, anchor: int) -> tuple[bool, bool, int, int]:
        sl = self.slots[s]
        new_gen = sl.dirty or not sl.announced
        first, k = self.window(s, anchor)
        if new_gen and k > 0 and (first, k) != (fp, v):
            return new_gen, True, first, k
        return new_gen, False, fp, max(v, 0)


def assert_same(t: SlotTable, ref: RefRing) -> None:
    for s, sl in enumerate(ref.slots):
        got = t.snapshot(s)
        want_lo, want_hi = (sl.positions[0], sl.positions[-1]) if sl.positions else (0, -1)
        assert (got["owner"], got["generation"], got["lo"], got["hi"], got["dirty"], got["announced"],
                got["unknown"]) == (sl.owner, sl.generation, want_lo, want_hi, sl.dirty, sl.announced,
                                    sl.unknown), (s, got, vars(sl))
        assert 0 <= got["n_rows"] <= t.W
        if sl.owner != NO_OWNER:  # the model never claims a row the engine does not hold
            assert sl.truth[len(sl.truth) - len(sl.positions):] == sl.positions, (s, vars(sl))
            assert sl.unknown or sl.positions == sl.truth, (s, vars(sl))  # and known means exact
    assert t.n_unknown == sum(sl.unknown and sl.owner != NO_OWNER for sl in ref.slots)


# ---------------------------------------------------------------------------- rules, one by one


def test_fresh_table_is_empty_dirty_unannounced() -> None:
    t = SlotTable(4, 8)
    for s in range(4):
        assert t.snapshot(s) == {"slot": s, "owner": NO_OWNER, "generation": 0, "lo": 0, "hi": -1,
                                 "n_rows": 0, "dirty": True, "announced": False, "unknown": True}
    assert t.n_unknown == 0  # none in use: the hot path pays nothing for them
    assert not SlotTable(4, 8, known=True).unknown.any()  # the engine side's copy is the ring itself


def test_new_owner_starts_a_generation_and_same_owner_keeps_it() -> None:
    t = SlotTable(4, 8)
    assert t.begin_requests(arr(1, 2), arr(10, 11)).tolist() == [True, True]
    t.apply(arr(1, 2), arr(0, 0), arr(5, 5))
    t.accept(arr(1, 2), arr(5, 5), np.array([True, True]), np.array([False, False]), arr(5, 5))
    assert not t.dirty[1] and t.announced[1]
    assert t.begin_requests(arr(1, 2), arr(10, 12)).tolist() == [False, True]
    assert t.snapshot(1) == {"slot": 1, "owner": 10, "generation": 1, "lo": 0, "hi": 4, "n_rows": 5,
                             "dirty": False, "announced": True, "unknown": False}
    assert t.snapshot(2) == {"slot": 2, "owner": 12, "generation": 2, "lo": 0, "hi": -1, "n_rows": 0,
                             "dirty": True, "announced": False, "unknown": False}


def test_generation_only_grows_even_when_an_old_owner_returns() -> None:
    t = SlotTable(2, 4)
    for r in (7, 8, 7, 8):
        t.begin_requests(arr(0), arr(r))
    assert int(t.generation[0]) == 4 and int(t.owner[0]) == 8


def test_extend_from_empty_then_continue_then_keep_last_w() -> None:
    t = SlotTable(2, 8)
    t.begin_requests(arr(0), arr(1))
    assert t.apply(arr(0), arr(100), arr(3)).tolist() == [103]  # empty: extends from any start
    t.dirty[0] = False
    t.apply(arr(0), arr(103), arr(4))
    assert held(t, 0) == list(range(100, 107)) and not t.dirty[0]
    t.apply(arr(0), arr(107), arr(5))  # 12 positions written, the ring keeps the last 8
    assert held(t, 0) == list(range(104, 112)) and not t.dirty[0]


@pytest.mark.parametrize("first_pos", [20, 9, 3, 0], ids=["forward_jump", "one_gap", "rewind", "to_zero"])
def test_any_other_start_restarts_as_exactly_this_rounds_rows(first_pos: int) -> None:
    t = SlotTable(2, 8)
    t.begin_requests(arr(0), arr(1))
    t.apply(arr(0), arr(0), arr(8))
    t.dirty[0], t.announced[0] = False, True
    t.apply(arr(0), arr(first_pos), arr(3))
    assert held(t, 0) == list(range(first_pos, first_pos + 3)) and t.dirty[0]
    # so the entry is NEW_GEN with this round's rows, and no RESYNC
    p = t.plan(arr(0), arr(first_pos), arr(3), arr(first_pos + 3))
    assert (p.new_gen.tolist(), p.resync.tolist(), p.first.tolist(), p.n_rows.tolist()) == (
        [True], [False], [first_pos], [3])


def test_long_prefill_chunk_sends_its_last_w_rows_as_a_forward_jump() -> None:
    t = SlotTable(1, 4)
    t.begin_requests(arr(0), arr(1))
    t.apply(arr(0), arr(0), arr(4))  # chunk 1: positions 0..3
    t.dirty[0] = False
    t.apply(arr(0), arr(6), arr(4))  # chunk 2: positions 4..9, only 6..9 sent
    assert held(t, 0) == [6, 7, 8, 9] and t.dirty[0]


@pytest.mark.parametrize("valid", [0, -1])
def test_no_rows_clears_and_dirties(valid: int) -> None:
    t = SlotTable(2, 8)
    t.begin_requests(arr(0), arr(1))
    t.apply(arr(0), arr(0), arr(5))
    t.dirty[0] = False
    assert t.apply(arr(0), arr(5), arr(valid)).tolist() == [5 + valid]
    assert held(t, 0) == [] and t.dirty[0] and (int(t.lo[0]), int(t.hi[0])) == (0, -1)
    assert t.window(arr(0), arr(5 + valid))[1].tolist() == [0]


def test_more_than_w_rows_in_one_round_keeps_the_last_w() -> None:
    t = SlotTable(1, 4)
    t.begin_requests(arr(0), arr(1))
    t.apply(arr(0), arr(10), arr(7))
    assert held(t, 0) == [13, 14, 15, 16]
    first, n = t.window(arr(0), arr(17))
    assert (first.tolist(), n.tolist()) == ([13], [4])


def test_apply_writes_anchor_into_out() -> None:
    t = SlotTable(4, 8)
    out = np.full(2, -7, dtype=I64)
    t.begin_requests(arr(0, 3), arr(1, 2))
    got = t.apply(arr(0, 3), arr(4, 9), arr(2, 1), out=out)
    assert got is out and out.tolist() == [6, 10]


def test_window_only_for_the_anchor_right_after_the_range() -> None:
    t = SlotTable(3, 8)
    t.begin_requests(arr(0, 1, 2), arr(1, 2, 3))
    t.apply(arr(0, 1, 2), arr(10, 0, 0), arr(5, 3, 0))
    first, n = t.window(arr(0, 0, 1, 2), arr(15, 16, 3, 0))
    assert n.tolist() == [5, 0, 3, 0]
    assert first.tolist() == [10, 16, 0, 0]
    assert t.rows_for_anchor(arr(0, 1, 2), arr(15, 2, 0)).tolist() == [5, 0, 0]


def test_accept_partial_window_stays_dirty_only_when_the_ring_has_more() -> None:
    t = SlotTable(4, 8)
    slots = arr(0, 1, 2, 3)
    t.begin_requests(slots, arr(1, 2, 3, 4))
    anchors = t.apply(slots, arr(0, 0, 0, 0), arr(6, 6, 6, 6))
    t.announced[3] = True
    usable = np.array([True, True, True, False])
    partial = np.array([False, True, True, False])
    t.accept(slots, anchors, usable, partial, arr(6, 4, 6, 0))
    assert t.dirty.tolist() == [False, True, False, True]
    assert t.announced.tolist() == [True, True, True, True]  # a failed status leaves announced alone
    t.begin_requests(arr(3), arr(9))
    t.accept(arr(3), arr(0), np.array([False]), np.array([False]), arr(0))
    assert not t.announced[3] and t.dirty[3]


def test_plan_resends_the_whole_window_of_a_dirty_extended_slot() -> None:
    t = SlotTable(3, 8)
    slots = arr(0, 1, 2)
    t.begin_requests(slots, arr(1, 2, 3))
    a = t.apply(slots, arr(0, 0, 0), arr(5, 5, 5))
    t.accept(slots, a, np.ones(3, bool), np.zeros(3, bool), arr(5, 5, 5))
    t.mark_dirty(arr(1))
    t.begin_requests(arr(2), arr(4))  # slot 2 changes owner: a new generation, its rows are this round's
    fp, v = arr(5, 5, 0), arr(2, 2, 3)
    a = t.apply(slots, fp, v)
    p = t.plan(slots, fp, v, a)
    assert p.generation.tolist() == [1, 1, 2]
    assert p.new_gen.tolist() == [False, True, True]
    assert p.resync.tolist() == [False, True, False]
    assert p.first.tolist() == [5, 0, 0] and p.n_rows.tolist() == [2, 7, 3]
    assert p.first is not fp


def test_restart_mark_dirty_and_mark_all_dirty() -> None:
    t = SlotTable(4, 8)
    slots = arr(0, 1, 2, 3)
    t.begin_requests(slots, arr(1, 2, 3, 4))
    a = t.apply(slots, arr(0, 0, 0, 0), arr(3, 3, 3, 3))
    t.accept(slots, a, np.ones(4, bool), np.zeros(4, bool), arr(3, 3, 3, 3))
    assert not t.dirty.any()
    assert not t.unknown[slots].any()  # started at position 0: the engine cannot hold more
    t.restart(arr(2))
    assert t.snapshot(2)["n_rows"] == 0 and t.dirty.tolist() == [False, False, True, False]
    # forgotten: unknown and without owner, so its next round starts a new generation
    assert int(t.generation[2]) == 1 and int(t.owner[2]) == NO_OWNER and t.unknown[2] and t.n_unknown == 0
    t.mark_dirty(arr(0))
    assert t.dirty.tolist() == [True, False, True, False]
    t.mark_all_dirty()
    assert t.dirty.all() and held(t, 1) == [0, 1, 2]


def test_unknown_slot_drafts_from_what_it_saw_until_it_adopts_the_engines_range() -> None:
    """A new proxy (fresh table) meets requests deep into decoding: the engine's ring holds W = 8 rows
    of each, the model only this round's. Its entries go out with those rows (no RESYNC: nothing else is
    known), the slot is unknown; adopting the engine's staged window makes the model exact again."""
    t = SlotTable(4, 8)
    slots = arr(0, 1, 2)
    a = t.advance(slots, arr(7, 8, 9), arr(100, 50, 0), arr(2, 1, 3))
    assert a.n_unknown == 2 and t.n_unknown == 2  # slot 2 starts at position 0: the engine holds no more
    assert t.unknown[:3].tolist() == [True, True, False] and not a.resync.any()
    assert a.held_rows.tolist() == [2, 1, 3] and a.new_gen.all()
    t.announce(slots)
    # the engine's windows: slot 0 holds 94..101 (adopted, the range grows: dirty, resent whole);
    # slot 1's window ends elsewhere (not this round's): refused, still unknown
    assert not t.adopt(arr(0), arr(101), arr(101)).any()  # holds less than the model saw: refused
    got = t.adopt(arr(0, 1), arr(94, 40), arr(101, 48))
    assert got.tolist() == [True, False]
    assert held(t, 0) == list(range(94, 102)) and t.dirty[0] and not t.unknown[0]
    assert t.unknown[1] and not t.dirty[1] and t.n_unknown == 1
    assert not t.adopt(arr(0), arr(94), arr(101)).any()  # known slots are not adopted again
    # a window that does not cover what the model saw is refused; one longer than W keeps W
    assert not t.adopt(arr(1), arr(51), arr(50)).any()
    assert t.adopt(arr(1), arr(30), arr(50)).all() and held(t, 1) == list(range(43, 51))
    assert t.n_unknown == 0


def test_unknown_slot_is_known_without_a_window_when_the_engine_cannot_hold_more() -> None:
    t = SlotTable(4, 4)
    t.advance(arr(0, 1, 2), arr(1, 2, 3), arr(10, 20, 30), arr(1, 1, 1))
    assert t.n_unknown == 3
    a = t.advance(arr(0, 1, 2), arr(1, 2, 3), arr(11, 21, 31), arr(3, 0, 1))
    # slot 0 now holds W rows, slot 1 was cleared (the engine clears too); slot 2 holds 2 of up to 4
    assert t.unknown[:3].tolist() == [False, False, True] and a.n_unknown == 1 and t.n_unknown == 1
    t.advance(arr(2), arr(4), arr(0), arr(1))  # a real change of owner: the engine cleared it too
    assert not t.unknown[2] and t.n_unknown == 0
    t.restart(arr(0, 1, 2, 3))  # forgotten: unknown, but not in use until their next round
    assert t.unknown.all() and t.n_unknown == 0 and (t.owner == NO_OWNER).all()
    new = t.begin_requests(arr(0), arr(1))  # the same request goes on: a new generation, still unknown
    assert new.all() and t.unknown[0] and t.n_unknown == 1


@pytest.mark.parametrize(("slots", "req_ids", "fragment"), [
    (np.array([0, 1, 0]), None, "slot 0 appears more than once"),
    (np.array([0, 4]), None, "out of range"),
    (np.array([-1, 2]), None, "out of range"),
    (np.array([0, 1], dtype=np.int32), np.array([1, 1, 2]), "req_ids must be an array of shape (2,)"),
    (np.array([0, 1]), np.array([1, -3]), "negative request id"),
    (np.array([0, 1]), np.array([1.0, 2.0]), "req_ids must be integers"),
    (np.array([0.0]), None, "slots must be integers"),
    (np.zeros((1, 1), dtype=I64), None, "1-D"),
    (np.arange(5), None, "5 requests > max_slots 4"),
])
def test_validate_round_names_the_problem(slots, req_ids, fragment: str) -> None:
    reason = SlotTable(4, 8).validate_round(slots, req_ids)
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("slots", [np.array([3, 0, 2], dtype=I64), np.array([1, 2], dtype=np.uint8),
                                   np.zeros(0, dtype=I64)])
def test_validate_round_accepts_good_rounds(slots: np.ndarray) -> None:
    t = SlotTable(4, 8)
    assert t.validate_round(slots, np.arange(len(slots), dtype=I64)) is None
    assert t.validate_round(slots) is None  # and again: the scratch marks from the last call do not leak


def test_constructor_refuses_empty_shapes() -> None:
    with pytest.raises(ValueError, match="max_slots"):
        SlotTable(0, 8)
    with pytest.raises(ValueError, match="window"):
        SlotTable(4, 0)


# ---------------------------------------------------------------------------- the property test

M = 6
ACTIONS = ("decode", "decode", "decode", "chunk", "long_chunk", "new", "rewind", "clear", "move", "random")


@st.composite
def window_size(draw) -> int:
    return draw(st.sampled_from([1, 2, 3, 5, 8]))


def _draw_round(data, ref: RefRing, next_req: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """One engine step's batch, drawn against the reference's state so that decode continues, prefill
    chunks follow, and rewinds go back, as they would in an engine."""
    W = ref.W
    n = data.draw(st.integers(0, M), label="n")
    slots = data.draw(st.permutations(range(M)), label="slot order")[:n]
    in_round = set(slots)
    used: set[int] = set()

    def fresh() -> int:
        next_req[0] += 1
        return next_req[0]

    req_ids, first_pos, valid = [], [], []
    for s in slots:
        action, a, b = data.draw(st.tuples(st.sampled_from(ACTIONS), st.integers(1, 2 * W + 2),
                                           st.integers(0, 40)), label=f"slot {s}")
        sl = ref.slots[s]
        last = sl.owner if sl.owner != NO_OWNER else sl.forgotten  # a forgotten request may go on
        owner = last if last != NO_OWNER and last not in used else None
        nxt = sl.truth[-1] + 1 if sl.truth else b
        if action == "move":
            donors = [ref.slots[o].owner for o in range(M) if o not in in_round
                      and ref.slots[o].owner not in (NO_OWNER, *used)]
            owner = donors[b % len(donors)] if donors else None
            action = "chunk"
        if action == "new" or owner is None:
            r, start, length = fresh(), b % 3 * 7, a
            fp, v = start + max(0, length - W), min(length, W)
        elif action == "decode":  # 1..N+1 accepted tokens with N = 4
            r, fp, v = owner, nxt, 1 + a % 5
        elif action == "chunk":
            r, fp, v = owner, nxt, min(a, W)
        elif action == "long_chunk":  # longer than W: only the last W rows are sent
            r, fp, v = owner, nxt + a, W
        elif action == "rewind":  # preempted, recomputed from an earlier position
            r, fp, v = owner, b % nxt if nxt else 0, min(a, W)
        elif action == "clear":
            r, fp, v = owner, nxt, -(b % 2)
        else:  # anything at all, including more than W rows
            r = owner if b % 2 else fresh()
            fp, v = b, a - 2
        used.add(r)
        req_ids.append(r)
        first_pos.append(fp)
        valid.append(v)
    return slots, req_ids, first_pos, valid


@pytest.mark.timeout(180)  # 300 examples: 17 s at load 1.6 on 2 cores, over 60 s at load ~6 (a bound on hangs, not speed)
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(W=window_size(), data=st.data())
def test_model_matches_reference_under_random_rounds(W: int, data) -> None:
    t, ref = SlotTable(M, W), RefRing(M, W)
    next_req = [0]
    n_rounds = data.draw(st.integers(1, 30), label="rounds")
    prev_gen = t.generation.copy()
    for _ in range(n_rounds):
        slots_l, req_l, fp_l, v_l = _draw_round(data, ref, next_req)
        slots, req_ids, first_pos, valid = arr(*slots_l), arr(*req_l), arr(*fp_l), arr(*v_l)
        assert t.validate_round(slots, req_ids) is None

        new = t.begin_requests(slots, req_ids)
        want_new = [ref.slots[s].owner != r for s, r in zip(slots_l, req_l, strict=True)]
        anchors = t.apply(slots, first_pos, valid)
        ref_anchors = ref.round(slots_l, req_l, fp_l, v_l)
        assert new.tolist() == want_new
        assert anchors.tolist() == ref_anchors
        assert_same(t, ref)
        assert (t.generation >= prev_gen).all()
        prev_gen = t.generation.copy()

        # window / rows_for_anchor at the round's anchors and at arbitrary ones, for every slot
        probe_slots = np.arange(M, dtype=I64)
        probe_anchor = arr(*data.draw(st.lists(st.integers(-1, 60), min_size=M, max_size=M), label="probes"))
        for s_arr, a_arr in ((slots, anchors), (probe_slots, probe_anchor)):
            first, n_rows = t.window(s_arr, a_arr)
            want = [ref.window(int(s), int(a)) for s, a in zip(s_arr, a_arr, strict=True)]
            assert list(zip(first.tolist(), n_rows.tolist(), strict=True)) == want
            assert t.rows_for_anchor(s_arr, a_arr).tolist() == [k for _, k in want]

        p = t.plan(slots, first_pos, valid, anchors)
        want_plan = [ref.plan(s, fp, v, a) for s, fp, v, a in zip(slots_l, fp_l, v_l, ref_anchors, strict=True)]
        got_plan = list(zip(p.new_gen.tolist(), p.resync.tolist(), p.first.tolist(), p.n_rows.tolist(), strict=True))
        assert got_plan == want_plan
        assert p.generation.tolist() == [ref.slots[s].generation for s in slots_l]

        # what happens to the round next: a reply, a failed round, or a connection/lost-claim event
        fate = data.draw(st.sampled_from(["reply", "reply", "failed", "all_dirty", "restart", "adopt", "none"]),
                         label="fate")
        n = len(slots_l)
        if fate == "reply":
            usable = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="usable")
            partial = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="partial")
            wrows = data.draw(st.lists(st.integers(0, W + 1), min_size=n, max_size=n), label="worker rows")
            t.accept(slots, anchors, np.array(usable, dtype=bool), np.array(partial, dtype=bool), arr(*wrows))
            for s, a, u, pa, w in zip(slots_l, ref_anchors, usable, partial, wrows, strict=True):
                ref.accept(s, a, u, pa, w)
        elif fate == "failed":
            t.mark_dirty(slots)
            for s in slots_l:
                ref.slots[s].dirty = True
        elif fate == "all_dirty":
            t.mark_all_dirty()
            for sl in ref.slots:
                sl.dirty = True
        elif fate == "restart":
            t.restart(slots)
            for s in slots_l:
                ref.restart(s)
        elif fate == "adopt":  # the engine staged the round's windows after writing its rows
            truths = [ref.slots[s].truth for s in slots_l]
            lo, hi = arr(*[tr[0] if tr else 0 for tr in truths]), arr(*[tr[-1] if tr else -1 for tr in truths])
            assert t.adopt(slots, lo, hi).tolist() == [ref.adopt(s) for s in slots_l]
        assert_same(t, ref)
