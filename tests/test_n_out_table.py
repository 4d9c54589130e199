"""`--n-out-table` end to end: the proxy CLI with the in-process integrity worker, the real shim, the
simulated engine. The number of drafts a request gets follows the table entry for its batch size, and
an entry of 0 means all N (the flag's help), not one."""

from __future__ import annotations

import numpy as np
import pytest

import engine_shim
from dspark_proxy.ops.launch import spawn_proxy
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(120)

M, N, W, B = 8, 4, 8, 64
LAYOUT = ["--max-reqs", str(M), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(B)]
TABLE = (0, 0, 0, 1, 0, 3)  # n <= 2 and n = 4: all N; n = 3: one draft; n >= 5: three


def test_n_out_table_follows_the_batch_size_and_zero_means_all(seg_name):
    proxy = spawn_proxy(seg_name, "inproc", *LAYOUT, "--deadline-ms", "200",
                        "--n-out-table", ",".join(map(str, TABLE)))
    shim = engine_shim.attach(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=5.0)
    seen: dict[int, set[int]] = {}

    def check(batch, reply):
        ok = np.flatnonzero(reply.ok_mask)
        if not ok.shape[0]:
            return
        n = int(reply.n)
        want = TABLE[min(n, len(TABLE) - 1)] or N
        got = (reply.draft_ids[ok] >= 0).sum(axis=1)
        assert (got == want).all(), f"n={n}: drafts per request {got.tolist()}, the table says {want}"
        seen.setdefault(min(n, len(TABLE) - 1), set()).update(got.tolist())

    try:
        # few arrivals and short outputs: batch sizes wander over the whole table
        sim = SimEngine(SimConfig(seed=3, max_reqs=M, num_spec=N, window=W, row_bytes=B, arrivals_per_round=0.15,
                                  output_len=(8, 40)))
        res = sim.run(shim, rounds=400, on_round=check)
        assert res.wrong_drafts == 0 and res.usable_rate > 0.9, res.to_dict()
        # every row of the table was exercised (the sim's batch sizes vary)
        assert seen.get(3) == {1} and seen.get(4) == {N} and seen.get(5) == {3}, seen
    finally:
        shim.close()
        proxy.stop()
