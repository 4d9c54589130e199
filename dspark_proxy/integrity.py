"""The `integrity` drafter's formula (docs/design.md, "The worker"): the test oracle every usable draft
is checked against.

It lives on its own so that the worker (which computes it from the rows it holds) and the simulated
engine (which recomputes it from the rows it sent) share the definition, not the code path: the worker
calls it with its window, the engine with its own ring, and any wrong, stale or misrouted row shows as
a different CRC.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["GOLDEN", "integrity_hash", "integrity_drafts"]

GOLDEN = 0x9E3779B1
_ANCHOR = struct.Struct("<iq")  # anchor_token int32 LE, anchor_pos int64 LE


def integrity_hash(anchor_token: int, anchor_pos: int, rows: bytes | memoryview | np.ndarray) -> int:
    """CRC-32 (IEEE, initial 0) of the anchor token, its position and the window's rows in order.

    `rows` are the rows of positions anchor_pos - w .. anchor_pos - 1, contiguous, as bytes.
    """
    h = zlib.crc32(_ANCHOR.pack(int(anchor_token), int(anchor_pos)))
    return zlib.crc32(memoryview(np.ascontiguousarray(rows)).cast("B") if isinstance(rows, np.ndarray)
                      else rows, h)


def integrity_drafts(h: int, w: int, window: int, num_spec: int, n_out: int,
                     ids_out: np.ndarray, conf_out: np.ndarray) -> None:
    """Fill one request's drafts [num_spec] int32 and confidences [num_spec] float32.

    Positions j < n_out (all when n_out == 0) get `(h ^ (j * GOLDEN)) & 0x7FFFFFFF` and `w / window`;
    later positions get -1 and 0.0, so a reader can tell a cut draft from a real one.
    """
    k = num_spec if n_out <= 0 else min(n_out, num_spec)
    j = np.arange(k, dtype=np.int64)
    ids_out[:k] = (h ^ ((j * GOLDEN) & 0xFFFFFFFF)) & 0x7FFFFFFF
    ids_out[k:] = -1
    conf_out[:k] = np.float32(w / window)
    conf_out[k:] = 0.0
