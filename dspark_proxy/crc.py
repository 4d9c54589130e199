"""CRC-32 algebra, so the `integrity` oracle never re-reads megabytes of rows.

The `integrity` drafter hashes the anchor and the window's rows with zlib's CRC-32. At the realistic
shapes (W = 128 rows of 71,680 bytes) recomputing that CRC from the bytes costs about 9 MB of hashing
per request and per round: too slow for the simulated engine that checks every draft, and for the
worker that makes them. CRC is linear over GF(2), so it can be assembled from small pieces instead:

- ``crc(A ‖ B) = shift(len(B))(crc(A)) ^ crc(B)`` where ``shift(n)`` multiplies by x^(8n) modulo the
  CRC polynomial (what zlib's ``crc32_combine`` does);
- for messages of one fixed length, ``crc(a ^ b ^ c) = crc(a) ^ crc(b) ^ crc(c)``, so the CRC of a
  fixed-length message is a constant XOR one table lookup per byte.

Every linear map on a 32-bit CRC is applied to whole numpy arrays through four 256-entry tables
(`CrcOp`); the constants come from zlib itself, so the tables can only agree with zlib or fail the
tests that compare them.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["CrcOp", "CrcOpSet", "WindowShifts", "multmodp", "x2nmodp", "byte_tables", "xor_lookup", "le_bytes",
           "shift_tables"]

_POLY = 0xEDB88320  # the reflected CRC-32 polynomial, as zlib uses it
_SMALL = 128  # below this many lookups, one fancy take + reduce beats column by column


def le_bytes(x: np.ndarray, dtype: type) -> np.ndarray:
    """The little-endian bytes of ``x`` as ``dtype`` (uint32 or uint64): an array [..., itemsize]."""
    a = np.ascontiguousarray(x, dtype=np.dtype(dtype).newbyteorder("<"))
    return a.view(np.uint8).reshape(a.shape + (a.itemsize,))


def xor_lookup(flat_tables: np.ndarray, index: np.ndarray) -> np.ndarray:
    """XOR over the last axis of ``flat_tables[index]``: index [..., k] already includes each column's
    table offset. (A linear map applied byte by byte.)"""
    if index.size <= _SMALL * index.shape[-1]:
        return np.bitwise_xor.reduce(flat_tables[index], axis=-1)
    out = flat_tables[index[..., 0]]
    for k in range(1, index.shape[-1]):
        out ^= flat_tables[index[..., k]]
    return out


def multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, in zlib's reflected bit order (zlib's ``multmodp``)."""
    if a == 0 or b == 0:
        return 0
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    p = 1 << 30  # x^1
    table = [p]
    for _ in range(1, 32):
        p = multmodp(p, p)
        table.append(p)
    return table


_X2N = _x2n_table()


def x2nmodp(n: int, k: int = 3) -> int:
    """x^(n * 2^k) modulo the polynomial; ``x2nmodp(n_bytes, 3)`` is zlib's combine operator."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    p = 1 << 31  # x^0
    while n:
        if n & 1:
            p = multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


class CrcOp:
    """A GF(2)-linear map on 32-bit CRC values, applied to numpy arrays by four byte tables.

    Maps built here multiply by a fixed polynomial, so they commute, and the XOR of two maps (``^``)
    is again such a map (the sum of linear maps).
    """

    __slots__ = ("tables", "flat")

    _OFFSETS = np.arange(4, dtype=np.intp) * 256

    def __init__(self, tables: np.ndarray) -> None:
        self.tables = np.ascontiguousarray(tables, dtype=np.uint32).reshape(4, 256)
        self.flat = self.tables.reshape(-1)

    @classmethod
    def from_poly(cls, op: int) -> CrcOp:
        """The map x -> multmodp(op, x)."""
        basis = np.array([multmodp(op, 1 << i) for i in range(32)], dtype=np.uint32)
        bits = ((np.arange(256, dtype=np.uint32)[:, None] >> np.arange(8, dtype=np.uint32)) & 1).astype(bool)
        tables = np.zeros((4, 256), dtype=np.uint32)
        for k in range(4):
            sel = np.where(bits, basis[8 * k: 8 * k + 8][None, :], np.uint32(0))
            tables[k] = np.bitwise_xor.reduce(sel, axis=1)
        return cls(tables)

    @classmethod
    def shift(cls, n_bytes: int) -> CrcOp:
        """Appending n_bytes to a message: crc(A ‖ B) = shift(len(B)).apply(crc(A)) ^ crc(B)."""
        return cls.from_poly(x2nmodp(int(n_bytes), 3))

    def __xor__(self, other: CrcOp) -> CrcOp:
        return CrcOp(self.tables ^ other.tables)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The map applied elementwise to a uint32 array (a new array)."""
        b = le_bytes(x, np.uint32)
        if b.size <= 4 * _SMALL:
            return np.bitwise_xor.reduce(self.flat[b + self._OFFSETS], axis=-1)
        t = self.tables  # column by column, indexing by the bytes themselves (no offset array)
        out = t[0][b[..., 0]]
        out ^= t[1][b[..., 1]]
        out ^= t[2][b[..., 2]]
        out ^= t[3][b[..., 3]]
        return out

    def apply_int(self, x: int) -> int:
        return int(self.apply(np.array([x], dtype=np.uint32))[0])


