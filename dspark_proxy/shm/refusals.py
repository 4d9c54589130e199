"""Engines the segment refused, recorded in the segment itself so that `status` lists them (shm_layout.md
§1, "Refused engines").

An engine whose shapes differ from the segment's (LayoutMismatch: max_reqs, num_spec, ...) never
attaches, so the proxy has no other way to learn it was tried. The engine that finds the mismatch
writes one small record into the header page, past the engine ring's name: its pid, the field and
both values. The last REFUSED_SLOTS distinct refusals are kept; an engine that finds the same
mismatch again (the watchdog looks once per incarnation) writes nothing new.

A count word claims a slot (CAS), and each slot is a seqlock (`_hostflag.seq_write` / `seq_read`), so
a reader sees a whole record or none. Two engines refused at once land in different slots; only a
wrap-around while another write is in flight could tear a slot, and that slot then reads as none.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from . import _hostflag
from .layout import PAGE

__all__ = ["REFUSED_OFF", "REFUSED_SLOTS", "record_refusal", "read_refusals"]

REFUSED_OFF = 2560  # byte offset in the header page: the count word, then the slots
REFUSED_SLOTS = 3
_SLOT = 504  # a seq word, then a u64 length and the record's JSON
_JSON_MAX = _SLOT - 16
_VALUE_MAX = 120  # characters of each value kept (a target id is 71)
assert REFUSED_OFF >= 2432 and REFUSED_OFF + 8 + REFUSED_SLOTS * _SLOT <= PAGE  # past the ring's name


def _slot_off(i: int) -> int:
    return REFUSED_OFF + 8 + i * _SLOT


def _short(v: object) -> object:
    if isinstance(v, bool | int | float) or v is None:
        return v
    s = str(v)
    return s if len(s) <= _VALUE_MAX else s[:_VALUE_MAX - 3] + "..."


def read_refusals(mm) -> list[dict[str, Any]]:
    """The refusals recorded, oldest first (each {"pid", "field", "segment", "engine", "at_unix"})."""
    n = _hostflag.load(mm, REFUSED_OFF)
    out = []
    for k in range(max(0, n - REFUSED_SLOTS), n):
        dst = bytearray(_SLOT - 8)
        if not _hostflag.seq_read(mm, _slot_off(k % REFUSED_SLOTS), _slot_off(k % REFUSED_SLOTS) + 8, dst, 100):
            continue
        size = int.from_bytes(dst[:8], "little")
        if size > _JSON_MAX:
            continue
        try:
            rec = json.loads(bytes(dst[8:8 + size]))
        except ValueError:
            continue
        if isinstance(rec, dict) and {"pid", "field", "segment", "engine"} <= rec.keys():
            out.append(rec)
    return out


def record_refusal(mm, field: str, segment_value: object, engine_value: object, pid: int | None = None) -> bool:
    """Engine side, refused: record it (False when the same refusal of this pid is recorded already)."""
    rec = {"pid": os.getpid() if pid is None else int(pid), "field": str(field)[:40],
           "segment": _short(segment_value), "engine": _short(engine_value), "at_unix": round(time.time(), 3)}
    same = ("pid", "field", "segment", "engine")
    if any(all(r.get(k) == rec[k] for k in same) for r in read_refusals(mm)):
        return False
    raw = json.dumps(rec, separators=(",", ":")).encode()[:_JSON_MAX]
    while True:
        n = _hostflag.load(mm, REFUSED_OFF)
        if _hostflag.cas(mm, REFUSED_OFF, n, n + 1):
            break
    off = _slot_off(n % REFUSED_SLOTS)
    _hostflag.seq_write(mm, off, off + 8, len(raw).to_bytes(8, "little") + raw)
    return True
