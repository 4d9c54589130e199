"""The torch drafter: deterministic drafts from seeded weights, the n_out cut, sampled-mode support
and q, a saved head with its manifest (dtype from the manifest, mismatches refused by field), the
per-slot caches, service through the worker, and torch never imported otherwise."""

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


def test_sampled_draws_follow_q_and_replay_by_seed_and_position():
    """Requests alike but for their seeds see one q at draft position 0: their draws must follow it
    (chi-square over the support, p >= 0.01), and a draw is a function of (seed, anchor position,
    position) alone, whatever else shares the round."""
    import torch

    d = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=3)
    rows = np.random.default_rng(9).integers(0, 256, (W, RB), dtype=np.uint8)
    B = 4000
    items = [DraftItem(i, 1234, 77, W, 1, [rows], seed=1000 + i, temperature=1.0) for i in range(B)]
    r = _run(d, items, wire.SF_SAMPLED)
    sup, q = r.support_ids[0, 0], r.proposal_q[0, 0]
    assert (r.support_ids[:, 0] == sup).all() and np.allclose(r.proposal_q[:, 0], q)
    hit = r.draft_ids[:, 0][:, None] == sup[None, :]
    assert hit.any(axis=1).all()  # every draw is in the support
    counts = hit.sum(axis=0).astype(np.float64)
    expected = q.astype(np.float64) * B
    big = expected >= 5  # the cells the test can judge; the rest pooled
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()
    stat = float(((obs - exp) ** 2 / exp).sum())
    p = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    assert p >= 0.01, f"the draws do not follow q: chi-square p = {p:.2e} over {len(obs)} cells"
    if len(obs) > 2:  # and the test can fail: the argmax every time is far from q
        mutant = np.zeros_like(obs)
        mutant[np.argmax(exp)] = obs.sum()
        stat = float(((mutant - exp) ** 2 / exp).sum())
        assert float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64),
                                             torch.tensor(stat / 2, dtype=torch.float64))) < 0.01
    alone = _run(d, [DraftItem(0, 1234, 77, W, 1, [rows], seed=1017, temperature=1.0)],
                 wire.SF_SAMPLED)  # request 17 in a round of its own
    assert alone.draft_ids[0, 0] == r.draft_ids[17, 0]
    # one seed at 40 anchor positions draws more than one token: the position is in the key
    draws = _run(d, [DraftItem(k, 1234, 77 + k, W, 1, [rows], seed=1017, temperature=1.0) for k in range(40)],
                 wire.SF_SAMPLED).draft_ids[:, 0]
    assert len(set(draws.tolist())) > 1


def _saved_head(tmp_path, row_dtype="float32", n_taps=2, seed=7, **over):
    """A small random head saved with its manifest: 2 taps x 8 float32 values = RB bytes a row."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from dspark_proxy.model.head import DraftHead
    from dspark_proxy.model.manifest import ROW_DTYPES, HeadManifest
    from dspark_proxy.model.train_head import save_head

    hidden = RB // n_taps // ROW_DTYPES[row_dtype]
    torch.manual_seed(seed)
    head = DraftHead(n_taps=n_taps, hidden=hidden, window=W, num_spec=N, vocab=64, d_model=32, n_heads=4)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape) * 0.5)
    man = HeadManifest(target_id="sha256:test", target_name="t", tap_layers=list(range(n_taps)), tap_point="p",
                       hidden=hidden, row_dtype=row_dtype, window=W, num_spec=N, vocab_size=64, d_model=32,
                       n_heads=4)
    for k, v in over.items():
        setattr(man, k, v)
    d = tmp_path / f"head-{row_dtype}-{seed}"
    d.mkdir()
    save_head(head, d, man)
    return d


def _reference(weights, item, row_dtype, n):
    """Drafts straight from the saved head on the item's window read as row_dtype: no cache, no cut."""
    import torch

    from dspark_proxy.model.train_head import load_head

    head, _ = load_head(weights)
    rows = np.concatenate(item.segments)
    x = torch.from_numpy(rows.copy()).view(getattr(torch, row_dtype)).float()
    proj = head.project(x)
    cache = torch.zeros(W, proj.shape[-1])
    cache[W - item.w:] = proj
    mask = torch.arange(W) >= W - item.w
    prev = torch.tensor([item.anchor_token % 64])
    with torch.no_grad():
        ctx = head.backbone(cache[None], mask[None], prev, n)
        out = []
        for j in range(n):
            prev = head.step_logits(ctx[:, j], prev).argmax(-1)
            out.append(int(prev))
    return out


