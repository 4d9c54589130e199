"""`eval --plot DIR` (and `bench --sections eval --plot DIR`): what the drafts earn, as pictures.

Reads only the eval report's JSON fields (spec/evaluate.py), so it needs matplotlib and not torch:
`eval_acceptance.png`, acceptance by draft position per drafter (the head behind the proxy, prompt
lookup), and `eval_tokens_per_s.png`, tokens/s per arm (the median of the interleaved repetitions,
each repetition a dot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plotting import pyplot, save

__all__ = ["plot_eval"]

ARM_LABELS = {"target_only": "target only", "ngram": "n-gram", "proxy": "head, proxy", "thread": "head, thread mode",
              "proxy_full_k": "head, every draft"}


def _acceptance(plt: Any, r: dict[str, Any], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for key, label in (("accept_by_position", "DSpark head (proxy)"), ("accept_by_position_ngram", "n-gram")):
        ys = r.get(key) or []
        if ys:
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{label}: {sum(ys):.2f} of {len(ys)} a round")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted (fraction of full rounds)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(range(1, int(r.get("num_spec") or 1) + 1))
    ax.set_title(f"acceptance by position: {r.get('prompts')} held-out prompts x {r.get('max_new')} tokens", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return save(fig, path)


def _tokens_per_s(plt: Any, r: dict[str, Any], path: Path) -> str:
    med: dict[str, float] = r.get("tokens_per_s") or {}
    runs: dict[str, list[float]] = r.get("tokens_per_s_runs") or {}
    arms = [a for a in ARM_LABELS if a in med] + [a for a in med if a not in ARM_LABELS]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    base = med.get("target_only") or 0.0
    ax.bar(range(len(arms)), [med[a] for a in arms], color="#8fb3d9")
    for i, a in enumerate(arms):
        ax.plot([i] * len(runs.get(a, [])), runs.get(a, []), "k.", markersize=4)
    labels = [ARM_LABELS.get(a, a) + (f"\n{med[a] / base:.2f}x" if base else "") for a in arms]
    ax.set_xticks(range(len(arms)), labels, fontsize=7)
    ax.set_ylabel("tokens/s (median; dots: each repetition)")
    ax.set_title(f"tokens/s per arm, batch {r.get('max_batch')} (speed-up over target only)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    return save(fig, path)


def plot_eval(r: dict[str, Any], out: Path) -> list[str]:
    """The eval figures in `out` (which exists); the paths written."""
    plt = pyplot()
    written = []
    if r.get("accept_by_position"):
        written.append(_acceptance(plt, r, out / "eval_acceptance.png"))
    if r.get("tokens_per_s"):
        written.append(_tokens_per_s(plt, r, out / "eval_tokens_per_s.png"))
    return written
