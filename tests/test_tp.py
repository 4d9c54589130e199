"""engine_shim.tp.broadcast_reply over a real torch.distributed group: gloo, two processes.

Each rank runs the same script of replies (ok, failed, sampled, a smaller round after a larger one,
a round number past 2**32, torch tensors on src, src = 1 over a subgroup, a malformed reply) and
sends back what it got; the test compares every rank's result with the reply rank `src` passed.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from datetime import timedelta

import numpy as np
import pytest

from dspark_proxy.shm.layout import SUPPORT_K, ReplyPageLayout
from engine_shim.reply import Reply, ReplyReader
from engine_shim.tp import payload_words

pytestmark = pytest.mark.timeout(120)

M, N = 8, 3


def _reply(case: str):
    """(reply, src, sampled) for a case, the same in every process."""
    rng = np.random.default_rng(len(case))
    if case == "ok":
        return Reply(7, 1, 3, np.array([True, False, True]), np.arange(9, dtype=np.int32).reshape(3, N),
                     np.linspace(0, 1, 9, dtype=np.float32).reshape(3, N)), 0, False
    if case == "failed":
        return ReplyReader(ReplyPageLayout(M, N)).failed(8, 5, "deadline"), 0, False
    if case == "smaller":  # after "ok": the buffer is reused, nothing of the larger round shows
        return Reply(9, 0, 1, np.array([True]), np.array([[11, 12, 13]], np.int32),
                     np.array([[0.5, 0.25, 0.125]], np.float32)), 0, False
    if case == "big_t":
        return Reply(2**40 + 3, 0, 2, np.ones(2, bool), np.full((2, N), 2**31 - 1, np.int32),
                     np.full((2, N), -0.0, np.float32), reason="x" * 40), 0, False
    if case == "sampled":
        n = 4
        return Reply(10, 1, n, np.array([True, True, False, True]),
                     rng.integers(0, 150_000, (n, N), dtype=np.int32),
                     rng.random((n, N), dtype=np.float32), np.array([True, False, False, True]),
                     rng.integers(0, 150_000, (n, N, SUPPORT_K), dtype=np.int32),
                     rng.random((n, N, SUPPORT_K), dtype=np.float32)), 0, True
    if case == "sampled_failed":
        return ReplyReader(ReplyPageLayout(M, N, True)).failed(11, 2, "proxy_hung"), 0, True
    if case == "full":
        return Reply(12, 0, M, np.ones(M, bool), rng.integers(-1, 99, (M, N), dtype=np.int32),
                     rng.random((M, N), dtype=np.float32)), 0, False
    if case == "src1":
        return Reply(13, 0, 2, np.array([False, True]), np.array([[1, 2, 3], [4, 5, 6]], np.int32),
                     np.ones((2, N), np.float32)), 1, False
    raise KeyError(case)


CASES = ["ok", "failed", "smaller", "big_t", "sampled", "sampled_failed", "full", "src1", "torch_on_src"]


def _dump(r) -> dict:
    def a(x):
        return None if x is None else np.array(np.asarray(x))

    return {"t": int(r.t), "status": int(r.status), "n": int(r.n), "reason": r.reason, "ok": a(r.ok_mask),
            "ids": a(r.draft_ids), "conf": a(r.confidence), "sm": a(r.sample_mask), "qids": a(r.support_ids),
            "q": a(r.proposal_q), "nd": a(r.n_drafts)}


def _rank_main(rank: int, init: str, q) -> None:
    import torch.distributed as dist

    from engine_shim.tp import broadcast_reply

    out: dict[str, dict] = {}
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=30))
        try:
            sub = dist.new_group([0, 1])
            for case in CASES:
                base = "ok" if case == "torch_on_src" else case
                reply, src, sampled = _reply(base)
                mine = reply if rank == src else None
                if case == "torch_on_src" and mine is not None:
                    mine = mine.to_torch()
                got = broadcast_reply(mine, group=sub if case == "src1" else None, src=src, num_spec=N,
                                      max_reqs=M, sampled=sampled)
                out[case] = _dump(got)
            # a malformed reply on src: src raises after broadcasting a failed round; nobody hangs
            bad = Reply(14, 0, 2, np.ones(2, bool), np.zeros((2, N + 1), np.int32), np.zeros((2, N), np.float32))
            try:
                got = broadcast_reply(bad if rank == 0 else None, num_spec=N, max_reqs=M)
                out["bad"] = _dump(got)
            except ValueError as e:
                out["bad"] = {"raised": str(e)}
            # src passing None: the same
            try:
                out["none"] = _dump(broadcast_reply(None, num_spec=N, max_reqs=M))
            except ValueError as e:
                out["none"] = {"raised": str(e)}
            # tp_round: rank 0's shim raising inside the block still broadcasts (a failed round of n)
            from engine_shim.shim import ShimError
            from engine_shim.tp import tp_round

            try:
                with tp_round(15, 3, num_spec=N, max_reqs=M) as r:
                    if rank == 0:
                        raise ShimError("valid: every value must be in [0, window=4]")
                out["tp_raise"] = _dump(r.reply)
            except ShimError as e:
                out["tp_raise"] = {"raised": str(e), **_dump(r.reply)}
            with tp_round(16, 3, num_spec=N, max_reqs=M) as r:
                if rank == 0:
                    r.reply = _reply("ok")[0]
            out["tp_ok"] = _dump(r.reply)
        finally:
            dist.destroy_process_group()
        q.put((rank, out, None))
    except BaseException:  # noqa: BLE001 - report to the parent, which fails the test
        q.put((rank, out, traceback.format_exc()))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    init = f"file://{tmp_path_factory.mktemp('pg')}/init"
    ctx = mp.get_context("spawn")  # a clean interpreter per rank: no forked torch thread pools
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, init, q), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    got: dict[int, dict] = {}
    try:
        for _ in procs:
            rank, out, err = q.get(timeout=90)
            assert err is None, f"rank {rank} failed:\n{err}"
            got[rank] = out
    except queue.Empty:
        pytest.fail("a rank did not finish within 90 s")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray) or isinstance(b[k], np.ndarray):
            assert a[k] is not None and b[k] is not None, k
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (k, a[k], b[k])
            assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), (k, a[k], b[k])  # bit for bit
        else:
            assert a[k] == b[k], (k, a[k], b[k])


@pytest.mark.parametrize("case", CASES)
def test_every_rank_gets_the_reply(results, case):
    want = _dump(_reply("ok" if case == "torch_on_src" else case)[0])
    if case == "big_t":
        want["reason"] = "x" * 32  # the reason travels in 32 bytes
    for rank in (0, 1):
        got = results[rank][case]
        if case == "big_t" and rank == _reply(case)[1]:
            got = {**got, "reason": got["reason"][:32]}  # src returns its own reply as is
        _same(got, want)


def test_failed_round_reads_as_target_only(results):
    for rank in (0, 1):
        r = results[rank]["failed"]
        assert r["status"] == 2 and r["n"] == 5 and not r["ok"].any() and r["reason"] == "deadline"
        assert (r["ids"] == -1).all() and (r["conf"] == 0).all()
        s = results[rank]["sampled_failed"]
        # a failed sampled round has every field, all off (as the shim's own failed replies)
        assert s["status"] == 2 and not s["sm"].any() and s["reason"] == "proxy_hung"
        assert (s["qids"] == -1).all() and (s["q"] == 0).all()


def test_sampled_extras_arrive(results):
    r = results[1]["sampled"]
    assert r["sm"].tolist() == [True, False, False, True]
    assert r["qids"].shape == (4, N, SUPPORT_K) and r["q"].dtype == np.float32


def test_malformed_reply_raises_on_src_and_fails_the_round_elsewhere(results):
    assert "do not match" in results[0]["bad"]["raised"]
    r = results[1]["bad"]
    assert r["t"] == 14 and r["status"] == 2 and r["n"] == 2 and not r["ok"].any()
    assert "must pass the reply" in results[0]["none"]["raised"]
    assert results[1]["none"]["status"] == 2 and results[1]["none"]["n"] == 0


def test_payload_is_one_page_sized_tensor():
    assert payload_words(M, N) == 16 + 2 + M + 2 * M * N
    assert payload_words(M, N, True) == payload_words(M, N) + M + 2 * M * N * SUPPORT_K


def test_tp_round_broadcasts_whatever_rank0_does(results):
    """Rank 0 raising inside tp_round (its shim rejected the round, say): rank 0 still gets its error,
    and rank 1 a failed round of n requests naming it, instead of waiting for the group's timeout."""
    r0, r1 = results[0]["tp_raise"], results[1]["tp_raise"]
    assert r0["raised"].startswith("valid:")
    for r in (r0, r1):
        assert r["t"] == 15 and r["status"] == 2 and r["n"] == 3 and not r["ok"].any()
        assert r["reason"].startswith("rank0: ShimError: valid")
    _same(results[1]["tp_ok"], _dump(_reply("ok")[0]))
