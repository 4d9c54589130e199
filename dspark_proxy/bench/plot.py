"""--plot out.png: latency distributions (matplotlib, an optional extra: `pip install dspark-proxy[plot]`).

Panels: the hand-off against its baselines (CDF, one panel per placement), the engine's wait in
process and thread mode under GIL load (CDF), and the proxy's cost against n (scaling, p50).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .measure import Samples

__all__ = ["plot", "PlotUnavailable"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _cdf(ax: Any, a: np.ndarray, label: str) -> None:
    x = np.sort(a.astype(np.float64) / 1e3)
    y = np.arange(1, x.size + 1) / x.size
    ax.plot(x, y, label=label, linewidth=1.2)


def plot(results: dict[str, Any], samples: Samples, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'dspark-proxy[plot]'") from e
    by = samples.by_label
    places = sorted({k.split("/")[1] for k in by if k.startswith("handoff/")})
    panels: list[tuple[str, Any]] = [("handoff", p) for p in places]
    if any(k.startswith("gil/") for k in by):
        panels.append(("gil", None))
    if "scaling" in results:
        panels.append(("scaling", None))
    if not panels:
        raise ValueError("nothing to plot: run the handoff, gil or scaling section")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    for ax, (kind, arg) in zip(axes[:, 0], panels, strict=True):
        if kind == "handoff":
            for k in ("handoff", "bare_handoff", "futex_adaptive", "futex_sleep", "pipe", "tcp"):
                a = by.get(f"handoff/{arg}/{k}")
                if a is not None and a.size:
                    _cdf(ax, a, k)
            ax.set_title(f"hand-off vs baselines ({arg})")
        elif kind == "gil":
            for k in sorted(k for k in by if k.startswith("gil/")):
                _cdf(ax, by[k], k[4:].replace("/engine_wait", ""))
            ax.set_title("engine wait in read_reply under GIL load")
        else:
            groups: dict[str, list[tuple[int, float]]] = {}
            for c in results["scaling"]["cases"]:
                groups.setdefault(f"W={c['W']} {c['mix']}", []).append((c["n"], c["proxy_cost"]["p50_us"]))
            for label, pts in groups.items():
                xs, ys = zip(*sorted(pts), strict=True)
                ax.plot(xs, ys, marker="o", label=label)
            ax.set_xscale("log")
            ax.set_xlabel("requests per round (n)")
            ax.set_ylabel("proxy cost p50 (us)")
            ax.set_title("proxy cost per round")
            ax.legend(fontsize=7)
            ax.grid(True, alpha=0.3)
            continue
        ax.set_xscale("log")
        ax.set_xlabel("us")
        ax.set_ylabel("fraction of rounds")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
