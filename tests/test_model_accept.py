"""Acceptance bookkeeping and prompt lookup (pure numpy), and the stdlib corpus split (no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_proxy.model.accept import AcceptStats, ngram_drafts, walk_rounds
from dspark_proxy.model.corpus import stdlib_corpus

pytestmark = pytest.mark.timeout(60)


def test_ngram_drafts_follow_the_latest_match_and_loop():
    ctx = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 4, 1, 2])
    assert ngram_drafts(ctx, 3).tolist() == [3, 4, 1]  # "1 2" last seen before 3 4
    assert ngram_drafts(np.array([7, 8, 7, 8, 7]), 4).tolist() == [8, 7, 8, 7]  # read on through itself
    assert ngram_drafts(np.array([1, 2, 3]), 2).tolist() == [-1, -1]


def test_walk_rounds_counts_prefix_matches_and_jumps():
    seqs = np.arange(20)[None, :]
    truth = {}

    def drafts(s, a):  # right for 2 positions, then wrong
        truth.setdefault("anchors", []).append(a)
        d = seqs[s, a + 1:a + 4].copy()
        d[2] = -5
        return d

    st = AcceptStats(3)
    walk_rounds(seqs, 2, 3, drafts, st)
    assert truth["anchors"] == [2, 5, 8, 11, 14]  # each round moves accepted + 1
    assert st.mean == 2.0 and st.by_pos.tolist() == [5, 5, 0]


def test_stdlib_split_is_disjoint_by_package_and_leaves_tables_out():
    c = stdlib_corpus()
    top = lambda names: {n.split("/")[0].removesuffix(".py") for n in names}  # noqa: E731
    assert top(c.train).isdisjoint(top(c.held_out))
    every = c.train + c.held_out
    assert not any(n.startswith(("encodings/", "test/", "pydoc_data/")) or "/tests/" in n for n in every)
    assert len(c.train) > 5 * len(c.held_out) > 0
    assert stdlib_corpus().digest() == c.digest()
