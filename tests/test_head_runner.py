"""The serving form of the head (HeadRunner): the trainable DraftHead's drafts, batch-invariant to the
bit, and what the worker serves is what the offline measurement (train_head.head_drafts) computes, bit
for bit, round after round through slot windows and the projection pool."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from dspark_proxy.model.head import DraftHead  # noqa: E402
from dspark_proxy.model.head_runner import HeadRunner, bf16_to_f32  # noqa: E402

pytestmark = pytest.mark.timeout(120)

W, N, V, D = 8, 4, 96, 32


KINDS = [("markov", 1), ("carry", 1), ("carry", 2)]  # the head's step and its backbone's hops


def _head(seed=0, n_taps=2, hidden=16, draft=None, step="markov", hops=1) -> DraftHead:
    torch.manual_seed(seed)
    h = DraftHead(n_taps=n_taps, hidden=hidden, window=W, num_spec=N, vocab=V, d_model=D, n_heads=4, step=step,
                  hops=hops)
    with torch.no_grad():
        for p in h.parameters():
            p.add_(torch.randn(p.shape) * 0.5)
    if draft is not None:
        h.set_draft_vocab(torch.as_tensor(draft))
    return h.eval()


def _batch(rng, B, width=3 * D):
    win = rng.standard_normal((B, W, width)).astype(np.float32)
    lens = rng.integers(1, W + 1, B)
    return win, lens, rng.integers(0, V, B)


def test_bf16_bytes_read_exactly():
    x = torch.randn(50).to(torch.bfloat16)
    raw = x.view(torch.uint8).numpy()
    assert np.array_equal(bf16_to_f32(raw), x.float().numpy())


@pytest.mark.parametrize("step, hops", KINDS)
@pytest.mark.parametrize("draft", [None, [3, 5, 8, 13, 21, 34, 55, 89, 1, 2]])
def test_runner_drafts_what_the_trainable_head_drafts(draft, step, hops):
    """The folded numpy form against DraftHead's own forward (position by position, and teacher-forced
    `steps` as training runs it): same ids, probabilities within float rounding (the folds reorder sums)."""
    head = _head(1, draft=draft, step=step, hops=hops)
    r = HeadRunner(head)
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((40, 32)).astype(np.float32)
    with torch.no_grad():
        ref = head.project(torch.from_numpy(rows)).numpy()
    assert np.allclose(r.project(rows), ref, atol=1e-4, rtol=1e-4)
    win, lens, anchor = _batch(rng, 40)
    ids, conf, _ = r.greedy(win, lens, anchor, N)
    with torch.no_grad():
        mask = torch.arange(W)[None] >= torch.from_numpy(W - lens)[:, None]
        ctx = head.backbone(torch.from_numpy(win), mask, torch.from_numpy(anchor), N)
        prev, out, probs, carry, lgs = torch.from_numpy(anchor), [], [], None, []
        for j in range(N):
            lg, carry = head.step_carry(ctx[:, j], prev, carry)
            p = lg.softmax(-1)
            c = p.argmax(-1)
            lgs.append(lg)
            out.append(prev)
            prev = head.draft_ids[c]
            probs.append(p.max(-1).values)
        forced = head.steps(ctx, torch.stack(out, 1))  # fed the same previous drafts
    assert np.array_equal(ids, torch.stack(out[1:] + [prev], 1).numpy())
    assert np.allclose(conf, torch.stack(probs, 1).numpy(), atol=1e-5)
    assert torch.allclose(forced, torch.stack(lgs, 1), atol=1e-5)
    if draft is not None:
        assert np.isin(ids, draft).all()


@pytest.mark.parametrize("step, hops", KINDS)
def test_a_requests_drafts_do_not_depend_on_the_rest_of_the_batch(step, hops):
    """Bit for bit: alone, in a batch of 37, with fewer positions asked (n), and each row's projection
    alone or among 50."""
    r = HeadRunner(_head(2, step=step, hops=hops))
    rng = np.random.default_rng(1)
    win, lens, anchor = _batch(rng, 37)
    ids, conf, marg = r.greedy(win, lens, anchor, N)
    for b in range(37):
        i1, c1, m1 = r.greedy(win[b:b + 1], lens[b:b + 1], anchor[b:b + 1], 2)
        assert np.array_equal(i1[0], ids[b, :2]) and np.array_equal(c1[0], conf[b, :2])
        assert np.array_equal(m1[0], marg[b, :2])
    rows = rng.standard_normal((50, 32)).astype(np.float32)
    p = r.project(rows)
    assert all(np.array_equal(r.project(rows[i:i + 1])[0], p[i]) for i in range(50))


def test_draft_vocabulary_survives_save_and_load(tmp_path):
    """The ids are saved as integers (bf16 would round 95 to 96) and checked against the manifest."""
    from safetensors.torch import load_file, save_file

    from dspark_proxy.model.manifest import HeadManifest
    from dspark_proxy.model.train_head import load_head, save_head

    draft = list(range(V - 1, 40, -1))
    head = _head(3, draft=draft)
    man = HeadManifest(target_id="sha256:t", target_name="t", tap_layers=[0, 1], tap_point="p", hidden=16,
                       row_dtype="float32", window=W, num_spec=N, vocab_size=V, d_model=D, n_heads=4,
                       draft_vocab=head.draft_vocab)
    save_head(head, tmp_path, man)
    back, m2 = load_head(tmp_path)
    assert m2.draft_vocab == len(draft) and back.draft_ids.tolist() == draft
    st = load_file(str(tmp_path / "head.safetensors"))
    del st["draft_ids"]
    save_file(st, str(tmp_path / "head.safetensors"))
    with pytest.raises(ValueError, match="draft_vocab"):
        load_head(tmp_path)


@pytest.mark.parametrize("step, hops", KINDS)
def test_served_drafts_are_the_offline_drafts_bit_for_bit(tmp_path, step, hops):
    """A sequence walked round by round as a speculative decoder does (1-4 new rows a round), four
    requests batched with other slots' rows and n_out cuts: the worker's TorchDrafter (the projections
    each slot keeps beside its rows, bf16 rows, windows from those kept as the serve loop passes them or from the
    window's segments) drafts exactly what head_drafts computes for the same anchors offline."""
    import dspark_proxy.wire as wire
    from dspark_proxy.model.manifest import HeadManifest
    from dspark_proxy.model.train_head import head_drafts, load_head, save_head
    from dspark_proxy.worker.drafters import DraftItem, make_drafter
    from dspark_proxy.worker.session import SlotWindow

    head = _head(4, draft=list(range(0, V, 2)), step=step, hops=hops)
    man = HeadManifest(target_id="sha256:t", target_name="t", tap_layers=[0, 1], tap_point="p", hidden=16,
                       row_dtype="bfloat16", window=W, num_spec=N, vocab_size=V, d_model=D, n_heads=4,
                       draft_vocab=head.draft_vocab, step=step, hops=hops)
    save_head(head, tmp_path, man)
    shipped, _ = load_head(tmp_path)
    S, T, start = 4, 48, 6
    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, V, (S, T), generator=g)
    rows = torch.randn(S, T, 32, generator=g).to(torch.bfloat16)
    offline = head_drafts(shipped, toks, rows, start)
    raw = rows.view(torch.uint8).numpy()
    dr = make_drafter("torch", num_spec=N, window=W, row_bytes=man.row_bytes, weights=str(tmp_path))
    slots = [SlotWindow(W, man.row_bytes, chains=False) for _ in range(S)]
    held, anchor = [0] * S, [start] * S
    rng = np.random.default_rng(6)
    rounds = 0
    third: list[int] = []  # the windows drafted from their rows alone (every third round)
    while all(a + N < T for a in anchor):
        items = []
        for s, sw in enumerate(slots):
            a = anchor[s]
            new = raw[s, held[s]:a]
            sw.write(held[s], new, held[s] == 0, dr.project_rows(new))
            held[s] = sw.hi = a
            sw.lo = max(0, a - W)
            w = min(W, a)
            items.append(DraftItem(s, int(toks[s, a]), a, w, int(rng.integers(0, N + 1)), sw.segments(w),
                                   aux=sw.aux_window(w) if rounds % 3 else None))
            if rounds % 3 == 0:
                third.append(w)
        out = wire.ReplyWriter(S, N, wire.SF_WANT_MARGIN)
        dr.draft(items, out)
        for s, it in enumerate(items):
            k = N if it.n_out == 0 else it.n_out
            assert out.draft_ids[s, :k].tolist() == offline[s, it.anchor_pos, :k].tolist(), (s, it.anchor_pos)
            assert (out.draft_ids[s, k:] == -1).all()
            anchor[s] += int(rng.integers(1, N + 1))
        rounds += 1
    # each row projected once as it came, and every third round's windows again (given without them)
    assert rounds >= 8 and dr.rows_projected == sum(held) + sum(w for w in third)


