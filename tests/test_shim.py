"""engine_shim.Shim on the engine thread: input validation (nothing written on bad input), the input
types it accepts, detached rounds, rounds whose rows exceed max_rows, Reply.to_torch, close().

Most tests go through tests/rig.py: a real segment, the real RoundCore and the real Shim in one thread,
so the hand-off code runs for real while every step is deterministic.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from dspark_proxy.shm.layout import META_SLOTS, LayoutParams, State, Word
from dspark_proxy.shm.segment import Segment
from engine_shim import Reply, Shim, ShimError
from engine_shim.attach import AttachState
from tests.rig import Rig, row_of

pytestmark = pytest.mark.timeout(30)

M, N, W, B = 8, 3, 4, 16


@pytest.fixture
def rig(seg_name):
    r = Rig(seg_name, M=M, N=N, W=W, B=B)
    yield r
    r.close()


def _state(rig: Rig) -> tuple:
    """Everything enqueue could write: the whole segment, the engine ring, the shim's round counters."""
    shim, tab = rig.shim, rig.shim.ring.table
    return (bytes(rig.seg.mm), shim.ring.rows.tobytes(),
            tuple(getattr(tab, k).tobytes() for k in ("owner", "generation", "lo", "hi")),
            shim._t, shim._n, shim._round_attached, dict(shim.counters.snapshot().get("counters", {})))


def _good(rig: Rig, reqs=((1, 0, 2), (2, 3, 1), (3, 5, 4))) -> dict:
    """A valid batch for the next round, without moving the rig's positions (a bad copy may be refused)."""
    pos = dict(rig.pos)
    b = rig.batch(list(reqs))
    rig.pos = pos
    return b


def _replace(**kw):
    return lambda b: {**b, **kw}


def _bad_rows_f16(b):
    rows = b["rows"].view(np.float16)  # [R, B/2]: a valid view ...
    return {**b, "rows": rows[:, :-1].copy()}  # ... but a row of B - 2 bytes


