"""The torch drafter: deterministic drafts from seeded weights, the n_out cut, sampled-mode support
and q, a saved head with its manifest (dtype from the manifest, mismatches refused by field), the
projections kept beside each slot's rows, service through the worker, and torch never imported otherwise."""

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


def _stream(rng, n):
    return rng.standard_normal((n, RB // 4)).astype(np.float32).view(np.uint8)


def test_kept_projections_follow_every_write():
    """Random writes to one slot (restarts, appends that wrap the ring, some without projections):
    the window's kept projections are offered exactly when each of its rows has its own there, and
    then they are the projections of exactly the rows the window holds."""
    from dspark_proxy.worker.session import SlotWindow

    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=1)
    rng = np.random.default_rng(11)
    sw = SlotWindow(W, RB, chains=False)
    has: dict[int, bool] = {}  # the model: position -> its last write brought a projection
    hi = lo = 0
    offered = withheld = 0
    for _ in range(400):
        restart = hi == lo or rng.random() < 0.15
        first = int(rng.integers(0, 40)) if restart else hi
        k = int(rng.integers(1, W + 1))
        rows = _stream(rng, k)
        with_aux = rng.random() < 0.85
        sw.write(first, rows, restart, dr.project_rows(rows) if with_aux else None)
        if restart:
            has, lo = {}, first
        has.update({first + j: with_aux for j in range(k)})
        hi = first + k
        lo = max(lo, hi - W)
        sw.hi = hi
        w = int(rng.integers(1, hi - lo + 1))
        got = sw.aux_window(w)
        want = all(has[p] for p in range(hi - w, hi))
        assert (got is not None) == want
        if got is not None:
            offered += 1
            idx = np.arange(hi - w, hi) % W
            assert np.array_equal(got[idx], dr.runner.project(dr._to_float(sw.rows[idx])))
        else:
            withheld += 1
    assert offered > 100 and withheld > 20


def test_drafts_from_kept_projections_equal_drafts_from_rows():
    """The same windows drafted from the slots' kept projections and from their rows alone: the same
    drafts, and only the windows without kept projections are projected in the round."""
    from dspark_proxy.worker.session import SlotWindow

    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=2)
    rng = np.random.default_rng(12)
    sws, items, bare = [], [], []
    for i in range(5):
        sw = SlotWindow(W, RB, chains=False)
        first = int(rng.integers(0, 30))
        n = int(rng.integers(1, 2 * W))
        for a in range(first, first + n, 3):  # appends of up to 3 rows, wrapping the ring
            k = min(3, first + n - a)
            rows = _stream(rng, k)
            sw.write(a, rows, a == first, dr.project_rows(rows))
        sw.hi = first + n
        w = min(W, n)
        sws.append(sw)
        items.append(DraftItem(i, 7 + i, sw.hi, w, 0, sw.segments(w), aux=sw.aux_window(w)))
        bare.append(DraftItem(i, 7 + i, sw.hi, w, 0, sw.segments(w)))
    assert all(it.aux is not None for it in items)
    before = dr.rows_projected
    kept = _run(dr, items)
    assert dr.rows_projected == before  # nothing projected: every window's rows were kept projected
    fresh = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=2)
    got = _run(fresh, bare)
    assert fresh.rows_projected == sum(it.w for it in bare)
    assert np.array_equal(kept.draft_ids, got.draft_ids) and np.array_equal(kept.confidence, got.confidence)
    mixed = [items[0], bare[1], items[2], bare[3], items[4]]  # some kept, some not, in one round
    assert np.array_equal(_run(dr, mixed).draft_ids, got.draft_ids)


def _served_steps(dr, steps, fail_at=None):
    """serve_step over `steps` (lists of (slot, first_pos, n_rows, new_gen[, need_draft])) on one session;
    drafts per step, and the rows projected in each."""
    from collections import Counter

    from dspark_proxy.worker.serve import serve_step
    from dspark_proxy.worker.session import Session

    lay = wire.WireLayout(N, W, RB, 4)
    sess = Session(1, W, RB, 4, chains=False)
    rng = np.random.default_rng(13)
    counters: Counter = Counter()
    got = []
    for t, step in enumerate(steps):
        e = make_entries([dict(slot=s, first_pos=f, n_rows=k, generation=1,
                               flags=(2 if new else 0) | (1 if (need[0] if need else True) else 0),
                               anchor_token=5 + s) for s, f, k, new, *need in step])
        rows = _stream(rng, int(e["n_rows"].sum()))
        out = wire.ReplyWriter(len(step), N, 0)
        before = dr.rows_projected
        if t == fail_at:
            real = dr.project_rows
            dr.project_rows = lambda raw: (_ for _ in ()).throw(MemoryError("no room"))
        try:
            serve_step(sess, e, rows, None, out, lay, dr, counters)
        finally:
            if t == fail_at:
                dr.project_rows = real
        got.append((out.status.copy(), out.draft_ids.copy(), dr.rows_projected - before))
    return got, counters