def test_offline_confidences_are_the_served_ones(tmp_path):
    """Confidence and margin too, not just ids: one request through the drafter against the runner."""
    import dspark_proxy.wire as wire
    from dspark_proxy.worker.drafters import DraftItem
    from dspark_proxy.worker.drafters.torch_head import TorchDrafter

    dr = TorchDrafter(num_spec=N, window=W, row_bytes=64, seed=3, row_dtype="float32")
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((W, 16)).astype(np.float32)
    it = DraftItem(0, 11, 40, W, 0, [rows.view(np.uint8)])
    out = wire.ReplyWriter(1, N, wire.SF_WANT_MARGIN)
    dr.draft([it], out)
    proj = dr.runner.project(rows)
    ids, conf, marg = dr.runner.greedy(proj[None], np.array([W]), np.array([11]), N)
    assert np.array_equal(out.draft_ids[0], ids[0]) and np.array_equal(out.confidence[0], conf[0])
    assert np.array_equal(out.margin[0], marg[0])


def test_every_product_is_the_kernels_defined_order(monkeypatch):
    """The runner with its native kernels swapped for their readable references (headmm.mm_reference,
    rms_reference, gelu_reference, top1_reference) drafts the same bytes: every product, norm, GELU and
    top-1 of the head goes through the batch-invariant kernels."""
    from dspark_proxy.model import head_runner, headmm

    r = HeadRunner(_head(5, draft=list(range(0, V, 3))))
    rng = np.random.default_rng(8)
    win, lens, anchor = _batch(rng, 9)
    rows = rng.standard_normal((7, 32)).astype(np.float32)
    fast = r.greedy(win, lens, anchor, N), r.project(rows)
    monkeypatch.setattr(head_runner.headmm, "mm", lambda x, w, *a: headmm.mm_reference(x, w.w, *a))
    monkeypatch.setattr(head_runner, "_rms", headmm.rms_reference)
    monkeypatch.setattr(head_runner, "_gelu", headmm.gelu_reference)
    monkeypatch.setattr(head_runner.headmm, "top1", headmm.top1_reference)
    slow = r.greedy_reference(win, lens, anchor, N), r.project(rows)  # the positions a numpy call at a time
    for a, b in zip([*fast[0], fast[1]], [*slow[0], slow[1]], strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("step, hops", KINDS)
def test_the_native_positions_are_the_reference_positions(step, hops, threads):
    """`greedy` (every position in one native call) and `step_carry` (one position) against the same
    loop composed of numpy-level calls (`greedy_reference`, `step_carry_reference`): identical bytes
    at every batch size, drafting over the whole vocabulary or a draft vocabulary, on one thread and
    on two with every product split."""
    from dspark_proxy.model import headmm

    t, old = headmm.threads(), headmm.tune(0, 1, 0)
    headmm.set_threads(threads)
    try:
        for draft in (None, list(range(1, V, 2))):
            r = HeadRunner(_head(3, draft=draft, step=step, hops=hops))
            rng = np.random.default_rng(4)
            for B in (1, 2, 3, 4, 5, 8, 13):
                win, lens, anchor = _batch(rng, B)
                for n in (1, N):
                    a, b = r.greedy(win, lens, anchor, n), r.greedy_reference(win, lens, anchor, n)
                    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True)), (B, n)
                ctx = np.ascontiguousarray(r.backbone(win, lens, anchor, 2)[:, 1])
                carry = rng.standard_normal((B, D)).astype(np.float32) if step == "carry" else None
                for more in (False, True):
                    got, want = r.step_carry(ctx, anchor, carry, more), r.step_carry_reference(ctx, anchor, carry, more)
                    assert got[0].tobytes() == want[0].tobytes()
                    assert (got[1] is None) == (want[1] is None)
                    assert got[1] is None or got[1].tobytes() == want[1].tobytes()
    finally:
        headmm.set_threads(t)
        headmm.tune(*old)


