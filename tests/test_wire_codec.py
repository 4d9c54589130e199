"""Codec round trips and edge cases: whole input, byte at a time, truncated, oversize, bad fields."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark_proxy.wire as wire
from dspark_proxy.wire import Decoder, RemoteProtocolError, WireLayout

LAYOUT = WireLayout(num_spec=5, window=8, row_bytes=16, max_reqs=12, sampled=True)
ALL_LIMITS = {t: 1 << 20 for t in wire.MSG_NAMES}


def _decoder(**kw) -> Decoder:
    return Decoder(kw.pop("limits", ALL_LIMITS), max_frame_bytes=kw.pop("max_frame_bytes", 1 << 21), **kw)


def _frames(data: bytes, chunk: int | None = None, **kw) -> list:
    d = _decoder(**kw)
    out = []
    step = chunk or max(1, len(data))
    for i in range(0, len(data), step):
        d.feed(data[i:i + step])
        while (f := d.next_frame()) is not wire.NEED_DATA:
            out.append((f.header, bytes(f.payload)))
    return out


@st.composite
def step_batches(draw):
    n = draw(st.integers(0, LAYOUT.max_reqs))
    sampled = draw(st.booleans())
    e = np.zeros(n, dtype=wire.ENTRY_DTYPE)
    e["slot"] = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n, unique=True))
    e["n_rows"] = draw(st.lists(st.integers(0, LAYOUT.window), min_size=n, max_size=n))
    e["generation"] = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n))
    e["first_pos"] = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    e["anchor_pos"] = e["first_pos"] + e["n_rows"]
    e["anchor_token"] = draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n))
    e["flags"] = draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
    e["k_window"] = draw(st.lists(st.integers(0, 255), min_size=n, max_size=n))
    e["n_out"] = draw(st.lists(st.integers(0, LAYOUT.num_spec), min_size=n, max_size=n))
    meta = None
    if sampled:
        meta = np.zeros(n, dtype=wire.SAMPLE_DTYPE)
        meta["seed"] = draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n))
        meta["temperature"] = draw(st.lists(st.floats(0, 4, width=32), min_size=n, max_size=n))
    n_rows = int(e["n_rows"].sum())
    rows = np.frombuffer(draw(st.binary(min_size=n_rows * 16, max_size=n_rows * 16)), dtype=np.uint8)
    flags = (wire.SF_SAMPLED if sampled else 0) | draw(st.sampled_from([0, wire.SF_WANT_MARGIN]))
    return e, meta, rows.reshape(n_rows, 16), flags


@settings(deadline=None, max_examples=150)
@given(step_batches(), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
       st.sampled_from([None, 1, 7, 64]))
def test_step_round_trip(batch, session, epoch, step_id, chunk):
    e, meta, rows, flags = batch
    parts = wire.encode_step(e, rows, row_bytes=16, step_flags=flags, sample_meta=meta, session=session,
                             epoch=epoch, step_id=step_id)
    data = b"".join(bytes(p) for p in parts)
    [(hdr, payload)] = _frames(data, chunk)
    assert (hdr.type, hdr.session, hdr.epoch, hdr.step_id) == (wire.MSG_STEP, session, epoch, step_id)
    sv = wire.decode_step(wire.Frame(hdr, memoryview(payload)), LAYOUT)
    assert sv.n_req == e.shape[0] and sv.step_flags == flags
    assert sv.entries.tobytes() == e.tobytes()
    assert np.array_equal(sv.rows, rows)
    if meta is None:
        assert sv.sample_meta is None
    else:
        assert sv.sample_meta.tobytes() == meta.tobytes()


@settings(deadline=None, max_examples=150)
@given(st.integers(0, LAYOUT.max_reqs), st.sampled_from([0, 1, 2, 3]), st.integers(0, 2**32), st.data())
def test_reply_round_trip(n, flags, step_id, data):
    w = wire.ReplyWriter(n, LAYOUT.num_spec, flags)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    w.status[:] = rng.integers(0, wire.RS_MAX + 1, n)
    w.window_rows[:] = rng.integers(1, LAYOUT.window + 1, n)
    w.draft_ids[:] = rng.integers(-1, 2**31 - 1, w.draft_ids.shape)
    w.confidence[:] = rng.random(w.confidence.shape)
    if w.margin is not None:
        w.margin[:] = rng.random(w.margin.shape)
    if w.sampled_mask is not None:
        w.sampled_mask[:] = rng.integers(0, 2, n)
        w.support_ids[:] = rng.integers(-1, 1000, w.support_ids.shape)
        w.support_ids[:, :, 0] = w.draft_ids  # a drafted id lies in its support (decode_reply checks)
        q = rng.random(w.proposal_q.shape)
        w.proposal_q[:] = q / q.sum(axis=-1, keepdims=True) * rng.random(q.shape[:-1] + (1,))
    buf = bytes(w.finish(session=9, epoch=3, step_id=step_id, worker_us=12.5))
    [(hdr, payload)] = _frames(buf, data.draw(st.sampled_from([None, 1, 13])))
    r = wire.decode_reply(wire.Frame(hdr, memoryview(payload)), LAYOUT, n_req=n, step_flags=flags)
    assert (r.step_id, r.session, r.worker_us) == (step_id, 9, 12.5)
    for name in ("status", "window_rows", "draft_ids", "confidence", "margin", "sampled_mask",
                 "support_ids", "proposal_q"):
        a, b = getattr(r, name), getattr(w, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert np.array_equal(a, b), name


CONTROL = [
    wire.Hello(protocol_version=1, num_spec=5, window=128, row_bytes=71680, max_reqs=256, sampled=True,
               client_id="proxy-1", nonce=b"n" * 32),
    wire.Challenge(nonce=b"x" * 32, proof=b"p" * 32),
    wire.Auth(proof=b"q" * 32),
    wire.Welcome(protocol_version=1, num_spec=5, window=128, row_bytes=71680, max_reqs=256, sampled=False,
                 worker_id="w", drafter="integrity"),
    wire.NewSession(previous=12345, reason="stale"),
    wire.ErrorMsg(code="mismatch", message="num_spec differs", field="num_spec"),
    wire.Ping(token=7),
    wire.Pong(token=7),
]


@pytest.mark.parametrize("msg", CONTROL, ids=lambda m: type(m).__name__)
def test_control_round_trip(msg):
    data = wire.encode_control(msg, session=4, epoch=2, step_id=1)
    [(hdr, payload)] = _frames(data, 3)
    assert hdr.type == wire.CONTROL_TYPE_OF[type(msg)]
    assert wire.decode_control(wire.Frame(hdr, memoryview(payload))) == msg


def test_control_type_must_match_header():
    data = bytearray(wire.encode_control(wire.Ping(token=1)))
    data[6] = wire.MSG_PONG
    [(hdr, payload)] = _frames(bytes(data))
    with pytest.raises(RemoteProtocolError) as ei:
        wire.decode_control(wire.Frame(hdr, memoryview(payload)))
    assert ei.value.counter == "bad_control"


def test_many_frames_in_one_feed_and_split_anywhere():
    msgs = [wire.encode_control(wire.Ping(token=i), step_id=i) for i in range(50)]
    data = b"".join(msgs)
    for chunk in (None, 1, 5, 41, 1000):
        got = _frames(data, chunk)
        assert [h.step_id for h, _ in got] == list(range(50))


def test_truncated_input_needs_data_without_error():
    data = wire.encode_control(wire.Ping(token=3))
    for cut in range(len(data)):
        d = _decoder()
        d.feed(data[:cut])
        assert d.next_frame() is wire.NEED_DATA


def test_oversize_header_refused_before_payload_is_buffered():
    d = _decoder(limits={wire.MSG_STEP: 1000}, max_frame_bytes=1 << 30)
    hdr = bytearray(40)
    wire.pack_app_header(hdr, 0, wire.MSG_STEP, session=0, epoch=0, step_id=0, payload_len=2**32 - 1)
    with pytest.raises(RemoteProtocolError) as ei:
        d.feed(hdr)
        d.next_frame()
    assert ei.value.counter == "frame_too_large"
    # the per-type limit is further capped by max_frame_bytes
    d = _decoder(limits={wire.MSG_STEP: 1 << 30}, max_frame_bytes=1000)
    hdr2 = bytearray(40)
    wire.pack_app_header(hdr2, 0, wire.MSG_STEP, session=0, epoch=0, step_id=0, payload_len=961)
    with pytest.raises(RemoteProtocolError):
        d.feed(hdr2)
        d.next_frame()


@pytest.mark.parametrize("field,offset,value,counter", [
    ("magic", 0, b"XXXX", "bad_magic"),
    ("version", 4, b"\x02\x00", "bad_version"),
    ("type", 6, b"\x63", "unexpected_type"),
    ("flags", 7, b"\x01", "bad_frame_header"),
    ("reserved", 36, b"\x01\x00\x00\x00", "bad_frame_header"),
])
def test_bad_header_fields(field, offset, value, counter):
    data = bytearray(wire.encode_control(wire.Ping(token=3)))
    data[offset:offset + len(value)] = value
    d = _decoder()
    with pytest.raises(RemoteProtocolError) as ei:
        d.feed(bytes(data))
        d.next_frame()
    assert ei.value.counter == counter


def test_zero_copy_receive_path():
    """recv_buffer/advance: a large payload lands in its own buffer; readahead bytes are carried over."""
    e = np.zeros(1, dtype=wire.ENTRY_DTYPE)
    e["n_rows"] = 8
    e["anchor_pos"] = 8
    e["flags"] = wire.RF_NEW_GEN
    rows = np.arange(8 * 16, dtype=np.uint8).reshape(8, 16)
    data = b"".join(bytes(p) for p in wire.encode_step(e, rows, row_bytes=16, step_id=5)) * 3
    d = _decoder(readahead_bytes=64, reuse_payload=True)
    i, got = 0, []
    while i < len(data):
        buf = d.recv_buffer()
        k = min(len(buf), 7, len(data) - i)
        buf[:k] = data[i:i + k]
        i += k
        d.advance(k)
        while (f := d.next_frame()) is not wire.NEED_DATA:
            sv = wire.decode_step(f, LAYOUT)
            got.append(sv.rows.copy())
    assert len(got) == 3 and all(np.array_equal(g, rows) for g in got)
    assert d.buffered_bytes == 0


def _step_frame(e, rows, flags=0, meta=None):
    data = b"".join(bytes(p) for p in wire.encode_step(e, rows, row_bytes=16, step_flags=flags,
                                                       sample_meta=meta))
    [(hdr, payload)] = _frames(data)
    return wire.Frame(hdr, memoryview(payload))


def test_decode_step_refusals():
    e = np.zeros(2, dtype=wire.ENTRY_DTYPE)
    e["n_rows"] = [1, 2]
    rows = np.zeros((3, 16), dtype=np.uint8)
    small = WireLayout(num_spec=5, window=8, row_bytes=16, max_reqs=1)
    with pytest.raises(RemoteProtocolError):
        wire.decode_step(_step_frame(e, rows), small)  # n_req over max_reqs
    with pytest.raises(RemoteProtocolError):
        wire.decode_step(_step_frame(e, rows), WireLayout(5, 8, 32, 12))  # row_bytes differ
    unsampled = WireLayout(5, 8, 16, 12, sampled=False)
    with pytest.raises(RemoteProtocolError):
        wire.decode_step(_step_frame(e, rows, wire.SF_SAMPLED, np.zeros(2, wire.SAMPLE_DTYPE)), unsampled)
    f = _step_frame(e, rows)
    bad = bytearray(f.payload)
    bad[16 + 4] = 2  # first entry claims 2 rows: sum no longer matches the header
    with pytest.raises(RemoteProtocolError):
        wire.decode_step(wire.Frame(f.header, memoryview(bytes(bad))), LAYOUT)
    with pytest.raises(RemoteProtocolError):
        wire.decode_step(wire.Frame(f.header, f.payload[:-1]), LAYOUT)


def test_bad_entry_mask():
    e = np.zeros(9, dtype=wire.ENTRY_DTYPE)
    e["slot"] = np.arange(9)
    e["n_rows"] = 2
    e["first_pos"] = 10
    e["anchor_pos"] = 12
    e["flags"] = wire.RF_NEED_DRAFT
    e["flags"][1] = 0x10                      # unknown flag
    e["flags"][2] = wire.RF_RESYNC            # resync without new_gen
    e["n_rows"][3] = 9                        # more than W
    e["anchor_pos"][3] = 19
    e["flags"][4] = wire.RF_NEW_GEN           # empty new_gen
    e["n_rows"][4] = 0
    e["anchor_pos"][4] = 10
    e["anchor_pos"][5] = 13                   # anchor not right after the rows
    e["n_out"][6] = 6                         # n_out > N
    e["slot"][7] = 0                          # duplicate slot (second occurrence)
    e["first_pos"][8] = -2                    # negative position
    e["anchor_pos"][8] = 0
    assert wire.bad_entry_mask(e, LAYOUT).tolist() == [False] + [True] * 8
    # a slot at or past the agreed max_reqs has no window to go in
    e = np.zeros(3, dtype=wire.ENTRY_DTYPE)
    e["slot"] = [LAYOUT.max_reqs - 1, LAYOUT.max_reqs, 2**32 - 1]
    e["n_rows"] = e["anchor_pos"] = 1
    e["flags"] = wire.RF_NEW_GEN
    assert wire.bad_entry_mask(e, LAYOUT).tolist() == [False, True, True]


def test_decode_reply_refusals():
    def reply(mut):
        w = wire.ReplyWriter(2, 5, 0)
        w.window_rows[:] = 3
        mut(w)
        data = bytes(w.finish(session=1, epoch=1, step_id=1, worker_us=1.0))
        [(hdr, payload)] = _frames(data)
        return wire.Frame(hdr, memoryview(payload))

    ok = reply(lambda w: None)
    assert wire.decode_reply(ok, LAYOUT, n_req=2, step_flags=0).n == 2
    cases = [
        lambda w: w.status.__setitem__(0, 7),               # unknown status
        lambda w: w.window_rows.__setitem__(1, 9),          # over W
        lambda w: w.window_rows.__setitem__(1, 0),          # usable with empty window
        lambda w: w.confidence.__setitem__((0, 0), np.nan),  # non-finite confidence
    ]
    for mut in cases:
        with pytest.raises(RemoteProtocolError):
            wire.decode_reply(reply(mut), LAYOUT, n_req=2, step_flags=0)
    with pytest.raises(RemoteProtocolError):
        wire.decode_reply(ok, LAYOUT, n_req=3, step_flags=0)   # shape differs from the STEP
    with pytest.raises(RemoteProtocolError):
        wire.decode_reply(ok, LAYOUT, n_req=2, step_flags=1)   # flags differ from the STEP


def test_local_errors_for_illegal_encodes():
    with pytest.raises(wire.LocalProtocolError):
        wire.fill_step_prefix(bytearray(10), n_req=1, n_rows=0, row_bytes=16, step_flags=0, session=0,
                              epoch=0, step_id=0)
    with pytest.raises(wire.LocalProtocolError):
        wire.fill_step_prefix(bytearray(1000), n_req=1, n_rows=0, row_bytes=16, step_flags=8, session=0,
                              epoch=0, step_id=0)
    with pytest.raises(wire.LocalProtocolError):
        wire.encode_control(object())


SAMPLED = wire.SF_SAMPLED


def _sampled_reply(mut) -> wire.Frame:
    """Two usable sampled requests with valid sections (support = draft + k, q one-hot), then mut."""
    w = wire.ReplyWriter(2, 5, SAMPLED)
    w.window_rows[:] = 3
    w.draft_ids[:] = np.arange(10, dtype=np.int32).reshape(2, 5) + 100
    w.sampled_mask[:] = 1
    w.support_ids[:] = w.draft_ids[:, :, None] + np.arange(wire.TOP_K, dtype=np.int32)
    w.proposal_q[:, :, 0] = 1.0
    mut(w)
    [(hdr, payload)] = _frames(bytes(w.finish(session=1, epoch=1, step_id=1, worker_us=1.0)))
    return wire.Frame(hdr, memoryview(payload))


@pytest.mark.parametrize("mut,vocab,counter", [
    (lambda w: w.proposal_q.__setitem__((0, 1, 0), np.nan), 0, "bad_reply_proposal_q"),
    (lambda w: w.proposal_q.__setitem__((1, 4, 3), np.inf), 0, "bad_reply_proposal_q"),
    (lambda w: w.proposal_q.__setitem__((0, 0, 0), 1.5), 0, "bad_reply_proposal_q"),
    (lambda w: w.proposal_q.__setitem__((0, 0, 5), -0.1), 0, "bad_reply_proposal_q"),
    (lambda w: w.proposal_q.__setitem__((1, 2, 1), 0.01), 0, "bad_reply_q_sum"),  # 1.01 > 1 + eps
    (lambda w: w.support_ids.__setitem__((0, 3, 7), -2), 0, "bad_reply_support_id"),  # not the padding
    (lambda w: w.support_ids.__setitem__((1, 0, 31), 5000), 1000, "bad_reply_support_id"),  # past vocab
    (lambda w: w.draft_ids.__setitem__((1, 1), 7), 0, "bad_reply_draft_support"),  # not in its support
    (lambda w: w.sampled_mask.__setitem__(1, 0) or w.support_ids.__setitem__((1, 2, 9), 2**31 - 1), 1000,
     "bad_reply_support_id"),  # a request that did not sample is checked too: its fields reach the page
])
def test_decode_reply_refuses_bad_sampled_sections(mut, vocab, counter):
    with pytest.raises(RemoteProtocolError) as ei:
        wire.decode_reply(_sampled_reply(mut), LAYOUT, n_req=2, step_flags=SAMPLED, vocab_size=vocab)
    assert ei.value.counter == counter


def test_decode_reply_accepts_good_sampled_sections():
    ok = _sampled_reply(lambda w: None)
    assert wire.decode_reply(ok, LAYOUT, n_req=2, step_flags=SAMPLED, vocab_size=1000).n == 2
    # q summing to 1 within float32 rounding, padding -1 past n_out, a draft -1 needs no support,
    # ids up to the int32 maximum when the vocabulary is unknown, and an unusable request is not
    # held to its drafts
    def fine(w):
        w.proposal_q[0, 0, :] = np.float32(1 / 32)
        w.support_ids[0, 4] = -1
        w.proposal_q[0, 4] = 0
        w.draft_ids[0, 4] = -1
        w.support_ids[1, 0, 31] = 2**31 - 1
        w.status[1] = wire.RS_GAP
        w.draft_ids[1, 1] = 7
    assert wire.decode_reply(_sampled_reply(fine), LAYOUT, n_req=2, step_flags=SAMPLED).n == 2
    with pytest.raises(RemoteProtocolError):  # the same with a vocabulary: 2**31 - 1 is past it
        wire.decode_reply(_sampled_reply(fine), LAYOUT, n_req=2, step_flags=SAMPLED, vocab_size=1000)


def test_welcome_without_vocab_size_still_decodes():
    """WELCOME gained vocab_size with a default: a peer that does not send it agrees (0 = unknown)."""
    import msgspec

    class OldWelcome(msgspec.Struct, frozen=True, tag="welcome"):
        protocol_version: int
        num_spec: int
        window: int
        row_bytes: int
        max_reqs: int
        sampled: bool
        worker_id: str
        drafter: str

    body = msgspec.msgpack.encode(OldWelcome(1, 5, 128, 71680, 256, False, "w", "integrity"))
    hdr = bytearray(wire.APP_HEADER_SIZE)
    wire.pack_app_header(hdr, 0, wire.MSG_WELCOME, session=0, epoch=0, step_id=0, payload_len=len(body))
    [(h, payload)] = _frames(bytes(hdr) + body)
    msg = wire.decode_control(wire.Frame(h, memoryview(payload)))
    assert isinstance(msg, wire.Welcome) and msg.vocab_size == 0


@pytest.mark.parametrize("sampled", [False, True])
def test_place_copies_anything_but_the_prefixs_own_views(sampled):
    """`place` leaves the prefix's own in-place views alone (known by identity) and copies anything else
    in: a caller's array, or a view of the prefix's memory that sits elsewhere (an offset slice)."""
    from dspark_proxy.wire.step import StepPrefix, place

    rng = np.random.default_rng(3)
    p = StepPrefix(8, sampled)
    own = p.entries(3)
    assert p.entries(3) is own  # made once per k
    own.view(np.uint8)[:] = rng.integers(0, 256, own.nbytes, dtype=np.uint8)
    meta = p.sample(3) if sampled else None
    before = bytes(p)
    place(p, own, meta)
    assert bytes(p) == before
    foreign = np.zeros(3, wire.ENTRY_DTYPE)
    foreign.view(np.uint8)[:] = rng.integers(0, 256, foreign.nbytes, dtype=np.uint8)
    fmeta = None
    if sampled:
        fmeta = np.zeros(3, wire.SAMPLE_DTYPE)
        fmeta["seed"] = [1, 2, 3]
    place(p, foreign, fmeta)
    assert p.entries(3).tobytes() == foreign.tobytes()
    if sampled:
        assert p.sample(3)["seed"].tolist() == [1, 2, 3]
    shifted = p.entries(4)[1:]  # the prefix's memory, one entry along: not in place
    want = shifted.copy()
    place(p, shifted, None)
    assert p.entries(3).tobytes() == want.tobytes()


def _bad_entry_reference(e: np.ndarray, layout: WireLayout) -> list[bool]:
    """bad_entry_mask's rules, one entry at a time in Python integers (no overflow to reason about)."""
    out, seen = [], set()
    for x in e.tolist():
        slot, n_rows, _gen, first, anchor, _tok, flags, _k, n_out, _pad = x
        bad = (flags & ~wire.RF_ALL) != 0 or (flags & wire.RF_RESYNC and not flags & wire.RF_NEW_GEN)
        bad = bad or n_rows > layout.window or (flags & wire.RF_NEW_GEN and n_rows == 0) or first < 0
        bad = bad or anchor != first + n_rows or n_out > layout.num_spec or slot >= layout.max_reqs
        bad = bad or slot in seen
        seen.add(slot)
        out.append(bool(bad))
    return out