def test_a_step_projects_its_rows_once_and_drafts_as_from_the_rows():
    steps = [[(0, 0, 5, True), (1, 10, 3, True)]] + [[(0, 5 + j, 2, False), (1, 13 + j, 2, False)][: 1 + j % 2]
                                                      for j in range(0, 20, 2)]
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=4)
    got, counters = _served_steps(dr, steps)
    for (status, ids, projected), step in zip(got, steps, strict=True):
        assert projected == sum(k for _, _, k, _ in step)  # each row once, as it arrived
        assert (status != wire.RS_INTERNAL).all() and (ids >= 0).all()
    # the same steps served by a drafter that keeps nothing: its windows projected whole, same drafts
    bare = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=4)
    bare.project_rows = None  # not a transforming drafter: the serve loop keeps no projections for it
    again, _ = _served_steps(bare, steps)
    for (_, ids, _), (_, ids2, _) in zip(got, again, strict=True):
        assert np.array_equal(ids, ids2)
    assert counters["drafter_errors"] == 0


def test_a_paused_step_projects_nothing_and_the_next_drafting_step_its_windows_once():
    """A STEP that asks no drafts (the batch paused by the proxy's gate) costs no projection; the next
    STEP that asks drafts projects the windows it lacks once and keeps them, and the drafts are those
    of a drafter that projects every window whole."""
    steps = [[(0, 0, 5, True), (1, 10, 3, True)]]
    steps += [[(0, 5 + j, 1, False, False), (1, 13 + j, 1, False, False)] for j in range(6)]  # paused
    steps += [[(0, 11 + j, 1, False), (1, 19 + j, 1, False)] for j in range(3)]  # drafting again
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=6)
    got, counters = _served_steps(dr, steps)
    assert [p for _, _, p in got] == [8, 0, 0, 0, 0, 0, 0, 2 + W + W, 2, 2]
    for status, ids, _ in got[1:7]:
        assert np.isin(status, (wire.RS_OK, wire.RS_PARTIAL_WINDOW)).all() and (ids == -1).all()  # none asked, none made
    bare = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=6)
    bare.project_rows = None
    again, _ = _served_steps(bare, steps)
    for t in (0, 7, 8, 9):
        assert (got[t][1] >= 0).all() and np.array_equal(got[t][1], again[t][1])
    assert counters["drafter_errors"] == 0


def test_a_failed_projection_fails_that_steps_drafts_and_later_windows_are_projected_whole():
    steps = [[(0, 0, 4, True)], [(0, 4, 2, False)], [(0, 6, 1, False)], [(0, 7, W, False)]]
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=5)
    got, counters = _served_steps(dr, steps, fail_at=1)
    assert counters["drafter_errors"] == 1
    assert got[1][0].tolist() == [wire.RS_INTERNAL] and (got[1][1] == -1).all()
    # step 2's window holds rows applied without projections: the round projects its window whole
    assert got[2][2] == 1 + 7 and (got[2][1] >= 0).all()
    assert got[3][2] == W  # a whole window of new rows, all projected as they came: kept again
    bare = make_drafter("torch", num_spec=N, window=W, row_bytes=RB, seed=5)
    bare.project_rows = None
    again, _ = _served_steps(bare, steps)
    for t in (0, 2, 3):
        assert np.array_equal(got[t][1], again[t][1])


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
    code = ("import sys, dspark_proxy.worker, dspark_proxy.link.client, dspark_proxy.commands.worker;"
            "from dspark_proxy.worker import WorkerServer;"
            "s = WorkerServer('127.0.0.1', 0, num_spec=2, window=2, row_bytes=8, max_reqs=2); s.start(); s.stop();"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


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
