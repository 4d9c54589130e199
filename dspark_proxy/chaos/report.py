"""The campaign's report: per fault kind, what the engine saw (rounds, usable drafts, wrong drafts, full
windows, its waits against the deadline and its longest enqueue, rounds until drafts resumed and until
windows were full again) and what both watchdogs recorded; the checks docs/guarantees.md lists; a
human table.

Windows, per injection, as indices into the engine's per-round record:
    [idx_start, idx_clear)  the fault is on         -> rounds, usable rate
    [idx_clear, idx_resume] until the first usable  -> rounds (and ms) until drafts resume
    [idx_start, idx_end)    fault, recovery, settle -> waits, wrong drafts
Rounds outside every window are the `baseline` row.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from .completeness import BASELINE_MIN_FULL_RATE, full_rate, recovery, settled
from .pool_faults import HEALTHY_MIN_USABLE, healthy_bar
from .ring_faults import RING_GONE_S

__all__ = ["build_report", "format_table"]

_SHOWN_COUNTER_PREFIXES = ("fallback_", "watchdog_", "deaths", "breaker_trips", "abandoned", "attaches",
                           "client.connections_dropped", "client.bad_", "client.late_", "client.disabled",
                           "client.timeouts", "client.reconnects", "detach_", "attach_")


def _ms(ns: np.ndarray, q: float | None = None) -> float:
    if ns.size == 0:
        return 0.0
    v = ns.max() if q is None else np.percentile(ns, q)
    return round(float(v) / 1e6, 3)


def _wait_summary(ns: np.ndarray, deadline_ms: float, late: np.ndarray) -> dict[str, float]:
    """Waits inside read_reply, and how far past gathered + deadline the latest reply came back."""
    mx = _ms(ns)
    return {"wait_ms_p50": _ms(ns, 50), "wait_ms_p99": _ms(ns, 99), "wait_ms_max": mx,
            "beyond_deadline_ms": round(mx - deadline_ms, 3),
            "late_ms_max": round(float(late.max()) / 1e6, 3) if late.size else 0.0}


def _sum(a: list[int], lo: int, hi: int) -> int:
    return int(sum(a[lo:hi]))


def build_report(*, cfg: dict[str, Any], probe: Any, injections: list, passes: int, elapsed_s: float,
                 leftovers: list[str], failures: list[str], corruptions: dict[str, int],
                 timeline: list[tuple[int, int, str]] | None = None) -> dict[str, Any]:
    D, margin = float(cfg["deadline_ms"]), float(cfg["margin_ms"])
    failures = list(failures)
    n_rounds = probe.count if probe is not None else 0
    wait = np.asarray(probe.wait_ns[:n_rounds] if probe else [], dtype=np.int64)
    enq = np.asarray(probe.enqueue_ns[:n_rounds] if probe else [], dtype=np.int64)
    late = np.asarray(probe.late_ns[:n_rounds] if probe else [], dtype=np.int64)
    in_fault = np.zeros(n_rounds, dtype=np.bool_)
    per_inj: list[dict[str, Any]] = []
    by_kind: dict[str, list] = {}
    for inj in injections:
        lo, clear, hi = inj.idx_start, inj.idx_clear, min(inj.idx_end, n_rounds)
        in_fault[lo:hi] = True
        resume_rounds = None if inj.idx_resume is None else inj.idx_resume - clear
        resume_ms = None
        if inj.idx_resume is not None and inj.idx_resume < len(probe.done_ns):
            resume_ms = round(max(0, probe.done_ns[inj.idx_resume] - inj.clear_ns) / 1e6, 1)
        row = {"kind": inj.kind, "n": inj.n, "t_start": inj.t_start, "t_end": inj.t_end,
               "clock_start_s": inj.clock_start_s, "rounds_fault": clear - lo, "rounds": hi - lo,
               "needed_fault": _sum(probe.needed, lo, clear), "usable_fault": _sum(probe.usable, lo, clear),
               "wrong": _sum(probe.wrong, lo, hi), "resume_rounds": resume_rounds, "resume_ms": resume_ms,
               "usable": _sum(probe.usable, lo, hi), "full": _sum(probe.full, lo, hi),
               "full_window_rate": full_rate(_sum(probe.usable, lo, hi), _sum(probe.full, lo, hi)),
               **recovery(probe, clear, hi, inj.windows_per_round),
               "enqueue_ms_max": _ms(enq[lo:hi]),
               **_wait_summary(wait[lo:hi], D, late[lo:hi]), "notes": inj.notes, "error": inj.error,
               "shim_events": dict(Counter(e.get("how", "?") for e in inj.shim_events)),
               "shim_events_lost": inj.shim_events_lost,
               "proxy_events": dict(Counter(e.get("how", "?") for e in inj.proxy_events)),
               "shim_counters": inj.shim_counters, "proxy_counters": inj.proxy_counters,
               "first_events": {"shim": inj.shim_events[:3], "proxy": inj.proxy_events[:3]}}
        per_inj.append(row)
        by_kind.setdefault(inj.kind, []).append((inj, row))
        if inj.error:
            failures.append(f"{inj.kind} #{inj.n}: {inj.error}")
        if resume_rounds is None:
            failures.append(f"{inj.kind} #{inj.n}: usable drafts did not resume within "
                            f"{cfg['resume_timeout_s']} s after the fault cleared")
    kinds: dict[str, dict[str, Any]] = {}
    for kind, items in by_kind.items():
        idx = np.concatenate([np.arange(i.idx_start, min(i.idx_end, n_rounds)) for i, _ in items])
        rows = [r for _, r in items]
        needed = sum(r["needed_fault"] for r in rows)
        res = [r["resume_rounds"] for r in rows]
        res_ms = [r["resume_ms"] for r in rows if r["resume_ms"] is not None]
        shim_ev: Counter[str] = Counter()
        proxy_ev: Counter[str] = Counter()
        shim_c: Counter[str] = Counter()
        proxy_c: Counter[str] = Counter()
        for r in rows:
            shim_ev.update(r["shim_events"])
            proxy_ev.update(r["proxy_events"])
            shim_c.update(r["shim_counters"])
            proxy_c.update(r["proxy_counters"])
        kinds[kind] = {
            "injections": len(rows), "rounds_fault": sum(r["rounds_fault"] for r in rows),
            "rounds": sum(r["rounds"] for r in rows),
            "usable_rate_fault": round(sum(r["usable_fault"] for r in rows) / needed, 4) if needed else None,
            "wrong": sum(r["wrong"] for r in rows), **_wait_summary(wait[idx], D, late[idx]),
            "enqueue_ms_max": _ms(enq[idx]),
            "full_window_rate": full_rate(sum(r["usable"] for r in rows), sum(r["full"] for r in rows)),
            "full_after_rounds_max": max((r["full_after_rounds"] for r in rows if r["full_after_rounds"] is not None),
                                         default=None),
            "full_bound_rounds_max": max((r["full_bound_rounds"] for r in rows if r["full_bound_rounds"] is not None),
                                         default=None),
            "resume_rounds_max": None if None in res else max(res, default=0),
            "resume_rounds_median": None if None in res else float(np.median(res)) if res else 0,
            "resume_ms_max": max(res_ms, default=None), "never_resumed": sum(x is None for x in res),
            "shim_events": dict(sorted(shim_ev.items())), "proxy_events": dict(sorted(proxy_ev.items())),
            "shim_counters": dict(sorted(shim_c.items())), "proxy_counters": dict(sorted(proxy_c.items())),
            "notes": [r["notes"] for r in rows if r["notes"]],
            # a kind that could not run here (ring_squat without root) says so: never counted a pass
            "skipped": next((f"skipped: {r['notes']['skipped']}" for r in rows if r["notes"].get("skipped")), None),
        }
    base = ~in_fault
    base_needed = int(np.asarray(probe.needed[:n_rounds])[base].sum()) if n_rounds else 0
    baseline = {"rounds": int(base.sum()), "wrong": int(np.asarray(probe.wrong[:n_rounds])[base].sum())
                if n_rounds else 0,
                "usable_rate": round(int(np.asarray(probe.usable[:n_rounds])[base].sum()) / base_needed, 4)
                if base_needed else None, **_wait_summary(wait[base], D, late[base]),
                "enqueue_ms_max": _ms(enq[base]),
                **_baseline_full(probe, n_rounds, base)}
    wrong_total = int(sum(probe.wrong)) if probe else 0
    limit_ns = (D + margin) * 1e6
    over = np.flatnonzero(wait > limit_ns)
    timeline = sorted(timeline or [])
    over_rows = []
    for i in over[np.argsort(-wait[over])].tolist():
        end = probe.reply_end_ns[i]
        rd = probe.wait_run_delay_ns[i]
        others = _gil_by_others(probe, i)
        over_rows.append({"round": int(probe.t[i]), "wait_ms": round(float(wait[i]) / 1e6, 3),
                          "during": _during(i, injections), "off_cpu_ms": round(rd / 1e6, 3),
                          "gil_by_others_ms": round(others / 1e6, 3),
                          "explained": bool(rd + others >= wait[i] - limit_ns),
                          "controller": _near(timeline, end - int(wait[i]), end), **_where(probe, i)})
    unexplained = [o for o in over_rows if not o["explained"]]
    worst = over_rows[:10]
    _checks(cfg, kinds, wrong_total, unexplained if not cfg.get("strict") else over_rows, leftovers, failures,
            per_inj, baseline["usable_rate"])
    _completeness_checks(baseline, per_inj, failures)
    overall = {"rounds": n_rounds, "elapsed_s": round(elapsed_s, 1), "passes": passes,
               "injections": len(injections), "wrong_drafts": wrong_total,
               "drafts_needed": int(sum(probe.needed)) if probe else 0,
               "usable_drafts": int(sum(probe.usable)) if probe else 0, **_wait_summary(wait, D, late),
               "full_windows": int(sum(probe.full)) if probe else 0,
               "full_window_rate": full_rate(int(sum(probe.usable)), int(sum(probe.full))) if probe else None,
               "rounds_over_limit_unexplained": len(unexplained),
               "off_cpu_ms_max": _ms(np.asarray(probe.wait_run_delay_ns[:n_rounds] if probe else [], np.int64)),
               "enqueue_ms_max": _ms(enq), "enqueue_ms_p99": _ms(enq, 99),
               "worst_enqueue": [_outlier(probe, int(i), injections, timeline, "enqueue")
                                 for i in np.argsort(-enq)[:5]],
               "worst_late": [_outlier(probe, int(i), injections, timeline, "late")
                              for i in np.argsort(-late)[:5]], "limit_ms": D + margin, "rounds_over_limit": int(over.size),
               "worst_over_limit": worst, "descriptor_corruptions": corruptions}
    return {"ok": not failures, "failures": failures, "config": cfg, "overall": overall, "baseline": baseline,
            "faults": kinds, "injections": per_inj, "leftovers": leftovers}


def _near(timeline: list[tuple[int, int, str]], lo: int, hi: int, slack_ns: int = 5_000_000) -> list[str]:
    """What the controller (or the collector) was doing while [lo, hi] went by."""
    out = []
    for a0, a1, what in timeline:
        if a0 > hi + slack_ns:
            break
        if a1 >= lo - slack_ns:
            out.append(f"{what} ({(a1 - a0) / 1e6:.1f} ms, from {(a0 - lo) / 1e6:+.1f} ms)")
    return out[:6]


def _outlier(probe: Any, i: int, injections: list, timeline: list, what: str) -> dict[str, Any]:
    """One slow round, with how long the kernel kept the engine thread off the CPU meanwhile."""
    end = probe.reply_end_ns[i]
    enq_end = end - probe.late_ns[i] - probe.deadline_ns  # late = reply end - enqueue end - deadline
    lo, hi = (enq_end - probe.enqueue_ns[i], enq_end) if what == "enqueue" else (enq_end, end)
    rd = probe.enqueue_run_delay_ns[i] if what == "enqueue" else probe.wait_run_delay_ns[i]
    return {"round": int(probe.t[i]), f"{what}_ms": round((hi - lo - (probe.deadline_ns if what == "late" else 0))
                                                           / 1e6, 3),
            "during": _during(i, injections), "off_cpu_ms": round(rd / 1e6, 3),
            "controller": _near(timeline, lo, hi)}


def _gil_by_others(probe: Any, i: int) -> int:
    """The part of round i's GIL wait (after its wait ended) that no thread of the product can have
    caused (probe.py: all of it when the shim's watchdog thread was asleep, holding no GIL, since before
    it began; else none). The campaign's threads (its controller, in the engine's process as an engine's
    other threads are) caused it, and the engine would wait for them whatever the product did."""
    if i >= len(probe.gil_wait_ns):
        return 0
    return max(0, probe.gil_wait_ns[i] - probe.product_threads_ns[i])


def _where(probe: Any, i: int) -> dict[str, Any]:
    """Where round i's wait went (probe.py): the shim's wait outcome, how far past the deadline its wait
    returned (GIL held again), read_reply's Python after that, and the other thread of this process
    kept off the CPU longest meanwhile."""
    if i >= len(probe.wait_outcome):
        return {}
    tid = probe.others_run_delay_tid[i]
    busy, btid = probe.busiest_thread[i]
    return {"outcome": {1: "published", 2: "claimed_by_engine", 3: "claimed_unpublished", 4: "out_of_order"}.get(
                probe.wait_outcome[i], "none"),
            "returned_past_deadline_ms": round(probe.returned_past_deadline_ns[i] / 1e6, 3),
            "on_cpu_ms": round(probe.wait_on_cpu_ns[i] / 1e6, 3),
            # neither on the CPU nor runnable: the wait for the reply itself, and any other sleep (the GIL
            # handed to another thread, a page fault's I/O, a lock)
            "asleep_ms": round(max(0, probe.wait_ns[i] - probe.wait_on_cpu_ns[i] - probe.wait_run_delay_ns[i]) / 1e6, 3),
            "gil_wait_ms": round(probe.gil_wait_ns[i] / 1e6, 3),
            "product_threads_ms": round(probe.product_threads_ns[i] / 1e6, 3),
            "after_wait_ms": round(probe.after_wait_ns[i] / 1e6, 3),
            "other_thread_off_cpu_ms": round(probe.others_run_delay_ns[i] / 1e6, 3),
            "other_thread": probe.thread_names.get(tid, str(tid)) if tid else None,
            "busiest_thread": probe.thread_names.get(btid, str(btid)) if btid else None,
            "busiest_thread_on_cpu_ms": round(busy / 1e6, 3)}


def _during(i: int, injections: list) -> str:
    for inj in injections:
        if inj.idx_start <= i < inj.idx_end:
            return f"{inj.kind} #{inj.n}"
    return "baseline"


def _baseline_full(probe: Any, n_rounds: int, base: np.ndarray) -> dict[str, Any]:
    """The baseline's full-window rate over its settled rounds (completeness.settled: a failed round's
    aftermath is held to the recovery bound, as a fault's is), and over every baseline round."""
    if not n_rounds:
        return {"full_window_rate": None, "full_window_rate_all": None, "rounds_recovering": 0}
    usable, full = np.asarray(probe.usable[:n_rounds]), np.asarray(probe.full[:n_rounds])
    calm = base & settled(probe, n_rounds)
    return {"full_window_rate": full_rate(int(usable[calm].sum()), int(full[calm].sum())),
            "full_window_rate_all": full_rate(int(usable[base].sum()), int(full[base].sum())),
            "rounds_recovering": int(base.sum() - calm.sum())}