BAD = {
    "slots_2d": lambda b: {**b, "slots": b["slots"].reshape(1, -1)},
    "slots_not_numbers": lambda b: {**b, "slots": np.array(["a", "b", "c"])},
    "slots_more_than_max_reqs": lambda b: {**b, "slots": np.arange(M + 1)},
    "slot_out_of_range": lambda b: {**b, "slots": np.array([0, 3, M])},
    "slot_negative": lambda b: {**b, "slots": np.array([0, -1, 5])},
    "duplicate_slots": lambda b: {**b, "slots": np.array([0, 3, 3])},
    "valid_shape": lambda b: {**b, "valid": b["valid"][:2]},
    "first_pos_shape": lambda b: {**b, "first_pos": np.zeros(4, np.int64)},
    "anchor_shape": lambda b: {**b, "anchor": b["anchor"].reshape(3, 1)},
    "k_window_shape": lambda b: {**b, "k_window": np.zeros(2, np.int64)},
    "need_draft_shape": lambda b: {**b, "need_draft": np.ones(4, bool)},
    "qsl_shape": lambda b: {**b, "qsl": b["qsl"][:-1]},
    "qsl_decreasing": lambda b: {**b, "qsl": np.array([0, 2, 1, 3])},
    "valid_over_window": lambda b: {**b, "valid": np.array([2, 1, W + 1])},
    "valid_negative": lambda b: {**b, "valid": np.array([2, -1, 4])},
    "first_pos_negative": lambda b: {**b, "first_pos": np.array([0, -5, 0])},
    "k_window_negative": lambda b: {**b, "k_window": np.array([0, -1, 0])},
    "req_ids_shape": lambda b: {**b, "req_ids": b["req_ids"][:2]},
    "req_ids_negative": lambda b: {**b, "req_ids": np.array([1, -2, 3])},
    "str_req_ids_too_many": lambda b: {**b, "req_ids": ["a", "b", "c", "d"]},
    "str_req_ids_too_few": lambda b: {**b, "req_ids": ["a", "b"]},
    "rows_count": lambda b: {**b, "rows": b["rows"][:-1]},
    "rows_width": lambda b: {**b, "rows": np.zeros((b["rows"].shape[0], B + 1), np.uint8)},
    "rows_1d": lambda b: {**b, "rows": b["rows"].reshape(-1)},
    "rows_3d": lambda b: {**b, "rows": b["rows"].reshape(-1, 2, B // 2)},
    "rows_f16_wrong_width": _bad_rows_f16,
    "rows_torch_wrong_width": lambda b: {**b, "rows": torch.zeros(b["rows"].shape[0], B // 2 + 1,
                                                                 dtype=torch.bfloat16)},
    "rows_torch_count": lambda b: {**b, "rows": torch.from_numpy(b["rows"][1:].copy())},
    "sampled_shape": lambda b: {**b, "sampled": np.zeros(2, bool)},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_costs_exactly_its_round(rig, case):
    """A bad input raises ShimError and writes none of itself (engine ring, staging), and round t is
    then in flight as failed, naming the input; the proxy skips it and round t+1 drafts as usual."""
    reply, b = rig.round([(1, 0, 2), (2, 3, 3)])  # attached, one round done
    assert reply.status == 0
    tab = rig.shim.ring.table
    ring_before = (rig.shim.ring.rows.tobytes(), tuple(getattr(tab, k).tobytes() for k in ("owner", "generation",
                                                                                          "lo", "hi")))
    staging_before = rig.seg.staging.tobytes()
    bad = BAD[case](_good(rig))
    with pytest.raises(ShimError) as ei:
        rig.shim.enqueue(2, **bad)
    assert isinstance(ei.value, ValueError)
    assert (rig.shim.ring.rows.tobytes(), tuple(getattr(tab, k).tobytes() for k in ("owner", "generation", "lo",
                                                                                     "hi"))) == ring_before
    assert rig.seg.staging.tobytes() == staging_before, "enqueue staged rows of a refused input"
    rig.core.handle(2, 0.0)  # the proxy finds round 2 failed already: nothing applied, nothing sent
    failed = rig.shim.read_reply(2)
    assert failed.status == 2 and failed.reason.startswith("bad_input: ") and not failed.ok_mask.any()
    rig.t = 2
    reply, b = rig.round([(1, 0, 2), (2, 3, 1), (3, 5, 4)])
    assert reply.status in (0, 1) and rig.check_drafts(reply, b) >= 1


@pytest.mark.parametrize("t", [0, 1, 3, -1])
def test_t_must_be_the_next_round(rig, t):
    rig.round([(1, 0, 2)])
    before = _state(rig)
    with pytest.raises(ShimError, match="next round is 2|numbered from 1"):
        rig.shim.enqueue(t, **_good(rig))
    assert _state(rig) == before


def test_first_round_below_one_refused(rig):
    with pytest.raises(ShimError, match="numbered from 1"):
        rig.shim.enqueue(0, **_good(rig))
    assert rig.shim.state is AttachState.PENDING  # not even attached: refused before the boundary


def test_enqueue_before_read_reply_refused(rig):
    rig.round([(1, 0, 2)])
    rig.shim.enqueue(2, **rig.batch([(1, 0, 1)]))
    rig.core.handle(2, 0.0)
    before = _state(rig)
    with pytest.raises(ShimError, match=r"read_reply\(2\) must come first"):
        rig.shim.enqueue(3, **_good(rig, [(1, 0, 1)]))
    assert _state(rig) == before
    assert rig.shim.read_reply(2).status == 0


def test_enqueue_before_read_reply_refused_while_detached(seg_name):
    """The engine's call order is checked whether or not a proxy is there: a bug in the engine must
    not go unnoticed until the day a proxy attaches."""
    with Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, start_watchdog=False) as shim:
        b = Rig.batch(_FakeRig(), [(1, 0, 2)])
        shim.enqueue(1, **b)
        with pytest.raises(ShimError, match=r"read_reply\(1\) must come first"):
            shim.enqueue(2, **Rig.batch(_FakeRig(), [(1, 0, 1)]))
        assert shim.read_reply(1).status == 2
        shim.enqueue(2, **Rig.batch(_FakeRig(), [(1, 0, 1)]))


def test_read_reply_of_another_round_refused(rig):
    rig.shim.enqueue(1, **rig.batch([(1, 0, 2)]))
    with pytest.raises(ShimError, match="round in flight is 1"):
        rig.shim.read_reply(2)


class _FakeRig:
    """Just enough of Rig for Rig.batch: a batch builder without a segment."""

    B = B

    def __init__(self) -> None:
        self.pos: dict[int, int] = {}


# ---------------------------------------------------------------------------------------- sampled


def test_sampled_segment_needs_seed_and_temperature(seg_name):
    p = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W, resync_per_round=2,
                     sampled=True)
    seg = Segment.create(seg_name, p, deadline_ms=1000.0)
    seg.set_word(Word.STATE, State.READY)
    shim = Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, sampled=True, start_watchdog=False)
    try:
        assert shim.offer(Segment.open(seg_name))
        b = Rig.batch(_FakeRig(), [(1, 0, 2), (2, 1, 1)])
        before = bytes(seg.mm)
        staging = seg.staging.tobytes()
        for t, kw in enumerate(({}, {"seed": np.array([1, 2])}, {"temperature": np.array([1.0, 0.5])},
                                {"seed": np.array([1]), "temperature": np.array([1.0, 0.5])},
                                {"seed": np.array([1, 2]), "temperature": np.array([1.0, 0.5, 0.2])}), 1):
            with pytest.raises(ShimError, match="seed|temperature"):
                shim.enqueue(t, **b, **kw)
            if t == 1:  # the refused round is the attach round: it goes through the segment, failed
                assert shim.attached and seg.word(Word.CLAIMED) == 1 and bytes(seg.mm) != before
            assert seg.staging.tobytes() == staging
            reason = shim.read_reply(t).reason
            assert reason.startswith("bad_input: ") and ("seed" in reason or "temperature" in reason), reason
        shim.enqueue(6, **b, seed=np.array([7, 8]), temperature=np.array([1.0, 0.5]))
        assert shim.attached
        m = seg.meta[6 % META_SLOTS]
        assert m["seed"][:2].tolist() == [7, 8]
        assert m["temperature"][:2].tolist() == [1.0, 0.5]
    finally:
        shim.close()
        seg.unlink()
        seg.close()


