"""`--plot DIR` for `bench`, `eval` and `chaos`: where the PNGs go and the matplotlib they need.

matplotlib is an optional extra (`pip install 'dspark-proxy[plot]'`; scripts/setup.sh installs it), so
each command checks for it before it measures anything (deps.py: one line, exit code 5) and imports it
only here, with the file-only Agg backend (no display on a server). Each figure is its own PNG, named
after what it shows (docs/performance.md lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["PNG_MAGIC", "LEGACY_SUFFIX", "out_dir", "plot_target", "pyplot", "save"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LEGACY_SUFFIX = ".png"  # `bench --plot FILE.png`: the one combined figure of before --plot DIR (deprecated)


def out_dir(value: str) -> Path:
    """The directory `--plot` names, created (with its parents) if missing; a file there is an error."""
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--plot {value}: exists and is not a directory")
    p.mkdir(parents=True, exist_ok=True)
    return p


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path | str, dpi: int = 90, tight: bool = True) -> str:
    """Write `fig` as a PNG and close it (figures are kept small: docs/img/ holds a few). `tight=False`
    for a grid laid out by hand: tight_layout over 20 panels took 6.6 s on a loaded 2-core machine."""
    plt = pyplot()
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, pil_kwargs={"optimize": True})
    plt.close(fig)
    return str(path)


def plot_target(command: str, value: str | None, *, legacy_png: bool = False) -> tuple[Path | None, str | None]:
    """Check `--plot VALUE` before the command measures anything: (directory, None), or (None, FILE) for
    `bench --plot FILE.png`, today's single combined file (deprecated: one warning line on stderr).

    Raises deps.MissingDependency without matplotlib, ValueError for a path that cannot be used; the
    command turns either into one line and its exit code."""
    from .ops.deps import require

    if not value:
        return None, None
    require("matplotlib", extra="plot", what="--plot")
    if value.endswith(LEGACY_SUFFIX) and not Path(value).is_dir():
        if not legacy_png:
            raise ValueError(f"--plot {value}: give a directory (one PNG per figure is written there)")
        print(f"dspark-proxy {command}: --plot FILE.png is deprecated: give a directory (--plot DIR writes "
              f"one PNG per figure); writing the combined figure to {value}", file=sys.stderr)
        return None, value
    return out_dir(value), None
