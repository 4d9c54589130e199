"""`--worker inproc` and `--worker null` with `--sampled`: the in-process workers
answer sampled rounds with the integrity drafter's own sampled sections (support draft + k, q one-hot,
for requests that sample), instead of every round failing with "sampled reply without its support ids
and q"."""

from __future__ import annotations

import numpy as np
import pytest

import engine_shim
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 4, 8, 64


@pytest.mark.parametrize("worker", ["inproc", "null"])
def test_in_process_workers_serve_sampled_rounds(seg_name, worker):
    shim = engine_shim.attach(seg_name, mode="thread", worker=worker, max_reqs=M, num_spec=N, window=W,
                              row_bytes=B, sampled=True, deadline_ms=1000.0, timeout_s=5.0)
    seen = {"sampled": 0, "greedy": 0, "rounds_ok": 0}

    def check(batch, reply) -> None:
        if int(reply.status) == 0:
            seen["rounds_ok"] += 1
        for i in np.flatnonzero(reply.ok_mask):
            ids = reply.draft_ids[i].astype(np.int64)
            if reply.sample_mask[i]:
                sup = reply.support_ids[i]
                assert np.array_equal(sup[:, 0], ids) and np.array_equal(sup[:, 3], (ids + 3) & 0x7FFFFFFF)
                assert np.all(reply.proposal_q[i][:, 0] == 1.0) and np.all(reply.proposal_q[i][:, 1:] == 0)
                seen["sampled"] += 1
            else:
                seen["greedy"] += 1

    try:
        sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B, sampled_mode=True))
        res = sim.run(shim, rounds=150, on_round=check)
        if worker == "inproc":  # real windows: every draft checked by the oracle
            assert res.wrong_drafts == 0 and res.usable_rate > 0.9, res.to_dict()
        assert seen["rounds_ok"] >= 140 and seen["sampled"] > 50, seen
        assert shim.stats()["counters"].get("replies_round_failed", 0) <= 10
    finally:
        shim.close()
