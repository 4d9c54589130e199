"""`dspark-proxy worker`: the remote draft worker, in the foreground (the library's `worker_main.run_worker`).

Prints one line `worker listening on HOST:PORT` to stdout once bound (tests and the demo wait for
it); SIGTERM and SIGINT only request a stop, and the serving loop then shuts down cleanly.
"""

from __future__ import annotations

import logging
import sys

import click

from ..config import WorkerConfig, format_settings
from ..config_flags import build_config, click_options
from ..ops.deps import MissingDependency, worker_needs
from ..ops.exitcodes import EXIT_MISSING_DEPENDENCY, EXIT_STARTUP_FAILURE
from ..ops.runtime import setup_logging
from .start import token_or_bad_parameter

__all__ = ["worker"]

log = logging.getLogger("dspark_proxy.worker")


@click.command("worker")
@click_options(WorkerConfig)
@click.pass_context
def worker(ctx: click.Context, **_: object) -> None:
    """Run the draft worker (foreground; SIGTERM/SIGINT stop it cleanly)."""
    from ..worker_main import head_shapes
    from ..worker_main import run_worker as run

    cfg, sources = build_config(WorkerConfig, ctx)
    setup_logging(cfg.log_level)
    try:
        cfg = head_shapes(cfg, sources)  # a missing or malformed head: one line naming its file
        log.info("[worker] settings %s", format_settings(cfg, sources))
        if cfg.drafter == "torch" and cfg.random_weights:
            log.warning("[worker] --random-weights: serving seeded random weights (seed %d), not a trained head: "
                        "nearly every draft will be rejected", cfg.seed)
        worker_needs(cfg)  # before anything starts: a missing extra is one line, not a traceback
        run(cfg, token=token_or_bad_parameter(cfg.token_file))
    except MissingDependency as e:
        click.echo(f"dspark-proxy worker: {e}", err=True)
        sys.exit(EXIT_MISSING_DEPENDENCY)
    except (OSError, ValueError) as e:
        click.echo(f"dspark-proxy worker: {e}", err=True)
        sys.exit(EXIT_STARTUP_FAILURE)


if __name__ == "__main__":
    worker()
