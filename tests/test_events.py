"""events.py: the flight-recorder ring: wrap order, id checks, disabled ring, watchdog event fields."""

from __future__ import annotations

import threading

import pytest

from dspark_proxy.ops.events import WATCHDOG_EVENTS_KEPT, WATCHDOG_HOWS, EventRing, watchdog_event

pytestmark = pytest.mark.timeout(20)


def test_wrap_keeps_the_last_capacity_in_order():
    ring = EventRing(capacity=4)
    ids = [ring.record(round=r) for r in range(10)]
    assert ids == list(range(10))
    dump = ring.dump()
    assert [e["id"] for e in dump] == [6, 7, 8, 9]
    assert [e["round"] for e in dump] == [6, 7, 8, 9]
    assert len(ring) == 4 and ring.total == 10


def test_partial_ring_dumps_what_it_has():
    ring = EventRing(capacity=4)
    assert ring.dump() == []
    ring.record(how="a")
    ring.record(how="b")
    assert [(e["id"], e["how"]) for e in ring.dump()] == [(0, "a"), (1, "b")]
    assert len(ring) == 2


def test_get_checks_the_stored_id():
    ring = EventRing(capacity=4)
    for r in range(6):
        ring.record(round=r)
    assert ring.get(5) == {"id": 5, "round": 5}
    assert ring.get(1) is None  # slot 1 now holds id 5
    assert ring.get(6) is None  # never recorded (its slot holds id 2)
    assert ring.get(-1) is None


def test_dump_returns_copies():
    ring = EventRing(capacity=2)
    ring.record(round=1)
    ring.dump()[0]["round"] = 99
    assert ring.dump()[0]["round"] == 1


def test_disabled_ring():
    ring = EventRing(capacity=0)
    assert ring.record(round=1) == -1
    assert ring.dump() == [] and ring.get(0) is None and len(ring) == 0 and ring.total == 0


def test_bad_use():
    with pytest.raises(ValueError):
        EventRing(capacity=-1)
    with pytest.raises(ValueError, match="reserved"):
        EventRing(2).record(id=3)


def test_watchdog_event_fields():
    ev = watchdog_event(round=17, how="late_publish", phase="decode", n=64, rows=70, longest_query=3,
                        proxy_wait_ms=1.23456, time_s=1700000000.123456)
    assert list(ev) == ["round", "time", "how", "phase", "n", "rows", "longest_query", "proxy_wait_ms",
                        "incarnation"]
    assert ev["time"] == 1700000000.123 and ev["proxy_wait_ms"] == 1.235
    ring = EventRing(WATCHDOG_EVENTS_KEPT)
    eid = ring.record(**ev)
    assert ring.get(eid) == {"id": eid, **ev}
    assert watchdog_event(round=1, how="watchdog")["time"] > 1.6e9  # wall clock by default
    assert {"watchdog", "skipped", "late_publish", "proxy_dead", "proxy_hung", "abandoned"} <= set(WATCHDOG_HOWS)


def test_concurrent_recorders_get_unique_ids_and_a_consistent_dump():
    ring = EventRing(capacity=64)
    ids: list[list[int]] = [[] for _ in range(4)]

    def work(k):
        for i in range(2000):
            ids[k].append(ring.record(thread=k, i=i))

    threads = [threading.Thread(target=work, args=(k,), name=f"rec-{k}") for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    flat = sorted(i for lst in ids for i in lst)
    assert flat == list(range(8000))
    assert [e["id"] for e in ring.dump()] == list(range(8000 - 64, 8000))
