"""Deterministic tokens and hidden-state rows: pure functions of (request uid, position).

Purity is what makes the oracle possible: the engine can recompute any row it ever sent (after a
preemption, a recompute produces the very same rows, as a real target would), so any row the worker
hashes that is stale, misrouted or damaged shows as a different CRC.

A row is a fixed base row with a 16-byte stamp, ``uid (int64 LE) ‖ pos (int64 LE)``, written at offset 0,
every ``stamp_stride_bytes`` after it, and in the last 16 bytes. Making a round's rows therefore writes
only the stamps into a buffer that already holds the base (a few hundred bytes per row, not 70 KB), yet
a copy that is truncated, shifted or taken from another row differs in some stamp. Rows shorter than 16
bytes carry a truncated stamp (then distinct requests may share rows; use at least 16 bytes).

Because the base is fixed and the stamps sit at fixed offsets, a row's CRC is
``C ^ S(lin(stamp))``: one constant, one linear map S (the sum of the shifts of each stamp offset to the
row's end) and a per-byte table lookup of the stamp (see `crc`). So the CRC of every row is known from
(uid, pos) in a handful of vectorised numpy operations.
"""

from __future__ import annotations

import zlib

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dspark_proxy.crc import CrcOp, byte_tables, le_bytes, xor_lookup

__all__ = ["RowGen", "mix64"]

_BASE_SEED = 0xD5A4C0DE  # fixed: rows must not depend on the run's seed
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_UID_MUL = np.uint64(0xD6E8FEB86659FD93)
_STAMP = 16


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic, a new array)."""
    z = np.asarray(x, dtype=np.uint64) + _GAMMA
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


class RowGen:
    """Rows, their CRCs and tokens for (uid, pos); owns the reusable buffer a round's rows are made in."""

    def __init__(self, row_bytes: int, *, vocab_size: int = 152064, stamp_stride_bytes: int = 4096) -> None:
        L = int(row_bytes)
        if L <= 0:
            raise ValueError(f"row_bytes must be > 0, got {row_bytes}")
        if stamp_stride_bytes < _STAMP:
            raise ValueError(f"stamp_stride_bytes must be >= {_STAMP}, got {stamp_stride_bytes}")
        self.row_bytes = L
        self.vocab_size = int(vocab_size)
        self.stride = int(stamp_stride_bytes)
        self.stamp_len = s = min(_STAMP, L)
        if L >= 2 * _STAMP:
            regular = list(range(0, L - 2 * _STAMP + 1, self.stride))
            self.offsets = regular + [L - _STAMP]
        else:
            regular = [0]
            self.offsets = [0]
        self._n_regular = len(regular)
        rng = np.random.default_rng(_BASE_SEED + L)
        self.base = rng.integers(0, 256, L, dtype=np.uint8)
        zeroed = self.base.copy()
        for o in self.offsets:
            zeroed[o:o + s] = 0
        self._crc_const = np.uint32(zlib.crc32(zeroed.tobytes()))
        op = CrcOp.shift(L - self.offsets[0] - s)
        for o in self.offsets[1:]:
            op = op ^ CrcOp.shift(L - o - s)
        self._spread = op
        _, tab = byte_tables(s)
        self._stamp_flat = tab.reshape(-1)
        self._n_uid_bytes = min(8, s)
        self._n_pos_bytes = max(0, min(12, s) - 8)  # positions < 2**32: higher bytes are zero
        self._uid_off = np.arange(self._n_uid_bytes, dtype=np.intp) * 256
        self._pos_off = (8 + np.arange(self._n_pos_bytes, dtype=np.intp)) * 256
        self._buf = np.empty((0, L), dtype=np.uint8)

    # ---- tokens -------------------------------------------------------------------------------

    def tokens(self, uid: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The token at (uid, pos), int64 in [0, vocab_size)."""
        key = (np.asarray(uid).astype(np.uint64) * _UID_MUL) ^ np.asarray(pos).astype(np.uint64)
        return (mix64(key) % np.uint64(self.vocab_size)).astype(np.int64)

    # ---- rows ---------------------------------------------------------------------------------

    def buffer(self, n_rows: int) -> np.ndarray:
        """A [n_rows, row_bytes] view of the reusable buffer, every byte outside the stamps already the
        base row. Valid until the next call (the buffer may grow and move)."""
        if n_rows > self._buf.shape[0]:
            cap = max(int(n_rows), self._buf.shape[0] * 3 // 2, 64)
            buf = np.empty((cap, self.row_bytes), dtype=np.uint8)
            buf[:] = self.base
            self._buf = buf
        return self._buf[:n_rows]

    def stamp(self, out: np.ndarray, uid: np.ndarray, pos: np.ndarray) -> None:
        """Write the stamps of rows (uid[r], pos[r]) into ``out`` [R, row_bytes], whose other bytes must
        already be the base row (a `buffer` view, or a copy of the base)."""
        R = out.shape[0]
        if R == 0:
            return
        st = np.empty((R, 2), dtype="<i8")
        st[:, 0] = uid
        st[:, 1] = pos
        sb = st.view(np.uint8).reshape(R, _STAMP)[:, :self.stamp_len]
        L, s = self.row_bytes, self.stamp_len
        if self._n_regular > 1:
            view = as_strided(out, shape=(R, self._n_regular, s), strides=(out.strides[0], self.stride, 1),
                              writeable=True)
            view[...] = sb[:, None, :]
        else:
            out[:, :s] = sb
        if len(self.offsets) > self._n_regular:
            out[:, L - _STAMP:] = sb

    def make_rows(self, uid: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Fresh rows (a new array) for (uid[r], pos[r]); for oracles and tests."""
        uid = np.broadcast_to(np.asarray(uid, dtype=np.int64), np.shape(pos))
        pos = np.asarray(pos, dtype=np.int64)
        out = np.empty((pos.size, self.row_bytes), dtype=np.uint8)
        out[:] = self.base
        self.stamp(out, uid.reshape(-1), pos.reshape(-1))
        return out

    # ---- CRCs ---------------------------------------------------------------------------------

    def uid_lin(self, uid: np.ndarray) -> np.ndarray:
        """The uid bytes' part of the stamp's linear CRC (uint32 per uid); combine with `row_crc`."""
        b = le_bytes(np.asarray(uid, dtype=np.int64), np.uint64)[..., :self._n_uid_bytes]
        return xor_lookup(self._stamp_flat, b + self._uid_off)

    def row_crc(self, uid_lin: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """zlib.crc32 of the row (uid, pos), given ``uid_lin`` = `uid_lin` (uid) per row.
        Positions must be below 2**32 (the stamp's higher position bytes are taken as zero)."""
        lin = np.asarray(uid_lin, dtype=np.uint32)
        if self._n_pos_bytes:
            b = le_bytes(np.asarray(pos, dtype=np.int64).astype(np.uint32), np.uint32)[..., :self._n_pos_bytes]
            lin = lin ^ xor_lookup(self._stamp_flat, b + self._pos_off)
        out = self._spread.apply(lin)
        out ^= self._crc_const
        return out
