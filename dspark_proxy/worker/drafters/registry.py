"""The drafters, in one table (docs/design.md, "The worker"): --drafter's choices and help, and how
`make_drafter` builds the chosen one from the worker's settings.

The `torch` and `dspark` drafters' modules are imported only when chosen, so the worker's default start
path (the `integrity` drafter) never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Drafter
from .integrity import IntegrityDrafter

__all__ = ["DRAFTERS", "DRAFTER_NAMES", "DrafterEntry", "make_drafter"]


def _make_integrity(*, num_spec: int, window: int, **_: object) -> Drafter:
    return IntegrityDrafter(num_spec, window)


def _make_torch(*, device: str = "cpu", head: str | None = None, target: str | None = None, row_dtype: str = "",
                gpu_memory_budget_mb: int = 0, max_reqs: int = 0, **kw: object) -> Drafter:
    from .torch_head import TorchDrafter  # lazy: torch only when this drafter is chosen

    return TorchDrafter(device="cpu" if device in ("", "auto") else device, **kw)


def _make_dspark(*, weights: str | None = None, head: str | None = None, seed: int = 0, **kw: object) -> Drafter:
    from .dspark import DSparkDrafter  # lazy: torch only when this drafter is chosen

    return DSparkDrafter(head=head or weights, **kw)


@dataclass(frozen=True)
class DrafterEntry:
    """One drafter: what it is (the --drafter help) and how to make it from the worker's settings
    (num_spec, window, row_bytes, device, weights, seed as keywords; it takes what it needs)."""

    what: str
    make: Callable[..., Drafter]


# The drafters, in one table: --drafter's choices and help, make_drafter and the worker read it.
DRAFTERS: dict[str, DrafterEntry] = {
    "integrity": DrafterEntry("the test oracle", _make_integrity),
    "torch": DrafterEntry("our carry head, from train-drafter's manifest", _make_torch),
    "dspark": DrafterEntry("a speculators DSpark checkpoint, --head DIR", _make_dspark),
}
DRAFTER_NAMES: tuple[str, ...] = tuple(DRAFTERS)


def make_drafter(name: str, *, num_spec: int, window: int, row_bytes: int, device: str = "cpu",
                 weights: str | None = None, seed: int = 0, **extra: object) -> Drafter:
    """extra: the settings only some drafters read (the dspark drafter's head, target, row_dtype,
    gpu_memory_budget_mb, max_reqs); each drafter's maker takes what it needs."""
    entry = DRAFTERS.get(name)
    if entry is None:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    return entry.make(num_spec=num_spec, window=window, row_bytes=row_bytes, device=device, weights=weights,
                      seed=seed, **extra)
