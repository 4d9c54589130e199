"""Thread mode: the same round loop on a thread inside the engine process (the baseline that process
mode is measured against). The shim makes its own segment; enqueue, read_reply and the watchdog are
unchanged.

A proxy thread that dies after start-up is what a supervisor would restart in process mode: here the
thread does it itself. Each death is logged once with its cause, counted (`thread_restarts` in the
proxy's and the shim's counters, the cause as the proxy's `thread_death` gauge, so `status` shows
both) and followed by a fresh Proxy after a back-off (50 ms doubling to 5 s, back to 50 ms after a
run of a minute). The dead one's segment is finished on its way out, so the shim detaches and
attaches to the new incarnation at a round boundary. An injected `client` is reused by the new Proxy.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any

from dspark_proxy.config import ProxyConfig
from dspark_proxy.link.draft_client import DraftClient
from dspark_proxy.proxy import Proxy

from .shim import Shim

__all__ = ["attach_thread", "BACKOFF_S"]

log = logging.getLogger(__name__)

_seq = itertools.count()
BACKOFF_S = (0.05, 5.0)  # first and longest pause before a restart
_HEALTHY_RUN_S = 60.0  # a proxy that ran this long before dying restarts after the first pause again


class _Supervisor:
    """Runs Proxy.serve() on one thread and replaces the Proxy when serve() raises after start-up."""

    def __init__(self, cfg: ProxyConfig, client: DraftClient | None, token: bytes | None) -> None:
        self.cfg, self.client, self.token = cfg, client, token
        self.proxy = Proxy(cfg, client=client, token=token)
        self.failed: list[BaseException] = []  # a death before the first READY: attach() raises it
        self.restarts = 0
        self.shim: Shim | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dspark-proxy-thread", daemon=True)

    def _run(self) -> None:
        pause = BACKOFF_S[0]
        while True:
            proxy = self.proxy  # set before the check: stop() sets the flag, then stops self.proxy
            if self._stop.is_set():
                return
            began = time.monotonic()
            death: BaseException | None = None
            try:
                proxy.serve()
                return  # stopped
            except BaseException as e:  # noqa: BLE001 - logged, counted and restarted below
                if not proxy.ready.is_set() and self.restarts == 0:
                    self.failed.append(e)  # start-up: attach() raises it with its reason
                    return
                cause, death = f"{type(e).__name__}: {e}", e
            if self._stop.is_set():
                return
            if time.monotonic() - began > _HEALTHY_RUN_S:
                pause = BACKOFF_S[0]
            self.restarts += 1
            # the exception itself: outside its except, exc_info=True would log "NoneType: None"
            log.error("[proxy-thread] the proxy thread died (%s); restart %d in %.2f s", cause, self.restarts,
                      pause, exc_info=death)
            if self._stop.wait(pause):
                return
            pause = min(2 * pause, BACKOFF_S[1])
            try:
                nxt = Proxy(self.cfg, client=self.client, token=self.token)
            except Exception:  # noqa: BLE001 - try again after the next pause
                log.exception("[proxy-thread] could not make a new proxy")
                continue
            nxt.stats.inc("thread_restarts", self.restarts)
            nxt.stats.set("thread_death", cause)
            self.proxy = nxt
            shim = self.shim
            if shim is not None:
                shim.proxy = nxt
                shim.counters.inc("thread_restarts")

    def stop(self) -> None:
        self._stop.set()
        self.proxy.stop()
        self.thread.join(5.0)
        self.proxy.stop()  # one made while we joined


def attach_thread(name: str | None, *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                  sampled: bool = False, deadline_ms: float | None = None, timeout_s: float = 5.0,
                  worker: str = "127.0.0.1:7470", client: DraftClient | None = None, token: bytes | None = None,
                  **proxy_kw: Any) -> Shim:
    seg_name = name or f"thread-{os.getpid()}-{next(_seq)}"
    shim_kw = {k: proxy_kw.pop(k) for k in ("grace_ms", "heartbeat_timeout_s", "look_every_s") if k in proxy_kw}
    if proxy_kw.get("target_id"):  # the proxy's HELLO names it from the start; the shim's claim again
        shim_kw["target_id"] = proxy_kw["target_id"]
    cfg = ProxyConfig(name=seg_name, worker=worker, max_reqs=max_reqs, num_spec=num_spec, window=window,
                      row_bytes=row_bytes, sampled=sampled, deadline_ms=deadline_ms or 5.0,
                      **{"log_every": 0, **proxy_kw})
    sup = _Supervisor(cfg, client, token)
    sup.thread.start()
    end = time.monotonic() + max(timeout_s, 5.0)
    while not sup.proxy.ready.wait(0.02):
        if sup.failed:  # e.g. a /dev/shm too small for the segment: say so, at once
            sup.thread.join(2.0)
            raise RuntimeError(f"thread-mode proxy failed to start: {sup.failed[0]}") from sup.failed[0]
        if time.monotonic() > end:
            sup.stop()
            raise RuntimeError("thread-mode proxy did not become ready")
    shim = Shim(seg_name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                sampled=sampled, deadline_ms=deadline_ms, **shim_kw)
    sup.shim = shim
    shim.on_close.append(sup.stop)
    shim.proxy = sup.proxy
    return shim
