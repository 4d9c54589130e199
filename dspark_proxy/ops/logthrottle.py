"""One log record per interval for an error that repeats every round, with a count of what was held back.

A systematic error (a bug hit by every round) would otherwise write a full traceback per round, a
thousand a second; one per interval says the same, and the count says how often it happened.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LogThrottle", "KeyedThrottle"]


class LogThrottle:
    """`exception(logger, msg, *args)` logs (with the traceback) at most once per `interval_s`; the
    next record that does get through ends with how many were suppressed since the last one."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._next = float("-inf")
        self._lock = threading.Lock()
        self.suppressed = 0  # since the last record written
        self.suppressed_total = 0

    def exception(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        """Call from an `except` block. True when the record was written."""
        now = self._clock()
        with self._lock:
            if now < self._next:
                self.suppressed += 1
                self.suppressed_total += 1
                return False
            held, self.suppressed = self.suppressed, 0
            self._next = now + self.interval_s
        if held:
            logger.exception(msg + " (and %d more like it in the last %g s, not logged)", *args, held,
                             self.interval_s)
        else:
            logger.exception(msg + " (repeats are logged at most once per %g s)", *args, self.interval_s)
        return True


class KeyedThrottle:
    """`log(logger, level, key, msg, *args)` writes at most one record per `key` per `interval_s`; the next
    one that gets through says how many were held back. For a peer that repeats the same mistake every
    retry (a misconfigured proxy reconnecting every 2 s): the first WARNING says what is wrong, the rest
    only add to a count. At most `max_keys` keys are remembered (the oldest forgotten first)."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 1024) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._next: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def log(self, logger: logging.Logger, level: int, key: object, msg: str, *args: object) -> bool:
        """True when the record was written."""
        now = self._clock()
        with self._lock:
            if now < self._next.get(key, float("-inf")):
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._next.pop(key, None)
            self._next[key] = now + self.interval_s  # re-inserted: the dict's order is the age
            while len(self._next) > self._max_keys:
                old = next(iter(self._next))
                del self._next[old]
                self._held.pop(old, None)
        if held:
            logger.log(level, msg + " (and %d more like it in the last %g s, not logged)", *args, held,
                       self.interval_s)
        else:
            logger.log(level, msg + " (repeats are logged at most once per %g s)", *args, self.interval_s)
        return True
