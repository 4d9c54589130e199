"""Thread mode: the same round loop on a thread inside the engine process (the baseline that process
mode is measured against). The shim makes its own segment; enqueue, read_reply and the watchdog are
unchanged."""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from dspark_proxy.config import ProxyConfig
from dspark_proxy.proxy import Proxy

from .shim import Shim

__all__ = ["attach_thread"]

_seq = itertools.count()


def attach_thread(name: str | None, *, max_reqs: int, num_spec: int, window: int, row_bytes: int,
                  sampled: bool = False, deadline_ms: float | None = None, timeout_s: float = 5.0,
                  worker: str = "127.0.0.1:7470", client: Any = None, token: bytes | None = None,
                  **proxy_kw: Any) -> Shim:
    seg_name = name or f"thread-{os.getpid()}-{next(_seq)}"
    shim_kw = {k: proxy_kw.pop(k) for k in ("grace_ms", "heartbeat_timeout_s", "look_every_s") if k in proxy_kw}
    cfg = ProxyConfig(name=seg_name, worker=worker, max_reqs=max_reqs, num_spec=num_spec, window=window,
                      row_bytes=row_bytes, sampled=sampled, deadline_ms=deadline_ms or 5.0,
                      **{"log_every": 0, **proxy_kw})
    proxy = Proxy(cfg, client=client, token=token)
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            proxy.serve()
        except BaseException as e:  # noqa: BLE001 - handed to attach() below, which raises it
            failed.append(e)

    thread = threading.Thread(target=serve, name="dspark-proxy-thread", daemon=True)
    thread.start()
    end = time.monotonic() + max(timeout_s, 5.0)
    while not proxy.ready.wait(0.02):
        if failed:  # e.g. a /dev/shm too small for the segment: say so, at once
            thread.join(2.0)
            raise RuntimeError(f"thread-mode proxy failed to start: {failed[0]}") from failed[0]
        if time.monotonic() > end:
            proxy.stop()
            thread.join(2.0)
            raise RuntimeError("thread-mode proxy did not become ready")
    shim = Shim(seg_name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                sampled=sampled, deadline_ms=deadline_ms, **shim_kw)

    def _stop_proxy() -> None:
        proxy.stop()
        thread.join(5.0)

    shim.on_close.append(_stop_proxy)
    shim.proxy = proxy
    return shim
