"""read_reply of a round whose reply is already there keeps the GIL (shm/_hostflag.c: wait_or_fail's
and read_page's fast paths). Released for nothing, the GIL went to another thread of the engine process
and the engine thread waited to get it back: a switch interval with that thread running, and as long
as the kernel kept it off the CPU on a busy machine: the chaos campaign's unexplained late waits
(docs/chaos.md, "Where a late wait went")."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from dspark_proxy.shm.hostflag import gil_wait_ns
from tests.rig import Rig

pytestmark = pytest.mark.timeout(60)

SWITCH_S = 0.05  # a release the busy thread sees costs the engine about this much


def test_read_reply_of_a_published_round_does_not_hand_the_gil_away(seg_name):
    stop = threading.Event()

    def busy() -> None:  # another thread of the engine process that always wants the GIL
        x = 0
        while not stop.is_set():
            x += 1

    rig = Rig(seg_name)
    old = sys.getswitchinterval()
    th = threading.Thread(target=busy, daemon=True)
    waits, gil = [], []
    try:
        rig.round([(1, 0, 2)])  # the attach round
        sys.setswitchinterval(SWITCH_S)
        th.start()
        for _ in range(20):
            b = rig.batch([(1, 0, 1)])
            rig.t += 1
            rig.shim.enqueue(rig.t, **b)
            rig.core.handle(rig.t, 0.0)  # the proxy's round, published before read_reply
            t0 = time.perf_counter()
            reply = rig.shim.read_reply(rig.t)
            waits.append(time.perf_counter() - t0)
            gil.append(gil_wait_ns())
            assert reply.ok_mask.all(), reply
    finally:
        stop.set()
        sys.setswitchinterval(old)
        th.join(5)
        rig.close()
    assert gil == [0] * len(gil), gil  # wait_or_fail answered without releasing the GIL
    # the busy thread never got the GIL inside read_reply: no wait of a switch interval (before: every round)
    assert max(waits) < SWITCH_S / 2, [round(w * 1e3, 2) for w in waits]
