"""Acceptance along the target's own greedy generations: the head's and prompt lookup's, measured alike.

A generation is lossless, so the drafter sees exactly the target's rows and tokens. Walking it in
rounds as a speculative decoder does (anchor a; accept the longest prefix of the N drafts that matches
tokens a+1..a+N; next anchor a + accepted + 1) gives the mean accepted drafts per request-round, not
counting the bonus token, and the acceptance rate of each draft position.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["walk_rounds", "ngram_drafts", "AcceptStats"]


class AcceptStats:
    def __init__(self, num_spec: int) -> None:
        self.n = num_spec
        self.rounds = 0
        self.accepted = 0
        self.by_pos = np.zeros(num_spec, dtype=np.int64)  # rounds whose draft j was accepted

    def add(self, k: int) -> None:
        self.rounds += 1
        self.accepted += k
        self.by_pos[:k] += 1

    @property
    def mean(self) -> float:
        return self.accepted / max(1, self.rounds)

    def as_dict(self) -> dict:
        return {"mean_accepted": round(self.mean, 4), "rounds": self.rounds,
                "accept_by_position": [round(float(x), 4) for x in self.by_pos / max(1, self.rounds)]}


def walk_rounds(seqs: np.ndarray, start: int, num_spec: int,
                drafts_at: Callable[[int, int], np.ndarray], stats: AcceptStats) -> None:
    """seqs [S, T] greedy token sequences whose tokens from `start` on are the target's greedy output;
    drafts_at(s, a) → N draft ids for anchor position a of sequence s."""
    S, T = seqs.shape
    for s in range(S):
        a = start
        while a + num_spec < T:
            d = drafts_at(s, a)
            match = d == seqs[s, a + 1:a + 1 + num_spec]
            k = int(num_spec if match.all() else np.argmin(match))
            stats.add(k)
            a += k + 1


def ngram_drafts(ctx: np.ndarray, num_spec: int, n_max: int = 3, n_min: int = 1) -> np.ndarray:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the context's last n
    tokens (longest n first), read on through the proposal itself when the match is near the end (so
    a loop of period p proposes the loop); -1 where nothing matches."""
    out = np.full(num_spec, -1, dtype=np.int64)
    L = len(ctx)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        tail = ctx[L - n:]
        win = np.lib.stride_tricks.sliding_window_view(ctx[:L - 1], n)  # starts 0 .. L-1-n
        hits = np.flatnonzero((win == tail).all(axis=1))
        hits = hits[hits + n < L]
        if hits.size:
            i = int(hits[-1]) + n
            ext = np.concatenate([ctx, out])  # a match near the end continues with its own proposal
            for j in range(num_spec):
                ext[L + j] = ext[i + j]
            return ext[L:].copy()
    return out
