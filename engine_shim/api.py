"""attach(), boot() and current(): how an engine gets its shim without ever failing its own boot."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from dspark_proxy.shm import ring_shm
from dspark_proxy.shm.segment import DEFAULT_NAME, LayoutMismatch, Segment, SegmentError, owner_alive

from .attach import AttachState
from .shim import Shim

__all__ = ["attach", "boot", "current", "ENV_NAME"]

log = logging.getLogger(__name__)

ENV_NAME = "DSPARK_PROXY"  # boot(): the segment name to attach to

_current: Shim | None = None
_current_lock = threading.Lock()
# one shim per (process, name): two would each abandon the other's incarnation for ever (boot() plus an
# explicit attach() in one engine is the usual way to get there). Keyed by pid so a forked child, whose
# copy of the parent's shim has no threads, makes its own.
_shims: dict[tuple[int, str], tuple[Shim, dict[str, Any]]] = {}
_shims_lock = threading.Lock()


def attach(name: str | None = None, *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
           sampled: bool = False, deadline_ms: float | None = None, mode: str = "process",
           timeout_s: float = 0.0, **kwargs: Any) -> Shim:
    """A shim for the proxy segment `name` (process mode) or for an in-process proxy thread (thread mode).

    Process mode validates a segment that is already there against the engine's parameters: a
    mismatch raises LayoutMismatch naming the field. `target_id` (either mode) names the target model
    (e.g. dspark_proxy.model.hf.target_id of its directory): it reaches the proxy's HELLO, and a worker
    whose head was made for another target refuses it, naming the field; none given: not checked.
    With `timeout_s > 0` it waits that long for the
    proxy to be ready and attached-to; otherwise the shim starts detached and attaches (at a round
    boundary) when a proxy appears. Thread mode takes the proxy's settings as keyword arguments
    (`worker="HOST:PORT"`, breaker_threshold=..., ...) and runs the same round loop on a thread; it
    returns once the shim has found that proxy (at least 5 s allowed), so the first round is not run
    detached.

    One shim per name and process: while one is open, attach() with the same arguments returns it
    (boot() plus an explicit attach() share one), and with different ones raises ValueError naming the
    first argument that differs.
    """
    want = {"mode": mode, "max_reqs": max_reqs, "num_spec": num_spec, "window": window, "row_bytes": row_bytes,
            "sampled": sampled, "deadline_ms": deadline_ms, **kwargs}
    key = (os.getpid(), DEFAULT_NAME if name is None else name)
    shim: Shim | None = None
    wait_s = max(timeout_s, 5.0) if mode == "thread" else timeout_s
    with _shims_lock:
        if name is not None or mode == "process":
            shim = _existing(key, want)
            if shim is not None:  # shared: it waits as asked (boot()'s may not have found the proxy yet)
                wait_s = timeout_s
        if shim is None:
            shim = _new_shim(name, want, timeout_s)
            _shims[(os.getpid(), shim.name or DEFAULT_NAME)] = (shim, want)
    _wait_found(shim, wait_s)
    _set_current(shim)
    return shim


def _existing(key: tuple[int, str], want: dict[str, Any]) -> Shim | None:
    """This process's open shim for the name: returned when `want` is what it was made with, else a
    ValueError naming the first field that differs."""
    got = _shims.get(key)
    if got is None:
        return None
    shim, had = got
    if shim.state is AttachState.CLOSED:
        del _shims[key]
        return None
    for k in sorted(set(had) | set(want)):
        if had.get(k) != want.get(k):
            raise ValueError(f"attach({key[1]!r}): this process already has a shim for that name with "
                             f"{k}={had.get(k)!r}, not {want.get(k)!r}; one shim per name and process "
                             f"(close it first, or attach with the same parameters to share it)")
    log.info("[shim] attach(%r): this process's shim for that name is returned", key[1])
    return shim


def _new_shim(name: str | None, want: dict[str, Any], timeout_s: float) -> Shim:
    kwargs = {k: v for k, v in want.items() if k not in ("mode", "max_reqs", "num_spec", "window", "row_bytes",
                                                          "sampled", "deadline_ms")}
    mode, max_reqs, num_spec, window, row_bytes, sampled, deadline_ms = (
        want[k] for k in ("mode", "max_reqs", "num_spec", "window", "row_bytes", "sampled", "deadline_ms"))
    if mode == "thread":
        from .thread_mode import attach_thread

        return attach_thread(name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                             sampled=sampled, deadline_ms=deadline_ms, timeout_s=timeout_s, **kwargs)
        # (attach() then waits for the watchdog to find it: the proxy is ours and already ready, and the
        # engine's first round should not run detached because that thread was not scheduled yet)
    if mode != "process":
        raise ValueError(f"mode={mode!r}: use 'process' or 'thread'")
    shim_kw = {k: kwargs.pop(k) for k in ("grace_ms", "heartbeat_timeout_s", "look_every_s", "target_id")
               if k in kwargs}
    if kwargs:
        raise TypeError(f"unexpected arguments for process mode: {', '.join(sorted(kwargs))}")
    _check_existing(name, max_reqs, num_spec, window, row_bytes, sampled)
    return Shim(name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes, sampled=sampled,
                deadline_ms=deadline_ms, **shim_kw)


def _wait_found(shim: Shim, timeout_s: float) -> None:
    """Until the watchdog has found a ready proxy (pending: the engine attaches at its next round)."""
    if timeout_s <= 0:
        return
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and shim.state.value == "detached":
        time.sleep(0.005)


def _check_existing(name: str | None, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                    sampled: bool) -> None:
    """If a segment is already there, its parameters must be the engine's: say which one is not."""
    try:
        seg = Segment.open(name)
    except SegmentError:
        return
    try:
        h = seg.header
        if not owner_alive(int(h["owner_pid"]), int(h["owner_start_ticks"])):
            return  # a dead proxy's leftover: its successor replaces it, and the watchdog checks that one
        seg.check_params(max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                         sampled=sampled, segment_rows=None if ring_shm.enabled() else True)
    finally:
        seg.close()


