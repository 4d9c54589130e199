"""Round t's metadata and descriptor slots (slot t % 64): the engine writes them, the proxy reads them.

Both halves of the stamped-slot protocol (shm_layout.md §5, "Meta and desc slots"):
- `SlotWriter` (engine thread): `begin_write(stamp_start = t)`, numpy writes of the fields,
  `store_release(stamp_end = t)`;
- `SlotReader` (the proxy's round thread): `load(stamp_end) == t`, copy the slot as bytes,
  `load_after(stamp_start) == t`; then the copy is validated as a whole. A slot that is not round t's,
  or does not hold together, is a `BadDescriptor`: that round fails, never the process.

Cost. The reader is on the proxy's hot path: the copies are one memcpy each, the header is read with
one struct call, checks are counted rather than branched on per field, and the views of a round size n
are made once (`RoundViews`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .. import native
from . import _hostflag
from .layout import META_SLOTS
from .segment import Segment

__all__ = ["BadDescriptor", "RoundViews", "SlotReader", "SlotWriter"]


class BadDescriptor(ValueError):
    """Round t's descriptor or metadata does not hold together: that round fails, never the process."""


def _u32_header(dtype: np.dtype, names: tuple[str, ...]) -> tuple[struct.Struct, int]:
    """A struct that reads these consecutive little-endian u32 header fields in one call, and its offset
    (one unpack_from is several times cheaper than as many structured-field reads)."""
    off = dtype.fields[names[0]][1]
    for i, name in enumerate(names):
        ft, o = dtype.fields[name][:2]
        if ft != np.dtype("<u4") or o != off + 4 * i:
            raise AssertionError(f"header field {name} is not the u32 at offset {off + 4 * i}")
    return struct.Struct(f"<{len(names)}I"), off


# ---------------------------------------------------------------------------------------- engine side


class SlotWriter:
    """The engine's writes of round t's metadata and descriptor slots, for one attached segment."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self._views: list = [None] * META_SLOTS  # per slot: field views (see _slot_views)
        self._meta_end_off = seg.layout.meta_dtype.fields["stamp_end"][1]
        self._desc_end_off = seg.layout.desc_dtype.fields["stamp_end"][1]

    def _slot_views(self, t: int) -> tuple[dict, dict]:
        """Field views of meta and desc slot t % 64, made once per segment (a structured-field lookup
        costs about a microsecond; a round writes a dozen fields)."""
        i = t % META_SLOTS
        views = self._views[i]
        if views is None:
            m, d = self.seg.meta[i:i + 1], self.seg.desc[i:i + 1]
            views = self._views[i] = tuple({k: arr[k].reshape(arr[k].shape[1:]) for k in arr.dtype.names}
                                           for arr in (m, d))
        return views

    def write_meta(self, t: int, n: int, rows_staged: int, k_fit: int, a: dict[str, np.ndarray],
                   sampled: bool) -> None:
        """Metadata slot t % 64: the per-request positions; the first `k_fit` requests' rows were staged."""
        mm, moff = self.seg.mm, self.seg.layout.meta_off(t)
        m = self._slot_views(t)[0]
        valid = a["valid"]
        _hostflag.begin_write(mm, moff, t)
        m["t"][...] = t
        m["n"][...] = n
        m["rows_staged"][...] = rows_staged
        m["valid"][:n] = valid
        m["first_pos"][:n] = a["first_pos"]
        m["anchor"][:n] = a["anchor"]
        staged_rows = m["staged_rows"]
        staged_rows[:k_fit] = valid[:k_fit]
        staged_rows[k_fit:n] = 0
        m["sampled"][:n] = a["sampled"]
        if sampled:
            m["seed"][:n] = a["seed"]
            m["temperature"][:n] = a["temperature"]
        _hostflag.store_release(mm, moff + self._meta_end_off, t)

    def write_desc(self, t: int, n: int, max_q: int, rows_staged: int, staged: list[int],
                   a: dict[str, np.ndarray]) -> None:
        """Descriptor slot t % 64: the batch as scheduled, and the resync windows staged with it."""
        mm, doff = self.seg.mm, self.seg.layout.desc_off(t)
        d = self._slot_views(t)[1]
        _hostflag.begin_write(mm, doff, t)
        d["t"][...] = t
        d["n"][...] = n
        d["max_q"][...] = max_q
        d["rows_gathered"][...] = rows_staged
        d["n_staged"][...] = len(staged)
        if staged:
            d["staged_slots"][:len(staged)] = staged
        d["req_id"][:n] = a["req_ids"]
        d["slot"][:n] = a["slots"]
        d["qsl"][:n + 1] = a["qsl"]
        d["need_draft"][:n] = a["need_draft"]
        d["k_window"][:n] = a["k_window"]
        _hostflag.store_release(mm, doff + self._desc_end_off, t)

    def write_nothing(self, t: int) -> None:
        """Round t's metadata and descriptor with no requests, no rows and no windows (stamped)."""
        mm, lay = self.seg.mm, self.seg.layout
        m, d = self._slot_views(t)
        moff = lay.meta_off(t)
        _hostflag.begin_write(mm, moff, t)
        m["t"][...] = t
        m["n"][...] = 0
        m["rows_staged"][...] = 0
        _hostflag.store_release(mm, moff + self._meta_end_off, t)
        doff = lay.desc_off(t)
        _hostflag.begin_write(mm, doff, t)
        d["t"][...] = t
        for k in ("n", "max_q", "rows_gathered", "n_staged"):
            d[k][...] = 0
        d["qsl"][:1] = 0
        _hostflag.store_release(mm, doff + self._desc_end_off, t)