_I64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.one_of(st.integers(-5, 40), _I64),
                          st.one_of(st.integers(-5, 60), _I64), st.integers(0, 255), st.integers(0, 8)),
                max_size=12))
def test_bad_entry_mask_is_its_entry_by_entry_definition(rows):
    """Both the C pass and the numpy reference (tests/test_native_entries.py: the same bytes)."""
    e = np.zeros(len(rows), dtype=wire.ENTRY_DTYPE)
    for i, (slot, n_rows, first, anchor, flags, n_out) in enumerate(rows):
        e[i]["slot"], e[i]["n_rows"], e[i]["first_pos"], e[i]["anchor_pos"] = slot, n_rows, first, anchor
        e[i]["flags"], e[i]["n_out"] = flags, n_out
    want = _bad_entry_reference(e, LAYOUT)
    assert wire.bad_entry_mask(e, LAYOUT).tolist() == want
    assert wire.bad_entry_mask_reference(e, LAYOUT).tolist() == want


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9), st.data())
def test_the_reply_checks_in_c_are_their_numpy_definition(n, data):
    """_fastround.check_reply answers what reply_section_error_reference answers (the first failed
    check over the whole batch) on replies with statuses, windows and confidences anywhere, NaN and
    infinities included; and decode_reply refuses the same replies with the same message either way."""
    from dspark_proxy.round import _fastround
    from dspark_proxy.wire.reply_checks import _USABLE_U8, reply_section_error, reply_section_error_reference

    N, W = 5, 8
    w = wire.ReplyWriter(n, N, 0)
    w.status[:] = data.draw(st.lists(st.sampled_from([0, 1, 2, 3, 6, 7, 255]), min_size=n, max_size=n))
    w.window_rows[:] = data.draw(st.lists(st.sampled_from([0, 1, W, W + 1, 2**32 - 1]), min_size=n, max_size=n))
    w.confidence[:] = np.asarray(data.draw(st.lists(st.sampled_from([0.0, 0.5, np.nan, np.inf, -np.inf]),
                                                    min_size=n * N, max_size=n * N)), np.float32).reshape(n, N)
    buf = bytes(w.finish(session=1, epoch=1, step_id=1, worker_us=1.0))
    lay = wire.reply_layout(n, N, 0)
    payload = buf[wire.APP_HEADER_SIZE:]
    want = reply_section_error_reference(w.status, w.window_rows, w.confidence, W) if n else 0
    assert reply_section_error(payload, lay, W) == want
    # an unaligned copy of the payload: the same answer (loads do not assume alignment)
    odd = bytearray(1) + payload
    assert _fastround.check_reply(memoryview(odd)[1:], lay.o_status, lay.o_window_rows, lay.o_confidence, n, N, W,
                                  wire.RS_MAX, _USABLE_U8) == want
    if n:  # sections past the payload: refused, never read
        with pytest.raises(ValueError):
            _fastround.check_reply(payload[:lay.o_confidence], lay.o_status, lay.o_window_rows, lay.o_confidence,
                                   n, N, W, wire.RS_MAX, _USABLE_U8)
    [(hdr, body)] = _frames(buf)
    seen, before = [], os.environ.get("DSPARK_NATIVE")
    for native in ("1", "0"):  # decode_reply through each: the same outcome
        os.environ["DSPARK_NATIVE"] = native
        try:
            wire.decode_reply(wire.Frame(hdr, memoryview(body)), WireLayout(num_spec=N, window=W, row_bytes=8,
                                                                            max_reqs=16), n_req=n, step_flags=0)
            seen.append(None)
        except RemoteProtocolError as e:
            seen.append(str(e))
        finally:
            os.environ.pop("DSPARK_NATIVE", None) if before is None else os.environ.__setitem__("DSPARK_NATIVE", before)
    assert seen[0] == seen[1] and (seen[0] is None) == (want == 0), seen