def _set_current(shim: Shim) -> None:
    global _current
    with _current_lock:
        _current = shim


def current() -> Shim | None:
    """The shim attached by boot() or attach(), if any."""
    return _current


def boot(**params: Any) -> None:
    """Attach in the background when DSPARK_PROXY=<name> is set. Never blocks and never raises: a
    mismatch or any other error is logged and the engine stays target-only.

    The engine's shapes come from `params` (max_reqs, num_spec, window, row_bytes, ...) or from
    DSPARK_PROXY_MAX_REQS / _NUM_SPEC / _WINDOW / _ROW_BYTES, and its target from `target_id` or
    DSPARK_PROXY_TARGET_ID.
    """
    name = os.environ.get(ENV_NAME)
    if not name:
        return

    def _go() -> None:
        try:
            p = {k: int(os.environ[f"{ENV_NAME}_{k.upper()}"]) for k in ("max_reqs", "num_spec", "window",
                                                                       "row_bytes")
                 if f"{ENV_NAME}_{k.upper()}" in os.environ}
            if os.environ.get(f"{ENV_NAME}_TARGET_ID"):
                p["target_id"] = os.environ[f"{ENV_NAME}_TARGET_ID"]
            p.update(params)
            attach(name, **p)
            log.info("[shim] boot: attached to %s (target-only until the proxy is there)", name)
        except LayoutMismatch as e:
            log.error("[shim] boot: %s; the engine stays target-only", e)
        except Exception:  # noqa: BLE001 - boot never fails because of us
            log.exception("[shim] boot: could not attach to %s; the engine stays target-only", name)

    threading.Thread(target=_go, name="dspark-boot", daemon=True).start()