def _completeness_checks(baseline: dict[str, Any], per_inj: list, failures: list[str]) -> None:
    """Full windows: at least BASELINE_MIN_FULL_RATE outside the faults, and whole again within the
    bound after each fault (completeness.py)."""
    rate = baseline["full_window_rate"]
    if rate is not None and rate < BASELINE_MIN_FULL_RATE:
        failures.append(f"baseline full-window rate {rate} < {BASELINE_MIN_FULL_RATE} (settled rounds: "
                        f"{baseline['rounds_recovering']} recovering from a failed round left out): usable drafts "
                        f"computed from fewer rows than the engine holds")
    for r in per_inj:
        after, bound = r["full_after_rounds"], r["full_bound_rounds"]
        if after is not None and after > bound:
            failures.append(f"{r['kind']} #{r['n']}: windows full again {after} rounds after the first round that "
                            f"reached the worker; the bound is {bound} (live requests / "
                            f"{r['windows_per_round_staged']} windows staged a round, + 1)")


def _checks(cfg: dict[str, Any], kinds: dict[str, dict[str, Any]], wrong_total: int, over: list[dict[str, Any]],
            leftovers: list[str], failures: list[str], per_inj: list, baseline_usable: float | None = None) -> None:
    for k in cfg["kinds"]:
        if k not in kinds:
            failures.append(f"fault kind {k} was never injected")
    if wrong_total:
        failures.append(f"{wrong_total} WRONG drafts reached the engine")
    if over:
        failures.append(f"{len(over)} rounds waited longer than deadline + margin "
                        f"({cfg['deadline_ms']} + {cfg['margin_ms']} ms)"
                        + ("" if cfg.get("strict") else " beyond the time the kernel kept the engine thread off the CPU "
                                                        "and the campaign's own threads kept the GIL")
                        + f"; worst {over[0]}")
    for r in per_inj:
        pc = r["proxy_counters"]
        if r["kind"] == "bad_descriptor":
            if r["notes"].get("corrupted", 0) and pc.get("fallback_bad_descriptor", 0) < 1:
                failures.append(f"bad_descriptor #{r['n']}: {r['notes'].get('corrupted')} rounds corrupted but "
                                f"the proxy counted no fallback_bad_descriptor")
            if pc.get("deaths", 0):
                failures.append(f"bad_descriptor #{r['n']}: the proxy's round loop died")
        rate = r["notes"].get("healthy_usable_rate")
        pool_bar = healthy_bar(baseline_usable, r["notes"].get("healthy_rounds"))
        if r["kind"].startswith("pool_") and (rate is None or rate < pool_bar):
            failures.append(f"{r['kind']} #{r['n']}: the healthy worker's requests got usable drafts at {rate} "
                            f"(< {pool_bar}: {HEALTHY_MIN_USABLE} of the baseline's {baseline_usable}, less chance; "
                            f"notes {r['notes']})")
        notes = r["notes"]
        if r["kind"] == "ring_truncate" and (notes.get("truncated") or notes.get("proxy_alive") is False):
            failures.append(f"ring_truncate #{r['n']}: the engine's ring was cut or the proxy died ({notes})")
        if notes.get("ring_left") or (notes.get("ring_gone_ms") or 0) > RING_GONE_S * 1e3:
            failures.append(f"{r['kind']} #{r['n']}: an ended engine's ring outlived it by "
                            f"{notes.get('ring_gone_ms')} ms (> {RING_GONE_S:g} s)")
        if (notes.get("proxy_ring_maps") or 0) > 1:
            failures.append(f"{r['kind']} #{r['n']}: the proxy maps {notes['proxy_ring_maps']} engines' rings "
                            "(an ended engine's ring outlives it)")
        if r["kind"] == "worker_layout" and not r["notes"].get("refusal"):
            failures.append(f"worker_layout #{r['n']}: no '[client] disabled: ...' message in the proxy's log")
    for left in leftovers:
        failures.append(f"left behind: {left}")


