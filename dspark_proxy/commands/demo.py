"""`dspark-proxy demo`: the library's `demo.run_demo` (a worker and a proxy as child processes, the
simulated engine through the shim), a summary at the end; exits non-zero if any draft was wrong."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..ops.exitcodes import EXIT_USAGE
from .errors import fail

__all__ = ["demo"]


def _summary(r: dict[str, Any]) -> str:
    return "\n".join([
        f"rounds            {r['rounds']} in {r['elapsed_s']} s ({r['rounds'] / max(r['elapsed_s'], 1e-9):.0f}/s)",
        f"usable drafts     {r['usable_drafts']} of {r['drafts_needed']} needed ({100 * r['usable_rate']:.1f}%)",
        f"wrong drafts      {r['wrong_drafts']}",
        f"full windows      {r.get('full_windows', 0)} of {r['usable_drafts']} usable "
        f"({100 * r.get('full_window_rate', 1.0):.1f}%: drafted from every row the engine holds, up to W)",
        f"engine wait (us)  p50 {r['wait_us_p50']:.0f}  p99 {r['wait_us_p99']:.0f}  max {r['wait_us_max']:.0f}"
        f"  (deadline {r['deadline_ms'] * 1000:.0f})",
        f"proxy round (us)  p50 {r.get('proxy_round_us_p50')}, worker rtt p50 {r.get('rtt_us_p50')}, "
        f"proxy cost (round - rtt, per round) p50 {r.get('proxy_cost_us_p50')}",
    ])


@click.command("demo")
@click.option("--duration", "duration_s", type=float, default=5.0, show_default=True, help="Seconds to run.")
@click.option("--rounds", type=int, default=None, help="Run this many rounds instead of --duration.")
@click.option("--max-reqs", type=int, default=32, show_default=True)
@click.option("--num-spec", type=int, default=5, show_default=True)
@click.option("--window", type=int, default=16, show_default=True)
@click.option("--row-bytes", type=int, default=256, show_default=True)
@click.option("--deadline-ms", type=float, default=20.0, show_default=True)
@click.option("--engine-work-us", type=float, default=2000.0, show_default=True,
              help="Simulated target forward per step (sleep), between enqueue and read_reply.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--staging-budget-mb", type=int, default=None,
              help="The proxy's staging budget (default: its own, 256): size it to the link at large rows.")
@click.option("--name", default=None, help="Segment name (default: demo-<pid>).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--engine", type=click.Choice(["sim", "vllm"]), default="sim", show_default=True,
              help="sim: the simulated engine. vllm: a real vLLM with the shipped target and head (needs vLLM: "
                   "scripts/setup.sh installs it) beside vLLM without speculation and with its n-gram drafter.")
@click.option("--cost", is_flag=True, help="--engine vllm: also measure what the shim and proxy add to a step.")
@click.option("--keep-awake-ms", type=click.FloatRange(0, 60_000), default=20.0, show_default=True,
              help="--engine vllm: the proxies' --keep-awake-ms (they run on a CPU of their own), and vLLM's "
                   "thread spins for its reply up to 1 ms (DSPARK_PROXY_REPLY_SPIN_US); 0: neither.")
@click.option("--head", "head", default=None, metavar="DIR",
              help="--engine vllm: the head the worker serves, our manifest head (its torch drafter) or a "
                   "speculators DSpark checkpoint (its dspark drafter) (default: models/stdlib-llama-head).")
def demo(duration_s: float, rounds: int | None, max_reqs: int, num_spec: int, window: int, row_bytes: int,
         deadline_ms: float, engine_work_us: float, seed: int, staging_budget_mb: int | None, name: str | None,
         as_json: bool, engine: str, cost: bool, keep_awake_ms: float, head: str | None) -> None:
    """Worker + proxy + simulated engine, end to end, with every draft checked against the oracle."""
    if engine == "vllm":
        _vllm_demo(as_json, cost, name, keep_awake_ms, head)
        return
    if head is not None:
        fail("demo", "--head: only with --engine vllm (the simulated engine drafts with the integrity oracle)",
             EXIT_USAGE)
    from ..demo import run_demo
    from ..ops.exitcodes import EXIT_WRONG_DRAFTS

    r = run_demo(rounds=rounds, duration_s=duration_s, max_reqs=max_reqs, num_spec=num_spec, window=window,
                 row_bytes=row_bytes, deadline_ms=deadline_ms, seed=seed, engine_work_us=engine_work_us, name=name,
                 staging_budget_mb=staging_budget_mb)
    click.echo(json.dumps(r, default=str) if as_json else _summary(r))
    if r["wrong_drafts"]:
        click.echo(f"dspark-proxy demo: {r['wrong_drafts']} WRONG drafts: {r.get('first_wrong')}", err=True)
        sys.exit(EXIT_WRONG_DRAFTS)


def _vllm_demo(as_json: bool, cost: bool, name: str | None, keep_awake_ms: float, head: str | None) -> None:
    from ..integrations.vllm_demo import DEFAULT_HEAD, run_vllm_demo
    from ..model.head_shapes import load_head_shapes
    from ..ops.exitcodes import EXIT_WRONG_DRAFTS

    head = head or str(DEFAULT_HEAD)
    try:
        load_head_shapes(head)  # a manifest head or a DSpark checkpoint; a bad one: one line naming it
    except ValueError as e:
        fail("demo", str(e), EXIT_USAGE)
    r = run_vllm_demo(cost=cost, name=name, keep_awake_ms=keep_awake_ms, head=head)
    if as_json:
        click.echo(json.dumps(r, default=str))
    else:
        click.echo("\n".join(f"{k:28s} {v}" for k, v in r.items()))
    if r["lossless_mismatches"]:
        click.echo(f"dspark-proxy demo: {r['lossless_mismatches']} outputs differ from vLLM without speculation",
                   err=True)
        sys.exit(EXIT_WRONG_DRAFTS)
