"""Every event field accurate (the round's own), the incarnation on every event, only
produced phases documented, and `status --watch` riding through a proxy restart."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from click.testing import CliRunner

from dspark_proxy.commands import control
from dspark_proxy.ops import events
from dspark_proxy.round.stats import PHASES as _PHASES
from dspark_proxy.shm.layout import LayoutParams, State, Word
from dspark_proxy.shm.segment import Segment
from engine_shim.attach import AttachState
from engine_shim.shim import Shim
from tests.rig import Rig

pytestmark = pytest.mark.timeout(60)

M, N, W, B = 8, 3, 4, 16
PARAMS = LayoutParams(max_reqs=M, num_spec=N, window=W, row_bytes=B, max_rows=M * W, resync_per_round=2)


def _round(n: int, q: int) -> dict:
    """n requests, each a query of q tokens sending q rows (q > N + 1: a prefill)."""
    return dict(req_ids=np.arange(n, dtype=np.int64), slots=np.arange(n), qsl=np.arange(n + 1) * q,
                need_draft=np.ones(n, bool), k_window=np.zeros(n, np.int64),
                rows=np.zeros((n * min(q, W), B), np.uint8), valid=np.full(n, min(q, W)),
                first_pos=np.zeros(n, np.int64), anchor=np.ones(n, np.int64))


def _segment(name: str) -> Segment:
    seg = Segment.create(name, PARAMS, deadline_ms=15.0)
    seg.set_word(Word.HEARTBEAT_NS, 1 << 62)
    seg.set_word(Word.STATE, State.READY)
    return seg


def test_a_late_rounds_event_carries_that_rounds_fields(seg_name):
    """Nobody serves the segment: the watcher fails a prefill round at its deadline. Its event has the
    round's phase, rows, longest query and incarnation, and proxy_wait_ms 0 (documented), also when
    reported after a smaller decode round was enqueued."""
    seg = _segment(seg_name)
    shim = Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, look_every_s=0.01)
    try:
        end = time.monotonic() + 5
        while shim.state is not AttachState.PENDING and time.monotonic() < end:  # the watchdog finds it
            time.sleep(0.005)
        shim.enqueue(1, **_round(3, 7))  # attaches at round 1
        assert shim.read_reply(1).status == 2
        ev = [e for e in shim.events.dump() if e["how"] == "watchdog" and e["round"] == 1]
        assert ev, shim.events.dump()
        e = ev[0]
        assert (e["phase"], e["n"], e["rows"], e["longest_query"], e["proxy_wait_ms"]) == ("prefill", 3, 12, 7, 0.0)
        assert e["incarnation"] == seg.incarnation and e["time"] > 1.6e9
        shim.enqueue(2, **_round(1, 1))
        shim.note_watchdog(1, 3, "watchdog")  # the watcher's record of round 1, drained late
        late = shim.events.dump()[-1]
        assert (late["round"], late["phase"], late["n"], late["rows"], late["longest_query"]) == (1, "prefill", 3, 12, 7)
        assert shim.read_reply(2).status == 2
        d = [e for e in shim.events.dump() if e["how"] == "watchdog" and e["round"] == 2][0]
        assert (d["phase"], d["n"], d["rows"], d["longest_query"]) == ("decode", 1, 1, 1)
        for e in shim.events.dump():  # every event of the shim: documented, tied to the incarnation
            assert e["how"] in events.WATCHDOG_HOWS and e["phase"] in events.PHASES
            assert e["incarnation"] == seg.incarnation
    finally:
        shim.close()
        seg.unlink()
        seg.close()


def test_the_proxys_events_carry_the_incarnation(seg_name):
    rig = Rig(seg_name)
    try:
        rig.round([(1, 0, 1)])
        rig.t += 1
        rig.shim.enqueue(rig.t, **rig.batch([(1, 0, 1)]))
        rig.shim._flags.fail(rig.t, 1)  # the watchdog's claim, before the proxy gets there
        rig.core.handle(rig.t, 0.0)
        rig.shim.read_reply(rig.t)
        skipped = [e for e in rig.core.events.dump() if e["how"] == "skipped"]
        assert skipped and skipped[0]["incarnation"] == rig.seg.incarnation
        assert skipped[0]["phase"] in events.PHASES
    finally:
        rig.close()


def test_events_document_only_the_phases_the_code_produces():
    assert set(events.PHASES) == set(_PHASES)
    doc = events.__doc__
    phase_doc = doc[doc.index("``phase``"):doc.index("``n``")]
    assert set(re.findall(r"``(\w+)``", phase_doc)) - {"phase", "PHASES"} == set(events.PHASES)
    how_doc = doc[doc.index("``how``"):doc.index("``phase``")]
    assert set(re.findall(r"``(\w+)``", how_doc)) - {"how", "WATCHDOG_HOWS"} == set(events.WATCHDOG_HOWS)


def test_status_watch_rides_through_a_proxy_restart(seg_name, monkeypatch):
    """The segment disappears and comes back as a new incarnation between two refreshes: --watch says
    so and goes on showing the new one, instead of exiting."""
    segs = [_segment(seg_name)]
    ticks = []

    def sleep(_s):
        ticks.append(1)
        if len(ticks) == 1:
            segs[0].unlink()  # the proxy re-creating its segment: gone for a moment
        elif len(ticks) == 2:
            segs.append(_segment(seg_name))
        else:
            raise SystemExit(0)

    monkeypatch.setattr(control.time, "sleep", sleep)
    try:
        r = CliRunner().invoke(control.status, ["--name", seg_name, "--json", "--watch", "0.01"])
        shown = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
        assert r.exit_code == 0, r.output
        assert [s["header"]["incarnation"] for s in shown] == [segs[0].incarnation, segs[1].incarnation]
        assert "retrying" in r.stderr
    finally:
        for s in segs:
            s.unlink()
            s.close()
