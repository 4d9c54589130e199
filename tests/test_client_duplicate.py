"""One REPLY frame too many: a frame nobody waits for is discarded, so the client
stays in step with the worker and drafts resume at once instead of every later round reading the
previous round's reply."""

from __future__ import annotations

import pytest

from dspark_proxy.worker import FaultPlan
from tests.test_client import Stepper, pair  # noqa: F401 - pair is a fixture

pytestmark = pytest.mark.timeout(60)


def test_one_duplicated_reply_does_not_put_the_client_behind(pair):  # noqa: F811
    srv, c = pair(server_kw=dict(faults=FaultPlan(duplicate_reply_every=3)))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True))
    s.check(*s.step())
    s.check(*s.step())  # the worker sends this reply twice
    assert srv.counters["fault_duplicate_reply"] == 1
    ok = 0
    for _ in range(40):  # 13 more duplicates on the way (43 steps: 14 in all, the last read at step 43): each is discarded, none costs a round
        out, a = s.step()
        s.check(out, a)
        ok += 1
    assert ok == 40 and c.counters["bad_replies"] == 0
    assert c.counters["extra_replies_dropped"] == srv.counters["fault_duplicate_reply"] == 14
    assert c.connection_epoch() == 1  # the stream stayed usable: no reconnect was needed


def test_an_extra_frame_after_a_timeout_is_also_discarded(pair):  # noqa: F811
    """A late reply and then its duplicate, both before the next step's own reply."""
    srv, c = pair(server_kw=dict(faults=FaultPlan(duplicate_reply_every=2, delay_ms=120)))
    assert c.wait_ready(5) == 1
    s = Stepper(c)
    s.check(*s.step(new_gen=True, timeout_s=2.0))
    out, _ = s.step(timeout_s=0.02)  # times out; its reply comes late, twice
    assert out.reason == "timeout"
    out, a = s.step(timeout_s=2.0)
    s.check(out, a)
    assert c.counters["late_replies_dropped"] == 1 and c.counters["extra_replies_dropped"] == 1
