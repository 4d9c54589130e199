"""`dspark-proxy demo`: a worker and a proxy as child processes, the simulated engine through the shim,
a summary at the end; exits non-zero if any draft was wrong."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

__all__ = ["demo", "run_demo"]


def run_demo(*, rounds: int | None, duration_s: float | None, max_reqs: int, num_spec: int, window: int,
             row_bytes: int, deadline_ms: float, seed: int, engine_work_us: float, name: str | None = None,
             quiet: bool = False, staging_budget_mb: int | None = None) -> dict[str, Any]:
    """Run the whole system once; returns the summary (also what --json prints)."""
    import engine_shim
    from dspark_proxy.launch import spawn_proxy, spawn_worker
    from dspark_proxy.sim import SimConfig, SimEngine
    from dspark_proxy.status import read_status

    name = name or f"demo-{os.getpid()}"
    layout = ["--num-spec", str(num_spec), "--window", str(window), "--row-bytes", str(row_bytes),
              "--max-reqs", str(max_reqs)]
    say = (lambda *a: None) if quiet else (lambda msg: click.echo(msg, err=True))
    worker = proxy = shim = None
    try:
        worker = spawn_worker(*layout)
        say(f"[demo] worker pid {worker.pid} on {worker.address}")
        extra = [] if staging_budget_mb is None else ["--staging-budget-mb", str(staging_budget_mb)]
        proxy = spawn_proxy(name, worker.address, *layout, "--deadline-ms", str(deadline_ms), "--log-every", "0",
                            *extra)
        say(f"[demo] proxy pid {proxy.pid}, segment {name}")
        shim = engine_shim.attach(name, max_reqs=max_reqs, num_spec=num_spec, window=window, row_bytes=row_bytes,
                                  timeout_s=5.0)
        sim = SimEngine(SimConfig(seed=seed, max_reqs=max_reqs, num_spec=num_spec, window=window,
                                  row_bytes=row_bytes, engine_work_us=engine_work_us))
        t0 = time.monotonic()
        res = sim.run(shim, rounds=rounds, duration_s=None if rounds else duration_s).to_dict()
        res["elapsed_s"] = round(time.monotonic() - t0, 3)
        time.sleep(0.3)  # let the proxy's heartbeat thread publish its last snapshot
        st = read_status(name)
        lat = st["proxy"].get("latency", {})
        r0, rtt = lat.get("rank0_round_us", {}), lat.get("rtt_us", {})
        res["proxy_round_us_p50"] = r0.get("p50_us")
        res["rtt_us_p50"] = rtt.get("p50_us")
        res["proxy_cost_us_p50"] = lat.get("proxy_cost_us", {}).get("p50_us")  # round - rtt, per round
        res["proxy_counters"] = st["proxy"].get("counters", {})
        res["deadline_ms"] = deadline_ms
        return res
    finally:
        if shim is not None:
            shim.close()
        for child in (proxy, worker):
            if child is not None:
                child.stop()


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
def demo(duration_s: float, rounds: int | None, max_reqs: int, num_spec: int, window: int, row_bytes: int,
         deadline_ms: float, engine_work_us: float, seed: int, staging_budget_mb: int | None, name: str | None,
         as_json: bool) -> None:
    """Worker + proxy + simulated engine, end to end, with every draft checked against the oracle."""
    from ..exitcodes import EXIT_WRONG_DRAFTS

    r = run_demo(rounds=rounds, duration_s=duration_s, max_reqs=max_reqs, num_spec=num_spec, window=window,
                 row_bytes=row_bytes, deadline_ms=deadline_ms, seed=seed, engine_work_us=engine_work_us, name=name,
                 staging_budget_mb=staging_budget_mb)
    click.echo(json.dumps(r, default=str) if as_json else _summary(r))
    if r["wrong_drafts"]:
        click.echo(f"dspark-proxy demo: {r['wrong_drafts']} WRONG drafts: {r.get('first_wrong')}", err=True)
        sys.exit(EXIT_WRONG_DRAFTS)
