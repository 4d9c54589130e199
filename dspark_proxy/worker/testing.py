"""Helpers for tests and tools that talk to a worker directly: a raw protocol peer (handshake, STEP,
REPLY, without TcpDraftClient), a record of the rows sent, and entries built from dicts. The integrity
formula is deliberately not here: tests recompute it on their own."""

from __future__ import annotations

import socket
import time

import numpy as np

from .. import wire
from ..link.conn import FramedConnection

__all__ = ["RowHistory", "RawPeer", "make_entries"]


class RowHistory:
    """Every row a test sent, by (session, slot, position): the window is read back from here."""

    def __init__(self, row_bytes: int) -> None:
        self.row_bytes = row_bytes
        self.rows: dict[tuple[int, int, int], bytes] = {}

    def record(self, session: int, entries: np.ndarray, rows: np.ndarray) -> None:
        o = 0
        for e in entries:
            for k in range(int(e["n_rows"])):
                self.rows[(session, int(e["slot"]), int(e["first_pos"]) + k)] = rows[o + k].tobytes()
            o += int(e["n_rows"])

    def window(self, session: int, slot: int, anchor_pos: int, w: int) -> np.ndarray:
        data = b"".join(self.rows[(session, slot, p)] for p in range(anchor_pos - w, anchor_pos))
        return np.frombuffer(data, dtype=np.uint8).reshape(w, self.row_bytes)


def make_entries(specs: list[dict]) -> np.ndarray:
    """Entries from dicts (slot, first_pos, n_rows, generation, flags, anchor_token, n_out); anchor_pos
    defaults to first_pos + n_rows."""
    e = np.zeros(len(specs), dtype=wire.ENTRY_DTYPE)
    for i, s in enumerate(specs):
        for k, v in s.items():
            e[k][i] = v
        if "anchor_pos" not in s:
            e["anchor_pos"][i] = e["first_pos"][i] + e["n_rows"][i]
    return e


class RawPeer:
    """A minimal protocol client: handshake, then STEP → REPLY (or ERROR) one at a time."""

    def __init__(self, port: int, layout: wire.WireLayout, *, token: bytes | None = None, session: int = 1,
                 host: str = "127.0.0.1") -> None:
        self.layout = layout
        self.session = session
        self.epoch = 1
        sock = socket.create_connection((host, port), timeout=2.0)
        limits = {t: wire.MAX_CONTROL_PAYLOAD for t in wire.CONTROL_TYPES}
        limits[wire.MSG_REPLY] = layout.max_reply_payload()
        self.conn = FramedConnection(sock, wire.Decoder(limits, max_frame_bytes=1 << 26))
        self.token = token

    def handshake(self, **overrides):
        lay = self.layout
        nonce = b"\x07" * 32
        hello = dict(protocol_version=wire.PROTOCOL_VERSION, num_spec=lay.num_spec, window=lay.window,
                     row_bytes=lay.row_bytes, max_reqs=lay.max_reqs, sampled=lay.sampled, client_id="test",
                     nonce=nonce)
        hello.update(overrides)
        self.send(wire.encode_control(wire.Hello(**hello)))
        msg = self.recv()
        if isinstance(msg, wire.Challenge):
            if self.token is None:
                raise ValueError("the worker asks for a token and this peer has none")
            if not wire.check_proof(wire.worker_proof(self.token, nonce, msg.nonce), msg.proof):
                raise ValueError("the worker's proof does not match this peer's token")
            self.send(wire.encode_control(wire.Auth(proof=wire.client_proof(self.token, nonce, msg.nonce))))
            msg = self.recv()
        return msg

    def send(self, data) -> None:
        self.conn.send_parts([data], time.monotonic() + 5.0)

    def recv(self, timeout_s: float = 5.0, *, n_req: int = 0, step_flags: int = 0):
        f = self.conn.recv_frame(time.monotonic() + timeout_s)
        if f is None:
            return None
        if f.header.type == wire.MSG_REPLY:
            return wire.decode_reply(f, self.layout, n_req=n_req, step_flags=step_flags)
        return wire.decode_control(f)

    def step(self, entries: np.ndarray, rows: np.ndarray, step_id: int, *, step_flags: int = 0,
             sample_meta: np.ndarray | None = None, session: int | None = None, timeout_s: float = 5.0):
        parts = wire.encode_step(entries, rows, row_bytes=self.layout.row_bytes, step_flags=step_flags,
                                 sample_meta=sample_meta, session=self.session if session is None else session,
                                 epoch=self.epoch, step_id=step_id)
        self.conn.send_parts(parts, time.monotonic() + 5.0)
        return self.recv(timeout_s, n_req=entries.shape[0], step_flags=step_flags)

    def close(self) -> None:
        self.conn.close()
