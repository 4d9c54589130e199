"""Messages of the wire protocol as Python objects.

Control messages (handshake, NEW_SESSION, ERROR, PING/PONG) are small and rare: frozen msgspec
structs, msgpack-encoded, decoded by one typed decoder whose field constraints do the validation.
STEP and REPLY are the per-round messages: fixed numpy layouts (dtypes.py) whose decoded forms here
(`StepView`, `StepReply`) hold views into the received buffer, never per-request Python objects.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated, Union

import msgspec
import numpy as np

from .dtypes import (
    APP_HEADER_SIZE,
    MSG_AUTH,
    MSG_CHALLENGE,
    MSG_ERROR,
    MSG_HELLO,
    MSG_NEW_SESSION,
    MSG_PING,
    MSG_PONG,
    MSG_WELCOME,
    REPLY_HDR_SIZE,
    SF_SAMPLED,
    SF_WANT_MARGIN,
    TOP_K,
    align8,
    rows_offset_for,
)

__all__ = [
    "Hello", "Challenge", "Auth", "Welcome", "NewSession", "ErrorMsg", "Ping", "Pong", "ControlMessage",
    "CONTROL_TYPE_OF", "MAX_CONTROL_PAYLOAD", "NONCE_BYTES",
    "WireLayout", "AppHeader", "StepView", "StepReply", "ReplyLayout", "reply_layout",
    "worker_proof", "client_proof", "check_proof",
]

MAX_CONTROL_PAYLOAD = 64 * 1024
NONCE_BYTES = 32

_U31 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
_U64 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
_Proof = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
_Name = Annotated[str, msgspec.Meta(max_length=256)]
_Text = Annotated[str, msgspec.Meta(max_length=4096)]


class Hello(msgspec.Struct, frozen=True, tag="hello"):
    """Client → worker: the layout the client will use, and its nonce for the worker's proof.
    `target_id`: the target model the engine names (attach(..., target_id=...)), "" = none; a field
    with a default, so a HELLO without it decodes as "" and the protocol version stays 1. `tap_layers`
    (the target layers whose hidden states make a row, in order) and `row_dtype` (bfloat16, float16 or
    float32) are defaulted the same way: empty = not said, served unchecked; a worker whose drafter
    fixes them refuses others, naming the field and both values."""

    protocol_version: _U31
    num_spec: _U31
    window: _U31
    row_bytes: _U31
    max_reqs: _U31
    sampled: bool
    client_id: _Name
    nonce: _Nonce
    target_id: _Name = ""
    tap_layers: Annotated[tuple[Annotated[int, msgspec.Meta(ge=-1, le=65535)], ...], msgspec.Meta(max_length=64)] = ()
    row_dtype: Annotated[str, msgspec.Meta(max_length=16)] = ""


class Challenge(msgspec.Struct, frozen=True, tag="challenge"):
    """Worker → client (token configured): the worker's nonce, and its proof over the client's nonce."""

    nonce: _Nonce
    proof: _Proof


class Auth(msgspec.Struct, frozen=True, tag="auth"):
    """Client → worker: the client's proof over the worker's nonce."""

    proof: _Proof


class Welcome(msgspec.Struct, frozen=True, tag="welcome"):
    """Worker → client: accepted; the worker's own layout and identity. `vocab_size`: the drafter's
    vocabulary (0 = unknown), what the client checks sampled-mode support ids against; a field with a
    default, so a peer that does not send it (or does not know it) still agrees."""

    protocol_version: _U31
    num_spec: _U31
    window: _U31
    row_bytes: _U31
    max_reqs: _U31
    sampled: bool
    worker_id: _Name
    drafter: _Name
    vocab_size: _U31 = 0


class NewSession(msgspec.Struct, frozen=True, tag="new_session"):
    """Client → worker: steps now go under the header's session id; forget `previous`."""

    previous: _U64
    reason: _Text = ""


class ErrorMsg(msgspec.Struct, frozen=True, tag="error"):
    """Either way: a refusal. `field` names the mismatching parameter for handshake errors."""

    code: _Name
    message: _Text = ""
    field: _Name | None = None


class Ping(msgspec.Struct, frozen=True, tag="ping"):
    """Liveness probe; answered by a Pong with the same token."""

    token: _U64 = 0


class Pong(msgspec.Struct, frozen=True, tag="pong"):
    token: _U64 = 0


ControlMessage = Union[Hello, Challenge, Auth, Welcome, NewSession, ErrorMsg, Ping, Pong]  # noqa: UP007
CONTROL_TYPE_OF: dict[type, int] = {
    Hello: MSG_HELLO, Challenge: MSG_CHALLENGE, Auth: MSG_AUTH, Welcome: MSG_WELCOME,
    NewSession: MSG_NEW_SESSION, ErrorMsg: MSG_ERROR, Ping: MSG_PING, Pong: MSG_PONG,
}


@dataclass(frozen=True)
class WireLayout:
    """The parameters both ends must agree on; they bound every length either side accepts."""

    num_spec: int
    window: int
    row_bytes: int
    max_reqs: int
    sampled: bool = False

    def __post_init__(self) -> None:
        for name in ("num_spec", "window", "row_bytes", "max_reqs"):
            v = getattr(self, name)
            if not 1 <= v <= 2**31 - 1:
                raise ValueError(f"{name}={v} out of range")
        if self.num_spec > 255 or self.window > 2**20:
            raise ValueError(f"num_spec={self.num_spec} (max 255) or window={self.window} (max 2**20) too large")

    def max_step_payload(self) -> int:
        """Largest legal STEP payload: every request sends at most W rows."""
        return rows_offset_for(self.max_reqs, self.sampled) + self.max_reqs * self.window * self.row_bytes

    def max_reply_payload(self) -> int:
        flags = SF_WANT_MARGIN | (SF_SAMPLED if self.sampled else 0)
        return reply_layout(self.max_reqs, self.num_spec, flags).payload_bytes


