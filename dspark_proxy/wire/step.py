"""A STEP's prefix, built in one place: app header, step header, entries, sample meta (FORMAT.md).

The round fills a round's entries and sample meta in place (`StepPrefix.entries(k)`, `.sample(k)`:
views into the buffer, no copy); the client, which owns the connection, `place`s them (a no-op for the
in-place views; tools and tests may hand in arrays of their own, which are copied in) and `seal`s the
headers with its session, then sends the sealed prefix followed by the rows.

Sans-IO like the rest of this package: no sockets, no clocks.
"""

from __future__ import annotations

import numpy as np

from .codec import fill_step_prefix
from .dtypes import (
    APP_HEADER_SIZE,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    SAMPLE_DTYPE,
    STEP_HDR_SIZE,
    entries_view,
    sample_view,
    step_prefix_bytes,
)
from .errors import LocalProtocolError

__all__ = ["StepPrefix", "place", "seal"]

_ENTRIES_AT = APP_HEADER_SIZE + STEP_HDR_SIZE


class StepPrefix(bytearray):
    """The caller-owned prefix buffer of a STEP of at most `max_reqs` requests. It never moves: the
    views below keep it exported, so its address, taken once, stays true."""

    def __init__(self, max_reqs: int, sampled: bool) -> None:
        super().__init__(step_prefix_bytes(max_reqs, sampled))
        self.max_reqs = max_reqs
        self._entries = entries_view(self, max_reqs)  # a round's k entries are its first k
        self.addr = self._entries.ctypes.data - _ENTRIES_AT
        # the views handed out, one per k, made once: `place` knows its own by identity, without asking
        # numpy for an address (a few us a round when the round runs on cold caches)
        self._entry_views: dict[int, np.ndarray] = {}
        self._sample_views: dict[int, np.ndarray] = {}

    def entries(self, k: int) -> np.ndarray:
        """ENTRY_DTYPE [k], in place."""
        v = self._entry_views.get(k)
        if v is None:
            v = self._entry_views[k] = self._entries[:k]
        return v

    def sample(self, k: int) -> np.ndarray:
        """SAMPLE_DTYPE [k], in place (after the k entries: its place depends on k)."""
        v = self._sample_views.get(k)
        if v is None:
            v = self._sample_views[k] = sample_view(self, k)
        return v


def place(prefix: bytearray, entries: np.ndarray, sample_meta: np.ndarray | None) -> None:
    """Entries (and sample meta, None: not sampled) into the prefix: nothing to do for the in-place views
    of a `StepPrefix`; anything else is copied in. Raises LocalProtocolError for the wrong dtypes."""
    if entries.dtype != ENTRY_DTYPE:
        raise LocalProtocolError(f"entries of dtype {entries.dtype}, expected ENTRY_DTYPE")
    n = entries.shape[0]
    if type(prefix) is StepPrefix and prefix._entry_views.get(n) is entries and (
            sample_meta is None or prefix._sample_views.get(n) is sample_meta):
        return  # the prefix's own views: already in place
    addr = prefix.addr if type(prefix) is StepPrefix else np.frombuffer(prefix, np.uint8).ctypes.data
    off = addr + _ENTRIES_AT
    if entries.ctypes.data != off:
        entries_view(prefix, n)[:] = entries
    if sample_meta is not None:
        if sample_meta.dtype != SAMPLE_DTYPE:
            raise LocalProtocolError(f"sample_meta dtype {sample_meta.dtype}, expected SAMPLE_DTYPE")
        if sample_meta.ctypes.data != off + n * ENTRY_SIZE:
            sample_view(prefix, n)[:] = sample_meta


def seal(prefix: bytearray, *, n_req: int, n_rows: int, row_bytes: int, step_flags: int, session: int,
         epoch: int, step_id: int) -> memoryview:
    """Write the headers; returns the prefix to send before the rows."""
    plen = fill_step_prefix(prefix, n_req=n_req, n_rows=n_rows, row_bytes=row_bytes, step_flags=step_flags,
                            session=session, epoch=epoch, step_id=step_id)
    return memoryview(prefix)[:plen]
