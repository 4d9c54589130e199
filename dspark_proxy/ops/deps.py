"""Optional dependencies: checked before a command starts anything, so that a missing one is one clear
line and EXIT_MISSING_DEPENDENCY, not a traceback from deep inside (or a proxy that half started).

Each check names what needs the package, the package and the extra that installs it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["MissingDependency", "require", "proxy_needs", "worker_needs"]


class MissingDependency(RuntimeError):
    """An optional package a chosen feature needs is not installed; the message says how to get it."""


def require(module: str, *, extra: str, what: str) -> None:
    """MissingDependency unless `module` can be imported (found, not imported: checking stays cheap)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a None left in sys.modules
        found = False
    if not found:
        raise MissingDependency(f"{what} needs the Python package {module!r}, which is not installed: "
                                f"pip install 'dspark-proxy[{extra}]' (or {module}) into this environment")


def proxy_needs(cfg: Any) -> None:
    """`dspark-proxy start` (and thread mode): what the chosen settings need."""
    if getattr(cfg, "metrics_port", None) is not None:
        require("prometheus_client", extra="metrics", what="--metrics-port (the Prometheus endpoint)")


def worker_needs(cfg: Any) -> None:
    """`dspark-proxy worker`: what the chosen drafter needs."""
    if getattr(cfg, "metrics_port", None) is not None:
        require("prometheus_client", extra="metrics", what="--metrics-port (the worker's Prometheus endpoint)")
    if getattr(cfg, "drafter", None) == "torch":
        require("torch", extra="torch", what="--drafter torch")
        if getattr(cfg, "head", None):
            require("safetensors", extra="model", what="--drafter torch --head (a saved head)")
    if getattr(cfg, "drafter", None) == "dspark":
        require("torch", extra="torch", what="--drafter dspark")
        require("safetensors", extra="model", what="--drafter dspark (a speculators checkpoint)")
        require("transformers", extra="model", what="--drafter dspark (its rotary embedding)")
