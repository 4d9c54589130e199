"""`bench --plot DIR`: latency distributions (matplotlib, the `plot` extra; dspark_proxy/plotting.py).

Files in DIR: `bench_handoff.png` (the hand-off against its baselines, CDF, one panel per placement),
`bench_gil.png` (the engine's wait in process and thread mode under GIL load, CDF),
`bench_scaling.png` (the proxy's cost against n, p50) and, with the eval section,
`eval_tokens_per_s.png` and `eval_acceptance.png` (spec/plot.py): each only when its section ran.
`--plot FILE.png` (deprecated) draws the first three as panels of one file, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..plotting import pyplot, save
from .measure import Samples

__all__ = ["plot", "plot_dir", "PlotUnavailable"]

HANDOFF_KINDS = ("handoff", "bare_handoff", "futex_adaptive", "futex_sleep", "pipe", "tcp")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        return pyplot()
    except ImportError as e:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'dspark-proxy[plot]'") from e


def _cdf(ax: Any, a: np.ndarray, label: str) -> None:
    x = np.sort(a.astype(np.float64) / 1e3)
    y = np.arange(1, x.size + 1) / x.size
    ax.plot(x, y, label=label, linewidth=1.2)


def _cdf_axes(ax: Any, title: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("us")
    ax.set_ylabel("fraction of rounds")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _draw_handoff(ax: Any, by: dict[str, np.ndarray], place: str) -> None:
    for k in HANDOFF_KINDS:
        a = by.get(f"handoff/{place}/{k}")
        if a is not None and a.size:
            _cdf(ax, a, k)
    _cdf_axes(ax, f"hand-off vs baselines ({place})")


def _draw_gil(ax: Any, by: dict[str, np.ndarray]) -> None:
    for k in sorted(k for k in by if k.startswith("gil/")):
        _cdf(ax, by[k], k[4:].replace("/engine_wait", ""))
    _cdf_axes(ax, "engine wait in read_reply under GIL load")


def _draw_scaling(ax: Any, results: dict[str, Any]) -> None:
    groups: dict[str, list[tuple[int, float]]] = {}
    for c in results["scaling"]["cases"]:
        groups.setdefault(f"W={c['W']} {c['mix']}", []).append((c["n"], c["proxy_cost"]["p50_us"]))
    for label, pts in groups.items():
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("requests per round (n)")
    ax.set_ylabel("proxy cost p50 (us)")
    ax.set_title("proxy cost per round", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def _places(by: dict[str, np.ndarray]) -> list[str]:
    return sorted({k.split("/")[1] for k in by if k.startswith("handoff/")})


def plot(results: dict[str, Any], samples: Samples, path: str) -> str:
    """The deprecated single file (`--plot FILE.png`): every latency panel stacked in one figure."""
    plt = _pyplot()
    by = samples.by_label
    panels: list[tuple[str, Any]] = [("handoff", p) for p in _places(by)]
    if any(k.startswith("gil/") for k in by):
        panels.append(("gil", None))
    if "scaling" in results:
        panels.append(("scaling", None))
    if not panels:
        raise ValueError("nothing to plot: run the handoff, gil or scaling section")
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    for ax, (kind, arg) in zip(axes[:, 0], panels, strict=True):
        if kind == "handoff":
            _draw_handoff(ax, by, arg)
        elif kind == "gil":
            _draw_gil(ax, by)
        else:
            _draw_scaling(ax, results)
    return save(fig, path, dpi=110)


def plot_dir(results: dict[str, Any], samples: Samples, out: Path) -> list[str]:
    """One PNG per figure in `out` (which exists), for the sections that ran; the paths written."""
    plt = _pyplot()
    by = samples.by_label
    written: list[str] = []
    places = _places(by)
    if places:
        fig, axes = plt.subplots(1, len(places), figsize=(4.2 * len(places), 3.4), squeeze=False)
        for ax, place in zip(axes[0], places, strict=True):
            _draw_handoff(ax, by, place)
        written.append(save(fig, out / "bench_handoff.png"))
    if any(k.startswith("gil/") for k in by):
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        _draw_gil(ax, by)
        written.append(save(fig, out / "bench_gil.png"))
    if "scaling" in results:
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        _draw_scaling(ax, results)
        written.append(save(fig, out / "bench_scaling.png"))
    if isinstance(results.get("eval"), dict):
        from ..spec.plot import plot_eval

        written += plot_eval(results["eval"], out)
    return written
