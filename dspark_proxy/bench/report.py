"""The human table: every section's figures as p50 / p99 / p99.9 / max, then its ratios."""

from __future__ import annotations

from typing import Any

__all__ = ["format_report"]

_HEAD = f"{'p50':>9} {'p99':>9} {'p99.9':>9} {'max':>9}"


def _v(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) < 1e5 else f"{x:.0f}"
    return str(x)


def _r(x: Any) -> str:
    """A ratio: three significant digits."""
    return "-" if x is None else f"{x:.3g}"


def _fig(d: dict[str, Any] | None) -> str:
    d = d or {}
    return " ".join(f"{_v(d.get(k)):>9}" for k in ("p50_us", "p99_us", "p999_us", "max_us"))


def _row(label: str, d: dict[str, Any] | None, width: int = 44, extra: str = "") -> str:
    return f"  {label:<{width}} {_fig(d)}{extra}"


def _handoff(r: dict[str, Any]) -> list[str]:
    s = r["shape"]
    out = [f"1. HAND-OFF  engine -> proxy (null worker) -> engine, n={s['n']}, M={s['max_reqs']} "
           f"N={s['num_spec']} W={s['window']} row_bytes={s['row_bytes']}; {r['rounds']} rounds, "
           f"{r['pings']} pings per baseline (us)",
           f"  {'':<44} {_HEAD}"]
    labels = (("handoff", "hand-off round (enqueue + read_reply)"), ("enqueue", "  of which enqueue"),
              ("read_reply", "  of which read_reply (wait + copy)"),
              ("proxy_round", "proxy's own round (gathered -> published)"),
              ("futex_adaptive", "futex ping-pong, adaptive spin (hostflag)"),
              ("futex_sleep", "futex ping-pong, sleep only (hostflag)"),
              ("bare_handoff", "bare hand-off: words + page, no round logic"),
              ("pipe", "multiprocessing.Pipe round trip"), ("tcp", "TCP loopback round trip"))
    for place, p in r["placements"].items():
        out.append(f" [{place}]" + (f"  failed rounds: {p['failed_rounds']}" if p["failed_rounds"] else ""))
        for key, label in labels:
            if key in p:
                out.append(_row(label, p[key]))
        if p.get("bare_handoff_note"):
            out.append(f"  (bare hand-off: {p['bare_handoff_note']})")
        rt = p["ratios"]
        if "handoff_over_bare_handoff_p50" in rt:
            out.append("  ratios p50: bare hand-off / futex floor "
                       f"{_r(rt['bare_handoff_over_futex_floor_p50'])}x, "
                       f"hand-off / bare hand-off {_r(rt['handoff_over_bare_handoff_p50'])}x")
        out.append(f"  ratios p50: hand-off / futex floor {_r(rt['handoff_over_futex_floor_p50'])}x, "
                   f"proxy round / futex floor {_r(rt['proxy_round_over_futex_floor_p50'])}x, "
                   f"Pipe / hand-off {_r(rt['pipe_over_handoff_p50'])}x, "
                   f"TCP / hand-off {_r(rt['tcp_over_handoff_p50'])}x")
    pc = r.get("paced")
    if pc:
        out.append(f" [paced: a round every {pc['gap_ms']} ms, the engine busy between, {pc['placement']}]"
                   + (f"  failed rounds: {pc['failed_rounds']}" if pc["failed_rounds"] else ""))
        for key, label in labels[:4]:
            out.append(_row(label, pc[key]))
    ka = r.get("keep_awake")
    if ka:
        for title, x in ((f"unpinned, the proxy's CPUs kept awake (--keep-awake-ms {ka['keep_awake_ms']:g})", ka),
                         ("paced as above, the proxy's CPUs kept awake", ka["paced"])):
            out.append(f" [{title}]" + (f"  failed rounds: {x['failed_rounds']}" if x["failed_rounds"] else ""))
            for key, label in labels[:4]:
                out.append(_row(label, x[key]))
    return out