@dataclass(frozen=True)
class AppHeader:
    """The fixed application header of one frame (magic and version already checked)."""

    type: int
    flags: int
    session: int
    epoch: int
    step_id: int
    payload_len: int

    @property
    def frame_bytes(self) -> int:
        return APP_HEADER_SIZE + self.payload_len


@dataclass(frozen=True)
class ReplyLayout:
    """Byte offsets of a REPLY payload's sections (-1 when absent) and its total size."""

    n_req: int
    num_spec: int
    step_flags: int
    o_status: int
    o_window_rows: int
    o_draft_ids: int
    o_confidence: int
    o_margin: int
    o_sampled_mask: int
    o_support_ids: int
    o_proposal_q: int
    payload_bytes: int


@functools.lru_cache(maxsize=1024)
def reply_layout(n_req: int, num_spec: int, step_flags: int) -> ReplyLayout:
    """Where each REPLY section lies for n requests, N drafts and the step's flags (FORMAT.md).
    Cached (a frozen value of three small ints): both ends ask for it every STEP, and computing it
    took ~5 us of the proxy's round trip on a loaded machine (docs/performance.md, the round trip)."""
    nn = n_req * num_spec
    o = REPLY_HDR_SIZE
    o_status = o
    o = align8(o + n_req)
    o_window_rows = o
    o = align8(o + 4 * n_req)
    o_draft_ids = o
    o = align8(o + 4 * nn)
    o_confidence = o
    o = align8(o + 4 * nn)
    o_margin = o_sampled_mask = o_support_ids = o_proposal_q = -1
    if step_flags & SF_WANT_MARGIN:
        o_margin = o
        o = align8(o + 4 * nn)
    if step_flags & SF_SAMPLED:
        o_sampled_mask = o
        o = align8(o + n_req)
        o_support_ids = o
        o = align8(o + 4 * nn * TOP_K)
        o_proposal_q = o
        o = align8(o + 4 * nn * TOP_K)
    return ReplyLayout(n_req, num_spec, step_flags, o_status, o_window_rows, o_draft_ids, o_confidence,
                       o_margin, o_sampled_mask, o_support_ids, o_proposal_q, o)


class StepView:
    """A decoded STEP: numpy views into the received payload (valid while that buffer is)."""

    __slots__ = ("header", "n_req", "n_rows", "row_bytes", "step_flags", "entries", "sample_meta", "rows")

    def __init__(self, header: AppHeader, n_req: int, n_rows: int, row_bytes: int, step_flags: int,
                 entries: np.ndarray, sample_meta: np.ndarray | None, rows: np.ndarray) -> None:
        self.header = header
        self.n_req = n_req
        self.n_rows = n_rows
        self.row_bytes = row_bytes
        self.step_flags = step_flags
        self.entries = entries
        self.sample_meta = sample_meta
        self.rows = rows  # uint8 [n_rows, row_bytes], entry order


class StepReply:
    """A decoded, validated REPLY: read-only numpy views into a buffer that belongs to this reply.

    status u8 [n], window_rows u32 [n], draft_ids i32 [n, N], confidence f32 [n, N], margin f32 [n, N]
    or None, sampled_mask u8 [n] or None, support_ids i32 [n, N, 32] or None, proposal_q f32 [n, N, 32]
    or None, worker_us (the worker's own time for the step).
    """

    __slots__ = ("header", "step_flags", "status", "window_rows", "draft_ids", "confidence", "margin",
                 "sampled_mask", "support_ids", "proposal_q", "worker_us")

    def __init__(self, header: AppHeader, step_flags: int, status: np.ndarray, window_rows: np.ndarray,
                 draft_ids: np.ndarray, confidence: np.ndarray, margin: np.ndarray | None,
                 sampled_mask: np.ndarray | None, support_ids: np.ndarray | None,
                 proposal_q: np.ndarray | None, worker_us: float) -> None:
        self.header = header
        self.step_flags = step_flags
        self.status = status
        self.window_rows = window_rows
        self.draft_ids = draft_ids
        self.confidence = confidence
        self.margin = margin
        self.sampled_mask = sampled_mask
        self.support_ids = support_ids
        self.proposal_q = proposal_q
        self.worker_us = worker_us

    @property
    def n(self) -> int:
        return int(self.status.shape[0])

    @property
    def step_id(self) -> int:
        return self.header.step_id

    @property
    def session(self) -> int:
        return self.header.session


# HMAC challenge-response: each side proves knowledge of the token over the other side's fresh nonce,
# with a role label so a proof can never be reflected back as the other role's.
def worker_proof(token: bytes, client_nonce: bytes, worker_nonce: bytes) -> bytes:
    return hmac.new(token, b"dspark-worker\0" + client_nonce + worker_nonce, hashlib.sha256).digest()


def client_proof(token: bytes, client_nonce: bytes, worker_nonce: bytes) -> bytes:
    return hmac.new(token, b"dspark-client\0" + worker_nonce + client_nonce, hashlib.sha256).digest()


def check_proof(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison of two proofs."""
    return hmac.compare_digest(expected, got)
