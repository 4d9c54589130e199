"""The target the attached engine names (`attach(..., target_id=...)`), carried to its proxy through the
segment so that the proxy's HELLO names it and a worker can refuse a head made for another target
(shm_layout.md §1, "Engine target").

A small length-prefixed field in the header page, past the header record: written once by the engine
that won the attach claim (after its CAS of `engine_pid`, before it stores `attached`), read by the
proxy once it sees `attached`. Each incarnation is a fresh, zeroed segment, so an engine that names no
target leaves it empty. What is read is checked (length, printable ASCII): a damaged field reads as
no target, never as someone else's.
"""

from __future__ import annotations

import struct

from .layout import HEADER_DTYPE, PAGE

__all__ = ["TARGET_OFF", "TARGET_MAX", "write_engine_target", "read_engine_target", "check_target_id"]

TARGET_OFF = 2048  # byte offset in the header page
TARGET_MAX = 254  # bytes of the id (a u16 length before it)
_LEN = struct.Struct("<H")
assert HEADER_DTYPE.itemsize <= TARGET_OFF and TARGET_OFF + _LEN.size + TARGET_MAX <= PAGE


def check_target_id(target_id: str) -> str:
    """The id as given, or ValueError: printable ASCII, at most TARGET_MAX bytes ("" = none)."""
    if not isinstance(target_id, str):
        raise ValueError(f"target_id={target_id!r}: expected a string")
    if len(target_id) > TARGET_MAX or not all(" " < c <= "~" for c in target_id):
        raise ValueError(f"target_id={target_id[:40]!r}: at most {TARGET_MAX} printable ASCII characters, "
                         "no spaces (e.g. dspark_proxy.model.hf.target_id's 'sha256:...')")
    return target_id


def write_engine_target(mm, target_id: str) -> None:
    """Engine, holding the attach claim: name the target (or clear the field for "")."""
    raw = check_target_id(target_id).encode("ascii")
    mm[TARGET_OFF + _LEN.size:TARGET_OFF + _LEN.size + len(raw)] = raw
    mm[TARGET_OFF:TARGET_OFF + _LEN.size] = _LEN.pack(len(raw))


def read_engine_target(mm) -> str:
    """Proxy, after `attached`: the target the engine named, "" when none (or unreadable)."""
    (n,) = _LEN.unpack(bytes(mm[TARGET_OFF:TARGET_OFF + _LEN.size]))
    if n > TARGET_MAX:
        return ""
    raw = bytes(mm[TARGET_OFF + _LEN.size:TARGET_OFF + _LEN.size + n])
    try:
        return check_target_id(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return ""
