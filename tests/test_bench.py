"""`dspark-proxy bench --quick --json` through the real CLI: every section is there with numbers.

Nothing here is about speed (benchmarks report, they do not assert): the run must complete, every
section must carry p50/p99/p99.9/max figures and its baselines, every measured round must have
succeeded (a failed round would mean the figures measure the failure path), and nothing may be
left behind in /dev/shm.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dspark_proxy.bench import SECTIONS
from dspark_proxy.bench.measure import Samples, summarize
from dspark_proxy.bench.report import format_report
from tests.conftest import DEV_SHM, new_segment_name

FIGS = ("p50_us", "p99_us", "p999_us", "max_us")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _figures(d: dict, what: str) -> None:
    assert d["n"] > 0, f"{what}: no samples"
    for k in FIGS:
        assert _num(d[k]) and d[k] >= 0, f"{what}: {k}={d[k]!r}"
    assert d["p50_us"] <= d["p99_us"] <= d["max_us"] * 1.001, f"{what}: percentiles out of order {d}"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    prefix = new_segment_name("bench")
    plots = tmp_path_factory.mktemp("bench") / "plots"  # made by --plot
    proc = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "bench", "--quick", "--json", "--quiet",
                           "--name-prefix", prefix, "--plot", str(plots)], capture_output=True, text=True, timeout=280)
    left = sorted(p.name for p in DEV_SHM.glob(f"dspark-proxy.{prefix}-*"))
    for p in left:
        (DEV_SHM / p).unlink()
    assert proc.returncode == 0, f"bench exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert not left, f"bench left segments behind: {left}"
    res = json.loads(proc.stdout)
    res["_plots"] = plots
    return res


@pytest.mark.timeout(300)
def test_quick_json_has_every_section_with_numbers(quick_run: dict) -> None:
    r = quick_run
    for s in SECTIONS:
        assert s in r, f"section {s} missing"
    assert r["meta"]["quick"] is True and set(r["meta"]["elapsed_s"]) == set(SECTIONS)

    # 1. hand-off: the round and its four baselines, in every placement, with ratios
    places = r["handoff"]["placements"]
    assert "same_core" in places and "unpinned" in places
    for place, p in places.items():
        for k in ("handoff", "enqueue", "read_reply", "proxy_round", "futex_adaptive", "futex_sleep", "pipe",
                  "tcp"):
            _figures(p[k], f"handoff/{place}/{k}")
        assert all(_num(v) and v > 0 for v in p["ratios"].values()), p["ratios"]
        assert p["failed_rounds"] == 0
        # the same rounds on the Python reference path (DSPARK_NATIVE=0), keys of their own
        for k in ("handoff", "enqueue", "read_reply", "proxy_round"):
            _figures(p["reference"][k], f"handoff/{place}/reference/{k}")
        assert p["reference"]["failed_rounds"] == 0
    for path in ("native", "reference"):  # n = 256, both paths, the unpinned placement
        _figures(places["unpinned"]["decode_n256"][path]["enqueue"], f"handoff/unpinned/decode_n256/{path}")
    pub = places["unpinned"]["read_reply_published"]  # read_reply of a reply already published
    _figures(pub, "handoff/unpinned/read_reply_published")
    assert pub["failed_rounds"] == 0
    # the engine's cost per step, each figure against its target (reported, not asserted)
    goals = {t["goal"]: t for t in r["targets"]}
    for g in ("hand-off p50 <= 20 us (unpinned, n=1)", "enqueue p50 <= 40 us (unpinned, n=256 decode)",
              "read_reply of a published reply p50 <= 5 us (unpinned, n=1)",
              "proxy's own round p50 <= 15 us (unpinned, n=1)"):
        assert goals[g]["met"] in (True, False), goals[g]
    if "cross_core" in places:  # the same rounds at a real engine's pace
        paced = r["handoff"]["paced"]
        assert paced["gap_ms"] > 0 and paced["failed_rounds"] == 0
        for k in ("handoff", "enqueue", "read_reply", "proxy_round"):
            _figures(paced[k], f"handoff/paced/{k}")
        ka = r["handoff"]["keep_awake"]  # both again with the proxy's CPUs kept awake
        assert ka["keep_awake_ms"] > 0 and ka["failed_rounds"] == 0 and ka["paced"]["failed_rounds"] == 0
        for k in ("handoff", "enqueue", "read_reply", "proxy_round"):
            _figures(ka[k], f"handoff/keep_awake/{k}")
            _figures(ka["paced"][k], f"handoff/keep_awake/paced/{k}")

    # 2. GIL isolation: both modes at 0, 2 and 4 busy threads
    for mode in ("process", "thread"):
        cases = r["gil"]["modes"][mode]
        assert set(cases) == {"busy_0", "busy_2", "busy_4"}
        for key, c in cases.items():
            for k in ("proxy_round", "worker_rtt", "engine_wait", "enqueue"):
                _figures(c[k], f"gil/{mode}/{key}/{k}")
            assert c["failed_rounds"] == 0, f"gil/{mode}/{key}: {c['failed_rounds']} rounds failed"
        assert _num(cases["busy_4"]["ratios_vs_idle"]["proxy_round_p50"])

    # 3. scaling: every (W, mix, n) with proxy and engine cost, and a fit per (W, mix)
    sc = r["scaling"]
    shapes = {(c["W"], c["mix"], c["n"]) for c in sc["cases"]}
    assert {(128, "decode", 256), (128, "prefill", 1024), (16, "decode", 1)} <= shapes
    for c in sc["cases"]:
        _figures(c["proxy_cost"], f"scaling {c['W']}/{c['mix']}/{c['n']} proxy")
        _figures(c["engine_cost"], f"scaling {c['W']}/{c['mix']}/{c['n']} engine")
    assert len(sc["fits"]) == len({(c["W"], c["mix"]) for c in sc["cases"]})

    # 4. rows: MB/s through the proxy and raw, the ratios between them
    assert r["rows"]["cases"]
    for c in r["rows"]["cases"]:
        for k in ("proxy_round", "rtt", "worker", "engine_round", "raw"):
            _figures(c[k], f"rows {c['row_bytes']}/{k}")
        assert all(_num(v) and v > 0 for v in c["mb_per_s"].values()), c["mb_per_s"]
        assert c["failed_rounds"] == 0

    # 5. memory: the segment by region, resident memory of each process, idle CPU
    m = r["memory"]
    regions = m["segment"]["regions_mb"]
    assert {"staging", "reply_page", "resync_windows", "meta", "desc"} <= set(regions)
    assert abs(sum(regions.values()) - m["segment"]["total_mb"]) < 1.0
    for who in ("proxy", "worker"):
        assert m[who]["after_rounds"]["vm_rss"] > 0 and _num(m[who]["after_rounds"]["own_mb"])
    assert m["proxy"]["after_rounds"]["rss_shmem"] > 0  # it sent rows straight from the engine's shared ring
    assert _num(m["engine"]["shim_added_mb"])
    for k in ("proxy_pct_core", "engine_process_pct_core", "shim_watchdog_pct_core"):
        assert _num(m["idle"][k]) and m["idle"][k] >= 0
    st = m["idle_states"]  # every idle state, each with proxy + shim as % of a core (bench/idle.py)
    for k in ("proxy_waiting", "attached_no_round", "after_rounds", "shim_alone_proxy_killed",
              "shim_alone_no_segment", "thread_mode_no_round", "thread_mode_after_rounds"):
        assert _num(st[k]["proxy_plus_shim_pct_core"]) and st[k]["proxy_plus_shim_pct_core"] >= 0
    assert st["worst_state"] in st and st["worst_pct_core"] == st[st["worst_state"]]["proxy_plus_shim_pct_core"]
    assert m["failed_rounds"] == 0

    # targets: each goal with what was measured; the run asserts none of them
    assert r["targets"] and all({"goal", "measured", "met"} <= set(t) for t in r["targets"])
    assert r["targets"][0]["met"] is True  # every measured round succeeded

    text = format_report(r)
    for head in ("1. HAND-OFF", "2. GIL ISOLATION", "3. SCALING", "4. ROWS THROUGHPUT", "5. MEMORY",
                 "TARGETS"):
        assert head in text


def test_unknown_section_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "bench", "--sections", "handoff,nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_summarize_figures() -> None:
    s = summarize(np.arange(1, 1001) * 1000, skip=0)
    assert s["n"] == 1000 and s["max_us"] == 1000.0
    assert 499 <= s["p50_us"] <= 501 and 989 <= s["p99_us"] <= 991 and 998 <= s["p999_us"] <= 1000
    assert summarize(np.arange(10), skip=10)["p50_us"] is None


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from dspark_proxy.bench.plot import plot

    rng = np.random.default_rng(0)
    samples = Samples()
    for k in ("handoff", "futex_adaptive", "futex_sleep", "pipe", "tcp"):
        samples.add(f"handoff/same_core/{k}", rng.integers(5_000, 50_000, 200))
    samples.add("gil/process/busy_0/engine_wait", rng.integers(5_000, 50_000, 200))
    res = {"scaling": {"cases": [{"W": 16, "mix": "decode", "n": n, "proxy_cost": {"p50_us": 10.0 + n}}
                                 for n in (1, 16, 256)]}}
    out = plot(res, samples, str(tmp_path / "bench.png"))
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_quick_run_plots_every_figure(quick_run: dict) -> None:
    """`bench --plot DIR` on the quick run: one valid PNG per figure of the sections that ran."""
    from tests.test_plots import assert_png

    names = sorted(p.name for p in quick_run["_plots"].iterdir())
    assert names == ["bench_gil.png", "bench_handoff.png", "bench_scaling.png"], names
    for p in quick_run["_plots"].iterdir():
        assert_png(p)
