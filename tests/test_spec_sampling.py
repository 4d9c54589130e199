"""Sampled-mode losslessness: speculative sampling through `spec.verify.accept_sampled` must give the
target's own distribution, whatever the proposal, as long as each draft was drawn from it; a drafter
that drafts greedily while reporting q is caught.

A small vocabulary (6 tokens) and a Markov target p(next | prev) make the exact distribution of the
first two generated tokens known; 20,000 generations in one batch, drafting 3 tokens a round from a
different Markov proposal q, and a chi-square test of the 36 cells."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from dspark_proxy.spec.verify import accept_sampled  # noqa: E402

V, N, SAMPLES, ANCHOR = 6, 3, 20_000, 2


def _markov(seed: int, floor: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(V, V, generator=g) + floor
    return m / m.sum(1, keepdim=True)


P = _markov(1, 0.3)  # the target: p(next | prev)
Q = _markov(7, 0.05)  # the drafter's proposal, deliberately unlike P


def _two_tokens(greedy_mutant: bool, seed: int) -> torch.Tensor:
    """SAMPLES generations of two tokens after ANCHOR, in rounds of up to N drafts: [SAMPLES, 2]."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((SAMPLES, 2), -1, dtype=torch.long)
    have = torch.zeros(SAMPLES, dtype=torch.long)
    prev = torch.full((SAMPLES,), ANCHOR, dtype=torch.long)
    while bool((have < 2).any()):
        idx = torch.nonzero(have < 2).flatten()
        B = len(idx)
        drafts = torch.zeros(B, N, dtype=torch.long)
        q = torch.zeros(B, N, V)
        last = prev[idx]
        for j in range(N):
            qj = Q[last]
            q[:, j] = qj
            last = qj.argmax(-1) if greedy_mutant else torch.multinomial(qj, 1, generator=gen)[:, 0]
            drafts[:, j] = last
        ctx = torch.cat([prev[idx][:, None], drafts], 1)  # the token each position conditions on
        logits = P[ctx].log()  # [B, N + 1, V]
        support = torch.arange(V).expand(B, N, V)
        v = accept_sampled(logits, torch.ones(B), drafts, torch.full((B,), N), support, q, gen)
        for j in range(N + 1):  # emitted tokens j <= m, kept while a row still needs them
            emit = (j <= v.m) & (have[idx] < 2)
            rows = idx[emit]
            out[rows, have[rows]] = v.tokens[emit, j]
            have[rows] += 1
            prev[rows] = v.tokens[emit, j]
    return out


def _chi2_p(pairs: torch.Tensor) -> float:
    counts = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    expected = (P[ANCHOR][:, None] * P).flatten().double() * len(pairs)
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = V * V - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampled_acceptance_keeps_the_target_distribution() -> None:
    assert float(P[ANCHOR].min() * P.min()) * SAMPLES > 5  # every cell expects enough for chi-square
    p = _chi2_p(_two_tokens(greedy_mutant=False, seed=11))
    assert p >= 0.01, f"speculative sampling changed the output distribution: chi-square p = {p:.2e}"


def test_a_drafter_that_drafts_greedily_is_rejected() -> None:
    p = _chi2_p(_two_tokens(greedy_mutant=True, seed=11))
    assert p < 0.01 and not math.isnan(p), f"the greedy-drafting mutant passed: chi-square p = {p:.3f}"


def test_point_mass_drafts_without_q() -> None:
    """Drafts that came without a proposal (greedy drafting, q absent) are point masses: still lossless."""
    gen = torch.Generator().manual_seed(3)
    B = SAMPLES
    drafts = torch.full((B, 1), int(Q[ANCHOR].argmax()))
    logits = P[torch.tensor([ANCHOR, int(drafts[0, 0])])].log().expand(B, 2, V)
    v = accept_sampled(logits, torch.ones(B), drafts, torch.ones(B, dtype=torch.long), None, None, gen)
    counts = torch.bincount(v.tokens[:, 0], minlength=V).double()
    expected = P[ANCHOR].double() * B
    stat = float(((counts - expected) ** 2 / expected).sum())
    p = float(torch.special.gammaincc(torch.tensor((V - 1) / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    assert p >= 0.01, f"point-mass drafts changed the first token's distribution: p = {p:.2e}"
