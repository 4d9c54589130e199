"""The head's backbone as one native call (model/_headmm_bb.c via HeadRunner.backbone) against its
numpy definition (HeadRunner.backbone_reference): identical bytes for any batch, window fill, number
of positions and thread count; a request's ctx the same alone or in a batch, whatever the rows its
window does not hold; bad input refused by name; and on the shipped head, `greedy` and
`greedy_reference` still draft the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from dspark_proxy.model import headmm  # noqa: E402
from dspark_proxy.model.head import DraftHead  # noqa: E402
from dspark_proxy.model.head_runner import HeadRunner  # noqa: E402

pytestmark = pytest.mark.timeout(300)

N, V = 5, 96
SHIPPED = Path(__file__).resolve().parent.parent / "models" / "stdlib-llama-head"
# the head's step, hops, window (under, at and over the kernel's 16 lanes), width and heads (a head's
# width a multiple of 16: the weighted sum in vectors; else one lane at a time)
KINDS = [("carry", 1, 16, 96, 2), ("markov", 1, 8, 32, 4), ("carry", 2, 21, 64, 4), ("carry", 1, 5, 40, 2)]
_heads: dict[tuple, DraftHead] = {}
_runners: dict[tuple, HeadRunner] = {}


def _runner(step: str, hops: int, window: int, d: int, heads: int) -> HeadRunner:
    key = (step, hops, window, d, heads)
    if key not in _runners:
        torch.manual_seed(sum(map(ord, str(key))))
        h = DraftHead(n_taps=2, hidden=16, window=window, num_spec=N, vocab=V, d_model=d, n_heads=heads, step=step,
                      hops=hops)
        with torch.no_grad():
            for p in h.parameters():
                p.add_(torch.randn(p.shape) * 0.5)
        _heads[key] = h.eval()
        _runners[key] = HeadRunner(h)
    return _runners[key]


def _inputs(rng: np.random.Generator, B: int, W: int, d: int, scale: float = 1.0):
    win = (rng.standard_normal((B, W, 3 * d)) * scale).astype(np.float32)
    return win, rng.integers(1, W + 1, B), rng.integers(0, V, B)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """1: the calling thread alone; 2: every product and the attention split across a helper."""
    t, old = headmm.threads(), headmm.tune(0, 1, 0)
    headmm.set_threads(request.param)
    yield request.param
    headmm.set_threads(t)
    headmm.tune(*old)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1), B=st.integers(1, 9), n=st.integers(1, N),
       scale=st.sampled_from([1.0, 0.01, 30.0]), full=st.booleans())
def test_the_native_backbone_is_its_reference_byte_for_byte(threads, kind, seed, B, n, scale, full):
    """Random batches (1..9), window fills (1..W rows present: masked rows occur), positions (1..N),
    anchors and magnitudes, on one thread and on two."""
    r = _runner(*kind)
    W = kind[2]
    rng = np.random.default_rng(seed)
    win, lens, anchor = _inputs(rng, B, W, kind[3], scale)
    if full:
        lens[:] = W
    got = r.backbone(win, lens, anchor, n)
    want = r.backbone_reference(win, lens, anchor, n)
    assert got.dtype == np.float32 and got.shape == (B, n, kind[3])
    assert got.tobytes() == want.tobytes()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1), B=st.integers(2, 9), n=st.integers(1, N))
def test_a_requests_ctx_is_the_same_alone_and_in_a_batch(threads, kind, seed, B, n):
    """Alone, in a batch, with fewer positions asked, and with whatever (even NaN) sits in the rows its
    window does not hold: the same bytes."""
    r = _runner(*kind)
    W = kind[2]
    rng = np.random.default_rng(seed)
    win, lens, anchor = _inputs(rng, B, W, kind[3])
    ctx = r.backbone(win, lens, anchor, n)
    junk = win.copy()
    for b in range(B):
        junk[b, :W - lens[b]] = np.nan if b % 2 else 1e30
    assert r.backbone(junk, lens, anchor, n).tobytes() == ctx.tobytes()
    assert r.backbone_reference(junk, lens, anchor, n).tobytes() == ctx.tobytes()
    for b in range(B):
        one = r.backbone(win[b:b + 1], lens[b:b + 1], anchor[b:b + 1], 1 + (n - 1) // 2)
        assert one[0].tobytes() == ctx[b, :one.shape[1]].tobytes(), b


def test_the_backbone_is_the_trainable_heads():
    """The defined order computes DraftHead.backbone's function (torch's attention), within float
    rounding."""
    for kind in KINDS:
        r = _runner(*kind)
        W = kind[2]
        win, lens, anchor = _inputs(np.random.default_rng(2), 13, W, kind[3])
        with torch.no_grad():
            mask = torch.arange(W)[None] >= torch.from_numpy(W - lens)[:, None]
            ref = _heads[kind].backbone(torch.from_numpy(win), mask, torch.from_numpy(anchor), N).numpy()
        assert np.allclose(r.backbone(win, lens, anchor, N), ref, atol=1e-4, rtol=1e-4), kind


def test_bad_input_is_refused_by_name():
    """Rows present outside 1..W, an id outside the vocabulary, positions outside 1..N or a window of
    another shape: a ValueError that names it, never a read out of bounds."""
    r = _runner(*KINDS[0])
    win, lens, anchor = _inputs(np.random.default_rng(3), 3, 16, KINDS[0][3])
    for bad in (0, 17, -1):
        with pytest.raises(ValueError, match=rf"lens\[1\] = {bad}: the rows present are 1 \.\. 16"):
            r.backbone(win, np.array([4, bad, 2]), anchor, N)
    for bad in (V, -1):
        with pytest.raises(ValueError, match=rf"anchor\[2\] = {bad}"):
            r.backbone(win, lens, np.array([0, 1, bad]), N)
    for n in (0, N + 1):
        with pytest.raises(ValueError, match=rf"n = {n} positions; 1 \.\. {N}"):
            r.backbone(win, lens, anchor, n)
    for w in (win[:, 1:], win[..., 1:]):
        with pytest.raises(ValueError, match="do not chain"):
            r.backbone(w, lens, anchor, N)
    with pytest.raises(ValueError, match="lens must be"):
        r.backbone(win, lens[:2], anchor, N)
    with pytest.raises(ValueError, match="q2 and o2"):
        headmm.backbone(win, lens, anchor, N, (*r._bw[:9], r._bw[3], None), r.h, r._scale)


def test_the_shipped_heads_greedy_is_its_reference(threads):
    """On the shipped head (its real shapes: d 192, 4 heads, W 16, N 5, a 2048-id draft vocabulary),
    windows of projected rows: `greedy` (native backbone and positions) and `greedy_reference` (the
    numpy definitions) draft the same ids, confidences and margins, byte for byte."""
    from dspark_proxy.model.train_head import load_head

    head, man = load_head(SHIPPED)
    r = HeadRunner(head)
    rng = np.random.default_rng(4)
    W = man.window
    rows = rng.standard_normal((9 * W, len(man.tap_layers) * man.hidden)).astype(np.float32)
    win = r.project(rows).reshape(9, W, -1)
    for B in (1, 4, 9):
        lens = rng.integers(1, W + 1, B)
        lens[0] = W
        anchor = rng.integers(0, man.vocab_size, B)
        for n in (1, man.num_spec):
            got, want = r.greedy(win[:B], lens, anchor, n), r.greedy_reference(win[:B], lens, anchor, n)
            assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True)), (B, n)
