"""Run the draft worker from a `WorkerConfig`: the library side of `dspark-proxy worker` (like `proxy.run_proxy`).

The server's options are derived from the config schema by name (a `WorkerServer` keyword that is
also a `WorkerConfig` field takes its value; `FaultPlan`'s field X is the config's `fault_X`), so a
new setting is one schema entry, not another hand-copied keyword.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import signal
import sys
from collections.abc import Mapping
from typing import Any

from .config import WorkerConfig, parse_hostport
from .worker.faults import FaultPlan
from .worker.server import WorkerServer

__all__ = ["run_worker", "fault_plan", "server_options", "head_shapes"]

log = logging.getLogger("dspark_proxy.worker")

# WorkerServer keywords whose config field has another name or unit
_RENAMED = {
    "torch_device": lambda cfg: cfg.device,
    "memory_budget_bytes": lambda cfg: (cfg.memory_budget_mb << 20) or None,
    "faults": lambda cfg: fault_plan(cfg),
    "weights": lambda cfg: cfg.head,
}


def fault_plan(cfg: WorkerConfig) -> FaultPlan:
    """The FaultPlan of a config: field X from `fault_X`; 0 means off for every counted fault."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(FaultPlan):
        v = getattr(cfg, "fault_" + f.name)
        kw[f.name] = (v or None) if f.default is None else v
    return FaultPlan(**kw)


def server_options(cfg: WorkerConfig) -> dict[str, Any]:
    """WorkerServer's keyword arguments for `cfg` (all but host, port and token)."""
    fields = {f.name for f in dataclasses.fields(cfg)}
    params = inspect.signature(WorkerServer.__init__).parameters
    out: dict[str, Any] = {}
    for name, p in params.items():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or name == "token":
            continue
        if name in _RENAMED:
            out[name] = _RENAMED[name](cfg)
        elif name in fields:
            out[name] = getattr(cfg, name)
    return out


def head_shapes(cfg: WorkerConfig, sources: Mapping[str, str]) -> WorkerConfig:
    """A torch head's manifest fixes its N, window and row bytes (worker/terms.py): those the command
    line, environment and file left at their defaults are taken from it, so `worker --drafter torch
    --head DIR` needs no shape flags; one given explicitly is still checked against it at start."""
    if cfg.drafter == "dspark":
        return _dspark_shapes(cfg, sources)
    if cfg.drafter != "torch" or not cfg.head:
        return cfg
    from .model.manifest import load_head_manifest  # no torch: the manifest is JSON

    man = load_head_manifest(cfg.head)  # ValueError naming the path: the command prints it as one line
    take = {k: getattr(man, k) for k in ("num_spec", "window", "row_bytes") if sources.get(k, "default") == "default"}
    if take:
        log.info("[worker] shapes from the head's manifest: %s", " ".join(f"{k}={v}" for k, v in take.items()))
    return dataclasses.replace(cfg, **take)


def _dspark_shapes(cfg: WorkerConfig, sources: Mapping[str, str]) -> WorkerConfig:
    """A DSpark checkpoint fixes N (block_size, less the anchor when it is the bonus token), the row
    bytes (tapped layers x hidden x --row-dtype) and, when every draft layer slides, the window; a
    full-attention checkpoint needs --window (exact only for contexts <= W; the drafter says so)."""
    from .model.dspark_ckpt import read_spec  # JSON only: no torch

    head = cfg.head
    if not head:
        raise ValueError("head: --drafter dspark needs --head CKPT_DIR (a speculators checkpoint directory)")
    spec = read_spec(head)
    want = {"num_spec": spec.num_spec, "row_bytes": spec.row_bytes(cfg.row_dtype)}
    if spec.window is not None:
        want["window"] = spec.window
    elif sources.get("window", "default") == "default":
        raise ValueError(f"window: {spec.head_dir / 'config.json'}: its draft layers attend to the whole prefix "
                         "(no sliding_window on every layer); give --window W, the rows kept a request (drafts "
                         "are then exact only for contexts <= W)")
    take = {k: v for k, v in want.items() if sources.get(k, "default") == "default"}
    if take:
        log.info("[worker] shapes from the dspark checkpoint: %s", " ".join(f"{k}={v}" for k, v in take.items()))
    return dataclasses.replace(cfg, head=head, **take)


def run_worker(cfg: WorkerConfig, *, token: bytes | None = None, install_signals: bool = True) -> None:
    """Serve until SIGTERM/SIGINT (or stop requested); the same function the tests call.

    Prints one line `worker listening on HOST:PORT` to stdout once bound (tests and the demo wait
    for it); signals only request a stop, and the serving loop then shuts down cleanly."""
    host, port = parse_hostport(cfg.listen, field="listen", allow_port_zero=True)
    server = WorkerServer(host, port, token=token, **server_options(cfg))
    previous = {}
    if install_signals:
        def _on_signal(signum, _frame):  # only sets state; serve_forever() does the shutdown
            server.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        _serve(server, host, cfg)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(server: WorkerServer, host: str, cfg: WorkerConfig) -> None:
    server.start()
    metrics = None
    try:
        if cfg.metrics_port is not None:  # before the line tests wait for: a scrape may follow it at once
            from .ops.metrics import start_metrics_server
            from .worker.metrics import WorkerCollector

            metrics = start_metrics_server(cfg.metrics_port, None, addr=cfg.metrics_host,
                                           collector=WorkerCollector(server))
            log.info("[worker] metrics url=%s", metrics.url)
        shown = f"[{host}]" if ":" in host else host
        print(f"worker listening on {shown}:{server.port}", flush=True)
        sys.stdout.flush()
        server.serve_forever()
    finally:
        if metrics is not None:
            metrics.stop()
        server.stop()
        log.info("[worker] stopped counters=%s", dict(server.counters))
