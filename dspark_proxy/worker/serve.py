"""One STEP's entries applied to a session and drafted: the serve loop of the remote worker
(`WorkerServer`) and of the in-process one (`inproc.InProcessClient`), so both follow one usability
rule and one order.

Entries are applied one by one in batch order (the reference the proxy's vectorised ring model is
checked against, written for clarity); a malformed entry (`wire.bad_entry_mask`) gets RS_BAD_ENTRY
and changes nothing. A drafter that works on a per-row transform (`project_rows`: the torch drafter's
projection) gets the STEP's rows in one call before they are applied, and each slot keeps the
transforms beside its rows (worker/session.py), so the drafter reads its windows' transforms without
asking which rows are new. Should that call raise, the rows are applied without them (the slots'
windows are then transformed whole, as the drafter needs them) and this STEP's drafts fail. A request
is drafted when its status is usable (`USABLE_STATUS_TABLE`: ok or partial window) and it asked for
drafts (RF_NEED_DRAFT). `out` is anything with ReplyWriter's
arrays (status, window_rows, draft_ids, confidence and the optional sections), cleared beforehand.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import zlib
from collections.abc import MutableMapping
from typing import Any

import numpy as np

from ..crc import WindowShifts
from ..wire import (
    ENTRY_DTYPE,
    RF_NEED_DRAFT,
    RS_BAD_ENTRY,
    RS_INTERNAL,
    USABLE_STATUS_TABLE,
    WireLayout,
    bad_entry_mask,
)
from .drafters import Drafter, DraftItem
from .drafters.base import project_at
from .session import Session

__all__ = ["serve_step"]

log = logging.getLogger("dspark_proxy.worker.server")

_ANCHOR_HDR = struct.Struct("<iq")  # anchor_token int32 LE, anchor_pos int64 LE (dspark_proxy.integrity)
assert ENTRY_DTYPE.names == ("slot", "n_rows", "generation", "first_pos", "anchor_pos", "anchor_token", "flags",
                             "k_window", "n_out", "_pad"), "serve_step unpacks the entries' fields in this order"


def serve_step(session: Session, entries: np.ndarray, rows: np.ndarray, sample_meta: np.ndarray | None, out: Any,
               layout: WireLayout, drafter: Drafter, counters: MutableMapping[str, int], *,
               shift_w: WindowShifts | None = None, draft_lock: Any = None, drafter_name: str = "") -> None:
    """Apply `entries` (rows: [n_rows, row_bytes], in entry order) to `session` and draft for the usable
    requests into `out`. shift_w: the integrity drafter's CRC shifts, to hash windows from the slots'
    CRC chains (None: the drafter reads the rows). A drafter that raises fails its requests
    (RS_INTERNAL), never the step."""
    n = entries.shape[0]
    bad = bad_entry_mask(entries, layout).tolist()
    meta = sample_meta
    items: list[DraftItem] = []
    aux, failed = None, False
    # a STEP that asks no drafts (the proxy's gate paused the batch) is applied without transforms: its
    # slots' windows get theirs when drafts are next asked (_repair), not every paused round
    if n and (entries["flags"] & RF_NEED_DRAFT).any():
        with draft_lock if draft_lock is not None else contextlib.nullcontext():  # the drafter's kernels, one caller
            aux, failed = _transforms(drafter, rows, counters, drafter_name, entries)
    ends_crc: list[tuple[int, int]] = []  # per item: (A(a - 1), A(hi - 1)) of its slot's CRC chain
    windows: list = []  # per item: its slot's SlotWindow
    status, held = [RS_BAD_ENTRY] * n, [0] * n
    end = 0
    # one conversion of the entries to Python values (ENTRY_DTYPE's fields in order; a field per
    # `tolist` cost a numpy call each, a round's largest share of this function at a few requests)
    for i, (slot, k, gen, first, anchor, token, flags, _kw, n_out, _pad) in enumerate(entries.tolist()):
        end += k
        if bad[i]:
            counters["bad_entries"] += 1
            if slot >= layout.max_reqs:
                counters["bad_entry_slot"] += 1  # beyond the agreed max_reqs: no window for it
            continue
        st, w = session.apply(slot, gen, first, k, flags, rows[end - k:end], None if aux is None else aux[end - k:end])
        status[i], held[i] = st, w
        if USABLE_STATUS_TABLE[st] and flags & RF_NEED_DRAFT:
            sw = session.slots[slot]
            items.append(DraftItem(i, token, anchor, w, n_out, sw.segments(w),
                                   int(meta["seed"][i]) if meta is not None else 0,
                                   float(meta["temperature"][i]) if meta is not None else 0.0,
                                   aux=sw.aux_window(w)))
            windows.append(sw)
            if shift_w is not None:
                ends_crc.append(sw.chain_ends(w))
    if n:
        out.status[:n] = status
        out.window_rows[:n] = held
    if not items:
        return
    if failed:
        _fail(items, out)
        return
    if shift_w is not None:
        _integrity_crcs(shift_w, items, ends_crc)
    with draft_lock if draft_lock is not None else contextlib.nullcontext():
        _repair(drafter, items, windows, counters, drafter_name)
    try:
        with draft_lock if draft_lock is not None else contextlib.nullcontext():
            drafter.draft(items, out)
    except Exception:
        log.exception("[worker] drafter %s failed for %d requests", drafter_name or drafter.name, len(items))
        counters["drafter_errors"] += 1
        _fail(items, out)


def _transforms(drafter: Drafter, rows: np.ndarray, counters: MutableMapping[str, int], drafter_name: str,
                entries: np.ndarray) -> tuple[np.ndarray | None, bool]:
    """(the drafter's per-row transforms of the STEP's rows, or None; True when computing them raised).
    A transform that depends on the row's position (`project_rows.needs_positions`: the dspark drafter's
    rotary keys) gets each row's position too, first_pos + its offset in its entry."""
    project = getattr(drafter, "project_rows", None)
    if project is None or not rows.shape[0]:
        return None, False

    def positions() -> np.ndarray:  # each row's: first_pos + its offset in its entry
        k = entries["n_rows"].astype(np.int64)
        starts = np.cumsum(k) - k
        return (np.repeat(entries["first_pos"].astype(np.int64) - starts, k) + np.arange(int(k.sum())))[:rows.shape[0]]

    try:
        return project_at(project, rows, positions), False
    except Exception:
        log.exception("[worker] drafter %s failed to transform %d rows", drafter_name or drafter.name, rows.shape[0])
        counters["drafter_errors"] += 1
        return None, True


