"""The order the fault kinds (kinds.py) are injected in.

A campaign runs passes; each pass injects every kind once, in a seeded random order, so a short run
covers every kind and a long one repeats each many times, interleaved differently each pass.
"""

from __future__ import annotations

import random

from .kinds import FAULT_KINDS, KIND_NAMES, FaultKind

__all__ = ["FaultKind", "FAULT_KINDS", "KIND_NAMES", "pass_order"]


def pass_order(kinds: tuple[str, ...], rng: random.Random) -> list[str]:
    """One pass: every kind once, shuffled by the campaign's seeded generator."""
    order = list(kinds)
    rng.shuffle(order)
    return order
