"""Every fixed byte layout of the wire protocol, declared once and checked at import.

The byte tables in FORMAT.md next to this file document the same layouts; a test parses them and
compares them with these dtypes, so the two cannot drift. All layouts are little-endian with explicit
'<' byte order and every section of a payload starts 8-aligned, so numpy views of it are aligned
whenever the frame itself is.
"""

from __future__ import annotations

import struct

import numpy as np

from ..limits import SUPPORT_K

__all__ = [
    "MAGIC", "PROTOCOL_VERSION",
    "MSG_HELLO", "MSG_CHALLENGE", "MSG_AUTH", "MSG_WELCOME", "MSG_STEP", "MSG_REPLY",
    "MSG_NEW_SESSION", "MSG_ERROR", "MSG_PING", "MSG_PONG", "MSG_NAMES", "CONTROL_TYPES",
    "APP_HEADER_STRUCT", "APP_HEADER_DTYPE", "APP_HEADER_SIZE",
    "STEP_HDR_DTYPE", "STEP_HDR_SIZE", "ENTRY_DTYPE", "ENTRY_SIZE", "SAMPLE_DTYPE", "SAMPLE_SIZE",
    "REPLY_HDR_DTYPE", "REPLY_HDR_SIZE", "TOP_K",
    "RF_NEED_DRAFT", "RF_NEW_GEN", "RF_RESYNC", "RF_ALL",
    "SF_WANT_MARGIN", "SF_SAMPLED", "SF_ALL",
    "RS_OK", "RS_PARTIAL_WINDOW", "RS_STALE_GENERATION", "RS_BAD_ENTRY", "RS_GAP", "RS_UNKNOWN_SLOT",
    "RS_INTERNAL", "RS_MAX", "REQ_STATUS_NAMES", "USABLE_REQ_STATUS", "USABLE_STATUS_TABLE",
    "align8", "rows_offset_for", "step_prefix_bytes", "entries_view", "sample_view",
]

MAGIC = int.from_bytes(b"DSPK", "little")
PROTOCOL_VERSION = 1

# message types (AppHeader.type)
MSG_HELLO = 1
MSG_CHALLENGE = 2
MSG_AUTH = 3
MSG_WELCOME = 4
MSG_STEP = 5
MSG_REPLY = 6
MSG_NEW_SESSION = 7
MSG_ERROR = 8
MSG_PING = 9
MSG_PONG = 10
MSG_NAMES = {MSG_HELLO: "HELLO", MSG_CHALLENGE: "CHALLENGE", MSG_AUTH: "AUTH", MSG_WELCOME: "WELCOME",
             MSG_STEP: "STEP", MSG_REPLY: "REPLY", MSG_NEW_SESSION: "NEW_SESSION", MSG_ERROR: "ERROR",
             MSG_PING: "PING", MSG_PONG: "PONG"}
# the msgpack-encoded messages (everything but STEP and REPLY)
CONTROL_TYPES = frozenset(MSG_NAMES) - {MSG_STEP, MSG_REPLY}

# The fixed application header that starts every frame. struct is faster than numpy for one record;
# the dtype is the same layout, for the doc test and for views.
APP_HEADER_STRUCT = struct.Struct("<IHBBQQQII")
APP_HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "<u2"), ("type", "u1"), ("flags", "u1"),
    ("session", "<u8"), ("epoch", "<u8"), ("step_id", "<u8"),
    ("payload_len", "<u4"), ("reserved", "<u4"),
])
APP_HEADER_SIZE = 40

STEP_HDR_DTYPE = np.dtype([("n_req", "<u4"), ("n_rows", "<u4"), ("row_bytes", "<u4"), ("step_flags", "<u4")])
STEP_HDR_SIZE = 16

ENTRY_DTYPE = np.dtype([
    ("slot", "<u4"), ("n_rows", "<u4"), ("generation", "<u8"),
    ("first_pos", "<i8"), ("anchor_pos", "<i8"), ("anchor_token", "<i4"),
    ("flags", "u1"), ("k_window", "u1"), ("n_out", "u1"), ("_pad", "u1"),
])
ENTRY_SIZE = 40

SAMPLE_DTYPE = np.dtype([("seed", "<i8"), ("temperature", "<f4"), ("_pad", "<u4")])
SAMPLE_SIZE = 16

