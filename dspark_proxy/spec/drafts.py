"""Where the engine's drafts come from: a shim (the proxy and its worker), prompt lookup in the engine,
or nowhere (target-only). Each is asked once a step with what the step finalised (`Finalised`) and
answers the next step's drafts (`Drafts`), in the same request order.

A round is two calls, `begin(f)` then `finish(pending)`, so the engine can do its own work while the
drafter works (the shim's `enqueue` returns at once and `read_reply` waits only for what is left);
`round(f)` is both at once. A source that drafts in the engine (prompt lookup) answers in `begin`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.accept import ngram_drafts

__all__ = ["Finalised", "Drafts", "NoDrafts", "NgramDrafts", "ShimDrafts"]


@dataclass
class Finalised:
    """One step's finalised positions per request (enqueue's arguments; rows in request order)."""

    req_ids: np.ndarray  # int64 [n]
    slots: np.ndarray  # int64 [n]
    qlen: np.ndarray  # int64 [n]: the request's query tokens in this step's forward
    valid: np.ndarray  # int64 [n]: rows finalised (the previous anchor and the accepted drafts; <= W)
    first_pos: np.ndarray  # int64 [n]: position of the first of them
    anchor: np.ndarray  # int64 [n]: the token the step produced last, at first_pos + valid
    k_window: np.ndarray  # int64 [n]: drafts verified this step
    need_draft: np.ndarray  # bool [n]
    rows: np.ndarray | None  # uint8 [sum(valid), row_bytes]: taps x hidden in the manifest's dtype, as bytes
    temperature: np.ndarray  # float32 [n]
    seed: np.ndarray  # int64 [n]
    context: list[np.ndarray]  # each request's tokens up to and including its anchor (prompt lookup)


@dataclass
class Drafts:
    """Request i's drafts are ids[i, :n[i]]; support/q: the proposal they were drawn from, if any."""

    n: np.ndarray  # int64 [n]
    ids: np.ndarray  # int64 [n, N]
    support: np.ndarray | None = None  # int32 [n, N, 32] (-1 padding)
    q: np.ndarray | None = None  # float32 [n, N, 32]
    confidence: np.ndarray | None = None  # float32 [n, N]: the drafter's estimate that each is accepted
    failed: bool = False  # the whole round failed (target-only)
    reason: str = ""


class NoDrafts:
    """Target-only decoding: one token per request per step."""

    name = "target-only"

    def __init__(self, num_spec: int) -> None:
        self.num_spec = num_spec

    def round(self, f: Finalised) -> Drafts:
        n = len(f.slots)
        return Drafts(np.zeros(n, np.int64), np.full((n, self.num_spec), -1, np.int64))

    def begin(self, f: Finalised) -> Any:
        return self.round(f)

    def finish(self, pending: Any) -> Drafts:
        return pending

    def close(self) -> None:
        return None


class NgramDrafts(NoDrafts):
    """Prompt lookup in the engine (the yardstick every drafter is compared with)."""

    name = "ngram"

    def round(self, f: Finalised) -> Drafts:
        d = super().round(f)
        for i, ctx in enumerate(f.context):
            if f.need_draft[i]:
                ids = ngram_drafts(ctx, self.num_spec)
                d.ids[i] = ids
                d.n[i] = int(np.argmin(ids >= 0)) if (ids < 0).any() else self.num_spec
        return d


class ShimDrafts:
    """The proxy's drafts: `enqueue(t)` the finalised rows, `read_reply(t)` the next drafts. The reply's
    arrays are views of the shim's buffer, so they are copied here."""

    name = "shim"

    def __init__(self, shim: Any) -> None:
        self.shim = shim
        self.num_spec = int(shim.num_spec)
        self.sampled = bool(shim.sampled)
        self.statuses: dict[str, int] = {}

    def round(self, f: Finalised) -> Drafts:
        return self.finish(self.begin(f))

    def begin(self, f: Finalised) -> int:
        """enqueue(t): the proxy starts the round and this returns at once; the round's number."""
        # the shim's rounds are numbered from 1 for as long as it lives, across runs that share it
        t = self.shim.round_in_flight()[0] + 1
        n = len(f.slots)
        qsl = np.zeros(n + 1, np.int64)
        np.cumsum(f.qlen, out=qsl[1:])
        kw: dict[str, Any] = {}
        if self.sampled:
            kw = {"sampled": f.temperature > 0, "seed": f.seed, "temperature": f.temperature}
        self.shim.enqueue(t, req_ids=f.req_ids, slots=f.slots, qsl=qsl, need_draft=f.need_draft,
                          k_window=np.minimum(f.k_window, 255), rows=f.rows, valid=f.valid, first_pos=f.first_pos,
                          anchor=f.anchor, **kw)
        return t

    def finish(self, t: int) -> Drafts:
        """read_reply(t): the drafts, or a failed round, by the round's deadline whatever the proxy does."""
        r = self.shim.read_reply(t)
        key = r.status_name if r.ok else f"failed:{r.reason}"
        self.statuses[key] = self.statuses.get(key, 0) + 1
        d = Drafts(r.n_drafts.astype(np.int64), r.draft_ids.astype(np.int64), failed=not r.ok, reason=r.reason,
                   confidence=r.confidence.astype(np.float32))
        if r.support_ids is not None and r.sample_mask is not None:
            sm = r.sample_mask[:, None, None]
            d.support = np.where(sm, r.support_ids, -1).astype(np.int32)
            d.q = np.where(sm, r.proposal_q, 0.0).astype(np.float32)
        return d

    def close(self) -> None:
        self.shim.close()