# ---------------------------------------------------------------------------------------- accepted inputs


def test_float16_rows_whose_row_is_row_bytes_are_accepted(rig):
    b = rig.batch([(1, 0, 3), (2, 1, 2)])
    f16 = b["rows"].view(np.float16)
    assert f16.shape == (5, B // 2)
    rig.t += 1
    rig.shim.enqueue(rig.t, **{**b, "rows": f16})
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == 0 and rig.check_drafts(reply, b) == 2
    assert np.array_equal(rig.client.sent_rows[-1][:5], b["rows"])  # what the proxy sent


def test_torch_inputs_accepted(rig):
    """Every field as a CPU tensor, rows as bf16 [R, H] (H * 2 == row_bytes): same drafts as numpy."""
    b = rig.batch([(1, 0, 3), (2, 4, 2), (3, 6, 1)])
    tb = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in b.items()}
    tb["rows"] = torch.from_numpy(b["rows"].copy()).view(torch.bfloat16)
    assert tb["rows"].dtype == torch.bfloat16 and tuple(tb["rows"].shape) == (6, B // 2)
    rig.t += 1
    rig.shim.enqueue(rig.t, **tb)
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == 0 and rig.check_drafts(reply, b) == 3
    assert np.array_equal(rig.client.sent_rows[-1][:6], b["rows"])  # what the proxy sent
    # a non-contiguous tensor (a transposed view) is accepted too
    b2 = rig.batch([(1, 0, 1), (2, 4, 1), (3, 6, 1)])
    rows_t = torch.from_numpy(b2["rows"].T.copy()).T  # same values, column-major
    assert not rows_t.is_contiguous()
    rig.t += 1
    rig.shim.enqueue(rig.t, **{**b2, "rows": rows_t})
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == 0 and rig.check_drafts(reply, b2) == 3


def _check_with_ids(rig: Rig, reply, b, ids: list[int]) -> int:
    return rig.check_drafts(reply, {**b, "req_ids": np.array(ids, np.int64)})


def test_string_request_ids(rig):
    """String ids map to stable small ids: the same string keeps its slot's window, a new string in the
    same slot starts a new generation (the proxy sees an owner change)."""
    r1 = rig.round([(1, 0, 3), (2, 1, 2)])
    # same requests by name: rig.batch uses 1 and 2 for the rows; the shim only sees the strings
    b = rig.batch([(1, 0, 1), (2, 1, 1)])
    rig.t += 1
    rig.shim.enqueue(rig.t, **{**b, "req_ids": ["req-a", "req-b"]})
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert r1[0].status == 0 and reply.status == 0
    gen_a = int(rig.core.slots.generation[0])
    b = rig.batch([(1, 0, 1), (2, 1, 1)])
    rig.t += 1
    rig.shim.enqueue(rig.t, **{**b, "req_ids": ["req-a", "req-b"]})
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == 0 and _check_with_ids(rig, reply, b, [1, 2]) == 2
    assert int(rig.core.slots.generation[0]) == gen_a  # same owner: same generation
    # a new request in slot 0 under a new name
    b = rig.batch([(9, 0, 2), (2, 1, 1)])
    rig.t += 1
    rig.shim.enqueue(rig.t, **{**b, "req_ids": ["req-c", "req-b"]})
    rig.core.handle(rig.t, 0.0)
    reply = rig.shim.read_reply(rig.t)
    assert reply.status == 0 and _check_with_ids(rig, reply, b, [9, 2]) == 2
    assert int(rig.core.slots.generation[0]) > gen_a


# ---------------------------------------------------------------------------------------- detached


def test_detached_read_reply_is_target_only_at_once(seg_name):
    with Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B) as shim:
        assert shim.state is AttachState.DETACHED and shim.segment is None
        fr = _FakeRig()
        for t in (1, 2, 3):
            b = Rig.batch(fr, [(1, 0, 2), (2, 1, 1), (3, 2, 1)])
            shim.enqueue(t, **b)
            reply = shim.read_reply(t)
            assert reply.t == t and reply.status == 2 and not reply.ok and reply.reason == "detached"
            assert reply.n == 3 and reply.ok_mask.shape == (3,) and not reply.ok_mask.any()
            assert reply.draft_ids.shape == (3, N) and reply.confidence.shape == (3, N)
        # the engine ring is kept even while detached (a later attach resyncs from it)
        assert np.array_equal(shim.ring.window_rows(0, 2, 4),  # positions 0..5 sent, the last W kept
                              np.stack([row_of(1, p, B) for p in range(2, 6)]))
        assert shim.counters.counter("rounds_detached") == 3