REPLY_HDR_DTYPE = np.dtype([
    ("n_req", "<u4"), ("num_spec", "<u4"), ("step_flags", "<u4"), ("reserved", "<u4"), ("worker_us", "<f8"),
])
REPLY_HDR_SIZE = 24

TOP_K = SUPPORT_K  # support size of the sampled-mode proposal (the reply page's too: limits.py)

# entry flags (ENTRY_DTYPE.flags)
RF_NEED_DRAFT = 1
RF_NEW_GEN = 2
RF_RESYNC = 4
RF_ALL = RF_NEED_DRAFT | RF_NEW_GEN | RF_RESYNC

# step flags (StepHeader.step_flags, echoed in ReplyHeader.step_flags)
SF_WANT_MARGIN = 1
SF_SAMPLED = 2
SF_ALL = SF_WANT_MARGIN | SF_SAMPLED

# per-request reply statuses
RS_OK = 0
RS_PARTIAL_WINDOW = 1
RS_STALE_GENERATION = 2
RS_BAD_ENTRY = 3
RS_GAP = 4
RS_UNKNOWN_SLOT = 5
RS_INTERNAL = 6
RS_MAX = RS_INTERNAL
REQ_STATUS_NAMES = {RS_OK: "ok", RS_PARTIAL_WINDOW: "partial_window", RS_STALE_GENERATION: "stale_generation",
                    RS_BAD_ENTRY: "bad_entry", RS_GAP: "gap", RS_UNKNOWN_SLOT: "unknown_slot",
                    RS_INTERNAL: "internal"}
USABLE_REQ_STATUS = frozenset({RS_OK, RS_PARTIAL_WINDOW})
# vectorised form: usable = USABLE_STATUS_TABLE[reply.status]
USABLE_STATUS_TABLE = np.zeros(256, dtype=bool)
USABLE_STATUS_TABLE[list(USABLE_REQ_STATUS)] = True
USABLE_STATUS_TABLE.setflags(write=False)

assert APP_HEADER_STRUCT.size == APP_HEADER_SIZE == APP_HEADER_DTYPE.itemsize
assert STEP_HDR_DTYPE.itemsize == STEP_HDR_SIZE
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE
assert SAMPLE_DTYPE.itemsize == SAMPLE_SIZE
assert REPLY_HDR_DTYPE.itemsize == REPLY_HDR_SIZE
assert APP_HEADER_SIZE % 8 == 0 and STEP_HDR_SIZE % 8 == 0 and ENTRY_SIZE % 8 == 0 and SAMPLE_SIZE % 8 == 0


def align8(n: int) -> int:
    """Round n up to a multiple of 8: every payload section starts 8-aligned."""
    return (n + 7) & ~7


def rows_offset_for(n_req: int, sampled: bool) -> int:
    """Bytes from the start of a STEP payload to its first row (step header, entries, sample meta).

    The engine side gathers rows straight to APP_HEADER_SIZE + this offset in its staging, so the
    proxy sends them where they lie. Always a multiple of 8.
    """
    return STEP_HDR_SIZE + n_req * ENTRY_SIZE + (n_req * SAMPLE_SIZE if sampled else 0)


def step_prefix_bytes(max_reqs: int, sampled: bool) -> int:
    """Size of a caller-owned STEP prefix buffer (app header + step header + entries + sample meta)."""
    return APP_HEADER_SIZE + rows_offset_for(max_reqs, sampled)


def entries_view(prefix, n_req: int) -> np.ndarray:
    """ENTRY_DTYPE [n_req] view into a STEP prefix buffer, for filling entries in place (no copy)."""
    return np.frombuffer(prefix, dtype=ENTRY_DTYPE, count=n_req, offset=APP_HEADER_SIZE + STEP_HDR_SIZE)


def sample_view(prefix, n_req: int) -> np.ndarray:
    """SAMPLE_DTYPE [n_req] view into a STEP prefix buffer; its place depends on n_req (after the entries)."""
    return np.frombuffer(prefix, dtype=SAMPLE_DTYPE, count=n_req,
                         offset=APP_HEADER_SIZE + STEP_HDR_SIZE + n_req * ENTRY_SIZE)
