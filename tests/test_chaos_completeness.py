"""The campaign's window-completeness checks (chaos/completeness.py, chaos/report.py) over a made-up
per-round record: they pass a system whose windows come back within the bound, and fail one whose
windows stay short (the mutant: drafts from fewer rows than the engine holds, all of them right)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from dspark_proxy.chaos import format_table
from dspark_proxy.chaos.campaign import ChaosConfig
from dspark_proxy.chaos.completeness import recovery
from dspark_proxy.chaos.controller import Injection
from dspark_proxy.chaos.report import build_report

pytestmark = pytest.mark.timeout(30)

N_REQ = 8


class _Probe:
    """EngineProbe's record, written by hand: (status, usable, full, enqueue ms[, windows staged]) per
    round; windows staged default to what makes the next round's full windows (a correct system)."""

    def __init__(self, rounds: list[tuple]) -> None:
        n = len(rounds)
        self.t = list(range(1, n + 1))
        self.status = [r[0] for r in rounds]
        self.needed = [N_REQ] * n
        self.usable = [r[1] for r in rounds]
        self.full = [r[2] for r in rounds]
        self.enqueue_ns = [int(r[3] * 1e6) for r in rounds]
        self.n_reqs = [N_REQ] * n
        self.staged = [r[4] if len(r) > 4 else 0 for r in rounds]
        for i in range(n - 1):
            if len(rounds[i + 1]) <= 4:
                self.staged[i + 1] = max(0, rounds[i + 1][2] - rounds[i][2]) if rounds[i][0] != 2 else 0
        self.wrong = [0] * n
        self.wait_ns = [100_000] * n
        self.late_ns = [-1_000_000] * n
        self.reply_end_ns = [i * 1_000_000 for i in range(n)]
        self.done_ns = list(self.reply_end_ns)
        self.wait_run_delay_ns = [0] * n
        self.enqueue_run_delay_ns = [0] * n
        self.deadline_ns = 30_000_000

    @property
    def count(self) -> int:
        return len(self.t)


OK = (0, N_REQ, N_REQ, 0.1)
FAILED = (2, 0, 0, 0.1)


def _run(fault: list, *, after: list, before: int = 20, tail: int = 20, windows: int = 4, kind: str = "conn_drop"):
    rounds = [OK] * before + fault + after + [OK] * tail
    probe = _Probe(rounds)
    clear = before + 2
    inj = Injection(kind=kind, n=1, idx_start=before, t_start=before + 1, clock_start_s=0.0, idx_clear=clear,
                    idx_resume=next(i for i in range(clear, len(rounds)) if probe.usable[i]),
                    idx_end=before + len(fault) + len(after) + 5, windows_per_round=windows)
    cfg = asdict(ChaosConfig(kinds=(kind,), max_reqs=N_REQ))
    return build_report(cfg=cfg, probe=probe, injections=[inj], passes=1, elapsed_s=1.0, leftovers=[],
                        failures=[], corruptions={})


def test_windows_back_within_the_bound_pass():
    # 8 live requests, 4 windows staged a round: bound 8 / 4 + 1 = 3 rounds from the first reaching round
    r = _run([FAILED, FAILED, FAILED], after=[(0, 8, 0, 0.1), (0, 8, 4, 0.1), (0, 8, 8, 0.1)])
    f = r["injections"][0]
    assert f["full_bound_rounds"] == 3 and f["full_after_rounds"] == 2 and f["reached_after_rounds"] == 1
    assert r["ok"], r["failures"]
    assert r["baseline"]["full_window_rate"] == 1.0 and r["overall"]["full_window_rate"] < 1.0
    # the injection: 3 failed rounds, 0 + 4 + 8 full of 3 x 8 usable, then 5 settle rounds all full
    assert r["faults"]["conn_drop"]["full_window_rate"] == round((0 + 4 + 8 + 5 * 8) / (8 * 8), 4)


