"""The short fault campaign, through the real CLI (docs/guarantees.md): every fault kind injected at least
once into a running system (real worker and proxy processes, the real shim, the simulated engine with
every draft checked by the integrity oracle), and the guarantees hold:

- zero wrong drafts;
- no engine wait (inside read_reply) beyond the deadline + MARGIN_MS;
- usable drafts resume after every fault;
- full windows (usable drafts computed from every row the engine holds, up to W) in >= 99% of the
  baseline's usable drafts, and again within the bound after every fault (chaos/completeness.py);
- every fault had its effect (the counters that prove it moved);
- no segment and no process left behind.

MARGIN_MS: measured on this 2-core box over ~300,000 rounds of campaigns with other test suites
running beside them: the longest wait inside read_reply was the deadline + 18 ms in a run where the
kernel never kept the engine thread off the CPU for long, and every larger overrun (up to hundreds of
ms on a box at load 6) coincided with at least that much off-CPU time of the engine thread (its
run_delay in /proc/thread-self/schedstat). So a round over deadline + 20 ms fails the test only when
the kernel does not account for the overrun: then something of ours made the engine wait.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dspark_proxy.chaos import FAULT_KINDS, KIND_NAMES, format_table
from dspark_proxy.chaos.tally import counter_delta

DEADLINE_MS = 30.0
MARGIN_MS = 20.0

# per fault kind, from the table of kinds: (where, counter, at least) that proves the injection did what it
# says; where "notes": the sum of that key over the injector's notes
EFFECTS = {k.name: (k.effect.where, k.effect.counter, k.effect.least) for k in FAULT_KINDS}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    from tests.conftest import _unlink, new_segment_name

    name = new_segment_name("chaos")
    plots = tmp_path_factory.mktemp("chaos") / "plots"  # made by --plot
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "chaos", "--duration", "60", "--passes", "2",
                              "--deadline-ms", str(DEADLINE_MS), "--margin-ms", str(MARGIN_MS), "--seed", "0",
                              "--name", name, "--json", "--quiet", "--plot", str(plots)],
                             capture_output=True, text=True, timeout=150)
        elapsed = time.monotonic() - t0
        left_segment = os.path.exists(f"/dev/shm/dspark-proxy.{name}")
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        left_procs = [ln for ln in ps.splitlines() if f"--name {name}" in ln]
    finally:
        _unlink(name)
    report = json.loads(out.stdout) if out.stdout.strip() else None
    return {"rc": out.returncode, "stderr": out.stderr, "report": report, "elapsed_s": elapsed,
            "left_segment": left_segment, "left_procs": left_procs, "plots": plots}


@pytest.mark.timeout(200)
def test_short_campaign_holds_every_guarantee(campaign):
    r = campaign["report"]
    assert r is not None, campaign["stderr"][-3000:]
    # where each late wait went (docs/chaos.md), whole: the assertion's message is cut short
    print("worst_over_limit:", json.dumps(r["overall"]["worst_over_limit"][:3], indent=1))
    assert campaign["rc"] == 0 and r["ok"], (r["failures"], campaign["stderr"][-2000:])
    assert set(r["faults"]) == set(KIND_NAMES)
    for kind, f in r["faults"].items():
        assert f["injections"] >= 1, kind
        assert f["never_resumed"] == 0 and f["resume_rounds_max"] is not None, (kind, f)
        assert f["wrong"] == 0, kind
        # the gate's throughput rule is off in the campaign (docs/chaos.md): no sample, no pause by it
        assert not any(c.startswith("accept_batch_tps") for c in f["proxy_counters"]), (kind, f["proxy_counters"])
    ov = r["overall"]
    assert ov["wrong_drafts"] == 0
    # a round over the limit passes only while the kernel kept the engine thread off the CPU (its
    # run_delay, from /proc/thread-self/schedstat), or the campaign's own threads kept the GIL from it
    # after its wait (the GIL wait, measured in C, less what the product's threads can have spent), at
    # least as long as the overrun: no wait of ours is in it
    assert ov["rounds_over_limit_unexplained"] == 0, ov["worst_over_limit"]
    for o in ov["worst_over_limit"]:
        assert o["explained"] and o["off_cpu_ms"] + o["gil_by_others_ms"] >= o["wait_ms"] - (DEADLINE_MS + MARGIN_MS), o
        assert o["gil_by_others_ms"] <= max(0.0, o["gil_wait_ms"] - o["product_threads_ms"]) + 1e-3, o
    assert ov["rounds"] > 2000 and r["baseline"]["usable_rate"] > 0.9, (ov, r["baseline"])
    assert r["leftovers"] == []
    assert not campaign["left_segment"] and campaign["left_procs"] == []
    assert campaign["elapsed_s"] < 90, f"the CI campaign took {campaign['elapsed_s']:.0f} s"


@pytest.mark.timeout(200)
def test_every_fault_had_its_effect(campaign):
    r = campaign["report"]
    assert r is not None, campaign["stderr"][-3000:]
    for kind, (where, counter, least) in EFFECTS.items():
        f = r["faults"][kind]
        if kind == "ring_squat" and os.geteuid() != 0:  # another uid needs root: said, never a pass
            assert f["skipped"] == "skipped: needs root" and not f["notes"][0].get("squatted"), f
            continue
        got = (sum(n.get(counter) or 0 for n in f["notes"]) if where == "notes"
               else f[f"{where}_counters"].get(counter, 0))
        assert got >= least, (kind, counter, f)
    # the flood was on while the proxy reconnected (the worker closed idle sockets to let it in)
    assert all(n["closed_by_worker"] >= 1 for n in r["faults"]["connection_flood"]["notes"])
    # the rogue was refused slots and sessions, the proxy's session was never evicted, the worker's RSS
    # grew by at most a few sessions' windows
    wm = r["faults"]["worker_memory"]
    assert wm["proxy_counters"].get("req_status_unknown_slot", 0) == 0, wm
    for n in wm["notes"]:
        assert n["slots_past_max_reqs_refused"] >= 1 and n["rss_growth_mb"] is not None and n["rss_growth_mb"] < 32, n
    bd = r["faults"]["bad_descriptor"]
    corrupted = sum(n["corrupted"] for n in bd["notes"])
    assert 1 <= bd["proxy_counters"]["fallback_bad_descriptor"] <= corrupted  # < only for rounds failed ahead
    assert bd["proxy_counters"].get("deaths", 0) == 0 and bd["proxy_counters"].get("fallback_internal_error", 0) == 0
    note = r["faults"]["worker_layout"]["notes"][0]
    assert "mismatch" in note["refusal"] and "window" in note["refusal"], note
    stall = r["faults"]["worker_stall_short"]["notes"][0]
    assert stall["stalls"] >= 1
    # the engine's watchdog claimed rounds while the proxy was stopped, and the proxy skipped them
    assert r["faults"]["proxy_stop_short"]["shim_events"].get("watchdog", 0) >= 1
    assert r["faults"]["proxy_stop_short"]["proxy_events"].get("skipped", 0) >= 1
    # a new engine (rounds from 1) attached while the breaker was open: the proxy counts the cooldown
    # in the new engine's rounds (the breaker's trip round re-based to before its round 1)
    for note in r["faults"]["engine_restart"]["notes"]:
        assert note["restarted"] and note["breaker_trips_old"] is not None, note
        if note["breaker_trips_new"] == note["breaker_trips_old"]:  # no new trip since the restart
            assert note["breaker_opened_round_new"] <= 0, note


@pytest.mark.timeout(200)
def test_the_json_reports_window_completeness_and_the_worst_enqueue(campaign):
    r = campaign["report"]
    assert r is not None, campaign["stderr"][-3000:]
    ov, base = r["overall"], r["baseline"]
    assert 0.0 < ov["full_window_rate"] <= 1.0 and ov["full_windows"] <= ov["usable_drafts"]
    assert base["full_window_rate"] >= 0.99, base
    assert ov["enqueue_ms_max"] >= base["enqueue_ms_max"] > 0
    for kind, f in r["faults"].items():
        assert f["full_window_rate"] is None or 0.0 <= f["full_window_rate"] <= 1.0, kind
        assert 0 < f["enqueue_ms_max"] <= ov["enqueue_ms_max"], kind
    for inj in r["injections"]:
        assert inj["full_after_rounds"] is not None and inj["full_bound_rounds"] >= 1, inj["kind"]


@pytest.mark.timeout(200)
def test_the_table_has_a_row_per_fault(campaign):
    r = campaign["report"]
    assert r is not None, campaign["stderr"][-3000:]
    table = format_table(r)
    rows = [ln.split()[0] for ln in table.splitlines() if ln and ln.split()[0] in KIND_NAMES]
    assert sorted(set(rows)) == sorted(KIND_NAMES)
    assert "PASSED" in table


def test_the_plot_shows_every_fault(campaign):
    """`chaos --plot DIR`: the engine's waits through each fault, one PNG, listed in the report."""
    from tests.test_plots import assert_png

    r = campaign["report"]
    assert r is not None, campaign["stderr"][-3000:]
    assert [p.name for p in campaign["plots"].iterdir()] == ["chaos_wait.png"]
    assert r["plots"] == [str(campaign["plots"] / "chaos_wait.png")]
    assert_png(r["plots"][0])


def test_counter_delta_sums_over_proxy_incarnations():
    before = {10: {"a": 5, "b": 1}}
    after = {10: {"a": 7, "b": 1}, 11: {"a": 3, "c": 2, "s": "x"}}  # 11: a proxy restarted meanwhile
    assert counter_delta(before, after) == {"a": 5, "c": 2}


def test_unknown_kind_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "chaos", "--kinds", "nope", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown fault kinds" in out.stderr


def test_every_kind_comes_from_one_table():
    from dspark_proxy.chaos.kinds import INJECTORS

    assert KIND_NAMES == tuple(k.name for k in FAULT_KINDS) and len(set(KIND_NAMES)) == len(KIND_NAMES)
    assert set(INJECTORS) == set(KIND_NAMES)
    for k in FAULT_KINDS:
        assert callable(k.inject) and k.what and k.effect.where in ("proxy", "shim", "notes") and k.effect.least >= 1
