"""How many threads the head's kernel uses each round, chosen by measuring rounds, not by assuming.

A second thread pays only while a second core is idle during the head's time (on a quiet 2-core
machine: the engine and the proxy wait while the worker drafts). When other work holds that core the
helper costs more than it brings: waking it preempts the caller, and two threads share the one
core's time (measured on the shared dev machine: a batch-4 round 1.3 ms on one thread, 1.7 ms on
two). Which case holds changes with the machine's load, so `ThreadChoice` keeps the recent round
times of each count per batch size and uses the faster, trying the other every `explore` rounds so a
change of load is noticed. The drafts are the same bytes whatever the count (model/headmm.py).
"""

from __future__ import annotations

from collections import deque

__all__ = ["ThreadChoice"]


class ThreadChoice:
    """`pick(n)` before a round of n requests, `record(n, seconds)` after it."""

    def __init__(self, most: int, *, explore: int = 16, keep: int = 9, buckets: int = 64) -> None:
        self.most = max(1, int(most))
        self.explore, self.keep, self.buckets = explore, keep, buckets
        self._times: dict[tuple[int, int], deque[float]] = {}
        self._rounds = 0
        self._last = self.most

    def _med(self, k: int, n: int) -> float | None:
        t = self._times.get((k, n))
        if t is None or len(t) < 3:
            return None
        return sorted(t)[len(t) // 2]

    def pick(self, n: int) -> int:
        """The thread count for a round of n requests: each count tried until it has 3 rounds at this
        size, then the faster median, the other every `explore` rounds."""
        if self.most == 1:
            return 1
        n = min(n, self.buckets)
        self._rounds += 1
        one, many = self._med(1, n), self._med(self.most, n)
        if one is None and many is None:  # not measured yet at this size: alternate
            k = 1 if self._last == self.most else self.most
        elif one is None or many is None:  # the one still short of samples
            k = 1 if one is None else self.most
        else:
            k = 1 if one <= many else self.most
            if self._rounds % self.explore == 0:
                k = self.most if k == 1 else 1
        self._last = k
        return k

    def record(self, n: int, seconds: float) -> None:
        key = (self._last, min(n, self.buckets))
        t = self._times.get(key)
        if t is None:
            self._times[key] = t = deque(maxlen=self.keep)
        t.append(seconds)
