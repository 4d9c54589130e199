"""The drafter interface and the `integrity` drafter (docs/design.md, "The worker"), plus the factory
for both drafters.

A drafter gets the batch's usable requests that asked for drafts (`DraftItem`s, each with its window
as at most two contiguous row segments in position order) and writes drafts, confidences and the
optional sections straight into the REPLY being built. The `torch` drafter lives in its own module
and is imported only when chosen, so the worker's default start path never loads torch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..integrity import GOLDEN, integrity_hash
from ..wire import TOP_K, ReplyWriter

__all__ = ["DraftItem", "Drafter", "IntegrityDrafter", "make_drafter", "DRAFTER_NAMES", "DRAFTERS", "DrafterEntry",
           "drafter_slot_bytes"]


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


class IntegrityDrafter:
    """The test oracle: drafts are a CRC of the anchor and the exact rows held (dspark_proxy.integrity).

    Optional sections, deterministic so an oracle can check them too: margin = confidence; in sampled
    mode a request with temperature > 0 gets sampled_mask 1, support_ids[j][k] = (draft_j + k) &
    0x7FFFFFFF and proposal_q[j] = one-hot on k = 0 (positions past n_out: -1 and 0).
    """

    name = "integrity"
    vocab_size = 0  # ids span every non-negative int32: no vocabulary to check them against
    fixes: tuple[str, ...] = ()  # serves any N, window and row_bytes (worker/terms.py)

    def __init__(self, num_spec: int, window: int) -> None:
        self.num_spec = num_spec
        self.window = window
        self._k = np.arange(TOP_K, dtype=np.int64)
        self._j = np.arange(num_spec, dtype=np.int64)
        self._golden = (self._j * GOLDEN) & 0xFFFFFFFF

    def slot_bytes(self, window: int, row_bytes: int) -> int:
        """The rows alone: the CRC chain it reads is the slot's, charged there (worker/session.py)."""
        return window * row_bytes

    def draft(self, items: list[DraftItem], out: ReplyWriter) -> None:
        """The whole batch at once (a per-item numpy call cost ~4 us a request at n = 256)."""
        k = len(items)
        idx = np.fromiter((it.index for it in items), dtype=np.intp, count=k)
        h = np.fromiter((self._hash(it) for it in items), dtype=np.int64, count=k)
        w = np.fromiter((it.w for it in items), dtype=np.float64, count=k)
        n_out = np.fromiter((it.n_out for it in items), dtype=np.int64, count=k)
        N = self.num_spec
        cut = np.where(n_out <= 0, N, np.minimum(n_out, N))  # positions j < cut are drafted
        live = self._j[None, :] < cut[:, None]
        ids = (h[:, None] ^ self._golden[None, :]) & 0x7FFFFFFF
        ids[~live] = -1
        conf = np.where(live, (w / self.window).astype(np.float32)[:, None], np.float32(0.0))
        out.draft_ids[idx] = ids
        out.confidence[idx] = conf
        if out.margin is not None:
            out.margin[idx] = conf
        if out.sampled_mask is not None:
            self.fill_sampled(out, idx, np.fromiter((it.temperature for it in items), dtype=np.float64, count=k))

    def fill_sampled(self, out, idx: np.ndarray, temperature: np.ndarray) -> None:
        """Sampled mode's sections for the requests `idx` whose drafts are already in `out` and that
        sample (temperature > 0): sampled_mask 1, support draft + k, q one-hot on k = 0. Also what the
        in-process `null` worker answers sampled rounds with (dspark_proxy.inproc)."""
        hot = idx[temperature > 0]
        if hot.size:
            out.sampled_mask[hot] = 1
            hid = out.draft_ids[hot].astype(np.int64)  # [h, N]
            sup = (hid[:, :, None] + self._k[None, None, :]) & 0x7FFFFFFF
            sup[hid < 0] = -1
            out.support_ids[hot] = sup
            q = np.zeros(sup.shape, dtype=np.float32)
            q[:, :, 0] = np.where(hid >= 0, 1.0, 0.0)
            out.proposal_q[hot] = q

    @staticmethod
    def _hash(it: DraftItem) -> int:
        if it.crc is not None:
            return it.crc
        h = integrity_hash(it.anchor_token, it.anchor_pos, it.segments[0])  # from the bytes
        for seg in it.segments[1:]:
            h = zlib.crc32(seg, h)
        return h


def drafter_slot_bytes(drafter: object, window: int, row_bytes: int) -> int | None:
    """What a slot holds for `drafter` at these shapes, rows included (its `slot_bytes`); None when it
    does not say (then the rows alone are charged)."""
    fn = getattr(drafter, "slot_bytes", None)
    return int(fn(window, row_bytes)) if fn is not None else None


def _make_integrity(*, num_spec: int, window: int, **_: object) -> Drafter:
    return IntegrityDrafter(num_spec, window)


def _make_torch(*, device: str = "cpu", head: str | None = None, target: str | None = None, row_dtype: str = "",
                gpu_memory_budget_mb: int = 0, max_reqs: int = 0, **kw: object) -> Drafter:
    from .torch_drafter import TorchDrafter  # lazy: torch only when this drafter is chosen

    return TorchDrafter(device="cpu" if device in ("", "auto") else device, **kw)


def _make_dspark(*, weights: str | None = None, head: str | None = None, seed: int = 0, **kw: object) -> Drafter:
    from .dspark_drafter import DSparkDrafter  # lazy: torch only when this drafter is chosen

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
