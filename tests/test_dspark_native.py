"""The dspark drafter's native CPU path (its products through the head's kernel with the norms folded in,
the greedy loop on the host) against its torch path (what it runs on CUDA, and on the CPU with
`native=False`), on random heads built by the reference library: the same drafts, and logits,
confidences and margins within 1e-5, for batches of windows of every length, anchors anywhere, a draft
vocabulary or the whole one, with and without the confidence and the Markov heads, margins asked or not.
The reference comparison itself (tests/test_dspark_reference.py) runs the native path too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_proxy import wire
from dspark_proxy.wire import ReplyWriter
from dspark_proxy.worker.drafters.base import DraftItem
from dspark_proxy.worker.drafters.registry import make_drafter
from dspark_proxy.worker.session import SlotWindow

from . import dspark_ref as R

RB = len(R.TAPS) * R.HIDDEN * 4  # float32 rows
W = 6

HEADS = {
    "vanilla-conf-reduced": dict(),
    "vanilla-noconf": dict(confidence=False),
    "no-markov": dict(rank=0, with_markov=False),
    "vanilla-full-vocab-bonus-anchor": dict(draft_vocab=R.VOCAB, sample_from_anchor=False),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Each head served twice: native (the CPU default) and torch."""
    target = R.make_target(tmp_path_factory.mktemp("target"))
    out = {}
    for name, kw in HEADS.items():
        d = tmp_path_factory.mktemp(name)
        m = R.make_head(d, target, **kw)
        n = m.config.block_size if m.config.sample_from_anchor else m.config.block_size - 1
        mk = [make_drafter("dspark", num_spec=n, window=W, row_bytes=RB, head=str(d), target=str(target),
                           row_dtype="float32", device="cpu", native=native) for native in (True, False)]
        for dr in mk:
            dr.keep_logits = True
        out[name] = (mk[0], mk[1], n)
    return out


def _round(dr, rng_seed: int, lens: list[int], anchors: list[int], starts: list[int], n_out: list[int], flags: int):
    rng = np.random.default_rng(rng_seed)
    items = []
    for i, (w, a, first, k) in enumerate(zip(lens, anchors, starts, n_out, strict=True)):
        sw = SlotWindow(W, RB, chains=False)
        rows = rng.standard_normal((w, RB // 4), dtype=np.float32).view(np.uint8)
        sw.write(first, rows, True, dr.project_rows(rows, np.arange(first, first + w)))
        sw.hi = first + w
        items.append(DraftItem(i, a, sw.hi, w, k, sw.segments(w), aux=sw.aux_window(w)))
    out = ReplyWriter(len(items), dr.num_spec, flags)
    dr.draft(items, out)
    return out, dr.last_logits


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(HEADS)), seed=st.integers(0, 2**31),
       reqs=st.lists(st.tuples(st.integers(1, W), st.integers(0, R.VOCAB - 1), st.integers(0, 5000),
                               st.integers(0, 5)), min_size=1, max_size=5),
       margin=st.booleans())
def test_native_path_drafts_as_the_torch_path(pairs, name, seed, reqs, margin):
    nat, ref, n = pairs[name]
    lens, anchors, starts, n_out = (list(x) for x in zip(*reqs, strict=True))
    flags = wire.SF_WANT_MARGIN if margin else 0
    a, la = _round(nat, seed, lens, anchors, starts, n_out, flags)
    b, lb = _round(ref, seed, lens, anchors, starts, n_out, flags)
    assert (a.draft_ids == b.draft_ids).all(), (name, a.draft_ids, b.draft_ids)
    assert np.abs(a.confidence - b.confidence).max() <= 1e-5
    assert la.shape == lb.shape and float((la - lb).abs().max()) <= 1e-5
    if margin:
        assert np.abs(a.margin - b.margin).max() <= 1e-5
    else:
        assert a.margin is None and b.margin is None


def test_native_is_the_cpu_default_and_holds_its_matrices_once(pairs):
    nat, ref, _ = pairs["vanilla-conf-reduced"]
    assert nat.native and not ref.native
    # the packed products' torch copies are dropped; the torch path keeps them
    assert {k for k, v in nat.w.items() if v is None} >= {"fc", "out", "0.qkv", "0.gate_up", "markov_w2"}
    assert all(ref.w[k] is not None for k in ("fc", "out", "0.qkv", "0.gate_up", "markov_w2"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_markov_table_gives_the_per_position_products_bytes(pairs, seed):
    nat, _, _ = pairs["vanilla-conf-reduced"]
    assert nat.host.markov_tab is not None
    case = (seed, [W, 2, 5, 1], [1, 7, 200, R.VOCAB - 1], [0, 40, 900, 3], [0, 5, 3, 1], wire.SF_WANT_MARGIN)
    a, la = _round(nat, *case)
    tab, nat.host.markov_tab = nat.host.markov_tab, None  # each position's bias by the kernel, as without a table
    try:
        b, lb = _round(nat, *case)
    finally:
        nat.host.markov_tab = tab
    assert (a.draft_ids == b.draft_ids).all()
    assert (a.confidence == b.confidence).all() and (a.margin == b.margin).all()
    assert torch.equal(la, lb)


def test_no_markov_table_past_its_size(tmp_path, monkeypatch):
    from dspark_proxy.worker.drafters import dspark_host

    target = R.make_target(tmp_path / "target")
    R.make_head(tmp_path / "head", target)
    monkeypatch.setattr(dspark_host, "MARKOV_TABLE_BYTES", R.VOCAB * 64 * 4 - 1)  # one byte short
    dr = make_drafter("dspark", num_spec=4, window=W, row_bytes=RB, head=str(tmp_path / "head"),
                      target=str(target), row_dtype="float32", device="cpu")
    assert dr.host.markov_tab is None


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rows_to_float_is_torchs_conversion_and_leaves_the_rows_alone(dtype):
    from dspark_proxy.worker.drafters.dspark_host import rows_to_f32

    raw = np.random.default_rng(0).integers(0, 256, (9, 64), dtype=np.uint8)  # every pattern: nan, inf, subnormal
    before = raw.copy()
    got = rows_to_f32(raw, dtype)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    want = torch.nan_to_num(torch.from_numpy(raw.copy()).view(tdt).float(), nan=0.0, posinf=0.0, neginf=0.0)
    assert got.dtype == np.float32 and np.array_equal(got, want.numpy())
    assert np.array_equal(raw, before)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_steps_rows_give_the_torch_paths_keys_hostile_rows_included(pairs, name):
    nat, ref, _ = pairs[name]
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((6, RB // 4), dtype=np.float32)
    rows[1, 3], rows[2, 0], rows[3, 7] = np.nan, np.inf, -np.inf
    rows[4] = np.float32(3e38)  # overflows the products
    pos = np.array([0, 1, 2, 900, 65535, 70000])
    a = nat.project_rows(rows.view(np.uint8), pos)
    b = ref.project_rows(rows.view(np.uint8), pos)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    assert a.shape == b.shape and np.abs(a - b).max() <= 1e-5
