"""`dspark-proxy chaos`: the fault campaign (docs/guarantees.md) against real worker
and proxy processes; a table (or --json) per fault kind; exits non-zero if any guarantee did not
hold."""

from __future__ import annotations

import json
import logging
import sys

import click

from .plot_option import plot_option

__all__ = ["chaos"]


@click.command("chaos")
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds in all: one pass over every fault kind, more passes while they fit.")
@click.option("--deadline-ms", type=float, default=30.0, show_default=True, help="The proxy's round deadline.")
@click.option("--margin-ms", type=float, default=20.0, show_default=True,
              help="No engine wait may exceed the deadline plus this.")
@click.option("--max-reqs", type=int, default=32, show_default=True)
@click.option("--num-spec", type=int, default=5, show_default=True)
@click.option("--window", type=int, default=16, show_default=True)
@click.option("--row-bytes", type=int, default=256, show_default=True)
@click.option("--engine-work-us", type=float, default=1000.0, show_default=True,
              help="Simulated target forward per step (sleep), between enqueue and read_reply.")
@click.option("--hold-ms", type=float, default=600.0, show_default=True, help="How long a held fault lasts.")
@click.option("--heartbeat-timeout-ms", type=float, default=500.0, show_default=True,
              help="The shim's: a proxy whose heartbeat is older than this is hung.")
@click.option("--kinds", default=None, help="Comma-separated fault kinds (default: all).")
@click.option("--passes", "max_passes", type=int, default=None, help="At most this many passes.")
@click.option("--strict", is_flag=True,
              help="Also fail rounds over deadline + margin while the kernel kept the engine thread off the CPU.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--name", default=None, help="Segment name (default: chaos-<pid>).")
@click.option("--log-dir", default=None, help="Keep the children's logs here (default: a temp dir, kept on failure).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--plot", "plot_path", default=None, metavar="DIR",
              help="Also draw the engine's wait over time through each fault as a PNG in DIR (created if "
                   "missing; needs matplotlib, the plot extra).")
def chaos(duration_s: float, deadline_ms: float, margin_ms: float, max_reqs: int, num_spec: int, window: int,
          row_bytes: int, engine_work_us: float, hold_ms: float, heartbeat_timeout_ms: float, kinds: str | None,
          max_passes: int | None, strict: bool, seed: int, name: str | None, log_dir: str | None, as_json: bool,
          quiet: bool, plot_path: str | None) -> None:
    """Inject every fault kind into a running system; report what the engine saw, per fault."""
    from ..chaos import KIND_NAMES, ChaosConfig, format_table, run_campaign
    from ..ops.exitcodes import EXIT_FAILURE, EXIT_WRONG_DRAFTS

    plot_dir, _ = plot_option("chaos", plot_path)
    if not quiet:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = ChaosConfig(duration_s=duration_s, seed=seed, deadline_ms=deadline_ms, margin_ms=margin_ms,
                          max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                          engine_work_us=engine_work_us, hold_s=hold_ms / 1e3,
                          heartbeat_timeout_s=heartbeat_timeout_ms / 1e3,
                          kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()) if kinds else KIND_NAMES,
                          max_passes=max_passes, strict=strict, name=name, log_dir=log_dir)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    report = run_campaign(cfg, progress=None if quiet else (lambda msg: click.echo(msg, err=True)), plot_dir=plot_dir)
    click.echo(json.dumps(report, default=str) if as_json else format_table(report))
    if not report["ok"]:
        click.echo("dspark-proxy chaos: FAILED: " + "; ".join(report["failures"][:5]), err=True)
        sys.exit(EXIT_WRONG_DRAFTS if report["overall"]["wrong_drafts"] else EXIT_FAILURE)
