"""`dspark-proxy worker`: the remote draft worker, in the foreground.

Prints one line `worker listening on HOST:PORT` to stdout once bound (tests and the demo wait for
it); SIGTERM and SIGINT only request a stop, and the serving loop then shuts down cleanly.
"""

from __future__ import annotations

import logging
import signal
import sys

import click

from ..config import WorkerConfig, build_config, click_options, format_settings, parse_hostport

__all__ = ["worker", "run_worker", "fault_plan"]

log = logging.getLogger("dspark_proxy.worker")


def fault_plan(cfg: WorkerConfig):
    """The FaultPlan of a config: 0 means off for every counted fault."""
    from ..worker import FaultPlan

    def k(v: int) -> int | None:
        return v or None

    return FaultPlan(delay_ms=cfg.fault_delay_ms, stall_after=k(cfg.fault_stall_after),
                     drop_every=k(cfg.fault_drop_every), garbage_every=k(cfg.fault_garbage_every),
                     wrong_step_every=k(cfg.fault_wrong_step_every),
                     wrong_session_every=k(cfg.fault_wrong_session_every), crash_after=k(cfg.fault_crash_after),
                     duplicate_reply_every=k(cfg.fault_duplicate_reply_every))


def run_worker(cfg: WorkerConfig, *, token: bytes | None = None, install_signals: bool = True) -> None:
    """Serve until SIGTERM/SIGINT (or stop requested); the same function the tests call."""
    from ..worker import WorkerServer

    host, port = parse_hostport(cfg.listen, field="listen", allow_port_zero=True)
    server = WorkerServer(host, port, num_spec=cfg.num_spec, window=cfg.window, row_bytes=cfg.row_bytes,
                          max_reqs=cfg.max_reqs, drafter=cfg.drafter, sampled=cfg.sampled, token=token,
                          insecure=cfg.insecure, faults=fault_plan(cfg), torch_device=cfg.device,
                          weights=cfg.weights, seed=cfg.seed,
                          memory_budget_bytes=(cfg.memory_budget_mb << 20) or None)
    previous = {}
    if install_signals:
        def _on_signal(signum, _frame):  # only sets state; serve_forever() does the shutdown
            server.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _on_signal)
    try:
        _serve(server, host)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(server, host: str) -> None:
    server.start()
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"worker listening on {shown}:{server.port}")
    sys.stdout.flush()
    try:
        server.serve_forever()
    finally:
        server.stop()
        log.info("[worker] stopped counters=%s", dict(server.counters))


@click.command("worker")
@click_options(WorkerConfig)
@click.pass_context
def worker(ctx: click.Context, **_: object) -> None:
    """Run the draft worker (foreground; SIGTERM/SIGINT stop it cleanly)."""
    from .start import read_token, setup_logging

    cfg, sources = build_config(WorkerConfig, ctx)
    setup_logging(cfg.log_level)
    log.info("[worker] settings %s", format_settings(cfg, sources))
    try:
        run_worker(cfg, token=read_token(cfg.token_file))
    except (OSError, ValueError) as e:
        click.echo(f"dspark-proxy worker: {e}", err=True)
        sys.exit(3)


if __name__ == "__main__":
    worker()