def _float_items(rng, dtype, n=3):
    out = []
    for i in range(n):
        w = int(rng.integers(1, W + 1))
        rows = rng.standard_normal((w, RB // np.dtype(dtype).itemsize)).astype(dtype).view(np.uint8)
        out.append(DraftItem(i, int(rng.integers(0, 64)), 100 + i, w, 0, [rows[: w // 2], rows[w // 2:]]))
    return out


def test_weights_and_manifest_round_trip(tmp_path):
    d = _saved_head(tmp_path)
    a = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    b = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d / "head.safetensors"))
    assert a.row_dtype == "float32" and a.manifest.target_id == "sha256:test"
    items = _float_items(np.random.default_rng(1), np.float32)
    ra = _run(a, items)
    assert np.array_equal(ra.draft_ids, _run(b, items).draft_ids)
    for it in items:  # the drafter (cached, batched) drafts what the head itself drafts
        assert ra.draft_ids[it.index].tolist() == _reference(d, it, "float32", N)


def test_row_dtype_comes_from_the_manifest(tmp_path):
    """fp16 rows (even row_bytes) are read as fp16, not guessed bf16; fp32 rows as fp32."""
    d16 = _saved_head(tmp_path, "float16", seed=3)
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d16))
    assert dr.row_dtype == "float16"
    items = _float_items(np.random.default_rng(2), np.float16)
    r = _run(dr, items)
    for it in items:
        assert r.draft_ids[it.index].tolist() == _reference(d16, it, "float16", N)
    wrong = [_reference(d16, it, "bfloat16", N) for it in items]
    assert wrong != [r.draft_ids[it.index].tolist() for it in items]  # the dtype matters to the drafts


@pytest.mark.parametrize("field,kw", [("row_bytes", dict(row_bytes=2 * RB)), ("window", dict(window=W + 1)),
                                      ("num_spec", dict(num_spec=N - 1))])
def test_manifest_mismatch_refused_naming_the_field(tmp_path, field, kw):
    from dspark_proxy.model.manifest import ManifestMismatch

    d = _saved_head(tmp_path)
    args = dict(num_spec=N, window=W, row_bytes=RB) | kw
    with pytest.raises(ManifestMismatch, match=field) as ei:
        make_drafter("torch", weights=str(d), **args)
    assert ei.value.field == field


def test_worker_refuses_a_mismatched_head_at_start(tmp_path):
    d = _saved_head(tmp_path)
    srv = WorkerServer("127.0.0.1", 0, num_spec=N, window=W + 2, row_bytes=RB, max_reqs=4, drafter="torch",
                       weights=str(d))
    with pytest.raises(ValueError, match="window"):
        srv.start()
    srv.stop()


def _ids(via: str, sw, w: int) -> dict:
    """A window's write ids as the caller gives them: per item (`written`), or the slot's whole ring of
    rows and ids for the drafter to gather (`ring_ids`: what the worker's serve loop gives)."""
    return {"written": sw.write_ids(w)} if via == "written" else {"ring": sw.rows, "ring_ids": sw.written}


@pytest.mark.parametrize("via", ["written", "ring_ids"])
def test_slot_cache_projects_only_new_rows_and_sees_restarts(tmp_path, via):
    """Rounds on one slot's window buffer: each costs its new rows; drafts equal an uncached drafter's;
    a restart that rewrites the same positions with other rows is re-projected."""
    from dspark_proxy.worker.session import SlotWindow

    d = _saved_head(tmp_path)
    cached = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    rng = np.random.default_rng(4)
    stream = rng.standard_normal((40, RB // 4)).astype(np.float32).view(np.uint8)
    sw = SlotWindow(W, RB, chains=False)

    def round_(hi, restart=False):
        if restart:
            sw.lo = 0
        sw.hi = hi
        w = min(W, sw.hi - sw.lo)
        it = DraftItem(0, 7, hi, w, 0, sw.segments(w), **_ids(via, sw, w))
        fresh = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
        assert np.array_equal(_run(cached, [it]).draft_ids, _run(fresh, [it]).draft_ids)

    sw.write(0, stream[:5], True)
    round_(5, restart=True)
    assert cached.rows_projected == 5
    for hi in range(6, 30):  # one new row a round, wrapping the W-row buffer
        sw.write(hi - 1, stream[hi - 1:hi], False)
        sw.lo = max(0, hi - W)
        round_(hi)
    assert cached.rows_projected == 5 + 24
    other = rng.standard_normal((5, RB // 4)).astype(np.float32).view(np.uint8)
    sw.write(0, other, True)  # a new request in the slot: positions 0..4 again, other rows
    round_(5, restart=True)
    assert cached.rows_projected == 5 + 24 + 5


@pytest.mark.parametrize("via", ["written", "ring_ids"])
def test_a_row_rewritten_in_place_is_projected_again_whatever_bytes_changed(tmp_path, via):
    """The cache reuses a projection only for the write that produced it: a rewrite of the same
    positions that changes a single byte (one a byte sample would not look at) is re-projected."""
    from dspark_proxy.worker.session import SlotWindow

    d = _saved_head(tmp_path)
    cached = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    rows = np.random.default_rng(8).standard_normal((W, RB // 4)).astype(np.float32).view(np.uint8)
    sw = SlotWindow(W, RB, chains=False)
    sw.write(0, rows, True)
    sw.hi = W

    def drafts() -> np.ndarray:
        it = DraftItem(0, 7, W, W, 0, sw.segments(W), **_ids(via, sw, W))
        fresh = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
        got = _run(cached, [it]).draft_ids.copy()
        assert np.array_equal(got, _run(fresh, [it]).draft_ids)
        return got

    drafts()
    assert cached.rows_projected == W
    changed = rows.copy()
    changed[:, 1] ^= 0x40  # one byte of every row: the float's low mantissa
    sw.write(0, changed, True)
    drafts()
    assert cached.rows_projected == 2 * W  # every rewritten row projected again


def test_only_n_out_positions_are_computed(tmp_path):
    d = _saved_head(tmp_path)
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    calls = []  # the positions asked of the backbone: the native greedy runs exactly ctx's positions
    bb = dr.runner.backbone
    dr.runner.backbone = lambda win, lens, anchor, n: calls.append(n) or bb(win, lens, anchor, n)
    items = _float_items(np.random.default_rng(3), np.float32)
    for it in items:
        it.n_out = 2
    r = _run(dr, items)
    assert calls == [2] and (r.draft_ids[:, 2:] == -1).all() and (r.draft_ids[:, :2] >= 0).all()


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


def test_projection_pool_frees_a_gone_windows_index(tmp_path):
    """The pool holds one index per live window buffer; a buffer that is gone gives its index back
    (pool memory follows the live slots, not every slot ever seen), and a new buffer starts empty."""
    import gc

    from dspark_proxy.worker.session import SlotWindow

    d = _saved_head(tmp_path)
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, weights=str(d))
    rng = np.random.default_rng(9)

    def batch(n):
        sws = [SlotWindow(W, RB, chains=False) for _ in range(n)]
        items = []
        for i, sw in enumerate(sws):
            sw.write(0, rng.standard_normal((W, RB // 4)).astype(np.float32).view(np.uint8), True)
            sw.hi = W
            items.append(DraftItem(i, 3, W, W, 0, sw.segments(W), written=sw.write_ids(W)))
        _run(dr, items)
        return sws

    sws = batch(20)
    assert len(dr.pool) == 20 and dr.rows_projected == 20 * W
    cap = len(dr.pool.proj)
    del sws
    gc.collect()
    keep = batch(3)
    assert len(dr.pool) == 3 and len(dr.pool.proj) == cap  # indices reused, nothing grown
    assert dr.rows_projected == 23 * W
    del keep


def test_a_device_other_than_the_cpu_is_refused_not_ignored():
    with pytest.raises(ValueError, match="device 'cuda'"):
        make_drafter("torch", num_spec=N, window=W, row_bytes=RB, device="cuda")


def test_a_rounds_thread_choice_does_not_lower_the_next_drafters_count():
    """A drafter's round at one thread (its measured choice, model/head_threads.py) leaves the
    configured count to a drafter made after it (the worker makes one a session)."""
    from dspark_proxy.model import headmm

    t = headmm.threads()
    try:
        headmm.set_threads(2)
        a = make_drafter("torch", num_spec=N, window=W, row_bytes=RB)
        for _ in range(4):  # the choice tries one thread and two
            _run(a, _items(np.random.default_rng(0)))
        b = make_drafter("torch", num_spec=N, window=W, row_bytes=RB)
        assert a.threads.most == 2 and b.threads.most == 2 and headmm.threads() == 2
    finally:
        headmm.set_threads(t)


def test_a_buffer_at_a_freed_buffers_address_gets_its_own_pool_index():
    """CPython gives a new window buffer the id of a freed one. The pool then holds the dead buffer's
    entry under that id with its release queued: the new buffer gets an index (it raised KeyError,
    failing the round's drafts) and the dead one's index is freed exactly once."""
    import weakref

    from dspark_proxy.worker.torch_drafter import ProjectionPool

    pool = ProjectionPool(4, 8, cap=2)
    new = np.zeros((4, 3), np.uint8)
    gone = np.zeros((4, 3), np.uint8)
    i = pool._free.pop()
    pool._of[id(new)] = (i, weakref.ref(gone))  # the buffer that lived at new's address
    del gone
    pool._released.append(id(new))  # what the pool's weakref callback queues when it dies
    j = pool.index_of(new)
    assert sorted([*pool._free, j]) == [0, 1]  # every index once: none lost, none handed out twice
    assert pool.index_of(new) == j and len(pool) == 1
