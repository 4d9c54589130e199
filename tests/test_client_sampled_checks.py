"""Sampled-mode reply fields are checked by the client before use: a worker whose
drafter writes a NaN q, a q over 1, a support summing past 1, an id outside the vocabulary its WELCOME
announced, or a draft outside its own support gets a `bad_reply` (a target-only round), counted by
cause, and the next good reply on the same connection is used as usual."""

from __future__ import annotations

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker import server as server_mod

pytestmark = pytest.mark.timeout(60)

N, W, RB, M = 4, 4, 16, 4
VOCAB = 1000


class VocabDrafter:
    """Sampled drafts inside a 1000-token vocabulary (draft = slot-ish index + j, support = draft + k,
    q one-hot), spoiled by `spoil(out, idx)` while it is set."""

    name = "test"
    vocab_size = VOCAB

    def __init__(self) -> None:
        self.spoil = None

    def draft(self, items, out) -> None:
        idx = np.array([it.index for it in items])
        ids = (idx[:, None] * 7 + np.arange(N)[None, :]) % VOCAB
        out.draft_ids[idx] = ids
        out.confidence[idx] = 0.5
        out.sampled_mask[idx] = 1
        out.support_ids[idx] = (ids[:, :, None] + np.arange(wire.TOP_K)) % VOCAB
        out.proposal_q[idx] = 0
        out.proposal_q[idx, :, 0] = 1.0
        if self.spoil is not None:
            self.spoil(out, idx)


def _nan(out, idx):
    out.proposal_q[idx[0], 1, 0] = np.nan


def _over_one(out, idx):
    out.proposal_q[idx[0], 0, 0] = 1.25


def _sum_over_one(out, idx):
    out.proposal_q[idx[0], 2, 1] = 0.2


def _out_of_vocab(out, idx):
    out.support_ids[idx[0], 3, 9] = VOCAB + 1


def _not_in_support(out, idx):
    out.draft_ids[idx[0], 1] = (out.draft_ids[idx[0], 1] + 40) % VOCAB


@pytest.fixture
def sampled_pair(monkeypatch):
    drafter = VocabDrafter()
    monkeypatch.setattr(server_mod, "make_drafter", lambda *a, **k: drafter)
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=M, sampled=True)
    srv.start()
    c = TcpDraftClient("127.0.0.1", srv.port, max_reqs=M, num_spec=N, window=W, row_bytes=RB, sampled=True,
                    backoff_s=(0.01, 0.05))
    c.start()
    yield srv, c, drafter
    c.stop()
    srv.stop()


def _step(c: TcpDraftClient, prefix: bytearray, t: int):
    """Two requests, each a fresh window of 2 rows, sampled at temperature 1."""
    e = wire.entries_view(prefix, 2)
    for i in range(2):
        e[i] = (i, 2, t, 0, 2, 5, wire.RF_NEED_DRAFT | wire.RF_NEW_GEN, 0, 0, 0)
    meta = wire.sample_view(prefix, 2)
    meta["seed"] = [1, 2]
    meta["temperature"] = 1.0
    rows = np.zeros((4, RB), np.uint8)
    return c.step(prefix, e, 4, step_id=t, step_flags=wire.SF_SAMPLED, epoch=c.connection_epoch(), rows=[rows],
                  sample_meta=meta, timeout_s=2.0)


@pytest.mark.parametrize("spoil,counter", [
    (_nan, "bad_reply_proposal_q"), (_over_one, "bad_reply_proposal_q"), (_sum_over_one, "bad_reply_q_sum"),
    (_out_of_vocab, "bad_reply_support_id"), (_not_in_support, "bad_reply_draft_support"),
])
def test_bad_sampled_fields_are_refused_and_counted(sampled_pair, spoil, counter):
    srv, c, drafter = sampled_pair
    assert c.wait_ready(5) == 1
    assert getattr(c.welcome, "vocab_size", VOCAB) == VOCAB
    prefix = bytearray(wire.step_prefix_bytes(M, True))
    good = _step(c, prefix, 1)
    assert good.ok and good.reply.sampled_mask.tolist() == [1, 1]
    drafter.spoil = spoil
    bad = _step(c, prefix, 2)
    assert not bad.ok and bad.reason == "bad_reply" and bad.reply is None
    assert c.counters[counter] == 1 and c.counters["bad_replies"] == 1
    drafter.spoil = None
    again = _step(c, prefix, 3)  # the stream is in sync: the next good reply is used
    assert again.ok and np.isfinite(again.reply.proposal_q).all()
    assert c.connection_epoch() == 1