def _gil(r: dict[str, Any]) -> list[str]:
    s = r["shape"]
    out = [f"2. GIL ISOLATION  full round to a local worker process, n={s['n']} decode, M={s['max_reqs']} "
           f"N={s['num_spec']} W={s['window']} row_bytes={s['row_bytes']}; engine on cpu {r['engine_cpu']}, "
           f"proxy and worker on cpu {r['proxy_worker_cpu']}; engine step {r['engine_step_ms']} ms (us)",
           f"  {'':<44} {_HEAD}"]
    for mode, cases in r["modes"].items():
        for key, c in cases.items():
            busy = key.split("_")[1]
            tag = f"{mode} mode, {busy} busy threads"
            fail = f"  ({c['rounds']} rounds, {c['failed_rounds']} failed)"
            out.append(_row(f"{tag}: proxy round", c["proxy_round"], extra=fail))
            out.append(_row("  of which worker round trip", c["worker_rtt"]))
            label = "  proxy round - worker round trip (p50s)"
            out.append(f"  {label:<44} {_v(c.get('proxy_cost_p50_us')):>9}")
            out.append(_row("  engine wait (read_reply)", c["engine_wait"]))
            out.append(_row("  engine enqueue", c["enqueue"]))
            rt = c.get("ratios_vs_idle")
            if rt:
                out.append(f"  vs idle: proxy round p50 {_r(rt['proxy_round_p50'])}x, p99 "
                           f"{_r(rt['proxy_round_p99'])}x; proxy round - worker p50 "
                           f"{_r(rt['proxy_cost_p50'])}x; "
                           f"engine wait p50 {_r(rt['engine_wait_p50'])}x")
    return out


def _scaling(r: dict[str, Any]) -> list[str]:
    out = [f"3. SCALING  {r['method']}; N={r['num_spec']} row_bytes={r['row_bytes']} M={r['max_reqs']} (us)",
           f"  {'W':>4} {'mix':<8} {'n':>5} {'rows':>7} | proxy cost {_HEAD} | engine cost {_HEAD}"]
    for c in r["cases"]:
        out.append(f"  {c['W']:>4} {c['mix']:<8} {c['n']:>5} {c['rows_per_round']:>7.0f} | {'':>10} "
                   f"{_fig(c['proxy_cost'])} | {'':>11} {_fig(c['engine_cost'])}")
    fits = ", ".join(f"{k}: {v['fixed_us']} + {v['us_per_request']} x n" for k, v in r["fits"].items())
    out.append(f"  proxy cost p50 fit (us): {fits}")
    return out


def _rows(r: dict[str, Any]) -> list[str]:
    out = [f"4. ROWS THROUGHPUT  rounds through the proxy to a local worker process vs a raw socket, "
           f"N={r['num_spec']}",
           f"  {'':<44} {_HEAD}"]
    for c in r["cases"]:
        out.append(f" [{c['n']} requests x {c['rows_per_request']} rows of {c['row_bytes']} B = "
                   f"{c['row_mb_per_round']:.1f} MB a round, {c.get('workers', 1)} worker(s), {c['rounds']} rounds"
                   + (f", {c['failed_rounds']} failed]" if c["failed_rounds"] else "]"))
        for key, label in (("proxy_round", "proxy round (us)"), ("rtt", "  STEP round trip (us)"),
                           ("worker", "  worker's own time (us)"), ("engine_round", "engine round (us)"),
                           ("enqueue", "  of which enqueue (us)"), ("raw", "raw socket round trip (us)")):
            out.append(_row(label, c[key]))
        mb, rt = c["mb_per_s"], c["ratios_vs_raw"]
        out.append(f"  MB/s at p50: proxy round {_v(mb['proxy_round'])}, proxy path (round - worker) "
                   f"{_v(mb['proxy_path'])}, transport {_v(mb['transport'])}, engine round "
                   f"{_v(mb['engine_round'])}, raw {_v(mb['raw'])}")
        out.append(f"  vs raw: proxy round {_r(rt['proxy_round'])}x, proxy path {_r(rt['proxy_path'])}x, "
                   f"transport {_r(rt['transport'])}x, engine round {_r(rt['engine_round'])}x")
    return out


