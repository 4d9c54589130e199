"""The reference engine's draft-length policy: a request verifies its drafts only while the product of
their confidences stays at or above `min_confidence`; it only ever verifies fewer, so the output is
target-only's, token for token."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dspark_proxy.spec.drafts import Drafts, Finalised, NoDrafts  # noqa: E402
from dspark_proxy.spec.engine import Request, SpecEngine  # noqa: E402
from dspark_proxy.spec.run import DEFAULT_HEAD, DEFAULT_MODEL, held_out_prompts, open_engine  # noqa: E402

pytestmark = pytest.mark.timeout(240)
N = 5
CONF = np.array([0.9, 0.9, 0.5, 0.9, 0.9], np.float32)  # cumulative 0.9, 0.81, 0.405, 0.36, 0.33


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return open_engine(DEFAULT_MODEL, DEFAULT_HEAD, max_batch=3, max_len=120)


class Oracle(NoDrafts):
    """Drafts the target's own next N greedy tokens (all would be accepted), with fixed confidences."""

    def __init__(self, full: list[np.ndarray]) -> None:
        super().__init__(N)
        self.full = full

    def round(self, f: Finalised) -> Drafts:
        d = super().round(f)
        d.confidence = np.tile(CONF, (len(f.slots), 1))
        for i, ctx in enumerate(f.context):
            seq = next(s for s in self.full if np.array_equal(s[:len(ctx)], ctx))
            nxt = seq[len(ctx):len(ctx) + N]
            d.ids[i, :len(nxt)], d.n[i] = nxt, len(nxt)
        return d


def _run(target, min_confidence: float):
    prompts = held_out_prompts(target.tokenizer, 5, 24)
    reqs = [Request(i, p, 30) for i, p in enumerate(prompts)]
    ref = SpecEngine(target, NoDrafts(N), max_batch=3, window=16).run(reqs)
    full = [np.concatenate([r.prompt, ref.outputs[r.rid]]) for r in reqs]
    st = SpecEngine(target, Oracle(full), max_batch=3, window=16, min_confidence=min_confidence).run(reqs)
    for r in reqs:
        assert st.outputs[r.rid].tolist() == ref.outputs[r.rid].tolist(), f"request {r.rid} differs"
    return st


@pytest.mark.parametrize("tau, verified", [(0.0, N), (0.35, 4), (0.5, 2), (0.95, 0)])
def test_drafts_are_verified_while_confidence_holds(target, tau: float, verified: int) -> None:
    st = _run(target, tau)
    assert st.full_rounds > 0
    # every full round verified exactly `verified` drafts, and the oracle's were all accepted
    assert st.verified_by_pos.tolist() == [st.full_rounds] * verified + [0] * (N - verified)
    assert st.mean_accepted_full == verified


def test_min_confidence_is_a_probability(target) -> None:
    with pytest.raises(ValueError, match="min_confidence"):
        SpecEngine(target, NoDrafts(N), max_batch=3, window=16, min_confidence=1.5)