# ---------------------------------------------------------------------------------------- max_rows


def test_rows_beyond_max_rows_stage_nothing_and_are_resynced(seg_name):
    rig = Rig(seg_name, M=M, N=N, W=W, B=B, max_rows=6, R=2)
    try:
        reply, b = rig.round([(1, 0, 4), (2, 1, 4), (3, 2, 4), (4, 3, 1)])
        m = rig.seg.meta[1 % META_SLOTS]
        assert m["staged_rows"][:4].tolist() == [4, 0, 0, 0]  # 4 fit; then 8 > 6: nothing more this round
        assert int(m["rows_staged"]) == 4
        assert np.array_equal(rig.client.sent_rows[-1], b["rows"][:4])  # what the proxy sent
        assert reply.status == 1 and reply.ok_mask.tolist() == [True, False, False, False]
        assert rig.check_drafts(reply, b) == 1
        assert rig.stats.counter("requests_not_staged") == 3
        # the engine ring holds every request's rows all the same
        assert np.array_equal(rig.shim.ring.window_rows(1, 0, 4), b["rows"][4:8])
        full = {}
        for _ in range(6):  # decode: one row each; the proxy asks for windows, the engine stages them
            reply, b = rig.round([(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 3, 1)])
            assert rig.check_drafts(reply, b) == int(reply.ok_mask.sum())
            for i in np.flatnonzero(reply.ok_mask):
                if round(float(reply.confidence[i][0]) * W) == W:
                    full.setdefault(i, rig.t)
        assert set(full) == {0, 1, 2, 3}, full  # every request drafts from a full window again
        assert rig.shim.counters.counter("resync_windows_staged") >= 2
        assert rig.stats.counter("resync_rounds") >= 1
        assert reply.status == 0 and reply.ok_mask.all()
    finally:
        rig.close()


