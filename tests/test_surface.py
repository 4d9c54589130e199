"""The operator's surfaces: `status` explains the drafting's effect (human and --json), the
same in Prometheus, `status --watch` redraws in place, and a missing optional dependency is one line
and an exit code."""

from __future__ import annotations

import io
import json
import sys
import time

import pytest
from click.testing import CliRunner

import engine_shim
from dspark_proxy.commands import control
from dspark_proxy.ops.exitcodes import EXIT_MISSING_DEPENDENCY
from dspark_proxy.ops.screen import Screen
from dspark_proxy.ops.status import drafting_summary, format_drafting, format_status, read_status
from dspark_proxy.sim import SimConfig, SimEngine

pytestmark = pytest.mark.timeout(90)

M, N, W, B = 8, 4, 8, 32


def test_drafting_summary_and_its_lines():
    snap = {"counters": {"spec_decode_num_drafts": 10, "spec_decode_num_draft_tokens": 40,
                         "spec_decode_num_accepted_tokens": 25, "spec_decode_num_accepted_tokens_per_pos_0": 9,
                         "spec_decode_num_accepted_tokens_per_pos_1": 8, "spec_decode_num_accepted_tokens_per_pos_2": 5,
                         "spec_decode_num_accepted_tokens_per_pos_3": 3, "rounds_ok": 90, "rounds_failed": 10,
                         "fallback_timeout": 6, "fallback_cooldown": 4, "accept_paused": 2},
            "gauges": {"accept_gate": {"enabled": True, "slots_paused": 1, "slots_probing": 0, "batch": "active"}}}
    d = drafting_summary(snap, N)
    assert d["mean_accepted"] == 2.5 and d["accepted_by_position"] == [0.9, 0.8, 0.5, 0.3]
    assert d["acceptance_rate"] == 0.625 and d["num_accepted_tokens_per_pos"] == [9, 8, 5, 3]
    assert d["fallbacks"] == {"cooldown": 4, "timeout": 6} and d["rounds"] == 100
    text = "\n".join(format_drafting(d))
    assert "mean accepted 2.50 of 4" in text and "0.90 0.80 0.50 0.30" in text
    assert "10 of 100 rounds target-only: cooldown=4 timeout=6" in text
    assert "paused now 1 requests" in text and "paused=2" in text
    assert drafting_summary({}, N)["mean_accepted"] is None
    assert "no drafts verified yet" in "\n".join(format_drafting(drafting_summary({}, N)))


@pytest.fixture
def live_proxy(seg_name):
    """A thread-mode proxy (in-process integrity worker) that has run sim rounds with accepted drafts."""
    shim = engine_shim.attach(seg_name, mode="thread", worker="inproc", max_reqs=M, num_spec=N, window=W,
                              row_bytes=B, deadline_ms=2000.0, timeout_s=5.0)
    try:
        res = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B)).run(shim, rounds=120)
        assert res.wrong_drafts == 0
        yield shim
    finally:
        shim.close()


def test_status_shows_the_drafting_human_and_json(live_proxy, seg_name):
    end = time.monotonic() + 10
    st = read_status(seg_name)
    while time.monotonic() < end and not st["drafting"]["num_drafts"]:  # the heartbeat publishes every 0.25 s
        time.sleep(0.05)
        st = read_status(seg_name)
    d = st["drafting"]
    assert d["num_drafts"] > 0 and 0 < d["mean_accepted"] <= N
    assert d["accepted_by_position"] == sorted(d["accepted_by_position"], reverse=True)  # a prefix property
    assert "drafting mean accepted" in format_status(st)
    r = CliRunner().invoke(control.status, ["--name", seg_name, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["drafting"]["num_spec"] == N


def test_prometheus_from_a_live_proxy(live_proxy):
    pytest.importorskip("prometheus_client")
    from dspark_proxy.ops.metrics import snapshot_to_families

    fams = {f.name: f for f in snapshot_to_families(live_proxy.proxy.snapshot())}
    assert fams["dspark_proxy_spec_decode_num_drafts"].type == "counter"  # exposed as ..._total
    assert fams["dspark_proxy_spec_decode_num_accepted_tokens_per_pos"].samples[0].labels == {"position": "0"}
    assert fams["dspark_proxy_rank0_round_seconds"].type == "histogram"
    assert fams["dspark_proxy_config"].type == "info"
    assert not any(n.startswith("dspark_proxy_config_") for n in fams)  # no gauge per setting
    assert "dspark_proxy_accept_gate_slots_paused" in fams


def test_watch_redraws_in_place_and_ctrl_c_ends_it(seg_name, monkeypatch, live_proxy):
    """On a terminal: the alternate screen, each frame from the top-left corner, lines cleared to their
    end; no clear-screen per refresh (which pushed a whole screen into the scrollback each time)."""
    out = io.StringIO()
    monkeypatch.setattr(control, "Screen", lambda _stdout: Screen(out, tty=True))
    frames = []

    def sleep(_s):
        frames.append(1)
        if len(frames) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(control.time, "sleep", sleep)
    r = CliRunner().invoke(control.status, ["--name", seg_name, "--watch", "0.5"])
    assert r.exit_code == 0, r.output
    text = out.getvalue()
    assert text.startswith("\x1b[?1049h") and "\x1b[?1049l" in text  # entered and left the alternate screen
    assert text.count("\x1b[H") == 3 and "\x1b[2J" not in text
    assert text.count("Every 0.5s: dspark-proxy status") == 4  # 3 frames + the last one left on screen


def test_screen_off_a_terminal_appends_plain_frames():
    out = io.StringIO()
    with Screen(out, tty=False) as s:
        s.draw("one")
        s.draw("two")
    assert out.getvalue() == "one\n\ntwo\n\n"


@pytest.mark.parametrize("argv,hidden", [
    (["start", "--metrics-port", "0", "--worker", "inproc"], "prometheus_client"),
    (["worker", "--drafter", "torch", "--random-weights", "--listen", "127.0.0.1:0"], "torch"),
])
def test_a_missing_optional_dependency_is_one_line_and_an_exit_code(monkeypatch, seg_name, argv, hidden):
    from dspark_proxy.cli import cli

    monkeypatch.setitem(sys.modules, hidden, None)
    r = CliRunner().invoke(cli, [*argv, *(["--name", seg_name] if argv[0] == "start" else [])])
    assert r.exit_code == EXIT_MISSING_DEPENDENCY, r.output
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in r.output and hidden in err and "pip install" in err