def test_the_native_positions_refuse_bad_ids_and_shapes():
    """An id outside the vocabulary or a shape that does not chain is a ValueError naming it, never
    a read out of bounds."""
    from dspark_proxy.model import headmm

    r = HeadRunner(_head(2, step="carry"))
    rng = np.random.default_rng(5)
    win, lens, anchor = _batch(rng, 3)
    ctx = r.backbone(win, lens, anchor, N)
    for bad in (V, -1):
        with pytest.raises(ValueError, match=rf"anchor\[1\] = {bad}: ids are 0 \.\. {V - 1}"):
            headmm.greedy(ctx, np.array([0, bad, 2]), r._w, r.draft_ids)
        with pytest.raises(ValueError, match=r"prev\[0\]"):
            r.step_carry(ctx[:, 0], np.array([bad, 0, 0]), None, True)
    bad_ids = r.draft_ids.copy()
    bad_ids[3] = V
    with pytest.raises(ValueError, match=r"draft_ids\[3\]"):
        headmm.greedy(ctx, anchor, r._w, bad_ids)
    with pytest.raises(ValueError, match="do not chain"):
        headmm.greedy(ctx, anchor, r._w, r.draft_ids[:2])
    with pytest.raises(ValueError, match="ctx must be"):
        headmm.greedy(ctx[..., :-1], anchor, r._w, r.draft_ids)
    with pytest.raises(ValueError, match="anchor"):
        headmm.greedy(ctx, anchor[:2], r._w, r.draft_ids)
    with pytest.raises(ValueError, match="carry must be"):
        r.step_carry(ctx[:, 0], anchor, np.zeros((3, D + 1), np.float32), True)
    with pytest.raises(ValueError, match="do not chain"):
        headmm.greedy(ctx, anchor, (np.ascontiguousarray(r._w[0][:, :-1]), *r._w[1:]), r.draft_ids)


