"""The round's view of a draft worker: the `DraftClient` protocol and the outcome of one STEP.

Three implementations: `client.TcpDraftClient` (a remote worker over TCP), `pool.client.PoolClient`
(several of them, docs/deploy.md, "A pool of workers") and `inproc.InProcessClient` (a worker inside the
proxy, for `--worker inproc|null`, benchmarks and tests). The round and the
proxy depend only on this protocol; both clients return the same types (`StepOutcome` holding a
`wire.StepReply`), so nothing downstream can tell them apart except by what they measure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..wire import StepReply

__all__ = ["DraftClient", "StepOutcome", "StepReply", "STEP_FAILURE_REASONS"]

# why a step returned no reply (StepOutcome.reason); the round counts each as fallback_<reason>
STEP_FAILURE_REASONS = ("not_ready", "disabled", "reconnected", "timeout", "connection_lost", "bad_reply",
                        "worker_error")


@dataclass(frozen=True)
class StepOutcome:
    """One step's result: ok with a validated reply, or not ok with one of STEP_FAILURE_REASONS."""

    ok: bool
    reason: str | None
    reply: StepReply | None
    rtt_us: float


class DraftClient(Protocol):
    """What the round needs from a worker. Called from the round's thread only, except start/stop."""

    @property
    def disabled(self) -> bool:
        """True after a permanent refusal (a layout mismatch, failed auth): steps return "disabled"."""
        ...

    @property
    def counters(self) -> Mapping[str, int]:
        """The client's own counters, published under "client" in the proxy's snapshot."""
        ...

    def start(self) -> None:
        """Begin connecting (in the background); never blocks on the worker."""
        ...

    def stop(self) -> None:
        """Idempotent: stop connecting and close everything."""
        ...

    def connection_epoch(self) -> int | None:
        """The current connection's epoch (raised on every reconnect), or None while not ready."""
        ...

    def new_session(self, reason: str) -> None:
        """Steps from now on go under a fresh session: the worker drops every window it held."""
        ...

    def moved_slots(self) -> np.ndarray | None:
        """Called by the round once a round, before it builds entries: the slots whose worker changed
        since the last call (a pool's failover or rebalance, pool/client.py), whose windows must be
        resent; None when none did (always, for a single worker)."""
        ...

    def step(self, prefix: Any, entries: np.ndarray, n_rows: int, *, step_id: int, step_flags: int, epoch: int,
             rows: Sequence, sample_meta: np.ndarray | None = None, timeout_s: float) -> StepOutcome:
        """Send one STEP (FORMAT.md) and wait for its reply until timeout_s. Never raises for worker or
        network problems: the outcome says why it failed."""
        ...