# ----------------------------------------------------------------------------------------- proxy side


def _native_offsets(lay) -> tuple[np.ndarray, np.ndarray]:
    return native.meta_offsets(lay.meta_dtype), native.desc_offsets(lay.desc_dtype)



class RoundViews(NamedTuple):
    """Views of one round size n over the private descriptor and metadata copies and the round's int64
    and bool scratch. Made once per n seen (at most max_reqs + 1 of them, a few KB each), so a round
    does one dict lookup instead of ~20 slicings of 0.1 µs each."""

    d_slot: np.ndarray  # int32, as the engine wrote them
    slots: np.ndarray  # int64 scratch: the round's slots (numpy casts an int32 index before using it)
    req: np.ndarray
    qsl_next: np.ndarray  # qsl[1:n + 1]
    qsl_prev: np.ndarray  # qsl[:n]
    need_raw: np.ndarray  # u1, as the engine wrote them
    need: np.ndarray  # bool scratch
    need_u8: np.ndarray  # the same bytes as u1
    k_window: np.ndarray
    valid_raw: np.ndarray  # int32, as the engine wrote them
    valid_u32: np.ndarray  # the same bytes as uint32 (a negative value is huge)
    valid: np.ndarray  # int64 scratch (mixed int32/int64 arithmetic costs a cast per call)
    staged: np.ndarray
    first: np.ndarray
    anchor: np.ndarray
    seed: np.ndarray
    temperature: np.ndarray


