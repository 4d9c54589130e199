"""Every reply says exactly what to use: n_drafts per request, -1 / 0 past it, nothing stale,
through the real shim, round and page, with the in-process integrity worker (tests/rig.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy import wire
from dspark_proxy.link.draft_client import StepOutcome
from dspark_proxy.round.core import RoundSettings
from dspark_proxy.round.ndrafts import leading_drafts
from dspark_proxy.shm.layout import STATUS_OK, STATUS_SOME_FAILED, SUPPORT_K
from engine_shim.reply import Reply
from tests.rig import Rig, ScriptedClient

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 4, 4, 16


def _usable_prefix_ok(reply) -> None:
    """The contract itself: ids[:n_drafts] are drafts, everything past them -1 / 0, ok_mask = n_drafts > 0."""
    nd = np.asarray(reply.n_drafts)
    assert nd.dtype == np.int32 and nd.shape == (reply.n,)
    assert ((nd >= 0) & (nd <= N)).all()
    past = np.arange(N)[None, :] >= nd[:, None]
    assert (reply.draft_ids[~past] >= 0).all()
    assert (reply.draft_ids[past] == -1).all() and (reply.confidence[past] == 0).all()
    assert np.array_equal(np.asarray(reply.ok_mask), nd > 0)
    if reply.sample_mask is not None:
        assert (reply.support_ids[past] == -1).all() and (reply.proposal_q[past] == 0).all()
        assert not np.asarray(reply.sample_mask)[nd == 0].any()


@pytest.mark.parametrize("n_out", [1, 2, 3])
def test_n_out_below_n_gives_n_drafts_n_out_and_minus_one_beyond(seg_name, n_out):
    with Rig(seg_name, M=M, N=N, W=W, B=B, settings=RoundSettings(n_out_table=(n_out,))) as rig:
        for _ in range(3):
            reply, b = rig.round([(1, 0, 1), (2, 3, 2)])
            assert reply.status == STATUS_OK
            assert reply.n_drafts.tolist() == [n_out, n_out] and reply.ok_mask.all()
            assert (reply.draft_ids[:, n_out:] == -1).all() and (reply.confidence[:, n_out:] == 0).all()
            _usable_prefix_ok(reply)


def test_all_n_by_default(seg_name):
    with Rig(seg_name, M=M, N=N, W=W, B=B) as rig:
        reply, b = rig.round([(1, 0, 1), (2, 3, 2)])
        assert reply.n_drafts.tolist() == [N, N] and rig.check_drafts(reply, b) == 2
        _usable_prefix_ok(reply)


def test_a_request_without_drafts_carries_minus_one(seg_name):
    with Rig(seg_name, M=M, N=N, W=W, B=B) as rig:
        rig.round([(1, 0, 2), (2, 1, 2), (3, 2, 2)])
        reply, b = rig.round([(1, 0, 1), (2, 1, 0), (3, 2, 1)])  # request 2 sends no rows: no entry
        assert reply.status == STATUS_SOME_FAILED
        assert reply.n_drafts.tolist() == [N, 0, N] and reply.ok_mask.tolist() == [True, False, True]
        assert (reply.draft_ids[1] == -1).all() and (reply.confidence[1] == 0).all()
        _usable_prefix_ok(reply)
        b["need_draft"] = np.array([True, False, True])  # one request that needs none: also cleared
        rig.t += 1
        rig.shim.enqueue(rig.t, **rig.batch([(1, 0, 1), (2, 1, 1), (3, 2, 1)]) | {"need_draft": b["need_draft"]})
        rig.core.handle(rig.t, 0.0)
        reply = rig.shim.read_reply(rig.t)
        assert reply.n_drafts.tolist() == [N, 0, N] and (reply.draft_ids[1] == -1).all()
        _usable_prefix_ok(reply)


class _Edited(ScriptedClient):
    """The in-process worker, its reply's draft ids then edited by `edit(ids)` (a buggy worker)."""

    edit = None

    def step(self, prefix, entries, n_rows, **kw):
        out = super().step(prefix, entries, n_rows, **kw)
        if out.ok and self.edit is not None:
            self.edit(out.reply.draft_ids)
        return out


