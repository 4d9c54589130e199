"""Steady-state rounds of a chosen shape, for the benchmarks that need exact control of n and rows.

The simulated engine (dspark_proxy.sim) draws realistic, varying batches and checks drafts; here every
round has exactly `n` requests in slots 0..n-1, so a cost can be plotted against n. Two mixes:

- decode: each request sends k + 1 rows (k = drafts accepted last step, uniform in 0..N, or a fixed
  number of rows), continuing its positions; query length N + 1; drafts needed.
- prefill: each request is in the middle of a chunked prefill with chunks of 2W tokens, so it sends
  the chunk's last W rows (a forward jump: NEW_GEN every round); no drafts needed.

Rows come from one preallocated random buffer (views, no per-round allocation); only the
per-request metadata is drawn each round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MIXES", "RoundGen", "wait_connected"]

MIXES = ("decode", "prefill")


class RoundGen:
    """The enqueue arguments of successive rounds of one shape."""

    def __init__(self, n: int, *, num_spec: int, window: int, row_bytes: int, mix: str = "decode",
                 seed: int = 0, req_base: int = 0, fixed_valid: int | None = None) -> None:
        if mix not in MIXES:
            raise ValueError(f"mix={mix!r}: one of {MIXES}")
        self.n, self.N, self.W, self.B, self.mix = n, num_spec, window, row_bytes, mix
        self.rng = np.random.default_rng(seed)
        self.fixed_valid = fixed_valid  # decode: exactly this many rows per request every round
        self.max_valid = window if mix == "prefill" else min(fixed_valid or num_spec + 1, window)
        self.rows_buf = self.rng.integers(0, 256, (max(1, n * self.max_valid), row_bytes), dtype=np.uint8)
        self.req_ids = np.arange(req_base, req_base + n, dtype=np.int64)
        self.slots = np.arange(n, dtype=np.int64)
        q = 2 * window if mix == "prefill" else num_spec + 1
        self.qsl = np.arange(n + 1, dtype=np.int64) * q
        self.need = np.full(n, mix == "decode", dtype=np.bool_)
        self.pos = np.zeros(n, dtype=np.int64)  # next position per request
        self.t = 0

    @property
    def rows_per_round_max(self) -> int:
        return self.n * self.max_valid

    def next(self) -> dict[str, Any]:
        """The next round's keyword arguments for `Shim.enqueue(t, **kw)` (t is `self.t`)."""
        self.t += 1
        n, W = self.n, self.W
        if self.mix == "decode":
            if self.fixed_valid:
                k = np.full(n, min(self.fixed_valid - 1, self.N), np.int64)
                valid = np.full(n, self.max_valid, np.int64)
            else:
                k = self.rng.integers(0, self.N + 1, n) if self.t > 1 else np.zeros(n, np.int64)
                valid = np.minimum(k + 1, self.max_valid)
            first = self.pos.copy()
            self.pos += valid
        else:
            k = np.zeros(n, np.int64)
            valid = np.full(n, W, np.int64)
            first = self.pos + W  # the last W rows of the chunk [pos, pos + 2W)
            self.pos += 2 * W
        total = int(valid.sum())
        return {"req_ids": self.req_ids, "slots": self.slots, "qsl": self.qsl, "need_draft": self.need,
                "k_window": k, "rows": self.rows_buf[:total], "valid": valid, "first_pos": first,
                "anchor": self.rng.integers(0, 150_000, n)}

    def nbytes(self, kw: dict[str, Any]) -> int:
        return int(kw["rows"].nbytes)


def wait_connected(name: str, timeout_s: float = 20.0, workers: int = 1) -> None:
    """Wait until the proxy `name` has connected to its worker (its published client counters say so).

    The proxy connects in the background; rounds before that fail at once ("not_ready") and would
    enter its latency histogram as sub-millisecond rounds."""
    import time

    from dspark_proxy.ops.status import read_status

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            client = read_status(name)["proxy"].get("gauges", {}).get("client") or {}
        except Exception:  # noqa: BLE001 - a segment being created or a snapshot not yet written
            client = {}
        if client.get("connects", 0) >= workers:
            return
        time.sleep(0.05)
    raise RuntimeError(f"proxy {name} did not connect to its worker within {timeout_s} s")
