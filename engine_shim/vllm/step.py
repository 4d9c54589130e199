"""One vLLM step as one `enqueue`: the mapping from the model runner's state to the round's arrays.

Pure numpy, no vLLM import, so it is tested without vLLM (tests/test_vllm_step.py) and documented in
docs/vllm.md. Per request i of the step, in vLLM's batch order:

- ``q``: tokens the step computed (its query span; the spans are ``qsl``), ``c0``: positions computed
  before the step, ``d``: drafts verified (``k_window``), ``n_sampled``: tokens vLLM kept (accepted
  drafts plus the bonus token; 0 for a prefill chunk that is not the prompt's last),
- the positions the step finalised: ``fin = q - d + max(n_sampled - 1, 0)`` (a decode step: the last
  anchor and the accepted drafts; a prefill chunk: all of it), ending at ``c1 = c0 + fin``, the
  anchor's position; the rows sent are the last ``valid = min(fin, W)`` of them, from ``first_pos``,
- the anchor is the token at ``c1`` (the token sampled this step, or the next prompt token of a chunk
  that sampled nothing), and a draft is asked for only when a token was sampled and the request has
  room for at least one draft before its own end: the smaller of ``max_model_len`` and its prompt
  plus ``max_tokens`` (``limit``); drafts are capped at that room, so prompt + generated + drafts
  never passes the end (vLLM would verify them and throw the tokens away).

Slots are the engine's, not vLLM's batch indices (vLLM compacts its batch when requests leave):
`SlotMap` gives each request id a slot for as long as it runs and a new owner id on every admission,
so a preempted request that comes back starts a new generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

__all__ = ["SlotMap", "StepArrays", "plan_step", "clip_drafts", "NO_LIMIT"]

NO_LIMIT = np.iinfo(np.int64).max  # a request whose only end is max_model_len


class SlotMap:
    """vLLM request id -> (slot, owner id, token limit). A slot is held from a request's first step
    until vLLM says it finished or was preempted; the owner id (int64, never reused) changes on every
    admission. ``limit[slot]`` is the request's own end (prompt + max_tokens), read once per admission
    through ``limit_of`` so the per-step path stays a gather.

    Thread ownership: the model runner's thread.
    """

    def __init__(self, max_slots: int) -> None:
        self.max_slots = int(max_slots)
        self._slot: dict[str, int] = {}
        self._free: list[int] = list(range(self.max_slots - 1, -1, -1))
        self.owner = np.full(self.max_slots, -1, dtype=np.int64)
        self.limit = np.full(self.max_slots, NO_LIMIT, dtype=np.int64)
        self._next_owner = 0

    def __len__(self) -> int:
        return len(self._slot)

    def release(self, req_ids: Iterable[str] | None) -> None:
        """Free the slots of requests that finished or were preempted (unknown ids are ignored)."""
        if not req_ids:
            return
        for r in req_ids:
            s = self._slot.pop(r, None)
            if s is not None:
                self.owner[s] = -1
                self._free.append(s)

    def slots_for(self, req_ids: Sequence[str], limit_of: Callable[[str], int] | None = None) -> np.ndarray:
        """The slots of the step's requests (int64 [n], batch order); new requests get free slots (and
        ``limit_of(req_id)`` as their limit). A request that finds none (only if vLLM ran more requests
        than max_num_seqs, or forgot to say one finished) first reclaims the slots of requests not in
        this step, else gets -1."""
        n = len(req_ids)
        got = np.fromiter(map(self._slot.get, req_ids, repeat(-1, n)), dtype=np.int64, count=n)
        if n and got.min() < 0:
            for i in np.flatnonzero(got < 0).tolist():
                got[i] = s = self._admit(req_ids[i], req_ids)
                if s >= 0:
                    self.limit[s] = NO_LIMIT if limit_of is None else limit_of(req_ids[i])
        return got

    def refresh(self, req_ids: Iterable[str], limit_of: Callable[[str], int]) -> None:
        """Read the limits of these held requests again (vLLM re-sent them: a streaming request's new
        prompt and max_tokens); ids without a slot are ignored (their admission reads theirs)."""
        for r in req_ids:
            s = self._slot.get(r)
            if s is not None:
                self.limit[s] = limit_of(r)

    def _admit(self, req_id: str, running: Sequence[str]) -> int:
        if not self._free:
            live = set(running)
            self.release([r for r in self._slot if r not in live])
        if not self._free:
            return -1
        s = self._free.pop()
        self._slot[req_id] = s
        self.owner[s] = self._next_owner
        self._next_owner += 1
        return s


@dataclass
class StepArrays:
    """One step's enqueue arrays (batch order) and where its rows are in the step's hidden states."""

    slots: np.ndarray  # int64 [n]
    owners: np.ndarray  # int64 [n] (the enqueue's req_ids)
    qsl: np.ndarray  # int64 [n + 1]
    k_window: np.ndarray  # int64 [n]
    valid: np.ndarray  # int64 [n]
    first_pos: np.ndarray  # int64 [n]
    anchor: np.ndarray  # int64 [n]
    need_draft: np.ndarray  # bool [n]
    max_drafts: np.ndarray  # int64 [n]: room left before the request's end, capped at N
    row_index: np.ndarray  # int64 [sum(valid)]: flat token index of each row, request after request
    consistent: np.ndarray  # bool [n]: the anchor's position agrees with vLLM's token count


def plan_step(*, slots: np.ndarray, owners: np.ndarray, qsl: np.ndarray, c0: np.ndarray, d: np.ndarray,
              n_sampled: np.ndarray, n_tokens: np.ndarray, token_ids: np.ndarray, window: int,
              num_spec: int, max_model_len: int, limit: np.ndarray | None = None) -> StepArrays:
    """The enqueue arrays of one step (module docstring). ``token_ids`` is vLLM's [max_reqs,
    max_model_len] token table (row i = batch index i) after the step's sampled tokens were written;
    ``n_tokens`` its per-request count of known tokens; ``limit`` each request's own end in tokens
    (prompt + max_tokens; None: max_model_len alone)."""
    n = int(slots.shape[0])
    qsl = qsl.astype(np.int64, copy=False)
    q = qsl[1:] - qsl[:-1]
    ns = n_sampled.astype(np.int64, copy=False)
    fin = q - d + np.maximum(ns - 1, 0)
    fin = np.minimum(np.maximum(fin, 0), q)  # (np.clip costs 3x more on a few requests)
    c1 = c0 + fin
    valid = np.minimum(fin, window)
    sampled = ns > 0
    # vLLM's count of known tokens says where the anchor is; a disagreement means we misread the step
    consistent = ~sampled | (c1 == n_tokens - 1)
    col = np.minimum(c1, token_ids.shape[1] - 1)
    anchor = token_ids[np.arange(n), col].astype(np.int64)
    end = max_model_len if limit is None else np.minimum(limit, max_model_len)
    room = end - n_tokens  # tokens the request may still append; a step appends drafts + 1
    max_drafts = np.minimum(np.maximum(room - 1, 0), num_spec)
    need = sampled & consistent & (max_drafts > 0) & (slots >= 0)
    total = int(valid.sum()) if n else 0
    starts = qsl[:-1] + fin - valid  # flat index of each request's first row
    before = np.cumsum(valid) - valid
    row_index = np.repeat(starts - before, valid) + np.arange(total, dtype=np.int64)
    return StepArrays(slots=slots, owners=owners, qsl=qsl, k_window=d.astype(np.int64, copy=False),
                      valid=valid, first_pos=c1 - valid, anchor=anchor, need_draft=need,
                      max_drafts=max_drafts, row_index=row_index, consistent=consistent)


def clip_drafts(draft_ids: np.ndarray, n_drafts: np.ndarray, need: np.ndarray, max_drafts: np.ndarray,
                vocab_size: int) -> list[list[int]]:
    """vLLM's list of drafts per request from a reply: request i's first ``n_drafts[i]`` ids, cut at
    the first id outside the vocabulary and at ``max_drafts[i]`` (the room before its end); an empty
    list where none are usable (never a -1 placeholder: some of vLLM's kernels index with the ids)."""
    n, N = draft_ids.shape
    if n == 0:
        return []
    ids = draft_ids.astype(np.int64, copy=False)
    inside = (ids >= 0) & (ids < vocab_size)
    lead = np.logical_and.accumulate(inside, axis=1).sum(axis=1)
    k = np.minimum(np.minimum(n_drafts.astype(np.int64, copy=False), lead), max_drafts)
    k = np.where(need, np.maximum(k, 0), 0)  # already <= N: lead and max_drafts are
    return [r[:j] for r, j in zip(ids.tolist(), k.tolist(), strict=True)]
