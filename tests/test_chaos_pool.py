"""The pool kinds' own check (chaos/report.py): a pool_* injection fails the campaign when the healthy
worker's requests got usable drafts in fewer than 99% of their entries (misses counted) — 99% of the
baseline's usable share where a busy machine kept the baseline itself below 100% — or when the rate is
missing (the injection never measured it)."""

from __future__ import annotations

from dspark_proxy.chaos.pool_faults import _healthy
from dspark_proxy.chaos.report import _checks


def _row(kind: str, notes: dict) -> dict:
    return {"kind": kind, "n": 1, "notes": notes, "proxy_counters": {}}


def _failures(rows: list[dict], baseline_usable: float | None = 1.0) -> list[str]:
    failures: list[str] = []
    _checks({"kinds": [r["kind"] for r in rows], "deadline_ms": 30.0, "margin_ms": 20.0},
            {r["kind"]: {} for r in rows}, 0, [], [], failures, rows, baseline_usable)
    return failures


def test_healthy_rate_below_99_percent_fails_the_run():
    assert _failures([_row("pool_worker_kill", {"healthy_usable_rate": 0.995})]) == []
    (f,) = _failures([_row("pool_worker_stall", {"healthy_usable_rate": 0.98})])
    assert "pool_worker_stall #1" in f and "0.98" in f
    (f,) = _failures([_row("pool_worker_kill", {"pool_setup_failed": True})])
    assert "None" in f
    assert _failures([_row("worker_kill", {})]) == []  # other kinds are not held to it


def test_healthy_rate_counts_misses_and_rounds_the_watchdog_took():
    before = {"entries": 100, "usable": 100, "missed": 0, "steps": 10}
    after = {"entries": 300, "usable": 296, "missed": 4, "steps": 20}
    h = _healthy(before, after, late=1)  # 20 entries a round: a round lost to the watchdog is 20 misses
    assert h["healthy_entries"] == 200 and h["healthy_missed"] == 24 and h["healthy_rounds"] == 11
    assert h["healthy_usable_rate"] == round(196 / 220, 4)


def test_on_a_busy_machine_the_bar_is_the_baselines_share():
    # load ~10 on two cores: the baseline itself got drafts for 40% of what it needed (rounds the watchdog
    # took), the healthy worker's requests 45%: the busy machine's loss, not the pool fault's
    assert _failures([_row("pool_worker_kill", {"healthy_usable_rate": 0.45})], baseline_usable=0.4) == []
    (f,) = _failures([_row("pool_worker_stall", {"healthy_usable_rate": 0.85})], baseline_usable=0.9)
    assert "< 0.891" in f and "0.9" in f  # the fault cost the healthy share more than the machine did
    # over 25 rounds chance alone moves a 90% share by 3 x 6 points: 85% is within it; 70% is not
    rows = [_row("pool_worker_stall", {"healthy_usable_rate": 0.85, "healthy_rounds": 25})]
    assert _failures(rows, baseline_usable=0.9) == []
    (f,) = _failures([_row("pool_worker_stall", {"healthy_usable_rate": 0.70, "healthy_rounds": 25})], 0.9)
    assert "< 0.711" in f
    assert _failures([_row("pool_worker_kill", {"healthy_usable_rate": 0.9})], baseline_usable=0.9) == []
    # a quiet machine (or no baseline rounds): the plain 99%
    (f,) = _failures([_row("pool_worker_kill", {"healthy_usable_rate": 0.45})], baseline_usable=None)
    assert "< 0.99" in f
