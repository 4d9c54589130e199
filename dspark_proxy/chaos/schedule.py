"""The fault kinds (SPEC §9) and the order they are injected in.

A campaign runs passes; each pass injects every kind once, in a seeded random order, so a short run
covers every kind and a long one repeats each many times, interleaved differently each pass.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["FaultKind", "FAULT_KINDS", "KIND_NAMES", "pass_order"]


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str  # one line: what is injected and how it is cleared


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("worker_stall_short", "worker SIGSTOPped for 0.4 x deadline, then SIGCONT, repeatedly"),
    FaultKind("worker_stall_long", "worker SIGSTOPped for many deadlines (timeouts, reconnect), then SIGCONT"),
    FaultKind("worker_kill", "worker SIGKILLed, restarted on the same port"),
    FaultKind("conn_drop", "worker closes the connection instead of answering (--fault-drop-every)"),
    FaultKind("garbage_replies", "worker answers with random bytes under a valid header (--fault-garbage-every)"),
    FaultKind("wrong_step_id", "worker answers with a wrong step id (--fault-wrong-step-every)"),
    FaultKind("wrong_session", "worker answers, real drafts and all, under another session id "
                               "(--fault-wrong-session-every)"),
    FaultKind("slow_replies", "every reply later than the deadline (--fault-delay-ms 2 x deadline)"),
    FaultKind("proxy_stop_short", "proxy SIGSTOPped for less than the shim's heartbeat timeout, then SIGCONT"),
    FaultKind("proxy_stop_long", "proxy SIGSTOPped past the heartbeat timeout (detach, new incarnation)"),
    FaultKind("proxy_kill", "proxy SIGKILLed and restarted while the engine runs"),
    FaultKind("round_loop_hang", "proxy's round loop blocked past the heartbeat timeout, heartbeat going on "
                                 "(SIGUSR1, --fault-round-hang-ms)"),
    FaultKind("bad_descriptor", "engine-side garbage in round descriptors/metadata before `gathered`"),
    FaultKind("worker_layout", "worker restarted with another window (handshake refused), then the right one"),
    FaultKind("engine_restart", "worker stopped until the breaker opens; the engine closes its shim and a new "
                                "engine (rounds from 1) attaches to the running proxy; worker resumed"),
    FaultKind("duplicate_reply", "worker sends every 3rd reply twice (--fault-duplicate-reply-every)"),
    FaultKind("connection_flood", "worker restarted, then 300 idle unauthenticated sockets at it while the "
                                  "proxy reconnects"),
    FaultKind("worker_memory", "rogue peers ask the worker for slots past max_reqs and sessions past its "
                               "limits while the proxy drafts"),
)
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in FAULT_KINDS)


def pass_order(kinds: tuple[str, ...], rng: random.Random) -> list[str]:
    """One pass: every kind once, shuffled by the campaign's seeded generator."""
    order = list(kinds)
    rng.shuffle(order)
    return order
