"""One worker of a pool: its link (a `TcpDraftClient`), its breaker, its row cap, and its place in the pool.

A member's place is a state machine, the table ``TRANSITIONS`` (in the shape of breaker.py): ``observe``
classifies what the link and the breaker say at the start of a round into a ``MemberEvent``, ``apply``
looks it up, and a missing pair raises ``MemberError`` and changes nothing.

- DOWN: not connected, refused, backing off, or its breaker is open. It owns no slot: the pool moved
  them to the other workers, which get their windows resent.
- JOINING: connected and its breaker lets it through (a breaker's probe included); new requests may go
  to it, and the pool moves back its share of the other slots a few per round (`Router.rebalance`),
  so a worker coming back costs the engine at most a few resyncs a round.
- UP: it has its whole share.

RECONNECTED (a new connection between two rounds: the worker dropped every window) keeps the member
where it is; its slots stay, and are resent.

Owned by the round thread, except `link()` (any thread: it reads attributes once each).
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from typing import Any

from ..link.client import TcpDraftClient
from ..round.breaker import CircuitBreaker
from ..round.pacing import LinkPacer
from ..wire.step import StepPrefix

__all__ = ["TRANSITIONS", "Member", "MemberError", "MemberEvent", "MemberState", "link_of"]


class MemberState(enum.Enum):
    DOWN = "down"
    JOINING = "joining"
    UP = "up"


class MemberEvent(enum.Enum):
    LINK_UP = "link_up"  # connected, and the breaker allows a round
    LINK_LOST = "link_lost"  # the connection is gone, refused, or the breaker opened
    RECONNECTED = "reconnected"  # still available, on a new connection (its windows are gone)
    SHARE_BACK = "share_back"  # nothing of its share is left on other workers


class MemberError(ValueError):
    """An event the table has no transition for (a caller bug)."""


_S, _E = MemberState, MemberEvent
TRANSITIONS: dict[tuple[MemberState, MemberEvent], MemberState] = {
    (_S.DOWN, _E.LINK_UP): _S.JOINING,  # its share comes back gradually
    (_S.JOINING, _E.SHARE_BACK): _S.UP,
    (_S.JOINING, _E.LINK_LOST): _S.DOWN,  # its slots move to the others
    (_S.UP, _E.LINK_LOST): _S.DOWN,
    (_S.JOINING, _E.RECONNECTED): _S.JOINING,  # its slots stay, their windows are resent
    (_S.UP, _E.RECONNECTED): _S.UP,
}


def link_of(client: Any, breaker: CircuitBreaker | None = None) -> dict[str, Any]:
    """The link as `status` shows it: connected, refused (why), backing off (why, next try in ...),
    connecting; plus the breaker's state. Any thread (each attribute read once)."""
    epoch = client.connection_epoch()
    err = getattr(client, "link_error", None)
    nxt = getattr(client, "next_try_at", None)
    out: dict[str, Any] = {"address": f"{getattr(client, 'host', '?')}:{getattr(client, 'port', '?')}"}
    if epoch is not None:
        out.update(state="connected", epoch=epoch)
        w = getattr(client, "welcome", None)
        if w is not None:
            out.update(worker_id=w.worker_id, drafter=w.drafter)
    elif getattr(client, "disabled", False):
        out.update(state="refused", reason=getattr(client, "disabled_reason", None) or err)
    elif err is not None and err.startswith("worker refused the handshake"):  # busy, memory_budget: retried
        out.update(state="refused", reason=err)
    elif err is not None:
        out.update(state="backing_off", reason=err)
    else:
        out.update(state="connecting")
    if epoch is None and nxt is not None:
        out["next_try_s"] = round(max(0.0, nxt - time.monotonic()), 3)
    if breaker is not None:
        out["breaker"] = breaker.state
        out["breaker_trips"] = breaker.trips
    return out


class Member:
    """One worker of the pool (see the module docstring)."""

    def __init__(self, address: str, client: TcpDraftClient, *, breaker: CircuitBreaker, pacer: LinkPacer,
                 key: int, max_reqs: int, sampled: bool) -> None:
        self.address = address
        self.client = client
        self.breaker = breaker
        self.pacer = pacer
        self.key = key
        self.state = MemberState.DOWN
        self.epoch: int | None = None  # the connection epoch it was last seen available on
        self.prefix = StepPrefix(max_reqs, sampled)  # its STEPs are built here when a round is split
        self.counters: Counter[str] = Counter()

    def observe(self, t: int, use_breaker: bool = True) -> MemberEvent | None:
        """At the start of pool round t: what the link and the breaker say, applied. The breaker is
        asked only for a connected link (an open breaker's probe goes to a worker that answers), and
        only in a pool of several (`use_breaker`): alone, a worker has nowhere to move its slots to, and
        the round's own breaker keeps it off the critical path as for the plain client."""
        e = self.client.connection_epoch()
        avail = e is not None and (not use_breaker or self.breaker.allow(t))
        ev: MemberEvent | None = None
        if self.state is MemberState.DOWN:
            if avail:
                ev = MemberEvent.LINK_UP
        elif not avail:
            ev = MemberEvent.LINK_LOST
        elif e != self.epoch:
            ev = MemberEvent.RECONNECTED
        if ev is not None:
            self.apply(ev)
            if avail:
                self.epoch = e
        return ev

    def apply(self, event: MemberEvent) -> None:
        dst = TRANSITIONS.get((self.state, event))
        if dst is None:
            raise MemberError(f"pool member {self.address}: no transition for {event.value} while "
                              f"{self.state.value}")
        self.state = dst
        self.counters[event.value] += 1

    @property
    def available(self) -> bool:
        return self.state is not MemberState.DOWN

    def record(self, t: int, reason: str | None) -> str | None:
        """The outcome of its part of round t (None: ok); the breaker hears what went out and failed
        for the worker's sake (not "not_ready"/"reconnected"/"disabled": nothing reached it)."""
        if reason in ("not_ready", "reconnected", "disabled"):
            return None
        if self.breaker.current.value == "open":
            return None  # tripped earlier (or a pool of one, which never asks it): nothing to learn
        return self.breaker.record(reason is None, t)

    def link(self) -> dict[str, Any]:
        out = link_of(self.client, self.breaker)
        out["address"] = self.address
        out["pool_state"] = self.state.value
        out["row_cap"] = self.pacer.row_cap
        c = self.counters
        for k in ("entries", "usable", "missed", "steps", "steps_failed"):
            out[k] = c.get(k, 0)
        return out
