"""`dspark-proxy eval`: what the drafts earn, measured in the reference engine on held-out prompts.

One run: the arms (target-only decoding, prompt lookup, the head through a proxy process and a worker
process, the same head in the engine process by thread mode) interleaved three times, medians of
tokens/s; acceptance (mean accepted drafts per request-round of N, by position), target forwards
per generated token, the drafter's time per round (the worker's own, p50) and the one-token target
step (p50); every greedy output compared token for token with target-only decoding (a mismatch is
counted and shown with both forwards' top logits and margins, never tolerated); then faults (worker
stall, worker kill, proxy kill) during a generation: its output compared the same way, and tokens/s
before, during and after (it falls to target-only and comes back).

The head's arms verify drafts while the drafter's confidence holds (`min_confidence`, the engine's
draft-length policy); one more arm, `proxy_full_k`, verifies every draft the head sends: that is
where acceptance is measured (a draft that is never verified cannot be counted as accepted or not).
Acceptance counts full rounds: a request with fewer than N + 1 tokens left cannot verify N drafts,
and such rounds say nothing about the drafter (`mean_accepted_all_rounds` counts them too).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .drafts import NgramDrafts, NoDrafts, ShimDrafts
from .engine import Request, RunStats, SpecEngine
from .run import DEFAULT_HEAD, DEFAULT_MODEL, held_out_prompts, open_engine

__all__ = ["run_eval", "mismatches", "distinct_4gram_rate", "fault_window"]

ARMS = ("target_only", "ngram", "proxy", "thread", "proxy_full_k")
MIN_CONFIDENCE = 0.0


def mismatches(ref: RunStats, got: RunStats, arm: str, finished_only: bool = False) -> list[dict[str, Any]]:
    """Each request whose output differs from target-only: where, and both forwards' view of the two
    tokens there (a near-tie flipped by floating-point order shows a margin near 0)."""
    out = []
    for rid, want in ref.outputs.items():
        have = got.outputs.get(rid)
        if have is not None and np.array_equal(have, want):
            continue
        if have is None:
            if finished_only:
                continue
            out.append({"arm": arm, "prompt": rid, "missing": True})
            continue
        k = int(np.argmin(have == want))
        a, b = got.margins[rid][k], ref.margins[rid][k]
        out.append({"arm": arm, "prompt": rid, "position": k, "token": int(have[k]), "target_only_token": int(want[k]),
                    "this_forward": {"top1_logit": float(a[0]), "runner_up": int(a[1]), "runner_up_logit": float(a[2]),
                                     "margin": float(a[0] - a[2])},
                    "one_token_forward": {"top1_logit": float(b[0]), "runner_up": int(b[1]),
                                          "runner_up_logit": float(b[2]), "margin": float(b[0] - b[2])}})
    return out


def closest_tie(ref: RunStats, got: RunStats) -> dict[str, Any] | None:
    """The target-only token with the smallest top-2 margin, and the same position in `got`'s
    forward: how near a flip the run came (a margin of 0 would be a tie)."""
    best = None
    for rid, m in ref.margins.items():
        if not len(m):
            continue
        gap = m[:, 0] - m[:, 2]
        k = int(np.argmin(gap))
        if best is None or gap[k] < best[2]:
            best = (rid, k, float(gap[k]))
    if best is None:
        return None
    rid, k, gap = best
    out: dict[str, Any] = {"prompt": rid, "position": k, "one_token_forward_margin": round(gap, 6)}
    g = got.margins.get(rid)
    if g is not None and np.array_equal(got.outputs[rid][:k + 1], ref.outputs[rid][:k + 1]):
        out["this_forward_margin"] = round(float(g[k, 0] - g[k, 2]), 6)
    return out


def distinct_4gram_rate(outputs: dict[int, np.ndarray]) -> float:
    rates = [len({tuple(r[i:i + 4]) for i in range(len(r) - 3)}) / (len(r) - 3) for r in outputs.values() if len(r) > 3]
    return round(float(np.mean(rates)), 4) if rates else 0.0


def _rate(tl: list[tuple[float, int, bool]], a: float, b: float) -> float | None:
    """tokens/s between times a and b, from the steps' (end time, tokens so far)."""
    pts = [(t, n) for t, n, _ in tl if a <= t <= b]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 1)


