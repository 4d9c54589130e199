"""Corrupting a round's descriptor or metadata slot from the engine side, before `gathered` is raised.

Each mode is damage the proxy's validation must catch (docs/guarantees.md: malformed
descriptors never crash or hang either side, and are counted): the round fails with
`fallback_bad_descriptor`, the proxy lives. Damage that happens to look valid (a slot id swapped for
another in-range one, say) is a different fault, a lying engine, which no proxy can detect; the modes
here are chosen so that every corrupted round is provably malformed.

`DescriptorCorruptor.install(shim)` hooks the shim instance's `_write_round` (the step between
writing the slots and raising `gathered`), so the proxy can never read the round before the damage.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..shm.segment import Segment

__all__ = ["CORRUPTION_MODES", "corrupt_round", "DescriptorCorruptor"]

CORRUPTION_MODES = ("desc_garbage", "desc_random_body", "desc_n_over_max", "desc_qsl_decreasing",
                    "desc_slot_out_of_range", "desc_duplicate_slot", "meta_rows_mismatch", "meta_garbage",
                    "meta_valid_over_window")


def _slot_bytes(seg: Segment, region: str, t: int) -> tuple[np.ndarray, np.dtype]:
    lay = seg.layout
    if region == "desc":
        off, dt = lay.desc_off(t), lay.desc_dtype
    else:
        off, dt = lay.meta_off(t), lay.meta_dtype
    return np.ndarray((dt.itemsize,), np.uint8, buffer=seg.mm, offset=off), dt


def corrupt_round(seg: Segment, t: int, mode: str, rng: np.random.Generator) -> str:
    """Damage round t's slot in `seg` so that it is malformed; returns the mode actually applied
    (a mode that needs requests falls back to `desc_n_over_max` on an empty round)."""
    M = seg.params.max_reqs
    slot = t % len(seg.desc)
    d, m = seg.desc[slot], seg.meta[slot]
    n = int(d["n"])
    if mode in ("desc_qsl_decreasing", "desc_slot_out_of_range", "meta_valid_over_window") and n < 1:
        mode = "desc_n_over_max"
    if mode == "desc_duplicate_slot" and n < 2:
        mode = "desc_n_over_max"
    if mode in ("desc_garbage", "meta_garbage"):
        raw, _ = _slot_bytes(seg, "desc" if mode == "desc_garbage" else "meta", t)
        raw[:] = rng.integers(0, 256, raw.shape[0], dtype=np.uint8)
        # the stamps are garbage too; make sure they cannot read as t by chance
        raw[:8] = np.frombuffer((t ^ 0x5A5A5A5A5A5A5A5A).to_bytes(8, "little"), np.uint8)
    elif mode == "desc_random_body":
        raw, dt = _slot_bytes(seg, "desc", t)
        lo, hi = dt.fields["t"][1] + 8, dt.fields["stamp_end"][1]  # keep both stamps and t: only the body
        raw[lo:hi] = rng.integers(0, 256, hi - lo, dtype=np.uint8)
        if 0 <= int(d["n"]) <= M:
            d["n"] = M + 1 + int(rng.integers(0, 1000))
    elif mode == "desc_n_over_max":
        d["n"] = M + 1 + int(rng.integers(0, 1 << 20))
    elif mode == "desc_qsl_decreasing":
        d["qsl"][n] = int(d["qsl"][n - 1]) - 1 - int(rng.integers(0, 100))
    elif mode == "desc_slot_out_of_range":
        d["slot"][int(rng.integers(0, n))] = int(rng.choice([M, M + 1 + int(rng.integers(0, 1000)), -1]))
    elif mode == "desc_duplicate_slot":
        i, j = rng.choice(n, size=2, replace=False)
        d["slot"][int(j)] = d["slot"][int(i)]
    elif mode == "meta_rows_mismatch":
        m["rows_staged"] = int(m["rows_staged"]) + 1 + int(rng.integers(0, 50))
    elif mode == "meta_valid_over_window":
        m["valid"][int(rng.integers(0, n))] = seg.params.window + 1 + int(rng.integers(0, 100))
    else:
        raise ValueError(f"unknown corruption mode {mode!r}; one of {CORRUPTION_MODES}")
    return mode


class DescriptorCorruptor:
    """Corrupts every `every`-th round the shim writes while armed (engine thread); counts by mode."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.every = 0  # 0: disarmed
        self.counts: Counter[str] = Counter()
        self._k = 0

    def install(self, shim: Any) -> None:
        original = shim._write_round

        def write_round(seg: Segment, t: int, n: int, a: dict) -> None:
            original(seg, t, n, a)
            if self.every:
                self._k += 1
                if self._k % self.every == 0:
                    mode = CORRUPTION_MODES[int(self.rng.integers(0, len(CORRUPTION_MODES)))]
                    self.counts[corrupt_round(seg, t, mode, self.rng)] += 1

        shim._write_round = write_round

    @property
    def total(self) -> int:
        return sum(self.counts.values())
