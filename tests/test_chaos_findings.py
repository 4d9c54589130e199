"""What the fault campaign found in other modules, kept as regression tests (both fixed in client.py).

1. A TcpDraftClient whose handshake was refused (a worker restarted with another layout) stays disabled
   for good: its connect thread returns. When the right worker comes back on the same address, drafts
   never resume until the proxy is restarted (docs/guarantees.md: after a fault
   clears, usable drafts resume within a bounded number of rounds). `dspark-proxy chaos`
   (worker_layout) restarts the proxy to recover and reports `self_recovered: False`.
2. A reply is matched to its STEP by the step id in its header alone: a late reply that carries the
   next step's id (a worker mislabeling, --fault-wrong-step-every, answering after the client timed
   out) is taken as the next step's reply, and its drafts (for the previous round's windows) reach
   the engine as WRONG drafts. Seen once in a short chaos run under load (32 wrong drafts in a round).
"""

from __future__ import annotations

import time

import pytest

from dspark_proxy.link.client import TcpDraftClient
from dspark_proxy.worker import WorkerServer

pytestmark = pytest.mark.timeout(30)

N, W, RB, M = 3, 4, 8, 6


def test_client_reconnects_when_the_right_worker_comes_back():
    wrong = WorkerServer("127.0.0.1", 0, num_spec=N, window=W * 2, row_bytes=RB, max_reqs=M,
                         adopt_shapes=False)  # a worker that serves only its own window
    wrong.start()
    port = wrong.port
    c = TcpDraftClient("127.0.0.1", port, max_reqs=M, num_spec=N, window=W, row_bytes=RB, backoff_s=(0.01, 0.05))
    right = None
    try:
        c.start()
        end = time.monotonic() + 5
        while not c.disabled and time.monotonic() < end:
            time.sleep(0.01)
        assert c.disabled and "window" in (c.disabled_reason or "")  # refused, with the field named
        wrong.stop()
        right = WorkerServer("127.0.0.1", port, num_spec=N, window=W, row_bytes=RB, max_reqs=M)
        right.start()
        end = time.monotonic() + 5  # a fix may retry a refused worker slowly (every second, say)
        while c.connection_epoch() is None and time.monotonic() < end:
            time.sleep(0.02)
        assert c.connection_epoch() is not None, "the client never retried after the refused handshake"
        assert not c.disabled
    finally:
        c.stop()
        wrong.stop()
        if right is not None:
            right.stop()


def test_late_mislabeled_reply_is_not_taken_for_the_next_step():
    """Found by `dspark-proxy chaos` (wrong_step_id under load): 32 WRONG drafts reached the engine in one
    round. The worker answers STEP t late (after the client's timeout) and labels it t+1 (the
    --fault-wrong-step-every fault); the client, now in step t+1, takes it as step t+1's reply: the
    drafts of round t's windows are handed to round t+1.

    The worker answers the STEPs of one connection in order, one REPLY or ERROR each, so the first
    reply after a timed-out step is that step's whatever its label says: a client that counts the
    replies it is owed can drop it (and count the wrong label)."""
    from dspark_proxy.worker import FaultPlan
    from tests.test_client import Stepper, make_client, make_server

    srv = make_server(faults=FaultPlan(wrong_step_every=1, delay_ms=150))
    c = make_client(srv.port)
    try:
        assert c.wait_ready(5) == 1
        s = Stepper(c)
        out, _ = s.step(new_gen=True, timeout_s=0.03)  # step 1: its reply comes 150 ms later, labeled 2
        assert not out.ok and out.reason == "timeout"
        out, anchor_pos = s.step(timeout_s=1.0)  # step 2: the first frame is step 1's reply, labeled 2
        if out.ok:
            s.check(out, anchor_pos)  # the drafts must be step 2's: they are step 1's
    finally:
        c.stop()
        srv.stop()
