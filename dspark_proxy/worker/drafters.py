"""The drafter interface and the `integrity` drafter (SPEC §6), plus the factory for both drafters.

A drafter gets the batch's usable requests that asked for drafts (`DraftItem`s, each with its window
as at most two contiguous row segments in position order) and writes drafts, confidences and the
optional sections straight into the REPLY being built. The `torch` drafter lives in its own module
and is imported only when chosen, so the worker's default start path never loads torch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..integrity import integrity_drafts, integrity_hash
from ..wire import TOP_K, ReplyWriter

__all__ = ["DraftItem", "Drafter", "IntegrityDrafter", "make_drafter", "DRAFTER_NAMES"]

DRAFTER_NAMES = ("integrity", "torch")


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


class Drafter(Protocol):
    name: str

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        """Fill out.draft_ids / confidence (and margin, sampled_mask, support_ids, proposal_q when
        present) for each item's index. Raising fails the batch's drafts (RS_INTERNAL)."""
        ...


class IntegrityDrafter:
    """The test oracle: drafts are a CRC of the anchor and the exact rows held (dspark_proxy.integrity).

    Optional sections, deterministic so an oracle can check them too: margin = confidence; in sampled
    mode a request with temperature > 0 gets sampled_mask 1, support_ids[j][k] = (draft_j + k) &
    0x7FFFFFFF and proposal_q[j] = one-hot on k = 0 (positions past n_out: -1 and 0).
    """

    name = "integrity"

    def __init__(self, num_spec: int, window: int) -> None:
        self.num_spec = num_spec
        self.window = window
        self._k = np.arange(TOP_K, dtype=np.int64)

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        for it in items:
            i = it.index
            h = it.crc
            if h is None:  # from the bytes (a caller without CRC chains)
                h = integrity_hash(it.anchor_token, it.anchor_pos, it.segments[0])
                for seg in it.segments[1:]:
                    h = zlib.crc32(seg, h)
            integrity_drafts(h, it.w, self.window, self.num_spec, it.n_out, out.draft_ids[i], out.confidence[i])
            if out.margin is not None:
                out.margin[i] = out.confidence[i]
            if out.sampled_mask is not None and it.temperature > 0:
                out.sampled_mask[i] = 1
                ids = out.draft_ids[i].astype(np.int64)
                sup = (ids[:, None] + self._k[None, :]) & 0x7FFFFFFF
                sup[ids < 0] = -1
                out.support_ids[i] = sup
                out.proposal_q[i] = 0.0
                out.proposal_q[i][ids >= 0, 0] = 1.0


def make_drafter(name: str, *, num_spec: int, window: int, row_bytes: int, device: str = "cpu",
                 weights: str | None = None, seed: int = 0) -> Drafter:
    if name == "integrity":
        return IntegrityDrafter(num_spec, window)
    if name == "torch":
        from .torch_drafter import TorchDrafter  # lazy: torch only when this drafter is chosen

        return TorchDrafter(num_spec=num_spec, window=window, row_bytes=row_bytes, device=device,
                            weights=weights, seed=seed)
    raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