# ---------------------------------------------------------------------------------------- Reply, close


def test_reply_to_torch(rig):
    reply, b = rig.round([(1, 0, 2), (2, 3, 3)])
    tr = reply.to_torch()
    assert isinstance(tr, Reply) and (tr.t, tr.status, tr.n) == (reply.t, reply.status, reply.n)
    assert tr.ok_mask.dtype == torch.bool and tr.draft_ids.dtype == torch.int32
    assert tr.confidence.dtype == torch.float32 and tuple(tr.draft_ids.shape) == (2, N)
    assert torch.equal(tr.draft_ids, torch.from_numpy(reply.draft_ids))
    assert torch.equal(tr.confidence, torch.from_numpy(reply.confidence))
    assert tr.sample_mask is None and tr.support_ids is None and tr.proposal_q is None
    # shares memory on CPU: valid until the next read_reply, like the numpy views
    assert tr.draft_ids.data_ptr() == reply.draft_ids.ctypes.data
    assert reply.to_torch("cpu").draft_ids.device.type == "cpu"


def test_close_is_idempotent_and_abandons_the_segment(rig):
    rig.round([(1, 0, 2)])
    shim = rig.shim
    shim.close()
    assert shim.state is AttachState.CLOSED and shim.segment is None
    assert rig.seg.word(Word.ABANDONED) == 1  # the proxy starts a fresh incarnation
    shim.close()
    assert shim.state is AttachState.CLOSED
    with pytest.raises(ShimError, match="closed"):
        shim.enqueue(2, **_good(rig))


def test_context_manager_stops_the_watchdog(seg_name):
    with Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, look_every_s=0.01) as shim:
        assert shim.watchdog._thread.is_alive()
        snap = shim.stats()
        assert snap["state"] == "detached"
        json.dumps(snap)  # what status and the stats file print
    assert shim.state is AttachState.CLOSED
    assert not shim.watchdog._thread.is_alive()


def test_close_with_a_round_in_flight_is_prompt(seg_name):
    """An engine shutting down between enqueue and read_reply: close() must not sit out the round's
    deadline in the watchdog's join, nor leave the watchdog thread running."""
    seg = Segment.create(seg_name, LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W,
                                                resync_per_round=2), deadline_ms=5_000.0)
    seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
    seg.set_word(Word.STATE, State.READY)
    shim = Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, look_every_s=0.01)
    try:
        end = time.monotonic() + 5
        while shim.state is not AttachState.PENDING and time.monotonic() < end:
            time.sleep(0.005)
        shim.enqueue(1, **Rig.batch(_FakeRig(), [(1, 0, 2)]))
        assert shim.attached
        time.sleep(0.05)  # the watchdog is waiting for round 1 (5 s deadline)
        t0 = time.perf_counter()
        shim.close()
        assert time.perf_counter() - t0 < 0.5
        assert not shim.watchdog._thread.is_alive()
        assert seg.word(Word.ABANDONED) == 1 and seg.word(Word.PUBLISHED) >= 1
    finally:
        shim.close()
        seg.unlink()
        seg.close()
