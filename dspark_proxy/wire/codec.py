"""Sans-IO encoding and decoding of frames (h11 style): bytes in, frames out; no sockets, no clocks.

A frame is the 40-byte application header followed by `payload_len` bytes. `Decoder` turns a byte
stream into frames. It works either with `feed(data)` (tests, fuzzing) or zero-copy with
`recv_buffer()` + `advance(n)`, where the caller's `recv_into` writes straight into the decoder's
buffers: a small read-ahead buffer while a header is awaited, then the frame's own payload buffer,
allocated only after the header's length has been checked against the per-type limit.

Payload decoders (`decode_step`, `decode_reply`, `decode_control`) validate every length, count and
enum before building views, and raise only `RemoteProtocolError`. Encoders raise
`LocalProtocolError` for arguments the format cannot carry.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
import numpy as np

from ..native import enabled as _native_enabled
from ..native import entry_offsets
from ..native import fastround as _fastround
from .dtypes import (
    APP_HEADER_SIZE,
    APP_HEADER_STRUCT,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    MAGIC,
    MSG_REPLY,
    MSG_STEP,
    PROTOCOL_VERSION,
    REPLY_HDR_SIZE,
    RF_ALL,
    RF_NEW_GEN,
    RF_RESYNC,
    SAMPLE_DTYPE,
    SF_ALL,
    SF_SAMPLED,
    STEP_HDR_SIZE,
    TOP_K,
    USABLE_STATUS_TABLE,
    rows_offset_for,
)
from .errors import LocalProtocolError, RemoteProtocolError
from .messages import (
    CONTROL_TYPE_OF,
    MAX_CONTROL_PAYLOAD,
    AppHeader,
    ControlMessage,
    ReplyLayout,
    StepReply,
    StepView,
    WireLayout,
    reply_layout,
)
from .reply_checks import REPLY_SECTION_ERRORS, reply_section_error, reply_section_error_reference

__all__ = [
    "Frame", "NEED_DATA", "Decoder", "parse_app_header", "pack_app_header",
    "encode_control", "decode_control", "fill_step_prefix", "encode_step", "decode_step",
    "bad_entry_mask", "bad_entry_mask_reference", "ReplyWriter", "decode_reply",
]

_STEP_HDR = struct.Struct("<IIII")
_REPLY_HDR = struct.Struct("<IIIId")
_MAX_U32 = 2**32 - 1
assert _STEP_HDR.size == STEP_HDR_SIZE and _REPLY_HDR.size == REPLY_HDR_SIZE


class _NeedData:
    """Sentinel: the decoder needs more bytes before it can return a frame."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()


@dataclass(frozen=True)
class Frame:
    header: AppHeader
    payload: memoryview


def parse_app_header(buf, limits: Mapping[int, int]) -> AppHeader:
    """Validate and parse the 40-byte header at the start of buf; `limits` maps each acceptable
    message type to its largest payload."""
    if len(buf) < APP_HEADER_SIZE:
        raise RemoteProtocolError("short header", counter="bad_frame_header")
    magic, version, mtype, flags, session, epoch, step_id, payload_len, reserved = \
        APP_HEADER_STRUCT.unpack_from(buf, 0)
    if magic != MAGIC:
        raise RemoteProtocolError(f"bad magic 0x{magic:08x}", counter="bad_magic")
    if version != PROTOCOL_VERSION:
        raise RemoteProtocolError(f"protocol version {version}, expected {PROTOCOL_VERSION}",
                                  counter="bad_version")
    limit = limits.get(mtype)
    if limit is None:
        raise RemoteProtocolError(f"unexpected message type {mtype}", counter="unexpected_type")
    if flags != 0 or reserved != 0:
        raise RemoteProtocolError("nonzero header flags/reserved", counter="bad_frame_header")
    if payload_len > limit:
        raise RemoteProtocolError(f"payload of {payload_len} bytes over the limit {limit} for type {mtype}",
                                  counter="frame_too_large")
    return AppHeader(mtype, flags, session, epoch, step_id, payload_len)