def shift_tables(step_bytes: int, count: int, scale: int = 1) -> np.ndarray:
    """The byte tables of shift(k * scale * step_bytes) for k = 0 .. count - 1, uint32 [count, 4, 256],
    built with numpy for all k at once (one multmodp per k): about 1000 times faster than `CrcOp.shift`
    one by one, which matters when a peer's HELLO chooses the window (worker/server.py)."""
    one = x2nmodp(int(step_bytes) * int(scale), 3)
    polys = np.empty(count, dtype=np.uint32)
    p = 1 << 31  # x^0: shift(0) is the identity
    for k in range(count):
        polys[k] = p
        p = multmodp(p, one)
    # basis[:, i] = the map applied to the bit 1 << i, i.e. poly * x^(31 - i) (multmodp's bit order)
    basis = np.empty((count, 32), dtype=np.uint32)
    cur = polys.copy()
    for i in range(31, -1, -1):
        basis[:, i] = cur
        cur = (cur >> np.uint32(1)) ^ (np.uint32(_POLY) * (cur & np.uint32(1)))
    tables = np.zeros((count, 4, 256), dtype=np.uint32)
    for k in range(4):  # table[b] = XOR of the basis of b's bits, built by doubling
        for bit in range(8):
            lo = 1 << bit
            tables[:, k, lo:2 * lo] = tables[:, k, :lo] ^ basis[:, 8 * k + bit, None]
    return tables


class CrcOpSet:
    """Several maps, one chosen per element: ``apply(x, which)`` is ``ops[which[i]].apply(x[i])``."""

    __slots__ = ("flat", "n_ops")

    def __init__(self, ops: list[CrcOp] | np.ndarray) -> None:
        """ops: the maps, or their byte tables [n, 4, 256] (`shift_tables`)."""
        if isinstance(ops, np.ndarray):
            self.flat = np.ascontiguousarray(ops, dtype=np.uint32).reshape(-1)
            self.n_ops = ops.shape[0]
        else:
            self.flat = np.concatenate([op.flat for op in ops])
            self.n_ops = len(ops)

    def apply(self, x: np.ndarray, which: np.ndarray) -> np.ndarray:
        which = np.asarray(which, dtype=np.intp)
        idx = le_bytes(x, np.uint32) + (which * 1024)[..., None] + CrcOp._OFFSETS
        return xor_lookup(self.flat, idx)


def byte_tables(msg_len: int, n_bytes: int | None = None) -> tuple[int, np.ndarray]:
    """The CRC of a fixed-length message as constant ^ XOR_k table[k][byte k].

    Returns ``(crc(zeros), tables)`` with ``tables[k][b] = crc(zeros with byte k = b) ^ crc(zeros)``
    for the first ``n_bytes`` positions (all by default), computed with zlib itself.
    """
    n = msg_len if n_bytes is None else min(int(n_bytes), msg_len)
    zero = bytearray(msg_len)
    c0 = zlib.crc32(zero)
    tables = np.zeros((n, 256), dtype=np.uint32)
    for k in range(n):
        col = tables[k]
        for b in range(1, 256):
            zero[k] = b
            col[b] = zlib.crc32(zero) ^ c0
        zero[k] = 0
    return c0, tables


class WindowShifts:
    """shift(w * row_bytes) for every window length w = 0 .. window, applied per element: what the
    worker assembles window CRCs with (worker/serve.py). Up to `DIRECT` windows it is one table per w
    (one lookup pass per batch, as before); beyond, w = hi * B + lo with B about sqrt(window), so it
    keeps about 2 sqrt(window) tables instead of window + 1 (8 MiB, not 4 GiB, at the protocol's
    2^20) and applies two passes. Either way it is built in milliseconds (`shift_tables`)."""

    DIRECT = 512  # window + 1 tables of 4 KiB each up to here: 2 MiB

    __slots__ = ("window", "row_bytes", "_one", "_lo", "_hi", "_bits")

    def __init__(self, row_bytes: int, window: int) -> None:
        self.window, self.row_bytes = int(window), int(row_bytes)
        n = self.window + 1
        self._one: CrcOpSet | None = None
        if n <= self.DIRECT:
            self._one = CrcOpSet(shift_tables(row_bytes, n))
            return
        self._bits = max(1, (n.bit_length() + 1) // 2)
        b = 1 << self._bits
        self._lo = CrcOpSet(shift_tables(row_bytes, b))
        self._hi = CrcOpSet(shift_tables(row_bytes, -(-n // b), scale=b))

    @property
    def nbytes(self) -> int:
        """Bytes of tables held."""
        if self._one is not None:
            return self._one.flat.nbytes
        return self._lo.flat.nbytes + self._hi.flat.nbytes

    def apply(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """shift(w[i] * row_bytes) applied to x[i] (uint32 arrays of one length; 0 <= w <= window)."""
        if self._one is not None:
            return self._one.apply(x, w)
        w = np.asarray(w, dtype=np.intp)
        return self._hi.apply(self._lo.apply(x, w & ((1 << self._bits) - 1)), w >> self._bits)
