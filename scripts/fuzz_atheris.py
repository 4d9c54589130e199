#!/usr/bin/env python
"""Coverage-guided fuzzing (atheris / libFuzzer) of everything that reads bytes from the other side, for
long runs. CI runs the bounded hypothesis versions of the same targets (tests/test_wire_fuzz.py,
tests/test_fuzz_descriptor.py, tests/test_fuzz_header.py, tests/test_fuzz_sockets.py); this harness is
for hours, not seconds.

Install (atheris is not a project dependency; it needs a clang/libFuzzer build on some platforms):

    .venv/bin/pip install atheris

Run one target (the last arguments go to libFuzzer):

    .venv/bin/python scripts/fuzz_atheris.py TARGET [libFuzzer args]
    .venv/bin/python scripts/fuzz_atheris.py step        -max_total_time=3600 -max_len=4096 corpus/step
    .venv/bin/python scripts/fuzz_atheris.py reply       -max_total_time=3600 corpus/reply
    .venv/bin/python scripts/fuzz_atheris.py control     -max_total_time=3600
    .venv/bin/python scripts/fuzz_atheris.py descriptor  -max_total_time=3600 -max_len=8192
    .venv/bin/python scripts/fuzz_atheris.py header      -max_total_time=3600 -max_len=4096
    .venv/bin/python scripts/fuzz_atheris.py --list

Targets and the invariant each checks (a violation raises, and libFuzzer saves the crashing input):

    step        the worker's STEP decoding: Decoder.feed + decode_step + bad_entry_mask on the bytes,
                as the worker reads them after a handshake: frames or RemoteProtocolError, nothing else
    reply       the client's REPLY decoding: Decoder + decode_reply for the STEP it answers
    control     msgpack control messages (HELLO, WELCOME, ERROR, ...) through decode_control
    descriptor  round t's desc (first half of the input) and meta (second half) slots of a real segment
                written with the bytes, then RoundCore.handle(t): it returns, publishes t, a refused
                round is a failed reply, and the next good round drafts right (integrity oracle)
    header      a real segment's header page overwritten: Segment.open / engine_shim.attach accept it
                or raise SegmentError (LayoutMismatch) with a message

Seed corpora: `--seed-corpus DIR TARGET` writes a few valid inputs for TARGET into DIR first.
Reproduce a crash: `.venv/bin/python scripts/fuzz_atheris.py TARGET crash-<sha>` (libFuzzer runs the
single input). Without atheris, `--smoke N` runs every target on N random inputs (a harness check;
tests/test_fuzz_atheris_harness.py runs it in CI). Shared-memory segments are named `atheris-<pid>-*` and removed at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import dspark_proxy.wire as wire  # noqa: E402

LAYOUT = wire.WireLayout(num_spec=3, window=4, row_bytes=8, max_reqs=6, sampled=True)
LIMITS = {wire.MSG_STEP: LAYOUT.max_step_payload(), wire.MSG_REPLY: LAYOUT.max_reply_payload()}
LIMITS.update({t: wire.MAX_CONTROL_PAYLOAD for t in wire.CONTROL_TYPES})


def _frames(data: bytes, handle: Callable[[wire.Frame], None]) -> None:
    d = wire.Decoder(LIMITS, max_frame_bytes=1 << 16)
    try:
        d.feed(data)
        while (f := d.next_frame()) is not wire.NEED_DATA:
            try:
                handle(f)
            except wire.RemoteProtocolError as e:
                assert e.counter, "a RemoteProtocolError must name its counter"
    except wire.RemoteProtocolError as e:
        assert e.counter


def target_step(data: bytes) -> None:
    def handle(f: wire.Frame) -> None:
        if f.header.type == wire.MSG_STEP:
            sv = wire.decode_step(f, LAYOUT)
            wire.bad_entry_mask(sv.entries, LAYOUT)

    _frames(data, handle)


def target_reply(data: bytes) -> None:
    n_req = data[0] % 7 if data else 0
    flags = (wire.SF_WANT_MARGIN if data and data[-1] & 1 else 0) | (wire.SF_SAMPLED if data and data[-1] & 2 else 0)

    def handle(f: wire.Frame) -> None:
        if f.header.type == wire.MSG_REPLY:
            wire.decode_reply(f, LAYOUT, n_req=n_req, step_flags=flags)

    _frames(data[1:], handle)


def target_control(data: bytes) -> None:
    def handle(f: wire.Frame) -> None:
        if f.header.type in wire.CONTROL_TYPES:
            wire.decode_control(f)

    _frames(data, handle)


# ------------------------------------------------------------------ shared-memory targets (lazy setup)

_names: list[str] = []
_rig = None


def _new_name(tag: str) -> str:
    name = f"atheris-{os.getpid()}-{tag}-{len(_names)}"
    _names.append(name)
    return name


@atexit.register
def _cleanup() -> None:
    import posix_ipc

    from dspark_proxy.shm.ring_shm import unlink_rings
    from dspark_proxy.shm.segment import shm_name

    for n in _names:
        unlink_rings(n)
        try:
            posix_ipc.unlink_shared_memory(shm_name(n))
        except posix_ipc.ExistentialError:
            pass


REQS = [(1, 0, 1), (2, 3, 1), (3, 5, 2)]


def _good_round(rig) -> int:
    reply, b = rig.round(REQS)
    return rig.check_drafts(reply, b)


def target_descriptor(data: bytes) -> None:
    global _rig
    from dspark_proxy.shm.layout import STATUS_ROUND_FAILED, Word
    from tests.rig import Rig

    if _rig is None or _rig.t > 1_000_000:
        if _rig is not None:
            _rig.close()
        _rig = Rig(_new_name("desc"))
        _good_round(_rig)
    rig = _rig
    lay = rig.seg.layout
    b = rig.batch(REQS)
    rig.t += 1
    t = rig.t
    rig.shim.enqueue(t, **b)
    half = len(data) // 2
    for region, chunk in (("desc", data[:half]), ("meta", data[half:])):
        off, dt = (lay.desc_off(t), lay.desc_dtype) if region == "desc" else (lay.meta_off(t), lay.meta_dtype)
        raw = np.ndarray((dt.itemsize,), np.uint8, buffer=rig.seg.mm, offset=off)
        body = np.frombuffer(chunk, np.uint8)[: dt.itemsize - 8]
        raw[8:8 + body.shape[0]] = body  # keep stamp_start: the body is what is fuzzed
    before = rig.stats.counter("fallback_bad_descriptor") + rig.stats.counter("fallback_internal_error")
    rig.core.handle(t, 0.0)
    assert rig.seg.word(Word.PUBLISHED) == t
    reply = rig.shim.read_reply(t)
    if rig.stats.counter("fallback_bad_descriptor") + rig.stats.counter("fallback_internal_error") > before:
        assert reply.status == STATUS_ROUND_FAILED
    for _ in range(6):  # drafts come back, and are right
        if _good_round(rig):
            break


def target_header(data: bytes) -> None:
    import engine_shim
    from dspark_proxy.shm.layout import HEADER_BYTES, LayoutParams, State, Word
    from dspark_proxy.shm.segment import Segment, SegmentError

    name = _new_name("hdr")
    p = LayoutParams(max_reqs=8, num_spec=3, window=4, row_bytes=16, max_rows=32, resync_per_round=2)
    seg = Segment.create(name, p, deadline_ms=50.0)
    try:
        seg.set_word(Word.STATE, State.READY)
        hdr = np.ndarray((HEADER_BYTES,), np.uint8, buffer=seg.mm, offset=0)
        chunk = np.frombuffer(data, np.uint8)[:HEADER_BYTES]
        hdr[: chunk.shape[0]] = chunk
        try:
            Segment.open(name).close()
        except SegmentError as e:
            assert str(e)
        try:
            shim = engine_shim.attach(name, max_reqs=8, num_spec=3, window=4, row_bytes=16)
        except SegmentError as e:
            assert str(e)
        else:
            shim.watchdog._look_for_proxy()
            shim.close()
    finally:
        _cleanup()
        _names.clear()
        seg.close()


TARGETS: dict[str, Callable[[bytes], None]] = {"step": target_step, "reply": target_reply,
                                               "control": target_control, "descriptor": target_descriptor,
                                               "header": target_header}


def _seed_corpus(target: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    from tests.test_wire_fuzz import VALID

    seeds = list(VALID) if target in ("step", "reply", "control") else [bytes(256), os.urandom(512)]
    for i, s in enumerate(seeds):
        (out / f"seed-{i}").write_bytes(s)


def smoke(n: int, seed: int = 0) -> dict[str, int]:
    """Every target on n random inputs (and mutations of valid frames), without atheris."""
    from tests.test_wire_fuzz import VALID

    rng = np.random.default_rng(seed)
    done = {}
    for name, fn in TARGETS.items():
        for i in range(n):
            if i % 2 and name in ("step", "reply", "control"):
                buf = bytearray(VALID[i % len(VALID)])
                for _ in range(int(rng.integers(1, 5))):
                    buf[int(rng.integers(0, len(buf)))] = int(rng.integers(0, 256))
                data = bytes(buf)
            else:
                data = rng.bytes(int(rng.integers(0, 1024)))
            fn(data)
        done[name] = n
    return done


def main() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help", "--list"):
        print(__doc__)
        print("targets:", ", ".join(TARGETS))
        return
    if args[0] == "--smoke":
        print(smoke(int(args[1]) if len(args) > 1 else 100))
        return
    if args[0] == "--seed-corpus":
        _seed_corpus(args[2], Path(args[1]))
        args = args[2:]
    target = args[0]
    if target not in TARGETS:
        sys.exit(f"unknown target {target!r}; one of {', '.join(TARGETS)}")
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: .venv/bin/pip install atheris (see the top of this file)")
    fn = TARGETS[target]
    atheris.instrument_all()
    atheris.Setup([sys.argv[0], *args[1:]], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
