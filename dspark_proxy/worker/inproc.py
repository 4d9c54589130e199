"""A worker inside the proxy, behind the client's interface (`draft_client.DraftClient`): no socket, no thread.

Used where the network must not count: the hand-off benchmark ("a full round with an in-process null
worker") and tests of the round and the proxy process that do not need TCP. It serves each STEP
with the remote worker's own serve loop (`worker.serve.serve_step`: real per-slot windows in the
worker's `Session`, the same usability rule) and drafts with the `integrity` drafter, so every
draft it produces is checkable by the engine's oracle. It returns the TCP client's types
(`StepOutcome` holding a `wire.StepReply`). In sampled mode both answer as the remote integrity
worker does (support draft + k, q one-hot, for requests with temperature > 0), with the drafter's own
code; their sampled sections are allocated on the first sampled round.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from ..link.draft_client import StepOutcome
from ..wire import MSG_REPLY, SF_SAMPLED, TOP_K, AppHeader, StepReply, WireLayout
from .drafters import IntegrityDrafter
from .serve import serve_step
from .session import Session

__all__ = ["InProcessClient"]

_clock = time.perf_counter


class _Out:
    """The arrays a serve loop and a drafter fill, under ReplyWriter's names: views [:k] of the
    client's preallocated ones (no per-round array allocation)."""

    __slots__ = ("status", "window_rows", "draft_ids", "confidence", "margin", "sampled_mask", "support_ids",
                 "proposal_q")


class InProcessClient:
    """A `DraftClient` whose worker is right here (connection_epoch, disabled, new_session, step, start, stop)."""

    def __init__(self, *, max_reqs: int, num_spec: int, window: int, row_bytes: int, null: bool = False) -> None:
        self.M, self.N, self.W, self.row_bytes = max_reqs, num_spec, window, row_bytes
        self.null = null  # null: answer every request with fixed drafts, keep no windows (cheapest)
        self.epoch = 1
        self.disabled = False
        self.counters: Counter[str] = Counter({"steps": 0, "sessions": 1})
        self._layout = WireLayout(num_spec=num_spec, window=window, row_bytes=row_bytes, max_reqs=max_reqs)
        self._session = Session(1, window, row_bytes, max_reqs, chains=False)  # drafts from the bytes
        self._drafter = IntegrityDrafter(num_spec, window)
        self._status = np.zeros(max_reqs, np.uint8)
        self._wrows = np.zeros(max_reqs, np.uint32)
        self._ids = np.zeros((max_reqs, num_spec), np.int32)
        self._conf = np.zeros((max_reqs, num_spec), np.float32)
        self._idx = np.arange(max_reqs)
        self._smask: np.ndarray | None = None  # sampled sections, made on the first sampled round
        self._sup: np.ndarray | None = None
        self._q: np.ndarray | None = None
        self._null_out: dict[int, _Out] = {}  # null, not sampled: a step's reply arrays by k

    def start(self) -> None:
        """Nothing to connect: the worker is right here."""

    def stop(self) -> None:
        """Nothing to close."""

    def connection_epoch(self) -> int | None:
        return None if self.disabled else self.epoch

    def moved_slots(self) -> None:
        """One worker: no slot ever moves."""
        return None

    def new_session(self, reason: str) -> None:
        self.counters["sessions"] += 1
        self._session = Session(self.counters["sessions"], self.W, self.row_bytes, self.M, chains=False)

    def step(self, prefix: Any, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int, epoch: int,
             rows: list, sample_meta: np.ndarray | None = None, timeout_s: float = 1.0) -> StepOutcome:
        t0 = _clock()
        if epoch != self.epoch:
            return StepOutcome(False, "reconnected", None, 0.0)
        self.counters["steps"] += 1
        k = int(entries.shape[0])
        sampled = bool(step_flags & SF_SAMPLED) and sample_meta is not None
        if self.null and not sampled:  # the views of k requests, made once per k (nothing else changes)
            out = self._null_out.get(k) or self._null_out.setdefault(k, self._out(k, False, clear=False))
        else:
            # null: every array below is overwritten, so the reply's own clearing is skipped
            out = self._out(k, sampled, clear=not self.null)
        if self.null:  # (fill: a third of a slice assignment's cost)
            out.status.fill(0)
            out.window_rows.fill(self.W)
            out.draft_ids.fill(1)
            out.confidence.fill(1.0)
            if out.sampled_mask is not None:
                self._drafter.fill_sampled(out, self._idx[:k], sample_meta["temperature"])
        else:
            # parts are [k, row_bytes] arrays (the staging) or flat byte views (runs of the shared ring)
            parts = [np.asarray(r, dtype=np.uint8).reshape(-1, self.row_bytes) for r in rows]
            flat = parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else
                                                      np.zeros((0, self.row_bytes), np.uint8))
            if flat.shape[0] != n_rows:
                return StepOutcome(False, "bad_reply", None, 0.0)
            serve_step(self._session, entries, flat, sample_meta if out.sampled_mask is not None else None, out,
                       self._layout, self._drafter, self.counters)
        us = (_clock() - t0) * 1e6
        header = AppHeader(MSG_REPLY, 0, self.counters["sessions"], epoch, step_id, 0)  # type, flags, ..., payload_len
        reply = StepReply(header, step_flags, out.status, out.window_rows, out.draft_ids, out.confidence, None,
                          out.sampled_mask, out.support_ids, out.proposal_q, us)
        return StepOutcome(True, None, reply, us)

    def _out(self, k: int, sampled: bool, clear: bool = True) -> _Out:
        """This step's reply arrays, cleared as a fresh REPLY is (ids -1, the rest 0); `clear` False:
        the caller overwrites the four per-request arrays itself (the sampled ones are cleared anyway)."""
        out = _Out()
        out.status, out.window_rows = self._status[:k], self._wrows[:k]
        out.draft_ids, out.confidence = self._ids[:k], self._conf[:k]
        if clear:
            out.status[:] = 0
            out.window_rows[:] = 0
            out.draft_ids[:] = -1
            out.confidence[:] = 0.0
        out.margin = out.sampled_mask = out.support_ids = out.proposal_q = None
        if sampled:
            if self._smask is None:
                self._smask = np.zeros(self.M, np.uint8)
                self._sup = np.full((self.M, self.N, TOP_K), -1, np.int32)
                self._q = np.zeros((self.M, self.N, TOP_K), np.float32)
            out.sampled_mask, out.support_ids, out.proposal_q = self._smask[:k], self._sup[:k], self._q[:k]
            out.sampled_mask[:] = 0
            out.support_ids[:] = -1
            out.proposal_q[:] = 0.0
        return out