def test_windows_that_stay_short_fail():
    """The mutant: every draft right, windows never whole again (a worker drafting from fewer rows)."""
    short = (0, N_REQ, 0, 0.1, 0)  # nothing staged: the proxy does not know the windows are short
    r = _run([FAILED, FAILED], after=[short] * 6)
    assert not r["ok"]
    assert any("windows full again 6 rounds" in f and "the bound is 2" in f for f in r["failures"]), r["failures"]
    r = _run([FAILED, FAILED], after=[short] * 6, tail=0)  # and none staged to the end
    assert any("windows full again 6 rounds" in f and "the bound is 1" in f for f in r["failures"]), r["failures"]
    wasted = (0, N_REQ, 0, 0.1, 4)  # 4 windows staged a round, for slots that are not the live ones
    r = _run([FAILED, FAILED], after=[wasted] * 6)
    assert any("windows full again 6 rounds" in f and "the bound is 3" in f for f in r["failures"]), r["failures"]
    r = _run([FAILED, FAILED], after=[OK], tail=0)
    assert r["ok"], r["failures"]
    rounds = [OK] * 30 + [(0, N_REQ, N_REQ - 1, 0.1)] * 30  # the baseline itself short of full windows
    probe = _Probe(rounds)
    rep = build_report(cfg=asdict(ChaosConfig(kinds=("conn_drop",), max_reqs=N_REQ)), probe=probe, injections=[],
                       passes=1, elapsed_s=1.0, leftovers=[], failures=[], corruptions={})
    assert rep["baseline"]["full_window_rate"] == 0.9375
    assert any("baseline full-window rate" in f for f in rep["failures"])


def test_a_failed_round_after_the_fault_starts_the_count_again():
    after = [(0, 8, 0, 0.1), (0, 8, 8, 0.1), (0, 8, 8, 0.1), FAILED, (0, 8, 0, 0.1), (0, 8, 8, 0.1)]
    assert recovery(_Probe([FAILED] + after), 0, 7, 4)["full_after_rounds"] == 1
    after[4:] = [(0, 8, 0, 0.1), (0, 8, 4, 0.1), (0, 8, 6, 0.1), (0, 8, 8, 0.1)]
    rec = recovery(_Probe([FAILED] + after), 0, 9, 4)  # 4, 2, 2 windows staged: paced at 2 at the slowest
    assert rec["full_after_rounds"] == 3 and rec["full_bound_rounds"] == 5 and rec["windows_per_round_staged"] == 2
    assert recovery(_Probe([FAILED, FAILED]), 0, 2, 4)["full_after_rounds"] is None


def test_worst_enqueue_per_kind_and_overall():
    slow = (0, N_REQ, N_REQ, 12.5)
    r = _run([FAILED, slow, FAILED], after=[OK])
    assert r["faults"]["conn_drop"]["enqueue_ms_max"] == 12.5 and r["injections"][0]["enqueue_ms_max"] == 12.5
    assert r["overall"]["enqueue_ms_max"] == 12.5 and r["baseline"]["enqueue_ms_max"] == 0.1
    table = format_table(r)
    assert "enq max" in table and "12.50" in table and "full%" in table


def _baseline(rounds: list[tuple]) -> dict:
    return build_report(cfg=asdict(ChaosConfig(kinds=("conn_drop",), max_reqs=N_REQ)), probe=_Probe(rounds),
                        injections=[], passes=1, elapsed_s=1.0, leftovers=[], failures=[], corruptions={})


def test_a_failed_baseline_round_is_held_to_the_recovery_bound_like_a_fault():
    """A round that fails outside any fault (late on a busy machine) dirties its slots as a fault does:
    windows short within the bound after it are the contract, not a defect; short beyond it still fail."""
    ok = _baseline([OK] * 30 + [FAILED, (0, N_REQ, 0, 0.1), (0, N_REQ, 4, 0.1)] + [OK] * 30)
    b = ok["baseline"]
    assert b["full_window_rate"] == 1.0 and b["full_window_rate_all"] < 1.0 and b["rounds_recovering"] == 3
    assert not any("full-window" in f for f in ok["failures"]), ok["failures"]
    short = _baseline([OK] * 30 + [FAILED] + [(0, N_REQ, 0, 0.1)] * 6 + [OK] * 30)  # the mutant: stays short
    assert short["baseline"]["full_window_rate"] == round(60 * N_REQ / (60 * N_REQ + 4 * N_REQ), 4)
    assert any("baseline full-window rate" in f for f in short["failures"]), short["failures"]