class SlotReader:
    """The proxy's private copies of round t's descriptor and metadata, read under the stamp rule.

    After `read(t)`: `v` (the round's views), `max_q`, `rows_staged`, `n_staged` (resync windows staged
    with t), `n_misfit` (requests whose rows did not fit the staging), `d` (the descriptor record) and
    `staged_slots` (the descriptor's list of staged windows).

    `native`: the copies and the checks in one C call (_fastround.read_round, dspark_proxy/native.py);
    whenever it finds something wrong, `_validate` below (the reference) runs on its copies and says what,
    so both raise the same BadDescriptor. `mark`: check_slots' scratch (the C call leaves it the same)."""

    def __init__(self, seg: Segment, check_slots: Callable[[np.ndarray], str], native: bool = False,
                 mark: np.ndarray | None = None) -> None:
        p, lay = seg.params, seg.layout
        self.seg, self._check_slots = seg, check_slots
        self.native = native and mark is not None
        self._mark = mark
        self._moffs, self._doffs = _native_offsets(lay)
        self.M, self.W, self.R, self.max_rows = p.max_reqs, p.window, p.resync_per_round, p.max_rows
        self._desc = np.zeros(1, lay.desc_dtype)  # private copies of round t's slots ...
        self._meta = np.zeros(1, lay.meta_dtype)
        d = self.d = self._desc[0]  # ... and views of their fields, made once
        m = self._meta[0]
        # the copies as bytes, and the 64 slots they come from: a structured assignment copies field by
        # field (~6 µs); a byte copy is one memcpy
        self._desc_u8, self._meta_u8 = self._desc.view(np.uint8), self._meta.view(np.uint8)
        self._seg_desc_u8 = seg.desc.view(np.uint8).reshape(META_SLOTS, -1)
        self._seg_meta_u8 = seg.meta.view(np.uint8).reshape(META_SLOTS, -1)
        self._desc_offs = [lay.desc_off(i) for i in range(META_SLOTS)]
        self._meta_offs = [lay.meta_off(i) for i in range(META_SLOTS)]
        self._desc_end = lay.desc_dtype.fields["stamp_end"][1]
        self._meta_end = lay.meta_dtype.fields["stamp_end"][1]
        self._desc_hdr, self._desc_hdr_off = _u32_header(lay.desc_dtype, ("n", "max_q", "rows_gathered", "n_staged"))
        self._meta_hdr, self._meta_hdr_off = _u32_header(lay.meta_dtype, ("n", "rows_staged"))
        self.max_q = self.rows_staged = self.n_staged = self.n_misfit = 0
        self._d_slot, self._d_req, self._d_qsl = d["slot"], d["req_id"], d["qsl"]
        self._d_need, self._d_k = d["need_draft"], d["k_window"]
        self._m_valid, self._m_staged, self._m_first = m["valid"], m["staged_rows"], m["first_pos"]
        self._m_anchor, self._m_seed, self._m_temp = m["anchor"], m["seed"], m["temperature"]
        self.staged_slots = d["staged_slots"]
        # the round's slots and valid as int64, need_draft as bools; RoundViews holds their [:n] views
        self._slots = np.zeros(self.M, dtype=np.int64)
        self._valid = np.zeros(self.M, dtype=np.int64)
        self._need = np.zeros(self.M, dtype=np.bool_)
        self._views: dict[int, RoundViews] = {}
        self.v = self._views_of(0)
        self._held = None  # a _fastround.Held of what read_round writes and reads, made at the first read

    def _views_of(self, n: int) -> RoundViews:
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = RoundViews(
                self._d_slot[:n], self._slots[:n], self._d_req[:n], self._d_qsl[1:n + 1], self._d_qsl[:n],
                self._d_need[:n], self._need[:n], self._need[:n].view(np.uint8), self._d_k[:n],
                self._m_valid[:n], self._m_valid[:n].view(np.uint32), self._valid[:n], self._m_staged[:n],
                self._m_first[:n], self._m_anchor[:n], self._m_seed[:n], self._m_temp[:n])
        return v

    def n_of(self, t: int) -> int:
        """n of the last copy if it is round t's (0 otherwise): what a failed round reports."""
        return int(self._desc["n"][0]) if self._desc["t"][0] == t else 0

    def read(self, t: int) -> int:
        """Copy round t's descriptor and metadata out of their slots under the stamp rule, validate;
        returns n. Checks are counted, not branched on per field: each numpy call costs ~0.5 µs whatever
        n is; the exact count for the error message is only computed when something is wrong."""
        slot = t % META_SLOTS
        if self.native:
            held = self._held
            if held is None:  # the offsets, copies and scratch, their buffers taken once (_fastround_held.c)
                held = self._held = native.fastround.Held((self._moffs, self._doffs, self._desc_u8, self._meta_u8,
                                                           self._mark, self._slots, self._valid))
            return self.read_done(t, *native.fastround.read_round(
                self.seg.mm, self._desc_offs[slot], self._meta_offs[slot], held, t, self.M, self.W, self.R,
                self.max_rows))
        if not self._copy(t, self._desc_offs[slot], self._desc_end, self._seg_desc_u8[slot], self._desc_u8):
            code = 1
        elif not self._copy(t, self._meta_offs[slot], self._meta_end, self._seg_meta_u8[slot], self._meta_u8):
            code = 2
        else:
            code = 0
        return self.read_done(t, code) if code else self._validate()

    def read_done(self, t: int, code: int, n: int = 0, max_q: int = 0, rows: int = 0, n_staged: int = 0,
                  n_misfit: int = 0) -> int:
        """After the C read (read_round, or round_front in round/fused.py): its results taken, or the
        BadDescriptor the reference raises; returns n."""
        if code == 0:
            self.max_q = max_q
            self.v = self._views.get(n) or self._views_of(n)
            self.rows_staged, self.n_staged, self.n_misfit = rows, n_staged, n_misfit
            return n
        if code == 3:
            self._validate()
            raise AssertionError("read_round found a bad descriptor that the reference accepts")
        slot = t % META_SLOTS
        if code == 1:
            raise BadDescriptor(f"descriptor slot {slot} is not round {t}'s (stamps)")
        raise BadDescriptor(f"metadata slot {slot} is not round {t}'s (stamps)")

    def offsets(self, t: int) -> tuple[int, int]:
        """Round t's descriptor and metadata slots' offsets in the segment."""
        slot = t % META_SLOTS
        return self._desc_offs[slot], self._meta_offs[slot]

    def front_arrays(self) -> tuple[np.ndarray, ...]:
        """What read_round's Held holds, in its order, then need's scratch (round/fused.py holds them too)."""
        return (self._moffs, self._doffs, self._desc_u8, self._meta_u8, self._mark, self._slots, self._valid,
                self._need)

    def _validate(self) -> int:
        """The reference checks of the copies; returns n."""
        n, self.max_q, rows_gathered, n_staged = self._desc_hdr.unpack_from(self._desc_u8, self._desc_hdr_off)
        meta_n, rows = self._meta_hdr.unpack_from(self._meta_u8, self._meta_hdr_off)
        if not 0 <= n <= self.M or meta_n != n:
            raise BadDescriptor(f"n={n} (meta n={meta_n}) outside [0, {self.M}]")
        v = self.v = self._views.get(n) or self._views_of(n)
        slots = v.slots
        slots[:] = v.d_slot
        why = self._check_slots(slots)
        if why:
            raise BadDescriptor(why)
        valid, staged, first = v.valid_raw, v.staged, v.first
        # valid in [0, W] in one comparison: a negative int32 viewed as uint32 is huge
        bad = np.count_nonzero(v.valid_u32 > self.W) + np.count_nonzero(first < 0)
        # staged_rows is valid (the rows fit) or 0 (they did not)
        misfit = staged != valid
        n_misfit = int(np.count_nonzero(misfit))
        if n_misfit:
            bad += np.count_nonzero(misfit & (staged != 0))
        if bad or np.count_nonzero(v.qsl_next < v.qsl_prev):
            bad = int(np.count_nonzero((valid < 0) | (valid > self.W) | ((staged != 0) & (staged != valid))
                                       | (first < 0)))
            bad += int(np.count_nonzero(v.qsl_next < v.qsl_prev))
            raise BadDescriptor(f"{bad} request fields out of range (valid, staged_rows, first_pos or qsl)")
        if int(np.add.reduce(staged)) != rows or rows > self.max_rows or rows_gathered != rows:
            raise BadDescriptor(f"rows_staged={rows} disagrees with the per-request counts or max_rows")
        if not 0 <= n_staged <= self.R:
            raise BadDescriptor(f"n_staged={n_staged} outside [0, {self.R}]")
        v.valid[:] = valid
        self.rows_staged, self.n_staged, self.n_misfit = rows, n_staged, n_misfit
        return n

    def _copy(self, t: int, off: int, end_off: int, src: np.ndarray, dst: np.ndarray) -> bool:
        mm = self.seg.mm
        if _hostflag.load(mm, off + end_off) != t:
            return False
        dst[:] = src
        return _hostflag.load_after(mm, off) == t
