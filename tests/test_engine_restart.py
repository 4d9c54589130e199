"""A new engine attaching to a running proxy numbers its rounds afresh (from 1): everything the proxy
counts in rounds restarts or is re-based with it. Before, the one breaker per proxy kept the old
engine's round numbers, and an engine restarted while it was open got no drafts for about the old
engine's round count plus the cooldown."""

from __future__ import annotations

import threading

import pytest

import engine_shim
from dspark_proxy.config import ProxyConfig
from dspark_proxy.proxy import Proxy
from dspark_proxy.round.breaker import CircuitBreaker
from dspark_proxy.sim import SimConfig, SimEngine
from tests.rig import ScriptedClient

pytestmark = pytest.mark.timeout(90)

M, N, W, B = 8, 3, 8, 64
COOLDOWN = 5


def test_breaker_rebase_keeps_the_cooldown_left():
    br = CircuitBreaker(3, COOLDOWN)
    for t in (201, 202, 203):
        br.record(False, t)
    assert br.state == "open" and br.opened_round == 203
    assert not br.allow(205)
    br.rebase(last_round=205, first_round=1)  # 2 of the 5 cooldown rounds were spent
    assert [br.allow(t) for t in range(1, 5)] == [False, False, False, True]  # round 4: the probe
    assert br.record(True, 4) == "recovered"


def test_a_half_open_probe_of_the_old_engine_is_granted_again():
    br = CircuitBreaker(1, 0)
    br.record(False, 50)
    assert br.allow(51) and br.state == "half_open"
    br.rebase(last_round=51, first_round=1)
    assert br.allow(1)


def _run_engine(name: str, rounds: int, on_round) -> tuple[SimEngine, object]:
    shim = engine_shim.attach(name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
    sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B))
    try:
        sim.run(shim, rounds=rounds, on_round=on_round)
    finally:
        shim.close()
    return sim, shim


def test_an_engine_restarted_while_the_breaker_is_open_drafts_within_the_cooldown(seg_name):
    cfg = ProxyConfig(name=seg_name, worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=500.0, breaker_threshold=3, breaker_cooldown=COOLDOWN, log_every=0)
    client = ScriptedClient(max_reqs=M, num_spec=N, window=W, row_bytes=B)
    proxy = Proxy(cfg, client=client)
    th = threading.Thread(target=proxy.serve, name="test-proxy", daemon=True)
    th.start()
    try:
        assert proxy.ready.wait(10.0)
        first_usable: list[int] = []
        caps: dict[str, tuple[int, int]] = {}

        def old_engine(batch, reply):
            if batch.t == 200:
                client.fail_reason = "timeout"  # the worker fails from here: the breaker trips
            caps["old"] = (proxy.core.pacer.row_cap, proxy.core.pacer.resync_cap)
            return batch.t >= 205

        _run_engine(seg_name, 300, old_engine)
        assert proxy.breaker.state == "open" and proxy.breaker.opened_round is not None
        assert proxy.breaker.opened_round > 200
        client.fail_reason = None  # the worker is fine again; the new engine counts from 1

        def new_engine(batch, reply):
            if reply.ok_mask.any() and not first_usable:
                first_usable.append(batch.t)
            if batch.t == 1:
                caps["new"] = (proxy.core.pacer.row_cap, proxy.core.pacer.resync_cap)
            return batch.t >= (40 if first_usable else 300)

        _run_engine(seg_name, 300, new_engine)
        assert first_usable, "the new engine never got a usable draft"
        assert first_usable[0] <= COOLDOWN + 2, f"first usable draft at round {first_usable[0]}"
        assert proxy.breaker.state == "closed"
        # the row cap and the resync pacing the timeouts taught the old engine's round start afresh
        assert caps["old"][0] > 0 and caps["old"][1] == 1, caps
        assert caps["new"] == (0, proxy.core.pacer.resync_max), caps
    finally:
        proxy.stop()
        th.join(10.0)
    assert not th.is_alive()
