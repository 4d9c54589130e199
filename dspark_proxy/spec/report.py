"""`dspark-proxy eval`'s text report (also the `eval` section of `bench`)."""

from __future__ import annotations

__all__ = ["format_eval"]


def _f2(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def format_eval(r: dict) -> str:
    tps = r["tokens_per_s"]
    lines = [
        f"{r['prompts']} held-out prompts x {r['max_new']} tokens, batch {r['max_batch']}, N={r['num_spec']}, "
        f"{r['reps']} interleaved repetitions (medians), {r['elapsed_s']} s (load average {r.get('load_avg')})",
        f"head               {r.get('head')} (the worker's {r.get('drafter')} drafter)",
        f"mean accepted      {r['mean_accepted']:.2f} of {r['num_spec']} (n-gram {r['mean_accepted_ngram']:.2f}, carry head "
        f"{_f2(r.get('mean_accepted_carry'))}); by position "
        f"{r['accept_by_position']} (n-gram {r['accept_by_position_ngram']}); all rounds {r['mean_accepted_all_rounds']:.2f}",
        f"draft length       verify while confidence >= {r['min_confidence']}: {r['mean_verified_policy']:.2f} "
        f"verified, {r['mean_accepted_policy']:.2f} accepted a full round",
        f"target forwards    {r['target_forwards_per_token']} per token (n-gram {r['target_forwards_per_token_ngram']})",
        f"tokens/s           target-only {tps['target_only']}, n-gram {tps['ngram']}, proxy {tps['proxy']}, "
        f"thread mode {tps['thread']}, every draft {tps['proxy_full_k']}",
        f"speed-up           {r['speedup']}x (n-gram {r['speedup_ngram']}x, thread mode {r['speedup_thread']}x, every draft {r['speedup_full_k']}x)",
        f"per step (p50, ms) target step {r['target_step_ms']}, verification {r['verify_step_ms']}, head "
        f"{r['head_ms']}, round {r['round_ms']} (thread mode {r['round_ms_thread']})",
        *([f"the round (p50, ms) at the engine {r['round_ms']}: proxy {p['proxy_round']} (its own part {p['proxy_own']}, "
           f"the STEP's round trip {p['proxy_worker_rtt']} of which the worker's own {p['worker']})"]
          if (p := r.get("round_parts_ms")) else []),
        f"greedy distinct-4-gram rate {r['greedy_distinct_4gram_rate']}",
        f"lossless mismatches {r['lossless_mismatches']} (closest near-tie of target-only: {r.get('closest_tie')})",
    ]
    for m in r.get("mismatches", []):
        lines.append(f"  MISMATCH {m}")
    for kind, f in r.get("faults", {}).items():
        lines.append(f"fault {kind:13s} output mismatches {f.get('mismatches')} of {f.get('prompts_checked')}; "
                     f"tokens/s before {f.get('tokens_per_s_before')}, during {f.get('tokens_per_s_during')} "
                     f"({f.get('failed_rounds')} failed rounds), after {f.get('tokens_per_s_after')} "
                     f"(good again {f.get('recovered_s_after_fault')} s after the fault)")
    return "\n".join(lines)
