"""The dspark drafter against the reference: small random-weight DSpark speculators
built and saved by `speculators` 0.9.0, served by our worker through the real protocol, compared on the
same rows and tokens with drafts from the reference model's own modules (tests/dspark_ref.py): drafts
identical at every position, float32 logits and confidences within 1e-4, contexts shorter and longer
than W. speculators is a test dependency: without it these tests fail at import, never skip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dspark_proxy import wire
from dspark_proxy.worker.server import WorkerServer
from dspark_proxy.worker.testing import RawPeer, make_entries

from . import dspark_ref as R

RB = len(R.TAPS) * R.HIDDEN * 4  # float32 rows
TOL = 1e-4

CONFIGS = {
    "vanilla-conf-anchor-reduced": dict(),
    "gated-noconf": dict(markov="gated", confidence=False),
    "vanilla-noconf": dict(confidence=False),  # the draft's probability as its confidence, on the host loop
    "rnn-bonus-anchor": dict(markov="rnn", sample_from_anchor=False),
    "gated-bonus-anchor-conf-without-markov": dict(markov="gated", sample_from_anchor=False, with_markov=False),
    "vanilla-full-vocab": dict(draft_vocab=R.VOCAB, markov="rnn"),
    "no-markov-conf": dict(rank=0, with_markov=False),
    "sliding-non-causal": dict(non_causal=True, markov="vanilla"),
    "full-attention": dict(sliding_window=None),
    "attention-bias": dict(attention_bias=True, markov="gated"),
    # rotary scaled (attention_scaling != 1): the drafter's own cos/sin, scaled as the module scales them
    "yarn-rope": dict(rope={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 10240}),
}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return R.make_target(tmp_path_factory.mktemp("target"))


def _serve(head_dir, target, m, window, sampled=False):
    n = m.config.block_size if m.config.sample_from_anchor else m.config.block_size - 1
    srv = WorkerServer("127.0.0.1", 0, num_spec=n, window=window, row_bytes=RB, max_reqs=4, drafter="dspark",
                       weights=str(head_dir), target=str(target), row_dtype="float32", torch_device="cpu",
                       sampled=sampled)
    srv.start()
    srv.drafter.keep_logits = True
    return srv, wire.WireLayout(n, window, RB, 4, sampled), n


def _steps(full_attention: bool):
    """Four rounds over three slots: (slot, rows this round, drafts asked); contexts grow past W = 6
    unless the checkpoint attends to the whole prefix (then they stay within W = 12). The second round
    asks no drafts (the proxy's gate paused the batch): the worker keeps its rows untransformed, and the
    third transforms the windows it needs (worker/serve.py `_repair`)."""
    if full_attention:
        return [[(0, 2, 1), (1, 5, 1), (2, 1, 1)], [(0, 1, 0), (2, 1, 0)], [(0, 3, 1), (1, 4, 1), (2, 1, 1)],
                [(0, 1, 1), (1, 3, 1), (2, 7, 1)]]
    return [[(0, 3, 1), (1, 6, 1), (2, 1, 1)], [(0, 2, 0), (1, 1, 0), (2, 2, 0)], [(0, 2, 1), (1, 1, 1), (2, 6, 1)],
            [(0, 5, 1), (1, 4, 1), (2, 1, 1)]]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_served_drafts_equal_the_reference(tmp_path, target, name):
    kw = CONFIGS[name]
    m = R.make_head(tmp_path / "head", target, **kw)
    window = 12 if kw.get("sliding_window", 6) is None else 6
    srv, lay, n = _serve(tmp_path / "head", target, m, window)
    # the projections it fused are held once, in their fused form only
    assert not [k for k in srv.drafter.t if k.endswith(("proj.weight", "proj.bias")) and "markov_head.gate" not in k
                and "joint_proj" not in k] and not {"lm_head.weight", "fc.weight"} & set(srv.drafter.t)
    peer = RawPeer(srv.port, lay)
    g = torch.Generator().manual_seed(5)
    hist = {s: torch.zeros(0, RB // 4) for s in range(3)}
    worst_l = worst_c = 0.0
    try:
        assert isinstance(peer.handshake(tap_layers=tuple(R.TAPS), row_dtype="float32"), wire.Welcome)
        for t, rnd in enumerate(_steps(window == 12)):
            specs, rows = [], []
            for slot, k, ask in rnd:
                new = torch.randn(k, RB // 4, generator=g)
                anchor = int(torch.randint(0, R.VOCAB - 1, (1,), generator=g))
                specs.append(dict(slot=slot, first_pos=hist[slot].shape[0], n_rows=k, generation=1,
                                  flags=(wire.RF_NEED_DRAFT if ask else 0) | (wire.RF_NEW_GEN if t == 0 else 0),
                                  anchor_token=anchor))
                hist[slot] = torch.cat([hist[slot], new])
                rows.append(new)
            r = peer.step(make_entries(specs), torch.cat(rows).numpy().view(np.uint8), t + 1)
            logits = srv.drafter.last_logits
            for i, (slot, _k, ask) in enumerate(rnd):
                T = hist[slot].shape[0]
                assert r.window_rows[i] == min(T, window)
                if not ask:
                    assert (r.draft_ids[i] == -1).all()
                    continue
                ref, ref_logits, ref_conf = R.reference_drafts(m, hist[slot], specs[i]["anchor_token"], n)
                assert r.draft_ids[i].tolist() == ref, (name, t, slot, T)
                worst_l = max(worst_l, float((logits[i] - ref_logits).abs().max()))
                if ref_conf:
                    worst_c = max(worst_c, float(np.abs(r.confidence[i] - np.array(ref_conf)).max()))
        assert worst_l <= TOL and worst_c <= TOL, (name, worst_l, worst_c)
        print(f"{name}: max|dlogits|={worst_l:.2e} max|dconf|={worst_c:.2e} drafts equal")
    finally:
        peer.close()
        srv.stop()


def test_sampled_reply_is_the_distribution_the_draft_was_drawn_from(tmp_path, target):
    """Sampled mode: each draft is in its support, q is softmax(top-32 of logits / t) of the reference
    logits given the drafts fed back, and a replay (same seed and positions) draws the same."""
    m = R.make_head(tmp_path / "head", target, markov="gated")
    srv, lay, n = _serve(tmp_path / "head", target, m, 6, sampled=True)
    peer = RawPeer(srv.port, lay)
    rows = torch.randn(6, RB // 4, generator=torch.Generator().manual_seed(2))
    meta = np.zeros(2, dtype=wire.SAMPLE_DTYPE)
    meta["seed"], meta["temperature"] = [11, 12], [0.7, 1.3]
    try:
        peer.handshake()
        e = make_entries([dict(slot=0, first_pos=0, n_rows=6, generation=1, flags=3, anchor_token=7),
                          dict(slot=1, first_pos=0, n_rows=6, generation=1, flags=3, anchor_token=7)])
        raw = torch.cat([rows, rows]).numpy().view(np.uint8)
        r = peer.step(e, raw, 1, step_flags=wire.SF_SAMPLED, sample_meta=meta)
        ids, sup, q = r.draft_ids.copy(), r.support_ids.copy(), r.proposal_q.copy()
        for i, temp in enumerate(meta["temperature"].tolist()):
            _, ref_logits, _ = R.reference_drafts(m, rows, 7, n, given=ids[i].tolist())
            for j in range(n):
                v, ix = torch.topk(ref_logits[j] / temp, 32)
                want_q = torch.softmax(v, -1).numpy()
                want_ids = (ix + m.d2t[ix]).numpy()
                assert ids[i, j] in sup[i, j].tolist()
                assert np.abs(q[i, j] - want_q).max() <= TOL
                assert sup[i, j].tolist() == want_ids.tolist()
        e2 = make_entries([dict(slot=2, first_pos=0, n_rows=6, generation=1, flags=3, anchor_token=7),
                           dict(slot=3, first_pos=0, n_rows=6, generation=1, flags=3, anchor_token=7)])
        r2 = peer.step(e2, raw, 2, step_flags=wire.SF_SAMPLED, sample_meta=meta)
        assert r2.draft_ids.tolist() == ids.tolist()
    finally:
        peer.close()
        srv.stop()


def test_n_out_cuts_the_drafts(tmp_path, target):
    m = R.make_head(tmp_path / "head", target)
    srv, lay, n = _serve(tmp_path / "head", target, m, 6)
    peer = RawPeer(srv.port, lay)
    rows = torch.randn(4, RB // 4, generator=torch.Generator().manual_seed(4))
    try:
        peer.handshake()
        e = make_entries([dict(slot=0, first_pos=0, n_rows=4, generation=1, flags=3, anchor_token=9, n_out=2)])
        r = peer.step(e, rows.numpy().view(np.uint8), 1)
        ref, _, _ = R.reference_drafts(m, rows, 9, n)
        assert r.draft_ids[0].tolist() == ref[:2] + [-1] * (n - 2)
        assert srv.drafter.last_logits.shape[1] == 2  # only the positions asked for were computed
    finally:
        peer.close()
        srv.stop()


def test_a_hostile_row_poisons_nothing_once_out_of_the_window(tmp_path, target):
    """Rows of huge values (their keys and values overflow) give finite drafts, and a new request in
    that slot, whose window is shorter than the ring, drafts as the reference does from its own rows
    (the ring's older columns are masked, and must not reach it through softmax @ V either)."""
    m = R.make_head(tmp_path / "head", target)
    srv, lay, n = _serve(tmp_path / "head", target, m, 6)
    peer = RawPeer(srv.port, lay)
    g = torch.Generator().manual_seed(8)
    flags = wire.RF_NEED_DRAFT | wire.RF_NEW_GEN
    try:
        peer.handshake()
        bad = torch.full((6, RB // 4), 3e38)
        e = make_entries([dict(slot=0, first_pos=0, n_rows=6, generation=1, flags=flags, anchor_token=4)])
        r = peer.step(e, bad.numpy().view(np.uint8), 1)
        assert np.isfinite(r.confidence).all() and ((r.draft_ids >= 0) & (r.draft_ids < R.VOCAB)).all()
        good = torch.randn(2, RB // 4, generator=g)
        e = make_entries([dict(slot=0, first_pos=0, n_rows=2, generation=2, flags=flags, anchor_token=4)])
        r = peer.step(e, good.numpy().view(np.uint8), 2)
        assert r.status[0] == wire.RS_PARTIAL_WINDOW
        ref, _, ref_conf = R.reference_drafts(m, good, 4, n)
        assert r.draft_ids[0].tolist() == ref
        assert np.abs(r.confidence[0] - np.array(ref_conf)).max() <= TOL
    finally:
        peer.close()
        srv.stop()
