"""The `serve` section's arithmetic: one `vllm bench serve` result file -> one run's figures, three runs ->
a cell's medians, every arm's texts -> the outputs that differ from the `nospec` arm's, and vLLM's
`/metrics` text -> its speculative-decoding counters (mean accepted per draft). Kept apart from the
orchestration (serve.py) so a recorded result checks it without a server (tests/test_bench_serve.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CELL_KEYS", "run_figures", "cell_medians", "mismatches", "spec_counters", "mean_accepted", "serve_targets",
           "format_serve"]

# the figures of one arm at one concurrency (docs/performance.md, "Serving under load")
CELL_KEYS = ("tokens_per_s", "ttft_ms_p50", "itl_ms_p50", "itl_ms_p99")
_FROM_VLLM = {"tokens_per_s": "output_throughput", "ttft_ms_p50": "median_ttft_ms",
              "itl_ms_p50": "median_itl_ms", "itl_ms_p99": "p99_itl_ms"}
_COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
             "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "accepted"}


def run_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    """One run's figures from `vllm bench serve --save-result --save-detailed`'s JSON; ValueError naming
    the field when one is missing (a failed run leaves them out) or a request failed."""
    out: dict[str, Any] = {}
    for key, src in _FROM_VLLM.items():
        if src not in result:
            raise ValueError(f"vllm bench serve result: no field {src!r} (percentiles need --percentile-metrics "
                             "ttft,itl and --metric-percentiles 50,99)")
        out[key] = float(result[src])
    failed = int(result.get("failed", 0))
    if failed:
        raise ValueError(f"vllm bench serve result: {failed} request(s) failed: {result.get('errors', [])[:2]}")
    out["texts"] = list(result.get("generated_texts", []))
    out["output_tokens"] = int(result.get("total_output_tokens", 0))
    return out


def cell_medians(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A cell: the median of its runs for every figure (rounded), how many runs it has, and each run's
    tokens/s in order (the first run of a proxy arm includes its gate's learning where drafting does
    not pay)."""
    if not runs:
        raise ValueError("a cell needs at least one run")
    cell: dict[str, Any] = {k: round(statistics.median(float(r[k]) for r in runs), 2) for k in CELL_KEYS}
    acc = [r["accepted_mean"] for r in runs if r.get("accepted_mean") is not None]
    if acc:
        cell["accepted_mean"] = round(statistics.median(acc), 3)
    cell["runs"] = len(runs)
    cell["tokens_per_s_runs"] = [round(float(r["tokens_per_s"]), 2) for r in runs]  # in run order: a gate's learning shows
    return cell


def mismatches(texts: Mapping[str, Sequence[Sequence[str]]], base: str = "nospec") -> dict[str, int]:
    """Per arm, the outputs (request by request, run by run) that differ from the `base` arm's first run's
    output for the same request: greedy decoding is deterministic, so any difference is a lost token."""
    ref = texts[base][0] if texts.get(base) else []
    out: dict[str, int] = {}
    for arm, runs in texts.items():
        n = 0
        for run in runs:
            n += sum(1 for i, t in enumerate(run) if i >= len(ref) or t != ref[i])
            n += max(len(ref) - len(run), 0)
        out[arm] = n
    return out


def spec_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from its Prometheus `/metrics` text (summed over label sets);
    zeros when the server does not speculate."""
    got = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _COUNTERS:
            try:
                got[_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return got


def mean_accepted(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Drafts accepted per drafting step between two reads of the counters; None without a draft."""
    drafts = after["drafts"] - before["drafts"]
    return None if drafts <= 0 else round((after["accepted"] - before["accepted"]) / drafts, 3)