def _short_counters(c: dict[str, int], limit: int = 7) -> str:
    shown = [(k, v) for k, v in c.items() if k.startswith(_SHOWN_COUNTER_PREFIXES)]
    shown.sort(key=lambda kv: -abs(kv[1]))
    return " ".join(f"{k}={v}" for k, v in shown[:limit])


def _merge_notes(notes: list[dict[str, Any]]) -> str:
    """Numbers summed over the injections (bools counted; rates: the lowest), anything else as the first
    one said it."""
    merged: dict[str, Any] = {}
    for n in notes:
        for k, v in n.items():
            if isinstance(v, bool):
                merged[k] = merged.get(k, 0) + int(v)
            elif isinstance(v, (int, float)) and k.endswith("_rate"):
                merged[k] = min(merged.get(k, v), v)  # a rate: the worst injection's
            elif isinstance(v, (int, float)) and not k.endswith("_ms"):
                merged[k] = merged.get(k, 0) + v
            else:
                merged.setdefault(k, v)
    return " ".join(f"{k}={v}" for k, v in merged.items())


def _events(c: dict[str, int]) -> str:
    return ",".join(f"{k}:{v}" for k, v in c.items()) or "-"


def format_table(r: dict[str, Any]) -> str:
    """The human table: one row per fault kind, then per-kind counters, then the verdict."""
    cfg, ov = r["config"], r["overall"]
    D = cfg["deadline_ms"]
    head = (f"{'fault':<19} {'inj':>3} {'rounds':>6} {'usable%':>7} {'wrong':>5} {'full%':>6} {'wait ms p50':>11} "
            f"{'p99':>7} {'max':>7} {'max-D':>7} {'late':>6} {'enq max':>7} {'resume rnds':>11} {'resume ms':>9} "
            f"{'full rnds':>9}  watchdog events (shim | proxy)")
    lines = [f"dspark-proxy chaos: {ov['rounds']} rounds in {ov['elapsed_s']} s, {ov['injections']} injections "
             f"({ov['passes']} passes), deadline {D:g} ms, margin {cfg['margin_ms']:g} ms, "
             f"M={cfg['max_reqs']} N={cfg['num_spec']} W={cfg['window']} row_bytes={cfg['row_bytes']}, seed {cfg['seed']}",
             "", head, "-" * len(head)]

    def row(name: str, inj: str, d: dict[str, Any], rate: Any, resume: str, resume_ms: str, ev: str,
            full_rnds: str = "-") -> str:
        pct = "-" if rate is None else f"{100 * rate:.1f}"
        fw = d.get("full_window_rate")
        full = "-" if fw is None else f"{100 * fw:.1f}"
        return (f"{name:<19} {inj:>3} {d.get('rounds_fault', d.get('rounds', 0)):>6} {pct:>7} {d['wrong']:>5} "
                f"{full:>6} {d['wait_ms_p50']:>11.2f} {d['wait_ms_p99']:>7.2f} {d['wait_ms_max']:>7.2f} "
                f"{d['beyond_deadline_ms']:>+7.2f} {d['late_ms_max']:>+6.2f} {d.get('enqueue_ms_max', 0.0):>7.2f} "
                f"{resume:>11} {resume_ms:>9} {full_rnds:>9}  {ev}")

    b = r["baseline"]
    lines.append(row("(baseline)", "-", b, b["usable_rate"], "-", "-", "-"))
    for kind, d in r["faults"].items():
        res = "never" if d["resume_rounds_max"] is None else f"{d['resume_rounds_max']}"
        res_ms = "-" if d["resume_ms_max"] is None else f"{d['resume_ms_max']:.0f}"
        ev = d["skipped"] or f"{_events(d['shim_events'])} | {_events(d['proxy_events'])}"
        fr = (f"{d['full_after_rounds_max']}/{d['full_bound_rounds_max']}"
              if d.get("full_after_rounds_max") is not None else "-")
        lines.append(row(kind, str(d["injections"]), d, d["usable_rate_fault"], res, res_ms, ev, fr))
    lines += ["", "rounds: rounds while the fault was on; usable%: usable drafts / drafts needed while it was on; "
              "full%: usable drafts whose window held every row the engine wrote (up to W), over fault + "
              "recovery; wait: inside read_reply, over fault + recovery; max-D: max wait minus the deadline; "
              "late: latest reply minus (gathered + deadline); enq max: longest enqueue (ms); resume: rounds "
              "(ms) from the fault clearing to the first usable draft; full rnds: rounds from the first round "
              "that reached the worker until every window was full / the bound (max over injections)", "",
              "counters (deltas over the injections):"]
    for kind, d in r["faults"].items():
        lines.append(f"  {kind:<19} proxy: {_short_counters(d['proxy_counters']) or '-'}")
        sc = _short_counters(d["shim_counters"])
        if sc:
            lines.append(f"  {'':<19} shim:  {sc}")
        if d["notes"]:
            lines.append(f"  {'':<19} note:  {_merge_notes(d['notes'])}")
    if ov["rounds_over_limit"]:
        lines.append(f"rounds over deadline + margin: {ov['rounds_over_limit']} "
                     f"({ov['rounds_over_limit_unexplained']} not explained by the kernel keeping the engine thread "
                     f"off the CPU); worst: " + "; ".join(
                         f"round {o['round']} {o['wait_ms']:.1f} ms during {o['during']} (off CPU "
                         f"{o['off_cpu_ms']:.1f} ms)" for o in ov["worst_over_limit"][:3]))
    fw = ov.get("full_window_rate")
    lines += ["", f"all rounds: wrong drafts {ov['wrong_drafts']}, usable {ov['usable_drafts']} of "
              f"{ov['drafts_needed']} needed, full windows {'-' if fw is None else f'{100 * fw:.2f}%'}; engine wait p50 {ov['wait_ms_p50']:.2f} p99 {ov['wait_ms_p99']:.2f} "
              f"max {ov['wait_ms_max']:.2f} ms (limit {ov['limit_ms']:g}); enqueue p99 {ov['enqueue_ms_p99']:.2f} "
              f"max {ov['enqueue_ms_max']:.2f} ms"]
    if r["failures"]:
        lines.append("FAILED:")
        lines += [f"  - {f}" for f in r["failures"]]
    else:
        explained = ov["rounds_over_limit"] - ov["rounds_over_limit_unexplained"]
        lines.append("PASSED: every fault kind injected, no wrong draft, no wait beyond deadline + margin, "
                     "full windows in the baseline and again within the bound after every fault"
                     + (f" (but {explained} over it while the kernel kept the engine off the CPU, above)" if explained else "")
                     + ", drafts resumed after every fault, nothing left behind")
    skipped = [f"{k}: {d['skipped']}" for k, d in r["faults"].items() if d.get("skipped")]
    if skipped:  # a kind that could not run here is not among those that passed
        lines.append("NOT RUN (not counted as passed): " + "; ".join(skipped))
    if r.get("log_dir"):
        lines.append(f"children's logs: {r['log_dir']}")
    return "\n".join(lines)