def fault_window(st: RunStats, start: float, end: float) -> dict[str, Any]:
    """Tokens/s before the fault, while rounds failed, and after the first good round again."""
    tl = st.timeline
    failed = [t for t, _, f in tl if f and t >= start]
    back = next((t for t, _, f in tl if t > (failed[-1] if failed else end) and not f), None)
    last_fail = failed[-1] if failed else start
    return {"fault_s": round(end - start, 2), "failed_rounds": len(failed),
            "recovered_s_after_fault": round(back - end, 2) if back is not None else None,
            "tokens_per_s_before": _rate(tl, st.started, start),
            "tokens_per_s_during": _rate(tl, start, last_fail),
            "tokens_per_s_after": _rate(tl, back, tl[-1][0]) if back is not None else None}


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 3) if xs else None


def _latency(name: str, read_status: Callable[[str], dict]) -> dict:
    """The proxy's round latencies as its statistics snapshot has them, waiting for the snapshot that
    covers the rounds just run (the proxy publishes one every STATS_EVERY_S: a short run can end
    before it, and its figures would read 0)."""
    from ..proxy import STATS_EVERY_S

    end = time.monotonic() + 4 * STATS_EVERY_S
    while True:
        lat = read_status(name)["proxy"].get("latency", {})
        if lat.get("worker_us", {}).get("p50_us", 0.0) > 0 or time.monotonic() > end:
            return lat
        time.sleep(STATS_EVERY_S / 5)