def serve_targets(res: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The goals for a head arm (docs/performance.md, "Serving under load"): >= 2.5x no speculation at c=1, >= 1.5x at
    c=8, ahead of vLLM's n-gram and never slower than no speculation at every concurrency, no output lost."""
    sp = res.get("speedup_vs_nospec") or {}
    heads = [a for a in sp if a != "ngram"]
    out = [{"goal": "serve: outputs identical to no speculation", "measured": str(res.get("lossless_mismatches")),
            "met": res.get("lossless_mismatches") == 0}]
    for h in heads:
        s = sp[h]
        ng = sp.get("ngram", {})
        for goal, c, want in (("serve: %s >= 2.5x no speculation at c=1", "c1", 2.5),
                              ("serve: %s >= 1.5x no speculation at c=8", "c8", 1.5)):
            if c in s:
                out.append({"goal": goal % h, "measured": f"{s[c]}x", "met": s[c] >= want})
        out.append({"goal": f"serve: {h} never slower than no speculation",
                    "measured": ", ".join(f"{c} {v}x" for c, v in s.items()), "met": all(v >= 1.0 for v in s.values())})
        if ng:
            out.append({"goal": f"serve: {h} ahead of vLLM's n-gram at every concurrency",
                        "measured": ", ".join(f"{c} {s[c]}x vs {ng[c]}x" for c in s if c in ng),
                        "met": all(s[c] > ng[c] for c in s if c in ng)})
    return out


def format_serve(res: Mapping[str, Any]) -> list[str]:
    """The section as a table: one line per arm and concurrency."""
    pl = res.get("placement", {})
    lines = [f"SERVE  vllm bench serve, {res.get('prompts')} held-out prompts x {res.get('output_tokens')} tokens, "
             f"greedy, median of {res.get('reps')} interleaved runs; vLLM on CPUs {pl.get('vllm_cpus')}, proxy, "
             f"worker and client on {pl.get('proxy_worker_client_cpus')}",
             f"  {'arm':<22}{'c':>3}{'tok/s':>9}{'x nospec':>9}{'TTFT p50':>10}{'ITL p50':>9}{'ITL p99':>9}"
             f"{'accepted':>9}"]
    sp = res.get("speedup_vs_nospec", {})
    for arm, cells in res.items():
        if arm in ("placement", "sampled", "speedup_vs_nospec", "mismatches_by_arm", "proxies") or \
                not isinstance(cells, dict):
            continue
        for c, cell in cells.items():
            acc = cell.get("accepted_mean")
            lines.append(f"  {arm:<22}{c[1:]:>3}{cell['tokens_per_s']:>9.1f}{sp.get(arm, {}).get(c, 1.0):>9.2f}"
                         f"{cell['ttft_ms_p50']:>10.1f}{cell['itl_ms_p50']:>9.2f}{cell['itl_ms_p99']:>9.2f}"
                         f"{'' if acc is None else f'{acc:.2f}':>9}")
    for arm, by_t in (res.get("sampled") or {}).items():
        lines.append(f"  sampled, {arm}: mean accepted " + ", ".join(
            f"T={t[1:]} {v.get('accepted_mean')}" + (f" ({v['tokens_per_s']} tok/s)" if 'tokens_per_s' in v else '')
            for t, v in by_t.items()))
    for arm, px in (res.get("proxies") or {}).items():
        g = px.get("gate", {})
        lines.append(f"  proxy, {arm}: {px.get('rounds')} rounds, {px.get('rounds_failed')} target-only "
                     f"{px.get('fallbacks') or ''}; gate: paused {g.get('batch_tps_paused', 0)}x by tokens/s, "
                     f"{g.get('batch_paused', 0)}x by acceptance, {g.get('batch_tps_resumed', 0)} resumed, "
                     f"{px.get('rounds_published_first', 0)} rounds published before their STEP, "
                     f"{px.get('rounds_answered_by_engine', 0)} answered by the engine while paused "
                     f"({px.get('paused_rows_overtaken', 0)} overtaken)")
    lines.append(f"  outputs differing from no speculation: {res.get('lossless_mismatches')}")
    return lines
