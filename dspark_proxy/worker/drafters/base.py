"""What every drafter shares (docs/design.md, "The worker"): the request it drafts for (`DraftItem`), the
interface it implements (`Drafter`), and the helpers more than one drafter uses.

A drafter gets the batch's usable requests that asked for drafts (`DraftItem`s, each with its window
as at most two contiguous row segments in position order) and writes drafts, confidences and the
optional sections straight into the REPLY being built. Nothing here imports torch: the worker's default
start path (the `integrity` drafter) never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ...wire import ReplyWriter

__all__ = ["DraftItem", "Drafter", "drafter_slot_bytes", "project_at", "seeded_uniform"]


@dataclass
class DraftItem:
    """One request to draft for: its index in the batch, anchor, window and output cut."""

    index: int
    anchor_token: int
    anchor_pos: int
    w: int
    n_out: int
    segments: list[np.ndarray]  # uint8 [*, row_bytes] views, positions anchor_pos-w .. anchor_pos-1
    seed: int = 0
    temperature: float = 0.0
    crc: int | None = None  # the integrity hash, when the worker assembled it from its CRC chains
    aux: np.ndarray | None = None  # the slot's ring of the rows' transforms (SlotWindow.aux, [W, width] at
    # position % W), given when every row of the window has its transform there (a `project_rows` drafter)


class Drafter(Protocol):
    """A drafter. One that keeps state per slot (transforms of the rows, keys and values) says what a
    slot holds for it with `slot_bytes(window, row_bytes) -> int`, its rows included, so the worker's
    memory budget charges it (worker/session.py); one without that method is charged the rows alone."""

    name: str

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        """Fill out.draft_ids / confidence (and margin, sampled_mask, support_ids, proposal_q when
        present) for each item's index. Raising fails the batch's drafts (RS_INTERNAL)."""
        ...


def project_at(project: Any, rows: np.ndarray, positions: Callable[[], np.ndarray]) -> np.ndarray:
    """A drafter's per-row transform (`project_rows`) of `rows`, given their positions (`positions()`,
    worked out only then) when it depends on them (`project_rows.needs_positions`: the dspark drafter's
    rotary keys). The one place that asks."""
    if getattr(project, "needs_positions", False):
        return project(rows, positions())
    return project(rows)


def drafter_slot_bytes(drafter: object, window: int, row_bytes: int) -> int | None:
    """What a slot holds for `drafter` at these shapes, rows included (its `slot_bytes`); None when it
    does not say (then the rows alone are charged)."""
    fn = getattr(drafter, "slot_bytes", None)
    return int(fn(window, row_bytes)) if fn is not None else None


_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise (uint64 arithmetic wraps, as the hash wants)."""
    x = x + _GOLD
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def seeded_uniform(seed: np.ndarray, pos: np.ndarray, j: int) -> np.ndarray:
    """A uniform in [0, 1) per request, a function of (seed, anchor position, draft position) alone,
    for all sampled requests of a round at once (no generator per request)."""
    with np.errstate(over="ignore"):
        x = _mix64(_mix64(_mix64(seed.astype(np.uint64)) ^ pos.astype(np.uint64)) ^ np.uint64(j))
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
