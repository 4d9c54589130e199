"""The worker's prefix-CRC chains give exactly the integrity hash of the window's bytes: through
restarts (NEW_GEN), continuations, windows that wrap the ring, partial windows and every w."""

from __future__ import annotations

import struct
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_proxy.crc import CrcOp, CrcOpSet
from dspark_proxy.integrity import integrity_hash
from dspark_proxy.wire import RF_NEW_GEN
from dspark_proxy.worker.session import Session

W, B = 5, 24
SHIFT = CrcOpSet([CrcOp.shift(k * B) for k in range(W + 1)])


def _row(p: int, salt: int) -> np.ndarray:
    return np.random.default_rng(p * 7919 + salt).integers(0, 256, B, dtype=np.uint8)


@settings(deadline=None, max_examples=150)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, W), st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(0, 10**6))
def test_chain_hash_equals_the_bytes_hash(steps, seed):
    s = Session(1, W, B, max_slots=2)
    pos, gen, rewound = 0, 1, True
    for restart, k, jump in steps:
        if restart or rewound:
            rewound = False
            pos += jump  # a NEW_GEN may start anywhere (a jump forward or a rewind below)
            flags = RF_NEW_GEN
        else:
            flags = 0
        rows = np.stack([_row(pos + j, seed) for j in range(k)])
        st_, w = s.apply(0, gen, pos, k, flags, rows)
        assert st_ in (0, 1) and w >= 1
        pos += k
        sw = s.slots[0]
        token = (seed + pos) % 150_000
        want = integrity_hash(token, pos, np.concatenate(sw.segments(w)))
        before, end = sw.chain_ends(w)
        hdr = np.array([zlib.crc32(struct.pack("<iq", token, pos))], np.uint32)
        got = SHIFT.apply(hdr ^ np.uint32(before), np.array([w])) ^ np.uint32(end)
        assert int(got[0]) == want
        if restart and jump == 0 and pos > W + 2:
            pos -= W + 2  # and now and then a rewind (a preempted request recomputed): a NEW_GEN next
            rewound = True


def test_only_the_integrity_worker_hashes_rows(monkeypatch):
    """The chains serve the integrity drafter alone: a worker with another drafter (torch) stores the
    rows without a CRC of any (at ~4 GB/s, a CRC is most of a large-row step's work)."""
    from dspark_proxy.worker import WorkerServer

    calls = []
    real = zlib.crc32
    monkeypatch.setattr("dspark_proxy.worker.session.zlib.crc32", lambda *a: calls.append(1) or real(*a))
    s = Session(1, W, B, max_slots=2, chains=False)
    rows = np.stack([_row(p, 0) for p in range(3)])
    assert s.apply(0, 1, 0, 3, RF_NEW_GEN, rows) == (1, 3)
    assert calls == [] and np.array_equal(np.concatenate(s.slots[0].segments(3)), rows)
    Session(1, W, B, max_slots=2).apply(0, 1, 0, 3, RF_NEW_GEN, rows)
    assert len(calls) == 3  # the integrity worker's session hashes each row once
    torch_srv = WorkerServer("127.0.0.1", 0, num_spec=2, window=W, row_bytes=B, max_reqs=2, drafter="torch")
    integrity_srv = WorkerServer("127.0.0.1", 0, num_spec=2, window=W, row_bytes=B, max_reqs=2)
    assert not torch_srv.sessions.get(1, 0, 2).chains and integrity_srv.sessions.get(1, 0, 2).chains


def test_window_shifts_equal_zlibs_combine_at_every_size():
    """WindowShifts (what the worker assembles window CRCs with) is shift(w * row_bytes) for every w,
    one table per w up to 512 windows and two passes beyond, up to the protocol's 2^20; built in
    milliseconds and about 2 sqrt(W) tables, not W + 1."""
    import time

    from dspark_proxy.crc import WindowShifts, shift_tables

    tables = shift_tables(7, 9)
    for k in range(9):
        assert np.array_equal(tables[k], CrcOp.shift(7 * k).tables)
    rng = np.random.default_rng(5)
    for row_bytes, window in ((24, 5), (3, 511), (1, 512), (2, 4000), (1, 1 << 15), (5, 1 << 20)):
        t0 = time.perf_counter()
        ws = WindowShifts(row_bytes, window)
        assert time.perf_counter() - t0 < 2.0 and ws.nbytes <= 11 << 20
        x = rng.integers(0, 2**32, 40, dtype=np.uint64).astype(np.uint32)
        w = np.concatenate([[0, 1, window, window - 1], rng.integers(0, window + 1, 36)])
        want = [_combine(int(a), int(k) * row_bytes) for a, k in zip(x, w, strict=True)]
        assert ws.apply(x, w).tolist() == want, (row_bytes, window)


def _combine(crc_a: int, len_b: int) -> int:
    """crc(A ‖ zeros(len_b)) ^ crc(zeros(len_b)): the shift by len_b bytes, from zlib's bytes (small
    len_b) or its combine algebra (CrcOp)."""
    if len_b <= 4096:
        zeros = bytes(len_b)
        return zlib.crc32(zeros, crc_a) ^ zlib.crc32(zeros)
    return CrcOp.shift(len_b).apply_int(crc_a)