def _repair(drafter: Drafter, items: list[DraftItem], windows: list, counters: MutableMapping[str, int],
            drafter_name: str) -> None:
    """Windows asked for drafts without their rows' transforms (rows applied while the batch was paused,
    or while projecting failed): their transforms, in one call for the STEP, kept in their slots' rings
    (SlotWindow.fill_aux), so each such window is transformed once, not every round after. Should the
    call raise, the drafter transforms those windows itself (or fails them)."""
    project = getattr(drafter, "project_rows", None)
    fix = [j for j, it in enumerate(items) if it.aux is None and it.w > 0]
    if project is None or not fix:
        return
    raw = np.concatenate([seg for j in fix for seg in items[j].segments])
    def positions() -> np.ndarray:  # each window's: the w before its anchor
        return np.concatenate([np.arange(items[j].anchor_pos - items[j].w, items[j].anchor_pos) for j in fix])

    try:
        tr = project_at(project, raw, positions)
    except Exception:
        log.exception("[worker] drafter %s failed to transform %d windows", drafter_name or drafter.name, len(fix))
        counters["drafter_errors"] += 1
        return
    off = 0
    for j in fix:
        it, sw = items[j], windows[j]
        sw.fill_aux(it.w, tr[off:off + it.w])
        off += it.w
        it.aux = sw.aux_window(it.w)


def _fail(items: list[DraftItem], out: Any) -> None:
    idx = np.array([it.index for it in items])
    out.status[idx] = RS_INTERNAL
    out.draft_ids[idx] = -1
    out.confidence[idx] = 0.0


def _integrity_crcs(shift_w: WindowShifts, items: list[DraftItem], ends_crc: list[tuple[int, int]]) -> None:
    """The integrity hash of every item from its slot's CRC chain, for the whole batch at once:
    crc(hdr ‖ window) = shift(w L)(crc(hdr) ^ A(a - 1)) ^ A(hi - 1) (dspark_proxy.crc). No row is
    read again: each was hashed once, when it arrived."""
    k = len(items)
    hdr = np.fromiter((zlib.crc32(_ANCHOR_HDR.pack(it.anchor_token, it.anchor_pos)) for it in items),
                      dtype=np.uint32, count=k)
    ce = np.array(ends_crc, dtype=np.uint32).reshape(k, 2)
    w = np.fromiter((it.w for it in items), dtype=np.intp, count=k)
    h = shift_w.apply(hdr ^ ce[:, 0], w) ^ ce[:, 1]
    for it, hv in zip(items, h.tolist(), strict=True):
        it.crc = hv
