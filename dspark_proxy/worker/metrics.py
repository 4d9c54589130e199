"""The worker's Prometheus endpoint (`worker --metrics-port`): what an operator of a drafting host asks.

How many sessions it holds and how much of its memory budget they use, how long the drafter takes a
round, why peers were refused, and how many rounds each peer sends. Names follow the proxy's endpoint
(metrics.py): namespace ``dspark_worker``, base units (seconds, bytes), ``_total`` on counters, one
family with a label for counts of one kind. The round path only adds to a histogram under a lock and
bumps a counter; everything else is read at scrape time, on the HTTP thread.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WorkerObserved", "WorkerCollector", "REFUSAL_COUNTERS"]

# the worker's counters that are refusals, -> the cause label (worker/admission.py, worker/server.py)
REFUSAL_COUNTERS = {
    "handshake_mismatch": "mismatch",
    "handshake_memory_refused": "memory_budget",
    "auth_refused": "auth",
    "connections_refused": "too_many_connections",
    "handshake_timeout": "handshake_timeout",
    "handshakes_evicted": "handshake_evicted",
}
_SESSION_REFUSED = "session_refused_"


class WorkerObserved:
    """The drafter's time per round (a histogram, the proxy's buckets) and rounds per peer host."""

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds_s = bounds_s
        self._lock = threading.Lock()
        self._buckets = [0] * (len(bounds_s) + 1)
        self._sum_s = 0.0
        self._count = 0
        self._max_s = 0.0
        self.rounds_by_peer: Counter[str] = Counter()

    def round(self, peer: str, draft_s: float) -> None:
        """One STEP served for `peer` (its host: the label stays bounded across reconnects)."""
        with self._lock:
            self._buckets[bisect.bisect_left(self.bounds_s, draft_s)] += 1
            self._sum_s += draft_s
            self._count += 1
            self._max_s = max(self._max_s, draft_s)
            self.rounds_by_peer[peer] += 1

    def read(self) -> tuple[list[int], float, int, float, dict[str, int]]:
        with self._lock:
            return list(self._buckets), self._sum_s, self._count, self._max_s, dict(self.rounds_by_peer)


class WorkerCollector:
    """prometheus_client collector over a running WorkerServer (read at each scrape)."""

    def __init__(self, server: Any, namespace: str = "dspark_worker") -> None:
        self._server = server
        self._ns = namespace

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        srv, ns = self._server, self._ns
        n: Callable[[str], str] = lambda k: f"{ns}_{k}"  # noqa: E731
        g = GaugeMetricFamily(n("sessions"), "Drafting sessions the worker holds (one per proxy, as a rule).")
        g.add_metric([], float(len(srv.sessions)))
        yield g
        conns, _ = srv.admission.live()
        g = GaugeMetricFamily(n("connections"), "Open connections from proxies.")
        g.add_metric([], float(len(conns)))
        yield g
        g = GaugeMetricFamily(n("memory_budget_bytes"), "Bytes of slot windows all sessions may hold "
                              "(--memory-budget-mb).")
        g.add_metric([], float(srv.budget_bytes))
        yield g
        g = GaugeMetricFamily(n("memory_used_bytes"), "Bytes of slot windows held by sessions and "
                              "connections now (past the budget, new ones are refused).")
        g.add_metric([], float(srv.sessions.reserved_bytes))
        yield g
        buckets, sum_s, count, max_s, by_peer = srv.observed.read()
        acc, cum = 0, []
        for le, c in zip(srv.observed.bounds_s, buckets, strict=False):
            acc += c
            cum.append((f"{le:g}", float(acc)))
        cum.append(("+Inf", float(count)))
        yield HistogramMetricFamily(n("draft_seconds"), "Time the drafter took for one round (STEP) of a "
                                    "proxy, window updates included.", buckets=cum, sum_value=sum_s)
        g = GaugeMetricFamily(n("draft_max_seconds"), "Longest time the drafter took for one round.")
        g.add_metric([], max_s)
        yield g
        c = CounterMetricFamily(n("rounds"), "Rounds (STEPs) served, by the peer's host.", labels=["peer"])
        for peer, v in sorted(by_peer.items()):
            c.add_metric([peer], float(v))
        yield c
        counters = dict(srv.counters)
        r = CounterMetricFamily(n("refusals"), "Peers or sessions refused, by cause (mismatch: shapes or "
                                "target the worker cannot serve; memory_budget: no room; auth: wrong token).",
                                labels=["cause"])
        for key, cause in sorted(REFUSAL_COUNTERS.items(), key=lambda kv: kv[1]):
            r.add_metric([cause], float(counters.pop(key, 0)))
        for key in sorted(k for k in counters if k.startswith(_SESSION_REFUSED)):
            r.add_metric([f"session_{key[len(_SESSION_REFUSED):]}"], float(counters.pop(key)))
        yield r
        for key, v in sorted(counters.items()):
            c = CounterMetricFamily(n(key), f"The worker's count of {key.replace('_', ' ')} (key {key}; "
                                    f"docs/operating.md lists the metrics).")
            c.add_metric([], float(v))
            yield c
