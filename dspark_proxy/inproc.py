"""A worker inside the proxy, behind the client's interface: no socket, no thread.

Used where the network must not count: the hand-off benchmark ("a full round with an in-process null
worker") and tests of the round and the proxy process that do not need TCP. It keeps real per-slot
windows (the worker's own `Session`) and drafts with the `integrity` drafter, so every draft it
produces is checkable by the engine's oracle. In sampled mode both answer as the remote integrity
worker does (support draft + k, q one-hot, for requests with temperature > 0), with the drafter's own
code; their sampled sections are allocated on the first sampled round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .wire import SF_SAMPLED, TOP_K
from .worker.drafters import DraftItem, IntegrityDrafter
from .worker.session import Session

__all__ = ["InProcessClient", "InProcessReply", "InProcessOutcome"]


@dataclass
class InProcessReply:
    status: np.ndarray
    window_rows: np.ndarray
    draft_ids: np.ndarray
    confidence: np.ndarray
    margin: np.ndarray | None = None
    sampled_mask: np.ndarray | None = None
    support_ids: np.ndarray | None = None
    proposal_q: np.ndarray | None = None
    worker_us: float = 0.0


@dataclass(frozen=True)
class InProcessOutcome:
    ok: bool
    reason: str | None
    reply: InProcessReply | None
    rtt_us: float


class InProcessClient:
    """DraftClient's interface (connection_epoch, disabled, new_session, step, start, stop)."""

    def __init__(self, *, max_reqs: int, num_spec: int, window: int, row_bytes: int, null: bool = False) -> None:
        self.M, self.N, self.W, self.row_bytes = max_reqs, num_spec, window, row_bytes
        self.null = null  # null: answer every request with fixed drafts, keep no windows (cheapest)
        self.epoch = 1
        self.disabled = False
        self.counters: dict[str, int] = {"steps": 0, "sessions": 1}
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
        self._sampled_now = False  # the drafter writes the sampled sections only in a sampled round

    def start(self) -> None:
        """Nothing to connect: the worker is right here (DraftClient's interface)."""

    def stop(self) -> None:
        """Nothing to close."""

    def connection_epoch(self) -> int | None:
        return None if self.disabled else self.epoch

    def new_session(self, reason: str) -> None:
        self.counters["sessions"] += 1
        self._session = Session(self.counters["sessions"], self.W, self.row_bytes, self.M, chains=False)

    def step(self, prefix: Any, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int, epoch: int,
             rows: list, sample_meta: np.ndarray | None = None, timeout_s: float = 1.0) -> InProcessOutcome:
        t0 = time.perf_counter()
        if epoch != self.epoch:
            return InProcessOutcome(False, "reconnected", None, 0.0)
        self.counters["steps"] += 1
        k = int(entries.shape[0])
        status, wrows = self._status[:k], self._wrows[:k]
        ids, conf = self._ids[:k], self._conf[:k]
        self._sampled_now = bool(step_flags & SF_SAMPLED) and sample_meta is not None
        if self._sampled_now:
            self._clear_sampled(k)
        if self.null:
            status[:] = 0
            wrows[:] = self.W
            ids[:] = 1
            conf[:] = 1.0
            if self._sampled_now:
                self._drafter.fill_sampled(self, self._idx[:k], sample_meta["temperature"])
        else:
            flat = rows[0] if len(rows) == 1 else np.concatenate(rows)
            if flat.shape[0] != n_rows:
                return InProcessOutcome(False, "bad_reply", None, 0.0)
            o = 0
            items = []
            for i in range(k):
                e = entries[i]
                c = int(e["n_rows"])
                st, w = self._session.apply(int(e["slot"]), int(e["generation"]), int(e["first_pos"]), c,
                                            int(e["flags"]), flat[o:o + c])
                o += c
                status[i], wrows[i] = st, w
                if st <= 1 and w > 0:
                    sw = self._session.slots[int(e["slot"])]
                    seed, temp = (int(sample_meta["seed"][i]), float(sample_meta["temperature"][i])) \
                        if self._sampled_now else (0, 0.0)
                    items.append(DraftItem(i, int(e["anchor_token"]), int(e["anchor_pos"]), w, int(e["n_out"]),
                                           sw.segments(w), seed, temp))
                else:
                    ids[i] = -1
                    conf[i] = 0.0
            self._drafter.draft(items, self)
        us = (time.perf_counter() - t0) * 1e6
        reply = InProcessReply(status, wrows, ids, conf, worker_us=us)
        if self._sampled_now:
            reply.sampled_mask, reply.support_ids, reply.proposal_q = self._smask[:k], self._sup[:k], self._q[:k]
        return InProcessOutcome(True, None, reply, us)

    def _clear_sampled(self, k: int) -> None:
        if self._smask is None:
            self._smask = np.zeros(self.M, np.uint8)
            self._sup = np.full((self.M, self.N, TOP_K), -1, np.int32)
            self._q = np.zeros((self.M, self.N, TOP_K), np.float32)
        self._smask[:k] = 0
        self._sup[:k] = -1
        self._q[:k] = 0.0

    # the drafter writes into these (ReplyWriter's attribute names)
    @property
    def draft_ids(self) -> np.ndarray:
        return self._ids

    @property
    def confidence(self) -> np.ndarray:
        return self._conf

    margin = None

    @property
    def sampled_mask(self) -> np.ndarray | None:
        return self._smask if self._sampled_now else None

    @property
    def support_ids(self) -> np.ndarray | None:
        return self._sup if self._sampled_now else None

    @property
    def proposal_q(self) -> np.ndarray | None:
        return self._q if self._sampled_now else None
