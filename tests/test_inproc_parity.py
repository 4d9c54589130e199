"""The in-process worker serves a STEP exactly as the remote worker does (one serve loop, one
usability rule: worker/serve.py): the same statuses, window sizes, drafts and confidences for the
same steps, including entries that ask for no drafts, malformed entries, gaps and stale generations."""

from __future__ import annotations

import numpy as np
import pytest

import dspark_proxy.wire as wire
from dspark_proxy.worker import WorkerServer
from dspark_proxy.worker.inproc import InProcessClient
from dspark_proxy.worker.testing import RawPeer, make_entries

pytestmark = pytest.mark.timeout(30)

N, W, RB, MR = 3, 4, 16, 8
ND, NG = wire.RF_NEED_DRAFT, wire.RF_NEW_GEN
STEPS = [
    # slot 0 starts, slot 1 starts without asking for drafts, slot 2 continues a slot it never started
    [dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=NG | ND, anchor_token=5),
     dict(slot=1, first_pos=0, n_rows=3, generation=1, flags=NG, anchor_token=6),
     dict(slot=2, first_pos=4, n_rows=1, generation=1, flags=ND, anchor_token=7)],
    # slot 0 continues to a full window; slot 1 asks now; a bad entry (more than W rows); a duplicate slot
    [dict(slot=0, first_pos=2, n_rows=3, generation=1, flags=ND, anchor_token=8, n_out=2),
     dict(slot=1, first_pos=3, n_rows=1, generation=1, flags=ND, anchor_token=9),
     dict(slot=3, first_pos=0, n_rows=W + 1, generation=1, flags=NG | ND, anchor_token=1),
     dict(slot=0, first_pos=5, n_rows=1, generation=1, flags=ND, anchor_token=2)],
    # a gap on slot 0, a stale generation on slot 1 after a new one, a slot past max_reqs
    [dict(slot=0, first_pos=9, n_rows=1, generation=1, flags=ND, anchor_token=3),
     dict(slot=1, first_pos=0, n_rows=2, generation=3, flags=NG | ND, anchor_token=4),
     dict(slot=MR, first_pos=0, n_rows=1, generation=1, flags=NG | ND, anchor_token=4)],
    [dict(slot=1, first_pos=2, n_rows=1, generation=2, flags=ND, anchor_token=4)],
]


def test_inproc_and_remote_worker_answer_alike():
    layout = wire.WireLayout(num_spec=N, window=W, row_bytes=RB, max_reqs=MR)
    rng = np.random.default_rng(3)
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W, row_bytes=RB, max_reqs=MR)
    srv.start()
    inproc = InProcessClient(max_reqs=MR, num_spec=N, window=W, row_bytes=RB)
    peer = RawPeer(srv.port, layout)
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        for t, specs in enumerate(STEPS, start=1):
            e = make_entries(specs)
            rows = rng.integers(0, 256, (int(e["n_rows"].sum()), RB), dtype=np.uint8)
            remote = peer.step(e, rows, t)
            local = inproc.step(bytearray(), e, rows.shape[0], step_id=t, step_flags=0, epoch=inproc.epoch,
                                rows=[rows])
            assert local.ok, local.reason
            got = local.reply
            for field in ("status", "window_rows", "draft_ids", "confidence"):
                assert np.array_equal(getattr(got, field), getattr(remote, field)), (t, field, getattr(got, field),
                                                                                    getattr(remote, field))
        assert inproc.counters["bad_entries"] == srv.counters["bad_entries"] >= 3
    finally:
        peer.close()
        srv.stop()