def pack_app_header(buf, offset: int, mtype: int, *, session: int, epoch: int, step_id: int,
                    payload_len: int) -> None:
    if not (0 <= payload_len <= _MAX_U32):
        raise LocalProtocolError(f"payload_len {payload_len} does not fit u32")
    try:
        APP_HEADER_STRUCT.pack_into(buf, offset, MAGIC, PROTOCOL_VERSION, mtype, 0, session, epoch, step_id,
                                    payload_len, 0)
    except struct.error as e:
        raise LocalProtocolError(f"header field out of range: {e}") from e


class Decoder:
    """Byte stream → frames, refusing any header before a byte of its payload is buffered.

    limits: message type → largest payload accepted (types not listed are refused). With
    reuse_payload, one payload buffer is reused, so a frame is valid only until the next call to
    next_frame(); the caller must then drain next_frame() to NEED_DATA before receiving more.
    """

    def __init__(self, limits: Mapping[int, int], *, max_frame_bytes: int, readahead_bytes: int = 65536,
                 reuse_payload: bool = False) -> None:
        self._ra = bytearray(max(readahead_bytes, 2 * APP_HEADER_SIZE))
        self._ra_start = 0
        self._ra_end = 0
        self._ready: deque[Frame] = deque()
        self._pl: np.ndarray | None = None
        self._pl_len = 0
        self._pl_got = 0
        self._hdr: AppHeader | None = None
        self._reuse = reuse_payload
        self._held = False
        self._shared = np.empty(0, dtype=np.uint8)
        self.set_limits(limits, max_frame_bytes=max_frame_bytes)

    def set_limits(self, limits: Mapping[int, int], *, max_frame_bytes: int) -> None:
        """Change what is accepted (e.g. once the handshake is done); applies from the next header."""
        cap = max(0, max_frame_bytes - APP_HEADER_SIZE)
        self._limits = {t: min(int(v), cap) for t, v in limits.items()}

    # zero-copy receive: recv_into(decoder.recv_buffer()) then decoder.advance(n)
    def recv_buffer(self) -> memoryview:
        if self._pl is not None:
            return memoryview(self._pl)[self._pl_got:self._pl_len]
        if self._ra_start:
            n = self._ra_end - self._ra_start
            self._ra[:n] = self._ra[self._ra_start:self._ra_end]
            self._ra_start, self._ra_end = 0, n
        if self._ra_end >= len(self._ra):
            raise LocalProtocolError("decoder buffer full: drain next_frame() before receiving more")
        return memoryview(self._ra)[self._ra_end:]

    def advance(self, n: int) -> None:
        if self._pl is not None:
            self._pl_got += n
        else:
            self._ra_end += n
        self._progress()

    def feed(self, data) -> None:
        """Copy bytes in (tests and fuzzing); frames come out of next_frame()."""
        mv = memoryview(data).cast("B")
        i = 0
        while i < len(mv):
            buf = self.recv_buffer()
            k = min(len(buf), len(mv) - i)
            buf[:k] = mv[i:i + k]
            i += k
            self.advance(k)

    def next_frame(self) -> Frame | _NeedData:
        """The next complete frame, or NEED_DATA. Raises RemoteProtocolError on a bad header; the
        stream is then out of sync and the connection must be dropped."""
        self._held = False  # the frame returned last time is released: its buffer may be reused
        self._progress()
        if self._ready:
            self._held = self._reuse
            return self._ready.popleft()
        return NEED_DATA

    @property
    def has_frame(self) -> bool:
        """A complete frame is waiting for next_frame()."""
        return bool(self._ready)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames (0 at a frame boundary)."""
        return (self._ra_end - self._ra_start) + (self._pl_got if self._pl is not None else 0)

    def _payload_buffer(self, n: int) -> np.ndarray:
        if not self._reuse:
            return np.empty(n, dtype=np.uint8)
        if self._shared.shape[0] < n:
            self._shared = np.empty(max(n, 2 * self._shared.shape[0]), dtype=np.uint8)
        return self._shared

    def _progress(self) -> None:
        while True:
            if self._pl is None:
                if self._reuse and (self._ready or self._held):
                    return
                avail = self._ra_end - self._ra_start
                if avail < APP_HEADER_SIZE:
                    return
                hdr = parse_app_header(memoryview(self._ra)[self._ra_start:self._ra_end], self._limits)
                self._ra_start += APP_HEADER_SIZE
                n = hdr.payload_len
                buf = self._payload_buffer(n)
                take = min(avail - APP_HEADER_SIZE, n)
                if take:
                    buf[:take] = np.frombuffer(self._ra, dtype=np.uint8, count=take, offset=self._ra_start)
                    self._ra_start += take
                self._pl, self._pl_len, self._pl_got, self._hdr = buf, n, take, hdr
            if self._pl_got < self._pl_len:
                return
            assert self._hdr is not None
            self._ready.append(Frame(self._hdr, memoryview(self._pl)[:self._pl_len]))
            self._pl, self._hdr = None, None


# ---------------------------------------------------------------- control messages (msgpack)

_CONTROL_DECODER = msgspec.msgpack.Decoder(ControlMessage)
_ENCODER = msgspec.msgpack.Encoder()


def encode_control(msg, *, session: int = 0, epoch: int = 0, step_id: int = 0) -> bytes:
    mtype = CONTROL_TYPE_OF.get(type(msg))
    if mtype is None:
        raise LocalProtocolError(f"not a control message: {type(msg).__name__}")
    body = _ENCODER.encode(msg)
    if len(body) > MAX_CONTROL_PAYLOAD:
        raise LocalProtocolError(f"control message of {len(body)} bytes over {MAX_CONTROL_PAYLOAD}")
    out = bytearray(APP_HEADER_SIZE + len(body))
    pack_app_header(out, 0, mtype, session=session, epoch=epoch, step_id=step_id, payload_len=len(body))
    out[APP_HEADER_SIZE:] = body
    return bytes(out)


def decode_control(frame: Frame) -> ControlMessage:
    if frame.header.payload_len > MAX_CONTROL_PAYLOAD:
        raise RemoteProtocolError("control message too large", counter="frame_too_large")
    try:
        msg = _CONTROL_DECODER.decode(frame.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise RemoteProtocolError(f"bad control message: {e}", counter="bad_control") from e
    if CONTROL_TYPE_OF[type(msg)] != frame.header.type:
        raise RemoteProtocolError(f"{type(msg).__name__} under frame type {frame.header.type}",
                                  counter="bad_control")
    return msg


# ---------------------------------------------------------------- STEP

def fill_step_prefix(prefix, *, n_req: int, n_rows: int, row_bytes: int, step_flags: int, session: int,
                     epoch: int, step_id: int) -> int:
    """Write the app header and step header into a STEP prefix buffer (whose entries and sample
    meta the caller filled in place); returns the prefix length to send before the rows."""
    if step_flags & ~SF_ALL:
        raise LocalProtocolError(f"unknown step flags 0x{step_flags:x}")
    if n_req < 0 or n_rows < 0 or row_bytes <= 0:
        raise LocalProtocolError(f"bad STEP sizes n_req={n_req} n_rows={n_rows} row_bytes={row_bytes}")
    off = rows_offset_for(n_req, bool(step_flags & SF_SAMPLED))
    if len(prefix) < APP_HEADER_SIZE + off:
        raise LocalProtocolError(f"prefix of {len(prefix)} bytes too small for {n_req} requests")
    pack_app_header(prefix, 0, MSG_STEP, session=session, epoch=epoch, step_id=step_id,
                    payload_len=off + n_rows * row_bytes)
    _STEP_HDR.pack_into(prefix, APP_HEADER_SIZE, n_req, n_rows, row_bytes, step_flags)
    return APP_HEADER_SIZE + off


def encode_step(entries: np.ndarray, rows: np.ndarray, *, row_bytes: int, step_flags: int = 0,
                sample_meta: np.ndarray | None = None, session: int = 0, epoch: int = 0,
                step_id: int = 0) -> list[memoryview]:
    """A whole STEP as [prefix, rows] buffers (tests and tools; the client fills a prefix in place)."""
    n = int(entries.shape[0])
    sampled = bool(step_flags & SF_SAMPLED)
    if sampled != (sample_meta is not None):
        raise LocalProtocolError("sample_meta must be given exactly when SF_SAMPLED is set")
    rows_u8 = np.ascontiguousarray(rows, dtype=np.uint8).reshape(-1)
    if rows_u8.shape[0] % row_bytes:
        raise LocalProtocolError("rows are not a whole number of rows")
    n_rows = rows_u8.shape[0] // row_bytes
    prefix = bytearray(APP_HEADER_SIZE + rows_offset_for(n, sampled))
    ev = np.frombuffer(prefix, dtype=ENTRY_DTYPE, count=n, offset=APP_HEADER_SIZE + STEP_HDR_SIZE)
    ev[:] = entries
    if sampled:
        np.frombuffer(prefix, dtype=SAMPLE_DTYPE, count=n,
                      offset=APP_HEADER_SIZE + STEP_HDR_SIZE + n * ENTRY_SIZE)[:] = sample_meta
    fill_step_prefix(prefix, n_req=n, n_rows=n_rows, row_bytes=row_bytes, step_flags=step_flags,
                     session=session, epoch=epoch, step_id=step_id)
    return [memoryview(prefix), memoryview(rows_u8)]


def decode_step(frame: Frame, layout: WireLayout) -> StepView:
    """Validate a STEP's framing (sizes, counts, flags, total rows) and return views into it.

    Per-entry semantics (slot range, window continuity, ...) are the worker's: a malformed entry is
    answered BAD_ENTRY while the rest of the batch is served (see bad_entry_mask)."""
    h = frame.header
    p = frame.payload
    if h.type != MSG_STEP:
        raise RemoteProtocolError(f"frame type {h.type} is not STEP", counter="unexpected_type")
    if len(p) < STEP_HDR_SIZE:
        raise RemoteProtocolError("STEP shorter than its header", counter="bad_step")
    n_req, n_rows, row_bytes, step_flags = _STEP_HDR.unpack_from(p, 0)
    if step_flags & ~SF_ALL:
        raise RemoteProtocolError(f"unknown step flags 0x{step_flags:x}", counter="bad_step")
    sampled = bool(step_flags & SF_SAMPLED)
    if sampled and not layout.sampled:
        raise RemoteProtocolError("sampled STEP but sampled mode was not agreed", counter="bad_step")
    if n_req > layout.max_reqs:
        raise RemoteProtocolError(f"n_req {n_req} over max_reqs {layout.max_reqs}", counter="bad_step")
    if row_bytes != layout.row_bytes:
        raise RemoteProtocolError(f"row_bytes {row_bytes}, agreed {layout.row_bytes}", counter="bad_step")
    if n_rows > n_req * layout.window:
        raise RemoteProtocolError(f"{n_rows} rows for {n_req} requests", counter="bad_step")
    off = rows_offset_for(n_req, sampled)
    if len(p) != off + n_rows * row_bytes:
        raise RemoteProtocolError(f"STEP payload {len(p)} bytes, its header says {off + n_rows * row_bytes}",
                                  counter="bad_step")
    entries = np.frombuffer(p, dtype=ENTRY_DTYPE, count=n_req, offset=STEP_HDR_SIZE)
    if int(entries["n_rows"].sum(dtype=np.uint64)) != n_rows:
        raise RemoteProtocolError("entries' n_rows do not add up to the STEP's n_rows", counter="bad_step")
    meta = (np.frombuffer(p, dtype=SAMPLE_DTYPE, count=n_req, offset=STEP_HDR_SIZE + n_req * ENTRY_SIZE)
            if sampled else None)
    rows = np.frombuffer(p, dtype=np.uint8, count=n_rows * row_bytes, offset=off).reshape(n_rows, row_bytes)
    return StepView(h, n_req, n_rows, row_bytes, step_flags, entries, meta, rows)


# per flags byte: malformed on its own (an unknown bit, RESYNC without NEW_GEN); NEW_GEN set
_FLAGS_BAD = np.array([bool(f & ~RF_ALL) or (bool(f & RF_RESYNC) and not f & RF_NEW_GEN) for f in range(256)])
_FLAGS_NEW_GEN = np.array([bool(f & RF_NEW_GEN) for f in range(256)])
_FLAGS_BAD_U8, _FLAGS_NEW_GEN_U8 = _FLAGS_BAD.astype(np.uint8), _FLAGS_NEW_GEN.astype(np.uint8)  # for the C pass
_ENTRY_OFFSETS = entry_offsets(ENTRY_DTYPE)


def bad_entry_mask(entries: np.ndarray, layout: WireLayout) -> np.ndarray:
    """Entries that are malformed on their own: unknown flags, RESYNC without NEW_GEN, more than W rows,
    an empty NEW_GEN, negative positions, an anchor that is not right after the rows, n_out over N, a
    slot at or past the agreed max_reqs, or a slot that appears twice in the batch (every later
    occurrence). One pass in C (_fastround_entries.c); `bad_entry_mask_reference` is the definition
    (DSPARK_NATIVE=0 runs it), tests/test_native_entries.py holds the two to the same bytes."""
    if not _native_enabled():
        return bad_entry_mask_reference(entries, layout)
    if entries.dtype != ENTRY_DTYPE or not entries.flags.c_contiguous:
        entries = np.ascontiguousarray(entries, dtype=ENTRY_DTYPE)
    out = np.empty(entries.shape[0], dtype=bool)
    _fastround.bad_entries(entries, _ENTRY_OFFSETS, _FLAGS_BAD_U8, _FLAGS_NEW_GEN_U8, layout.window,
                           layout.num_spec, layout.max_reqs, out.view(np.uint8))
    return out


def bad_entry_mask_reference(entries: np.ndarray, layout: WireLayout) -> np.ndarray:
    """`bad_entry_mask` in numpy, vectorised (the readable definition; the flag rules a table lookup
    per entry). tests/test_wire_codec.py holds it to an entry-by-entry definition."""
    flags = entries["flags"]
    n_rows = entries["n_rows"]
    first = entries["first_pos"]
    anchor = entries["anchor_pos"]
    bad = _FLAGS_BAD[flags]
    bad |= n_rows > layout.window
    bad |= _FLAGS_NEW_GEN[flags] & (n_rows == 0)
    bad |= first < 0
    # anchor_pos == first_pos + n_rows; where first_pos >= 0 and anchor_pos >= first_pos the difference
    # cannot overflow, and anywhere else the entry is bad already
    bad |= (anchor < first) | ((anchor - first) != n_rows)
    bad |= entries["n_out"] > layout.num_spec
    bad |= entries["slot"] >= layout.max_reqs  # slots are request indices < the agreed max_reqs
    if entries.shape[0] > 1:
        slots = entries["slot"]
        order = np.argsort(slots, kind="stable")
        s = slots[order]
        dup = np.zeros(s.shape[0], dtype=bool)
        dup[1:] = s[1:] == s[:-1]
        bad[order[dup]] = True
    return bad


# ---------------------------------------------------------------- REPLY

class ReplyWriter:
    """One REPLY frame in one buffer, with writable numpy views for the worker to fill in place."""

    def __init__(self, n_req: int, num_spec: int, step_flags: int) -> None:
        if step_flags & ~SF_ALL:
            raise LocalProtocolError(f"unknown step flags 0x{step_flags:x}")
        self.layout: ReplyLayout = reply_layout(n_req, num_spec, step_flags)
        lay = self.layout
        self.buf = np.zeros(APP_HEADER_SIZE + lay.payload_bytes, dtype=np.uint8)
        p = self.buf[APP_HEADER_SIZE:]
        nn = n_req * num_spec
        self.status = p[lay.o_status:lay.o_status + n_req]
        self.window_rows = p[lay.o_window_rows:lay.o_window_rows + 4 * n_req].view("<u4")
        self.draft_ids = p[lay.o_draft_ids:lay.o_draft_ids + 4 * nn].view("<i4").reshape(n_req, num_spec)
        self.confidence = p[lay.o_confidence:lay.o_confidence + 4 * nn].view("<f4").reshape(n_req, num_spec)
        self.margin = self.sampled_mask = self.support_ids = self.proposal_q = None
        if lay.o_margin >= 0:
            self.margin = p[lay.o_margin:lay.o_margin + 4 * nn].view("<f4").reshape(n_req, num_spec)
        if lay.o_sampled_mask >= 0:
            self.sampled_mask = p[lay.o_sampled_mask:lay.o_sampled_mask + n_req]
            k = 4 * nn * TOP_K
            self.support_ids = p[lay.o_support_ids:lay.o_support_ids + k].view("<i4").reshape(
                n_req, num_spec, TOP_K)
            self.proposal_q = p[lay.o_proposal_q:lay.o_proposal_q + k].view("<f4").reshape(
                n_req, num_spec, TOP_K)
        self.draft_ids[:] = -1

    def finish(self, *, session: int, epoch: int, step_id: int, worker_us: float) -> memoryview:
        lay = self.layout
        pack_app_header(self.buf, 0, MSG_REPLY, session=session, epoch=epoch, step_id=step_id,
                        payload_len=lay.payload_bytes)
        _REPLY_HDR.pack_into(self.buf, APP_HEADER_SIZE, lay.n_req, lay.num_spec, lay.step_flags, 0,
                             float(worker_us))
        return memoryview(self.buf)


SUPPORT_Q_EPS = 1e-3  # a position's proposal_q may sum to at most 1 + this (float32 rounding of a renormalisation)


def _check_sampled(status: np.ndarray, draft_ids: np.ndarray, sampled_mask: np.ndarray, support_ids: np.ndarray,
                   proposal_q: np.ndarray, vocab_size: int) -> None:
    """The sampled sections, before anything reaches an engine's rejection sampler: q finite and in
    [0, 1] with each position's support summing to at most 1 + SUPPORT_Q_EPS; support ids in the
    vocabulary (any non-negative int32 when vocab_size is 0) or the padding -1; every drafted id of a
    usable sampled request inside its own support. Vectorised over the whole batch."""
    q = proposal_q
    # reductions, not elementwise temporaries (n x N x 32 values every sampled round); a NaN makes
    # min and max NaN, and every comparison with NaN is false
    if not (float(q.min()) >= 0.0 and float(q.max()) <= 1.0):
        raise RemoteProtocolError("proposal_q not finite or outside [0, 1] in REPLY", counter="bad_reply_proposal_q")
    if float(q.sum(axis=-1).max()) > 1.0 + SUPPORT_Q_EPS:
        raise RemoteProtocolError("a position's proposal_q sums to more than 1 in REPLY", counter="bad_reply_q_sum")
    # ids are int32: -1 (padding) or in [0, vocab_size); with no vocabulary, any id >= -1
    if int(support_ids.min()) < -1 or (vocab_size > 0 and int(support_ids.max()) >= vocab_size):
        raise RemoteProtocolError(f"support id outside the vocabulary ({vocab_size or 'unknown'}) in REPLY",
                                  counter="bad_reply_support_id")
    drafted = (USABLE_STATUS_TABLE[status] & (sampled_mask == 1))[:, None] & (draft_ids >= 0)
    if drafted.any() and not (support_ids == draft_ids[:, :, None]).any(axis=-1)[drafted].all():
        raise RemoteProtocolError("a drafted id outside its own support in REPLY", counter="bad_reply_draft_support")


def decode_reply(frame: Frame, layout: WireLayout, *, n_req: int, step_flags: int, vocab_size: int = 0) -> StepReply:
    """Validate a REPLY against the STEP it answers (shape, flags, enums, window bounds; in sampled
    mode the support and q, against `vocab_size` from the worker's WELCOME, 0 = unknown) and return
    views into its payload. The caller checks session and step id from the header."""
    h = frame.header
    p = frame.payload
    if h.type != MSG_REPLY:
        raise RemoteProtocolError(f"frame type {h.type} is not REPLY", counter="unexpected_type")
    if len(p) < REPLY_HDR_SIZE:
        raise RemoteProtocolError("REPLY shorter than its header", counter="bad_reply")
    r_n, r_num_spec, r_flags, reserved, worker_us = _REPLY_HDR.unpack_from(p, 0)
    if r_n != n_req or r_num_spec != layout.num_spec or r_flags != step_flags or reserved:
        raise RemoteProtocolError(
            f"REPLY shape n={r_n} N={r_num_spec} flags={r_flags}, expected n={n_req} N={layout.num_spec} "
            f"flags={step_flags}", counter="bad_reply")
    if not (math.isfinite(worker_us) and worker_us >= 0.0):
        raise RemoteProtocolError(f"bad worker_us {worker_us}", counter="bad_reply")
    lay = reply_layout(n_req, layout.num_spec, step_flags)
    if len(p) != lay.payload_bytes:
        raise RemoteProtocolError(f"REPLY payload {len(p)} bytes, expected {lay.payload_bytes}",
                                  counter="bad_reply")
    n, N = n_req, layout.num_spec
    status = np.frombuffer(p, dtype=np.uint8, count=n, offset=lay.o_status)
    window_rows = np.frombuffer(p, dtype="<u4", count=n, offset=lay.o_window_rows)
    draft_ids = np.frombuffer(p, dtype="<i4", count=n * N, offset=lay.o_draft_ids).reshape(n, N)
    confidence = np.frombuffer(p, dtype="<f4", count=n * N, offset=lay.o_confidence).reshape(n, N)
    if n:
        # one pass in C (_fastround_reply.c): these four numpy checks were ~15 us of the proxy's round
        # trip on a loaded machine (docs/performance.md, the round trip's parts)
        err = (reply_section_error(p, lay, layout.window) if _native_enabled()
               else reply_section_error_reference(status, window_rows, confidence, layout.window))
        if err:
            raise RemoteProtocolError(REPLY_SECTION_ERRORS[err], counter="bad_reply")
    margin = sampled_mask = support_ids = proposal_q = None
    if lay.o_margin >= 0:
        margin = np.frombuffer(p, dtype="<f4", count=n * N, offset=lay.o_margin).reshape(n, N)
    if lay.o_sampled_mask >= 0:
        sampled_mask = np.frombuffer(p, dtype=np.uint8, count=n, offset=lay.o_sampled_mask)
        if n and int(sampled_mask.max()) > 1:
            raise RemoteProtocolError("sampled_mask not 0/1 in REPLY", counter="bad_reply")
        k = n * N * TOP_K
        support_ids = np.frombuffer(p, dtype="<i4", count=k, offset=lay.o_support_ids).reshape(n, N, TOP_K)
        proposal_q = np.frombuffer(p, dtype="<f4", count=k, offset=lay.o_proposal_q).reshape(n, N, TOP_K)
        if n:
            _check_sampled(status, draft_ids, sampled_mask, support_ids, proposal_q, vocab_size)
    return StepReply(h, step_flags, status, window_rows, draft_ids, confidence, margin, sampled_mask,
                     support_ids, proposal_q, float(worker_us))


