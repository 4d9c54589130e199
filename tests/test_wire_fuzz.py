"""Fuzzing the decoder: random and mutated frames yield frames or RemoteProtocolError, nothing else.

Together these tests run a little over 10,000 hypothesis cases. Every payload buffer the decoder
allocates is checked against the limit in force, so a hostile length can never make it allocate.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dspark_proxy.wire as wire
from dspark_proxy.wire import Decoder, RemoteProtocolError, WireLayout

LAYOUT = WireLayout(num_spec=3, window=4, row_bytes=8, max_reqs=6, sampled=True)
LIMITS = {wire.MSG_STEP: LAYOUT.max_step_payload(), wire.MSG_REPLY: LAYOUT.max_reply_payload()}
LIMITS.update({t: wire.MAX_CONTROL_PAYLOAD for t in wire.CONTROL_TYPES})
MAX_FRAME = 1 << 16


def fuzz(n: int) -> settings:
    return settings(deadline=None, max_examples=n, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class _CheckedDecoder(Decoder):
    """Asserts that no payload buffer is ever sized from a length over the limit."""

    def _payload_buffer(self, n):
        hdr_limit = min(max(LIMITS.values()), MAX_FRAME - wire.APP_HEADER_SIZE)
        assert n <= hdr_limit, f"allocation of {n} bytes from an unchecked length"
        return super()._payload_buffer(n)


def _consume(data: bytes, chunk: int, reuse: bool = False) -> tuple[int, int]:
    """Feed data in chunks; decode every frame by its type. Returns (frames, remote errors)."""
    d = _CheckedDecoder(LIMITS, max_frame_bytes=MAX_FRAME, readahead_bytes=256, reuse_payload=reuse)
    frames = errors = 0
    try:
        for i in range(0, len(data), chunk):
            d.feed(data[i:i + chunk])
            while (f := d.next_frame()) is not wire.NEED_DATA:
                frames += 1
                try:
                    t = f.header.type
                    if t == wire.MSG_STEP:
                        sv = wire.decode_step(f, LAYOUT)
                        wire.bad_entry_mask(sv.entries, LAYOUT)
                    elif t == wire.MSG_REPLY:
                        wire.decode_reply(f, LAYOUT, n_req=2, step_flags=wire.SF_WANT_MARGIN | wire.SF_SAMPLED)
                    else:
                        wire.decode_control(f)
                except RemoteProtocolError as e:
                    assert e.counter
                    errors += 1
    except RemoteProtocolError as e:  # header error: the stream is dropped
        assert e.counter
        errors += 1
    return frames, errors


def _valid_step() -> bytes:
    e = np.zeros(2, dtype=wire.ENTRY_DTYPE)
    e["slot"] = [1, 2]
    e["n_rows"] = [2, 1]
    e["first_pos"] = [0, 9]
    e["anchor_pos"] = [2, 10]
    e["flags"] = [wire.RF_NEW_GEN | wire.RF_NEED_DRAFT, wire.RF_NEED_DRAFT]
    meta = np.zeros(2, dtype=wire.SAMPLE_DTYPE)
    meta["temperature"] = 0.7
    rows = np.arange(3 * 8, dtype=np.uint8).reshape(3, 8)
    return b"".join(bytes(p) for p in wire.encode_step(e, rows, row_bytes=8, step_flags=wire.SF_SAMPLED,
                                                       sample_meta=meta, session=5, step_id=3))


def _valid_reply() -> bytes:
    w = wire.ReplyWriter(2, LAYOUT.num_spec, wire.SF_WANT_MARGIN | wire.SF_SAMPLED)
    w.window_rows[:] = [2, 4]
    w.confidence[:] = 0.5
    return bytes(w.finish(session=5, epoch=1, step_id=3, worker_us=10.0))


VALID = [_valid_step(), _valid_reply(), wire.encode_control(wire.NewSession(previous=3, reason="x")),
         wire.encode_control(wire.ErrorMsg(code="c", message="m", field="f")),
         wire.encode_control(wire.Hello(protocol_version=1, num_spec=3, window=4, row_bytes=8, max_reqs=6,
                                        sampled=True, client_id="c", nonce=b"\x01" * 32))]


def test_valid_frames_decode_cleanly():
    for v in VALID:
        assert _consume(v, len(v)) == (1, 0)
    assert _consume(b"".join(VALID), 5) == (len(VALID), 0)


@fuzz(3500)
@given(st.binary(min_size=0, max_size=600), st.integers(1, 64), st.booleans())
def test_random_bytes(data, chunk, reuse):
    _consume(data, chunk, reuse)


@fuzz(2500)
@given(st.binary(min_size=0, max_size=600), st.integers(1, 64))
def test_random_payload_under_valid_header(payload, chunk):
    """A valid header with random payload bytes reaches every payload decoder."""
    for mtype in (wire.MSG_STEP, wire.MSG_REPLY, wire.MSG_HELLO, wire.MSG_ERROR):
        hdr = bytearray(40)
        wire.pack_app_header(hdr, 0, mtype, session=1, epoch=1, step_id=1, payload_len=len(payload))
        frames, _ = _consume(bytes(hdr) + payload, chunk)
        assert frames == 1


@st.composite
def mutations(draw):
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete", "u32"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[i:i + draw(st.integers(1, 16))]
        else:  # overwrite a u32 with an extreme value (lengths, counts)
            v = draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 255, 65536]))
            data[i:i + 4] = v.to_bytes(4, "little")
    return bytes(data)


@fuzz(4500)
@given(mutations(), st.integers(1, 97))
def test_mutated_frames(data, chunk):
    _consume(data, chunk)


@pytest.mark.timeout(20)
def test_step_length_fields_at_extremes():
    """Every u32 in the step header and entries set to extreme values: refused, never allocated."""
    base = bytearray(_valid_step())
    for off in range(40, 40 + 16 + 2 * 40, 4):
        for v in (0xFFFFFFFF, 0x80000000, 7):
            data = bytearray(base)
            data[off:off + 4] = v.to_bytes(4, "little")
            _consume(bytes(data), 50)