def test_non_finite_and_huge_row_values_are_read_as_zero_and_clipped():
    """A corrupt row cannot blow up the head: NaN and ±inf read as 0, the rest clipped to ±1e4, so
    such a window drafts exactly what its cleaned copy drafts, with finite confidences."""
    import dspark_proxy.wire as wire
    from dspark_proxy.worker.drafters import DraftItem
    from dspark_proxy.worker.drafters.torch_head import TorchDrafter

    dr = TorchDrafter(num_spec=N, window=W, row_bytes=64, seed=3, row_dtype="float32")
    rows = np.random.default_rng(9).standard_normal((W, 16)).astype(np.float32)
    bad, clean = rows.copy(), rows.copy()
    bad[1, 2], bad[3, 4], bad[5, 6], bad[6, 7], bad[7, 0] = np.nan, np.inf, -np.inf, 3e30, -2e5
    clean[1, 2], clean[3, 4], clean[5, 6], clean[6, 7], clean[7, 0] = 0.0, 0.0, 0.0, 1e4, -1e4
    out = wire.ReplyWriter(2, N, wire.SF_WANT_MARGIN)
    dr.draft([DraftItem(0, 11, 40, W, 0, [bad.view(np.uint8)]), DraftItem(1, 11, 40, W, 0, [clean.view(np.uint8)])],
             out)
    assert np.array_equal(out.draft_ids[0], out.draft_ids[1]) and (out.draft_ids[0] >= 0).all()
    assert np.array_equal(out.confidence[0], out.confidence[1]) and np.isfinite(out.confidence).all()
