"""The ring kinds' checks in the campaign's report (chaos/ring_faults.py, chaos/report.py), over a made-up
per-round record: a ring that outlives its engine by more than 2 s, a ring truncated, a proxy mapping an
ended engine's ring each fail the campaign; a kind that could not run is said so, never a pass."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from dspark_proxy.chaos import format_table
from dspark_proxy.chaos.campaign import ChaosConfig
from dspark_proxy.chaos.controller import Injection
from dspark_proxy.chaos.report import build_report
from tests.test_chaos_completeness import N_REQ, OK, _Probe

pytestmark = pytest.mark.timeout(30)


def _report(kind: str, notes: dict) -> dict:
    rounds = [OK] * 60
    inj = Injection(kind=kind, n=1, idx_start=20, t_start=21, clock_start_s=0.0, idx_clear=22, idx_resume=22,
                    idx_end=30, windows_per_round=4, notes=notes)
    return build_report(cfg=asdict(ChaosConfig(kinds=(kind,), max_reqs=N_REQ)), probe=_Probe(rounds),
                        injections=[inj], passes=1, elapsed_s=1.0, leftovers=[], failures=[], corruptions={})


def test_the_ring_kinds_pass_when_every_ring_goes_in_time():
    for kind, notes in (("engine_exit", {"engines_exited": 1, "ring_gone_ms": 900, "ring_left": False,
                                         "proxy_ring_maps": 1}),
                        ("ring_truncate", {"truncate_refused": 1, "proxy_alive": True}),
                        ("ring_squat", {"squatted": 9, "restarted": True, "proxy_ring_maps": 1})):
        r = _report(kind, notes)
        assert r["ok"], (kind, r["failures"])
        assert r["faults"][kind]["skipped"] is None and "NOT RUN" not in format_table(r)


@pytest.mark.parametrize("kind,notes,says", [
    ("engine_exit", {"engines_exited": 1, "ring_gone_ms": 2500, "ring_left": False}, "outlived it by 2500 ms"),
    ("engine_exit", {"engines_exited": 1, "ring_gone_ms": 6000, "ring_left": True}, "outlived it"),
    ("engine_exit", {"engines_exited": 1, "ring_gone_ms": 10, "proxy_ring_maps": 2}, "maps 2 engines' rings"),
    ("ring_truncate", {"truncated": True, "proxy_alive": True}, "ring was cut"),
    ("ring_truncate", {"truncate_refused": 1, "proxy_alive": False}, "the proxy died"),
])
def test_a_ring_that_outlives_its_engine_or_is_cut_fails_the_campaign(kind, notes, says):
    r = _report(kind, notes)
    assert not r["ok"] and any(says in f for f in r["failures"]), r["failures"]


def test_a_kind_that_could_not_run_is_never_a_pass():
    r = _report("ring_squat", {"skipped": "needs root"})
    assert r["faults"]["ring_squat"]["skipped"] == "skipped: needs root"
    table = format_table(r)
    row = next(ln for ln in table.splitlines() if ln.startswith("ring_squat"))
    assert row.endswith("skipped: needs root")
    assert "NOT RUN (not counted as passed): ring_squat: skipped: needs root" in table