def run_eval(*, quick: bool = False, model: str = DEFAULT_MODEL, head: str = DEFAULT_HEAD, prompts: int | None = None,
             max_new: int | None = None, max_batch: int | None = None, reps: int = 3, faults: bool = True,
             deadline_ms: float = 50.0, threads: int = 1, min_confidence: float = MIN_CONFIDENCE,
             say: Callable[[str], None] = lambda s: None,
             prompt_texts: list[str] | None = None, keep_awake_ms: float = 0.0,
             spin_us: float = 0.0) -> dict[str, Any]:
    """`prompt_texts` (eval --prompts FILE) replace the held-out prompts, each cut to its last 32 tokens."""
    import engine_shim

    from ..model.head_shapes import head_drafter, load_head_shapes
    from ..ops.status import read_status
    from .arms import thread_shim
    from .system import SpecSystem

    t_start = time.monotonic()
    load0 = os.getloadavg()[0]
    torch.set_num_threads(threads)
    n_prompts = prompts or (16 if quick else 48)
    max_new = max_new or (64 if quick else 96)
    B = max_batch or (4 if quick else 8)
    man = load_head_shapes(head)
    N, P = man.num_spec, 32
    target = open_engine(model, head, max_batch=B, max_len=P + max_new + N + 2)
    if prompt_texts:
        enc = [np.asarray(target.tokenizer(t, add_special_tokens=False)["input_ids"], np.int64)[-P:]
               for t in prompt_texts]
        ps = [p for p in enc if len(p)]
        n_prompts = len(ps)
    else:
        ps = held_out_prompts(target.tokenizer, n_prompts, P)
    reqs = [Request(i, p, max_new) for i, p in enumerate(ps)]
    name = f"eval-{os.getpid()}"
    res: dict[str, Any] = {"prompts": n_prompts, "max_new": max_new, "max_batch": B, "num_spec": N, "window": man.window,
                           "reps": reps, "model": os.path.basename(model.rstrip("/")), "head": os.path.basename(head.rstrip("/")),
                           "drafter": head_drafter(man)}
    shown: list[dict[str, Any]] = []
    res["keep_awake_ms"], res["spin_us"] = keep_awake_ms, spin_us
    with SpecSystem(name, head, max_reqs=B, deadline_ms=deadline_ms, target=model, keep_awake_ms=keep_awake_ms,
                    spin_us=spin_us) as sysm:
        from ..model.hf import target_id

        tid = target_id(model)  # the engine names its target: a head made for another is refused
        shim = engine_shim.attach(name, max_reqs=B, num_spec=N, window=man.window, row_bytes=man.row_bytes,
                                  timeout_s=15.0, target_id=tid)
        tshim = thread_shim(f"{name}-thread", head, max_reqs=B, deadline_ms=deadline_ms, target_id=tid, target=model)
        try:
            sources = {"target_only": NoDrafts(N), "ngram": NgramDrafts(N), "proxy": ShimDrafts(shim),
                       "thread": ShimDrafts(tshim), "proxy_full_k": ShimDrafts(shim)}
            policy = {"proxy": min_confidence, "thread": min_confidence}
            runs: dict[str, list[RunStats]] = {a: [] for a in ARMS}
            for rep in range(reps):
                for arm in ARMS:
                    st = SpecEngine(target, sources[arm], max_batch=B, window=man.window,
                                    min_confidence=policy.get(arm, 0.0)).run(reqs)
                    runs[arm].append(st)
                    say(f"rep {rep + 1}/{reps} {arm}: {st.tokens_per_s:.0f} tokens/s, mean accepted "
                        f"{st.mean_accepted:.2f}")
            ref = runs["target_only"][0]
            for arm in ARMS:
                for st in runs[arm][1:] if arm == "target_only" else runs[arm]:
                    shown += mismatches(ref, st, arm)
            lat = _latency(name, read_status)
            ms = {k: round(lat.get(k, {}).get("p50_us", 0.0) / 1000.0, 3) for k in
                  ("worker_us", "rank0_round_us", "rtt_us", "proxy_cost_us")}
            res["head_ms"] = ms["worker_us"]
            res["proxy_round_ms"] = ms["rank0_round_us"]
            # where the engine's round goes (p50s, ms): the worker's own time, the STEP's round trip from
            # the proxy (that time plus the network, the worker's receive and send, and their wake-ups),
            # the proxy's own part of a round, and the proxy's whole round (gathered -> published)
            res["round_parts_ms"] = {"worker": ms["worker_us"], "proxy_worker_rtt": ms["rtt_us"],
                                     "proxy_own": ms["proxy_cost_us"], "proxy_round": ms["rank0_round_us"]}
            med = {a: statistics.median(s.tokens_per_s for s in runs[a]) for a in ARMS}
            pr, ng, fk = runs["proxy"], runs["ngram"], runs["proxy_full_k"]
            acc = sum(s.accepted_by_pos for s in fk) / max(1, sum(s.full_rounds for s in fk))
            acc_ng = sum(s.accepted_by_pos for s in ng) / max(1, sum(s.full_rounds for s in ng))
            res.update({
                "mean_accepted": round(sum(s.full_accepted for s in fk) / max(1, sum(s.full_rounds for s in fk)), 4),
                "mean_accepted_all_rounds": round(sum(s.accepted for s in fk) / max(1, sum(s.wanted_rounds for s in fk)), 4),
                "mean_accepted_ngram": round(sum(s.full_accepted for s in ng) / max(1, sum(s.full_rounds for s in ng)), 4),
                "ngram_drafted_share": round(sum(s.drafted_rounds for s in ng) / max(1, sum(s.wanted_rounds for s in ng)), 4),
                "mean_accepted_policy": round(sum(s.full_accepted for s in pr) / max(1, sum(s.full_rounds for s in pr)), 4),
                "min_confidence": min_confidence,
                "mean_verified_policy": round(float(sum(s.verified_by_pos.sum() for s in pr))
                                              / max(1, sum(s.full_rounds for s in pr)), 4),
                "mean_accepted_carry": None,
                "mean_accepted_thread": round(statistics.median(s.mean_accepted_full for s in runs["thread"]), 4),
                "accept_by_position": [round(float(x), 4) for x in acc],
                "accept_by_position_ngram": [round(float(x), 4) for x in acc_ng],
                "target_forwards_per_token": round(statistics.median(s.request_forwards / s.tokens for s in pr), 4),
                "target_forwards_per_token_ngram": round(statistics.median(s.request_forwards / s.tokens for s in ng), 4),
                "tokens_per_s": {a: round(v, 1) for a, v in med.items()},
                "tokens_per_s_runs": {a: [round(s.tokens_per_s, 1) for s in runs[a]] for a in ARMS},
                "speedup": round(med["proxy"] / med["target_only"], 3),
                "speedup_ngram": round(med["ngram"] / med["target_only"], 3),
                "speedup_thread": round(med["thread"] / med["target_only"], 3),
                "speedup_full_k": round(med["proxy_full_k"] / med["target_only"], 3),
                "target_step_ms": _pct([x for s in runs["target_only"] for x in s.forward_ms], 50),
                "verify_step_ms": _pct([x for s in pr for x in s.forward_ms], 50),
                "round_ms": _pct([x for s in pr for x in s.round_ms], 50),  # the engine thread's: enqueue + wait
                "round_ms_thread": _pct([x for s in runs["thread"] for x in s.round_ms], 50),
                "failed_rounds": sum(s.failed_rounds for s in pr),
                "greedy_distinct_4gram_rate": distinct_4gram_rate(ref.outputs),
                "closest_tie": closest_tie(ref, pr[0]),
            })
            res["mean_accepted_carry"] = _carry_accepted(res["mean_accepted"], model, head, man, target, reqs, B, tid,
                                                         f"{name}-carry", deadline_ms, say, ref, shown)
            if faults:
                res["faults"] = _faults(sysm, target, reqs, ref, ShimDrafts(shim), B, man.window, shown, say)
        finally:
            tshim.close()
            shim.close()
    res["lossless_mismatches"] = len({(m["arm"], m["prompt"]) for m in shown})
    res["mismatches"] = shown[:20]
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    res["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]  # 1-minute, at start and end: speed is noisy
    return res


def _carry_accepted(mean_accepted: float, model: str, head: str, man, target, reqs: list[Request], B: int, tid: str,
                    name: str, deadline_ms: float, say: Callable[[str], None], ref: RunStats,
                    shown: list[dict[str, Any]]) -> float | None:
    """The carry head's (DEFAULT_HEAD's) mean accepted on the same prompts, the yardstick any head is set
    beside: the run's own figure when the head is the carry head; else one full-k pass of the carry head
    through thread mode (the proxy's round loop on a thread, the `torch` drafter in this process: the
    same drafts a worker would send, without a second worker process, so `--quick` stays quick), on
    the same target engine when the carry head taps the same rows (else on one tapping its own); its
    outputs join the lossless check as arm `carry`. None
    when the carry head was made for another target than `model` (it cannot draft for it)."""
    from ..model.head_shapes import load_head_shapes
    from ..model.manifest import HeadManifest
    from .arms import thread_shim

    if os.path.realpath(head) == os.path.realpath(DEFAULT_HEAD):
        return mean_accepted
    carry = load_head_shapes(DEFAULT_HEAD)
    if isinstance(carry, HeadManifest) and carry.target_id and tid and carry.target_id != tid:
        say(f"carry head {DEFAULT_HEAD} was made for another target: no mean_accepted_carry")
        return None
    if (list(carry.tap_layers), carry.row_dtype) != (list(man.tap_layers), man.row_dtype) \
            or carry.num_spec > man.num_spec:  # its own tap, and room for its N drafts past the last token
        target = open_engine(model, DEFAULT_HEAD, max_batch=B, max_len=target.max_len + carry.num_spec)
    shim = thread_shim(name, DEFAULT_HEAD, max_reqs=B, deadline_ms=deadline_ms, target_id=tid)
    try:
        st = SpecEngine(target, ShimDrafts(shim), max_batch=B, window=carry.window).run(reqs)
    finally:
        shim.close()
    shown += mismatches(ref, st, "carry")  # its outputs are held to target-only's as every arm's are
    say(f"carry head (thread mode, full k): mean accepted {st.mean_accepted_full:.2f}")
    return round(st.full_accepted / max(1, st.full_rounds), 4)


def _faults(sysm, target, reqs: list[Request], ref: RunStats, src: ShimDrafts, B: int, W: int,
            shown: list[dict[str, Any]], say: Callable[[str], None]) -> dict[str, Any]:
    """Each fault during one generation of the prompts (repeated until it lasts long enough)."""
    long = [Request(k * len(reqs) + r.rid, r.prompt, r.max_new) for k in range(200) for r in reqs]  # ended by `stop`
    want = RunStats(outputs={r.rid: ref.outputs[r.rid % len(reqs)] for r in long},
                    margins={r.rid: ref.margins[r.rid % len(reqs)] for r in long})
    out = {}
    for kind, act in (("worker_stall", lambda: sysm.stall_worker(1.5)), ("worker_kill", sysm.kill_worker),
                      ("proxy_kill", sysm.kill_proxy)):
        when: list[float] = []
        errors: list[str] = []

        def inject(act=act, when=when, errors=errors) -> None:
            time.sleep(1.0)
            when.append(time.perf_counter())
            try:
                act()
            except Exception as e:  # noqa: BLE001 - reported in the result, the run goes on
                errors.append(f"{type(e).__name__}: {e}")
                return
            when.append(time.perf_counter())

        def stop(st: RunStats, when=when) -> bool:
            """Once the fault is over: after 2 s of good rounds again, or 15 s."""
            now = time.perf_counter()
            if len(when) < 2:
                return now > st.started + 60.0  # the fault never completed (its thread failed): give up
            failed = [t for t, _, f in st.timeline if f and t >= when[0]]
            return now > when[1] + 15.0 or (bool(failed) and now > max(failed[-1], when[1]) + 2.0) \
                or (not failed and now > when[1] + 2.0)

        th = threading.Thread(target=inject, name=f"eval-{kind}", daemon=True)
        th.start()
        st = SpecEngine(target, src, max_batch=B, window=W).run(long, stop=stop)
        th.join(60.0)
        bad = mismatches(want, st, kind, finished_only=True)
        shown += bad
        w = fault_window(st, when[0], when[1]) if len(when) == 2 else \
            {"error": errors[0] if errors else "fault not injected before the end"}
        out[kind] = {**w, "mismatches": len(bad), "prompts_checked": len(st.outputs),
                     "tokens_per_s": round(st.tokens_per_s, 1),
                     "mean_accepted": round(st.mean_accepted_full, 3)}
        say(f"fault {kind}: {out[kind]}")
    return out