def _rss(d: dict[str, Any]) -> str:
    return (f"VmRSS {_v(d.get('vm_rss'))} MB (anon {_v(d.get('rss_anon'))}, file {_v(d.get('rss_file'))}, "
            f"shmem {_v(d.get('rss_shmem'))}; outside the segment {_v(d.get('own_mb'))}; huge pages "
            f"{_v(d.get('anon_huge_pages'))})")


def _memory(r: dict[str, Any]) -> list[str]:
    s, seg = r["shape"], r["segment"]
    out = [f"5. MEMORY  M={s['max_reqs']} N={s['num_spec']} W={s['window']} row_bytes={s['row_bytes']}; "
           f"{r['rounds']} decode rounds of n={s['n']} ({r['row_mb_sent']} MB of rows, "
           f"{r['rows_held_per_slot']} rows held per slot)",
           f"  segment {seg['total_mb']} MB (max_rows {seg['max_rows']}, resync windows/round "
           f"{seg['resync_per_round']}): " + ", ".join(f"{k} {v:g}" for k, v in seg["regions_mb"].items()
                                                      if v >= 0.01) + " MB"]
    for who in ("proxy", "worker"):
        out.append(f"  {who:<7} after start   {_rss(r[who]['after_start'])}")
        out.append(f"  {'':<7} after rounds  {_rss(r[who]['after_rounds'])}")
    out.append(f"  worker windows at full: {r['worker']['windows_full_mb']} MB")
    e = r["engine"]
    out.append(f"  engine  before attach {_rss(e['before_attach'])}")
    out.append(f"  {'':<7} after rounds  {_rss(e['after_rounds'])}")
    out.append(f"  shim added: {e['shim_added_mb']} MB resident ({e['shim_added_own_mb']} MB outside the "
               f"segment; the engine ring at full is {e['engine_ring_full_mb']} MB)")
    i = r["idle"]
    out.append(f"  idle {i['seconds']} s: proxy {i['proxy_pct_core']}% of a core, shim (engine process) "
               f"{i['engine_process_pct_core']}%, of which watchdog thread {i['shim_watchdog_pct_core']}%, "
               f"worker {i['worker_pct_core']}%")
    for state, v in (r.get("idle_states") or {}).items():
        if isinstance(v, dict) and "proxy_plus_shim_pct_core" in v:
            out.append(f"  idle {state:<26} proxy + shim {v['proxy_plus_shim_pct_core']}% (proxy "
                       f"{v['proxy_pct_core']}%, engine process {v['engine_process_pct_core']}%), worker "
                       f"{v['worker_pct_core']}%")
    return out


def _targets(ts: list[dict[str, Any]]) -> list[str]:
    out = ["TARGETS (reported, not asserted)"]
    for t in ts:
        mark = {True: "met", False: "NOT met", None: "info"}[t["met"]]
        out.append(f"  [{mark:>7}] {t['goal']}: {t['measured']}")
    return out


def format_report(res: dict[str, Any]) -> str:
    m = res["meta"]
    lines = [f"dspark-proxy bench{' --quick' if m['quick'] else ''}: {m['cpus']} cpus ({m['cpu_model']}), "
             f"Python {m['python']}, numpy {m['numpy']}, {m['platform']}",
             f"load average at start {m['load_avg_start'][0]:.2f}, at end {m['load_avg_end'][0]:.2f}; "
             "time per section (s): " + ", ".join(f"{k} {v}" for k, v in m["elapsed_s"].items()), ""]
    for key, fn in (("handoff", _handoff), ("gil", _gil), ("scaling", _scaling), ("rows", _rows),
                    ("memory", _memory)):
        if key in res:
            lines += fn(res[key]) + [""]
    if "eval" in res:
        from ..spec.report import format_eval

        lines += ["EVAL  the reference engine (dspark-proxy eval)", format_eval(res["eval"]), ""]
    if "serve" in res:
        from .serve_stats import format_serve

        lines += format_serve(res["serve"]) + [""]
    lines += _targets(res.get("targets", []))
    return "\n".join(lines)
