"""The shim's attach/detach state machine, as a table (h11 style): every legal move is a row.

The watchdog thread *finds* segments and *detects* lost proxies; the engine thread *moves* the state,
and only at a round boundary (the start of `enqueue`), so a round never straddles two segments.
"""

from __future__ import annotations

import enum

__all__ = ["AttachState", "AttachEvent", "TRANSITIONS", "IllegalTransition", "next_state"]


class AttachState(enum.Enum):
    DETACHED = "detached"  # no proxy: every round is target-only; the watchdog looks for one
    PENDING = "pending"  # a ready incarnation was found; the engine attaches at its next round
    ATTACHED = "attached"  # rounds go through this segment
    CLOSED = "closed"  # Shim.close(): final


class AttachEvent(enum.Enum):
    FOUND = "found"  # watchdog: a ready, unattached incarnation with our parameters
    ATTACH_OK = "attach_ok"  # engine: the ENGINE_PID word's CAS 0 -> pid (the claim) succeeded
    ATTACH_REFUSED = "attach_refused"  # engine: someone attached first, or the segment went away
    LOST = "lost"  # watchdog/engine: proxy dead, hung, stopping, abandoned or replaced
    CLOSE = "close"


TRANSITIONS: dict[tuple[AttachState, AttachEvent], AttachState] = {
    (AttachState.DETACHED, AttachEvent.FOUND): AttachState.PENDING,
    (AttachState.DETACHED, AttachEvent.LOST): AttachState.DETACHED,
    (AttachState.PENDING, AttachEvent.ATTACH_OK): AttachState.ATTACHED,
    (AttachState.PENDING, AttachEvent.ATTACH_REFUSED): AttachState.DETACHED,
    (AttachState.PENDING, AttachEvent.LOST): AttachState.DETACHED,
    (AttachState.ATTACHED, AttachEvent.LOST): AttachState.DETACHED,
    (AttachState.DETACHED, AttachEvent.CLOSE): AttachState.CLOSED,
    (AttachState.PENDING, AttachEvent.CLOSE): AttachState.CLOSED,
    (AttachState.ATTACHED, AttachEvent.CLOSE): AttachState.CLOSED,
    (AttachState.CLOSED, AttachEvent.CLOSE): AttachState.CLOSED,
}


class IllegalTransition(RuntimeError):
    pass


def next_state(state: AttachState, event: AttachEvent) -> AttachState:
    """The state after `event`; an event the table does not list is a bug and raises."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"attach: {event.value} is not legal in state {state.value}") from None
