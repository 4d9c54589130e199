"""`chaos --plot DIR`: the engine's wait over time through each fault (matplotlib, the `plot` extra).

`chaos_wait.png` has one panel per fault kind: every injection of that kind overlaid, each round's wait
inside `read_reply` (ms, log scale) against the time since its injection began, the fault's span shaded
(from the start to where the injector cleared it, first injection) and the deadline as a line. The
guarantee it shows (docs/guarantees.md): no dot above the deadline plus the margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..plotting import pyplot, save
from .controller import Injection

__all__ = ["plot_chaos"]

FLOOR_MS = 1e-3  # a wait shorter than 1 us is drawn at 1 us (log scale)


def plot_chaos(reply_end_ns: Sequence[int], wait_ns: Sequence[int], injections: Sequence[Injection],
               deadline_ms: float, margin_ms: float, out: Path) -> list[str]:
    """Write `chaos_wait.png` to `out` (which exists) from the engine's per-round record; the paths
    written (none when no injection has rounds)."""
    end = np.asarray(reply_end_ns, dtype=np.int64)
    wait = np.maximum(np.asarray(wait_ns, dtype=np.float64) / 1e6, FLOOR_MS)
    by_kind: dict[str, list[Injection]] = {}
    for inj in injections:
        if 0 <= inj.idx_start < inj.idx_end <= end.size:
            by_kind.setdefault(inj.kind, []).append(inj)
    if not by_kind:
        return []
    plt = pyplot()
    cols = min(4, len(by_kind))
    rows = math.ceil(len(by_kind) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.1 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(by_kind):]:
        ax.set_visible(False)
    for ax, (kind, injs) in zip(axes.flat, by_kind.items(), strict=False):
        for j, inj in enumerate(injs):
            t0 = end[inj.idx_start]
            xs = (end[inj.idx_start:inj.idx_end] - t0) / 1e9
            ax.plot(xs, wait[inj.idx_start:inj.idx_end], ".", markersize=1.2)  # opaque: fewer colours, a smaller PNG
            if j == 0 and inj.idx_start < inj.idx_clear <= inj.idx_end:
                ax.axvspan(0, (end[inj.idx_clear - 1] - t0) / 1e9, color="#f4c7c3", alpha=0.5, lw=0)
        ax.axhline(deadline_ms, color="k", lw=0.8, ls="--")
        ax.axhline(deadline_ms + margin_ms, color="r", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_ylim(FLOOR_MS * 0.8, (deadline_ms + margin_ms) * 2)
        ax.set_yticks([1e-3, 1e-2, 1e-1, 1, 10, 100], ["0.001", "0.01", "0.1", "1", "10", "100"])  # no mathtext
        ax.minorticks_off()  # a log axis's minor ticks were most of the drawing time (20 panels: ~10 s loaded)
        ax.set_title(f"{kind} (x{len(injs)})", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("wait (ms)", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("s since injection", fontsize=7)
    h = fig.get_figheight()  # inches: the margins below are fixed in inches, whatever the rows
    fig.suptitle(f"engine wait in read_reply through each fault\n(deadline {deadline_ms:g} ms dashed, "
                 f"+ margin dotted; fault span shaded)", fontsize=9, y=1 - 0.05 / h, va="top")
    fig.subplots_adjust(left=0.6 / fig.get_figwidth(), right=0.99, bottom=0.5 / h, top=1 - 0.75 / h,
                        wspace=0.15, hspace=0.45)
    return [save(fig, out / "chaos_wait.png", dpi=72, tight=False)]
