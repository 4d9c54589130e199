"""Sampled requests through a vLLM arm (vllm_arm's `sampled` and `draws` spec keys; docs/vllm.md,
"Sampled requests").

- `accepted_at`: the prompts generated at each temperature, and the drafts vLLM accepted per drafting
  step, counted twice: from vLLM's own speculative-decoding counters (`LLM.get_metrics`, what a
  server's /metrics gives) and, for our proposer, from what it saw vLLM keep (`mean_accepted`).
- `draws`: one prompt generated `n` times at one temperature, each with its own seed, a few tokens
  each: the empirical next-tokens distribution that tests/test_vllm_sampled.py compares between
  arms by chi-square.
"""

from __future__ import annotations

from typing import Any

__all__ = ["accepted_at", "draws", "spec_counts"]

_NAMES = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_accepted_tokens": "accepted",
          "vllm:spec_decode_num_draft_tokens": "draft_tokens"}


def spec_counts(llm: Any) -> dict[str, float]:
    """vLLM's speculative-decoding counters now (zeros without speculation or without stats)."""
    got = dict.fromkeys(_NAMES.values(), 0.0)
    try:
        metrics = llm.get_metrics()
    except (AssertionError, AttributeError, RuntimeError):  # log stats off
        return got
    for m in metrics:
        key = _NAMES.get(getattr(m, "name", ""))
        if key is not None and hasattr(m, "value"):
            got[key] += float(m.value)
    return got


def accepted_at(llm: Any, drafter: Any, prompts: list[str], max_tokens: int, temperatures: list[float],
                seed: int = 0) -> dict[str, Any]:
    """{"tT": {...}} per temperature: vLLM's accepted per drafting step (`accepted_mean`), its drafts,
    accepted tokens and drafted tokens, and our proposer's own count when it is ours. Request i of
    temperature T has seed `seed + i` (None at T = 0)."""
    from vllm import SamplingParams

    out: dict[str, Any] = {}
    for t in temperatures:
        params = [SamplingParams(temperature=t, max_tokens=max_tokens, ignore_eos=True,
                                 seed=None if t == 0 else seed + i) for i in range(len(prompts))]
        before = spec_counts(llm)
        v0, a0 = _ours(drafter)
        llm.generate(prompts, params, use_tqdm=False)
        after = spec_counts(llm)
        v1, a1 = _ours(drafter)
        d = {k: after[k] - before[k] for k in after}
        cell: dict[str, Any] = {"accepted_mean": round(d["accepted"] / d["drafts"], 3) if d["drafts"] else None,
                                "drafts": int(d["drafts"]), "accepted": int(d["accepted"]),
                                "draft_tokens": int(d["draft_tokens"])}
        if v0 is not None:
            cell["proposer_accepted_mean"] = round((a1 - a0) / (v1 - v0), 3) if v1 > v0 else None
        out[f"t{t}"] = cell
    return out


def _ours(drafter: Any) -> tuple[int | None, int]:
    if drafter is None or not hasattr(drafter, "verified_rounds"):
        return None, 0
    return int(drafter.verified_rounds), int(drafter.accepted)


def draws(llm: Any, prompt: str, n: int, tokens: int, temperature: float, seed: int = 1,
          greedy: list[str] | None = None, greedy_tokens: int = 16) -> tuple[list[list[int]], list[list[int]]]:
    """`n` generations of `tokens` tokens of one prompt, generation i with seed `seed + i`, and in the
    same batches the `greedy` prompts at temperature 0 (a mixed batch): (the draws, the greedy outputs)."""
    from vllm import SamplingParams

    greedy = list(greedy or [])
    params = [SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True, seed=seed + i)
              for i in range(n)]
    params[:0] = [SamplingParams(temperature=0.0, max_tokens=greedy_tokens, ignore_eos=True) for _ in greedy]
    res = llm.generate(greedy + [prompt] * n, params, use_tqdm=False)
    out = [list(r.outputs[0].token_ids) for r in res]
    return out[len(greedy):], out[:len(greedy)]
