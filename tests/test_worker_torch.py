"""The torch drafter: deterministic drafts from seeded weights, the n_out cut, sampled-mode support
and q, a weights file round trip, service through the worker, and torch never imported otherwise."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.worker import DraftItem, WorkerServer, make_drafter
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(60)

N, W, RB = 4, 8, 64


def _items(rng, n=3, temperature=0.0):
    out = []
    for i in range(n):
        w = int(rng.integers(1, W + 1))
        rows = rng.integers(0, 256, (w, RB), dtype=np.uint8)
        segs = [rows[: w // 2], rows[w // 2:]] if w > 1 else [rows]
        out.append(DraftItem(i, int(rng.integers(0, 50000)), 100 + i, w, 0 if i else 2, segs, seed=i,
                             temperature=temperature))
    return out


def _run(drafter, items, flags=wire.SF_WANT_MARGIN):
    out = wire.ReplyWriter(len(items), N, flags)
    drafter.draft(items, out)
    return out


def test_deterministic_and_seeded():
    a = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=1)
    b = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=1)
    c = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=2)
    items = _items(np.random.default_rng(0))
    ra, rb, rc = _run(a, items), _run(b, items), _run(c, items)
    assert np.array_equal(ra.draft_ids, rb.draft_ids) and np.array_equal(ra.confidence, rb.confidence)
    assert not np.array_equal(ra.draft_ids, rc.draft_ids)
    # n_out = 2 for item 0: the rest is cut
    assert (ra.draft_ids[0, 2:] == -1).all() and (ra.confidence[0, 2:] == 0).all()
    live = ra.draft_ids >= 0
    assert (ra.draft_ids[live] < 4096).all()
    assert ((ra.confidence[live] > 0) & (ra.confidence[live] <= 1)).all()
    assert ((ra.margin[live] >= 0) & (ra.margin[live] <= ra.confidence[live])).all()


def test_sampled_support_and_q():
    d = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=3)
    items = _items(np.random.default_rng(5), temperature=0.9)
    items[1].temperature = 0.0  # greedy request: no proposal
    r = _run(d, items, wire.SF_SAMPLED)
    assert r.sampled_mask.tolist() == [1, 0, 1]
    for i in (0, 2):
        k = 2 if i == 0 else N
        q = r.proposal_q[i, :k]
        assert np.allclose(q.sum(-1), 1.0, atol=1e-5) and (q >= 0).all()
        for j in range(k):
            assert r.draft_ids[i, j] in r.support_ids[i, j]  # the draft was drawn from the support
    r2 = _run(d, items, wire.SF_SAMPLED)
    assert np.array_equal(r.draft_ids, r2.draft_ids)  # seeded sampling replays


def test_weights_file_round_trip(tmp_path):
    import torch

    a = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=7)
    path = tmp_path / "head.pt"
    torch.save(a.state_dict(), path)
    b = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=99, weights=str(path))
    items = _items(np.random.default_rng(1))
    assert np.array_equal(_run(a, items).draft_ids, _run(b, items).draft_ids)


def test_served_by_the_worker():
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=4, drafter="torch")
    srv.start()
    lay = wire.WireLayout(N, W, RB, 4)
    peer = RawPeer(srv.port, lay)
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        e = make_entries([dict(slot=0, first_pos=0, n_rows=3, generation=1, flags=3, anchor_token=5),
                          dict(slot=1, first_pos=0, n_rows=2, generation=1, flags=3, anchor_token=6)])
        r = peer.step(e, np.random.default_rng(0).integers(0, 256, (5, RB), dtype=np.uint8), 1)
        assert r.status.tolist() == [wire.RS_PARTIAL_WINDOW] * 2
        assert ((r.draft_ids >= 0) & (r.draft_ids < 4096)).all()
    finally:
        peer.close()
        srv.stop()


def test_torch_is_not_imported_unless_chosen():
    code = ("import sys, dspark_proxy.worker, dspark_proxy.client, dspark_proxy.commands.worker;"
            "from dspark_proxy.worker import WorkerServer;"
            "s = WorkerServer('127.0.0.1', 0, num_spec=2, window=2, row_bytes=8, max_reqs=2); s.start(); s.stop();"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
