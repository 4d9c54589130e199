"""Fault injection for tests and demos, switched on only by explicit flags (all off by default)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

__all__ = ["FaultPlan", "FaultAction", "FaultCounter"]


@dataclass(frozen=True)
class FaultPlan:
    """Which faults to inject, counted in STEPs served by the whole worker (1-based).

    delay_ms: sleep this long before every reply. draft_delay_ms: this long more before a reply to a STEP
    that asked for drafts (drafting made expensive, rows alone not: the acceptance gate's throughput rule,
    docs/design.md). stall_after: after this many steps, stop answering
    (connections stay open, nothing is sent). drop_every: close the connection instead of answering
    every k-th step. garbage_every: every k-th reply is random bytes under a valid header.
    wrong_step_every: every k-th reply carries a wrong step id. wrong_session_every: every k-th reply is
    well formed, with real drafts, under another session id (a reply meant for someone else).
    crash_after: os._exit after k steps. duplicate_reply_every: every k-th reply is sent twice (one
    frame nobody waits for: the client must discard it and stay in step).
    """

    delay_ms: float = 0.0
    draft_delay_ms: float = 0.0
    stall_after: int | None = None
    drop_every: int | None = None
    garbage_every: int | None = None
    wrong_step_every: int | None = None
    wrong_session_every: int | None = None
    crash_after: int | None = None
    duplicate_reply_every: int | None = None

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or self.draft_delay_ms < 0:
            raise ValueError("delay_ms and draft_delay_ms must be >= 0")
        for name in ("stall_after", "drop_every", "garbage_every", "wrong_step_every", "wrong_session_every",
                     "crash_after", "duplicate_reply_every"):
            v = getattr(self, name)
            if v is not None and v < (0 if name in ("stall_after", "crash_after") else 1):
                raise ValueError(f"{name}={v} out of range")

    @property
    def active(self) -> bool:
        return self != FaultPlan()


class FaultAction(Enum):
    NONE = "none"
    CRASH = "crash"
    STALL = "stall"
    DROP = "drop"
    GARBAGE = "garbage"
    WRONG_STEP = "wrong_step"
    WRONG_SESSION = "wrong_session"
    DUPLICATE = "duplicate"


class FaultCounter:
    """Counts steps across all connections and says which fault, if any, applies to the next one."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._lock = threading.Lock()
        self._steps = 0

    def next_step(self) -> FaultAction:
        p = self.plan
        if not p.active:
            return FaultAction.NONE
        with self._lock:
            self._steps += 1
            k = self._steps
        if p.crash_after is not None and k > p.crash_after:
            return FaultAction.CRASH
        if p.stall_after is not None and k > p.stall_after:
            return FaultAction.STALL
        if p.drop_every and k % p.drop_every == 0:
            return FaultAction.DROP
        if p.garbage_every and k % p.garbage_every == 0:
            return FaultAction.GARBAGE
        if p.wrong_step_every and k % p.wrong_step_every == 0:
            return FaultAction.WRONG_STEP
        if p.wrong_session_every and k % p.wrong_session_every == 0:
            return FaultAction.WRONG_SESSION
        if p.duplicate_reply_every and k % p.duplicate_reply_every == 0:
            return FaultAction.DUPLICATE
        return FaultAction.NONE
