"""The fault kinds (docs/guarantees.md): one table, each kind with what it does, its injector and its proof.

Adding a kind is one entry here, its injector (injectors.py or rogue.py) and its test: the campaign,
`--kinds`, the report and tests/test_chaos.py all read this table. `effect` names the counter (or the
injector's note) that shows the injection did what it says: the CI campaign checks it moved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .injectors import (
    bad_descriptor,
    engine_restart,
    faulty_worker,
    proxy_kill,
    proxy_stop_long,
    proxy_stop_short,
    round_loop_hang,
    slow_replies,
    worker_kill,
    worker_layout,
    worker_stall_long,
    worker_stall_short,
)
from .pool_faults import pool_worker_kill, pool_worker_stall
from .ring_faults import engine_exit, ring_squat, ring_truncate
from .rogue import connection_flood, worker_memory

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["Effect", "FaultKind", "FAULT_KINDS", "KIND_NAMES", "INJECTORS"]


@dataclass(frozen=True)
class Effect:
    """The proof an injection worked: `counter` moved by at least `least` in the proxy's or the shim's
    counters over the injection, or (where "notes") the sum of that key over the injector's notes."""

    where: Literal["proxy", "shim", "notes"]
    counter: str
    least: int = 1


@dataclass(frozen=True)
class FaultKind:
    name: str
    what: str  # one line: what is injected and how it is cleared
    inject: Callable[[Controller], None]  # runs on the controller thread; ends with c.cleared()
    effect: Effect


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("worker_stall_short", "worker SIGSTOPped for 0.4 x deadline, then SIGCONT, repeatedly",
              worker_stall_short, Effect("notes", "stalls")),
    FaultKind("worker_stall_long", "worker SIGSTOPped for many deadlines (timeouts, reconnect), then SIGCONT",
              worker_stall_long, Effect("proxy", "fallback_timeout")),
    FaultKind("worker_kill", "worker SIGKILLed, restarted on the same port",
              worker_kill, Effect("proxy", "client.connections_dropped")),
    FaultKind("conn_drop", "worker closes the connection instead of answering (--fault-drop-every)",
              faulty_worker("--fault-drop-every", "4"), Effect("proxy", "fallback_connection_lost", 2)),
    FaultKind("garbage_replies", "worker answers with random bytes under a valid header (--fault-garbage-every)",
              faulty_worker("--fault-garbage-every", "3"), Effect("proxy", "client.bad_reply")),
    FaultKind("wrong_step_id", "worker answers with a wrong step id (--fault-wrong-step-every)",
              faulty_worker("--fault-wrong-step-every", "3"), Effect("proxy", "client.bad_reply_step_id")),
    FaultKind("wrong_session", "worker answers, real drafts and all, under another session id "
                               "(--fault-wrong-session-every)",
              faulty_worker("--fault-wrong-session-every", "3"), Effect("proxy", "client.bad_reply_session")),
    FaultKind("slow_replies", "every reply later than the deadline (--fault-delay-ms 2 x deadline)",
              slow_replies, Effect("proxy", "fallback_timeout")),
    FaultKind("proxy_stop_short", "proxy SIGSTOPped for less than the shim's heartbeat timeout, then SIGCONT",
              proxy_stop_short, Effect("shim", "watchdog_watchdog")),
    FaultKind("proxy_stop_long", "proxy SIGSTOPped past the heartbeat timeout (detach, new incarnation)",
              proxy_stop_long, Effect("shim", "detach_proxy_hung")),
    FaultKind("proxy_kill", "proxy SIGKILLed and restarted while the engine runs",
              proxy_kill, Effect("shim", "detach_proxy_dead")),
    FaultKind("round_loop_hang", "proxy's round loop blocked past the heartbeat timeout, heartbeat going on "
                                 "(SIGUSR1, --fault-round-hang-ms)",
              round_loop_hang, Effect("shim", "detach_round_loop_hung")),
    FaultKind("bad_descriptor", "engine-side garbage in round descriptors/metadata before `gathered`",
              bad_descriptor, Effect("proxy", "fallback_bad_descriptor")),
    FaultKind("worker_layout", "worker restarted with another window and --no-adopt-shapes (handshake refused), then the right one",
              worker_layout, Effect("proxy", "client.disabled")),
    FaultKind("engine_restart", "worker stopped until the breaker opens; the engine closes its shim and a new "
                                "engine (rounds from 1) attaches to the running proxy; worker resumed",
              engine_restart, Effect("proxy", "attaches")),
    FaultKind("duplicate_reply", "worker sends every 3rd reply twice (--fault-duplicate-reply-every)",
              faulty_worker("--fault-duplicate-reply-every", "3"),
              Effect("proxy", "client.extra_replies_dropped")),
    FaultKind("connection_flood", "worker restarted, then 300 idle unauthenticated sockets at it while the proxy "
                                  "reconnects",
              connection_flood, Effect("notes", "resumed_during_flood")),
    FaultKind("worker_memory", "rogue peers ask the worker for slots past max_reqs and sessions past its limits "
                               "while the proxy drafts",
              worker_memory, Effect("notes", "rogue_refused")),
    FaultKind("pool_worker_kill", "a second worker joins the proxy's pool (SIGHUP), then is SIGKILLed: its requests "
                                  "move to the first, whose own keep >= 99% usable drafts (of the baseline's "
                                  "share, less chance, on a machine too busy for the baseline's own 100%)",
              pool_worker_kill, Effect("proxy", "pool_slots_resent")),
    FaultKind("pool_worker_stall", "a second worker joins the proxy's pool (SIGHUP), then is SIGSTOPped: its breaker "
                                   "opens, its requests move to the first, whose own keep >= 99% usable drafts "
                                   "(as for the kill)",
              pool_worker_stall, Effect("proxy", "pool_slots_resent")),
    FaultKind("ring_truncate", "the engine's shared ring ftruncated to 0 by its own uid: refused (a sealed memfd); "
                               "the proxy drafts on",
              ring_truncate, Effect("notes", "truncate_refused")),
    FaultKind("ring_squat", "another uid (65534; needs root, else skipped) takes every ring name an engine could "
                            "predict, then a new engine attaches: both start and draft",
              ring_squat, Effect("notes", "squatted")),
    FaultKind("engine_exit", "a second engine of the name (a named ring) exits without closing its shim: its ring "
                             "is gone within 2 s, ours drafts on",
              engine_exit, Effect("notes", "engines_exited")),
)
KIND_NAMES: tuple[str, ...] = tuple(k.name for k in FAULT_KINDS)
INJECTORS: dict[str, Callable[[Controller], None]] = {k.name: k.inject for k in FAULT_KINDS}