def test_a_minus_one_from_the_worker_is_never_counted(seg_name):
    rig = Rig(seg_name, M=M, N=N, W=W, B=B, client=_Edited(max_reqs=M, num_spec=N, window=W, row_bytes=B))

    def edit(ids):
        ids[0, 2] = -1  # a hole: drafts 0, 1 usable, 3 not (it follows a -1)
        ids[1, 0] = -1  # nothing usable
    rig.client.edit = edit
    try:
        reply, _ = rig.round([(1, 0, 1), (2, 1, 1), (3, 2, 1)])
        assert reply.n_drafts.tolist() == [2, 0, N]
        assert reply.status == STATUS_SOME_FAILED
        assert (reply.draft_ids[0, 2:] == -1).all() and (reply.draft_ids[1] == -1).all()
        _usable_prefix_ok(reply)
    finally:
        rig.close()


class _Sampled(ScriptedClient):
    """The in-process worker with the integrity drafter's sampled sections; `fail` lists entry indices
    answered with a failed status (their ids -1) this step."""

    fail: tuple[int, ...] = ()

    def step(self, prefix, entries, n_rows, **kw):
        out = super().step(prefix, entries, n_rows, **kw)
        if not out.ok:
            return out
        r = out.reply
        k = r.status.shape[0]
        for i in self.fail:
            r.status[i] = wire.RS_INTERNAL  # a not-usable status
            r.draft_ids[i] = -1
        hid = r.draft_ids.astype(np.int64)
        sup = ((hid[:, :, None] + np.arange(SUPPORT_K)) & 0x7FFFFFFF).astype(np.int32)
        sup[hid < 0] = -1
        q = np.zeros(sup.shape, np.float32)
        q[:, :, 0] = np.where(hid >= 0, 1.0, 0.0)
        r.sampled_mask, r.support_ids, r.proposal_q = np.ones(k, np.uint8), sup, q
        return StepOutcome(True, None, r, out.rtt_us)


def test_sampled_fields_of_requests_without_drafts_are_cleared_every_round(seg_name):
    client = _Sampled(max_reqs=M, num_spec=N, window=W, row_bytes=B)
    with Rig(seg_name, M=M, N=N, W=W, B=B, R=2, sampled=True, settings=RoundSettings(n_out_table=(3,)),
             client=client) as rig:
        reqs = [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
        seeds = dict(seed=np.array([1, 2, 3]), temperature=np.ones(3, np.float32))
        for t, fail, expect in ((1, (), [3, 3, 3]), (2, (1,), [3, 0, 3]), (3, (0, 2), [0, 3, 0]),
                                (4, (), [3, 3, 3])):
            client.fail = fail
            reply = rig.run({**rig.batch(reqs), **seeds})
            assert reply.n_drafts.tolist() == expect, t
            none = np.asarray(expect) == 0
            assert (reply.support_ids[none] == -1).all() and (reply.proposal_q[none] == 0).all(), t
            assert not reply.sample_mask[none].any() and (reply.draft_ids[none] == -1).all(), t
            assert (reply.support_ids[~none][:, 3:] == -1).all() and (reply.proposal_q[~none][:, 3:] == 0).all()
            assert (reply.proposal_q[~none][:, :3, 0] == 1).all()
            _usable_prefix_ok(reply)


def test_a_page_with_n_drafts_over_n_is_not_trusted(seg_name):
    with Rig(seg_name, M=M, N=N, W=W, B=B) as rig:
        rig.round([(1, 0, 1)])
        b = rig.batch([(1, 0, 1)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **b)
        L = rig.seg.layout.reply
        orig = rig.core._publish  # the round binds flags.publish once (round/core.py)

        def publish(t, page):
            page[L.o_ok] = N + 1
            return orig(t, page)
        rig.core._publish = publish
        rig.core.handle(rig.t, 0.0)
        reply = rig.shim.read_reply(rig.t)
        assert reply.status == 2 and reply.reason == "bad_page" and reply.n_drafts.tolist() == [0]


def test_leading_drafts():
    ids = np.array([[1, 2, 3, 4], [1, -1, 3, 4], [-1, 2, 3, 4], [1, 2, 3, -1]], np.int32)
    assert leading_drafts(ids, 4).tolist() == [4, 1, 0, 3]
    assert leading_drafts(ids, 2).tolist() == [2, 1, 0, 2]
    assert leading_drafts(ids[:1], 4) is None and leading_drafts(ids[:0], 4) is None


def test_a_reply_built_by_hand_gets_n_drafts():
    ids = np.array([[5, 6, -1], [7, 8, 9]], np.int32)
    r = Reply(1, 1, 2, np.array([True, False]), ids, np.zeros((2, 3), np.float32))
    assert r.n_drafts.tolist() == [2, 0]
