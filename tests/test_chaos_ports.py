"""The campaign's worker ports (chaos/system.py): drawn at random, not from the seed, and a worker whose
port was taken before the proxy knew the address moves to another. Two campaigns of one seed at once
(every run of tests/test_chaos.py uses seed 0) drew the same ports, and the second worker to bind
exited 3 "before listening"."""

from __future__ import annotations

import socket
import time

import pytest

from dspark_proxy.chaos.system import ChaosSystem

pytestmark = pytest.mark.timeout(90)

LAYOUT = (4, 3, 8, 16)


def _system(tmp_path, tag: str) -> ChaosSystem:
    d = tmp_path / tag
    d.mkdir()
    return ChaosSystem(f"ports-{tag}", LAYOUT, deadline_ms=30.0, heartbeat_timeout_s=0.5, log_dir=d, pool=True)


def _squat(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


def test_two_campaigns_draw_their_own_ports(tmp_path):
    # the seed no longer picks the ports: two systems built alike (as two campaigns of seed 0 were)
    # draw independent ports; 5 tries keep a chance collision (1 in ~20,000 each) out of the verdict
    a = _system(tmp_path, "a")
    others = [_system(tmp_path, f"b{k}") for k in range(5)]
    assert any(b.port != a.port for b in others) and any(b.pool_port != a.pool_port for b in others)
    for s in [a, *others]:
        assert s.pool_port != s.port


def test_a_second_worker_whose_port_was_taken_moves_to_another(tmp_path):
    s = _system(tmp_path, "pool")
    taken = s.pool_port
    squatter = _squat(taken)  # another campaign's worker, say, took it since it was drawn
    try:
        w = s.spawn_pool_worker()
        try:
            assert s.pool_port != taken and s.pool_address == f"127.0.0.1:{s.pool_port}"
            assert w.address == s.pool_address and w.alive()
        finally:
            s.stop_pool_worker()
    finally:
        squatter.close()
        for f in s._logs:
            f.close()


def test_the_first_worker_whose_port_was_taken_moves_before_the_proxy_knows_it(tmp_path):
    s = _system(tmp_path, "first")
    taken = s.port
    squatter = _squat(taken)
    try:
        w = s.spawn_first_worker()
        try:
            assert s.port != taken and w.address == s.address and w.alive()
            assert s.pool_file is not None and s.pool_file.read_text() == s.address + "\n"
        finally:
            s.kill_worker()
    finally:
        squatter.close()
        for f in s._logs:
            f.close()


def test_a_faulty_workers_hold_starts_once_the_proxy_reached_it(tmp_path):
    # injectors.faulty_worker holds the fault from the proxy's HELLO on, not from the spawn: on a busy
    # machine the proxy's reconnect could come after hold_s, and the kind then never had its effect
    # (slow_replies without a fallback_timeout, garbage_replies without a bad_reply)
    from dspark_proxy.chaos.injectors import wait_proxy_served
    from tests.conftest import _unlink, new_segment_name

    name = new_segment_name("served")
    s = ChaosSystem(name, LAYOUT, deadline_ms=30.0, heartbeat_timeout_s=0.5, log_dir=tmp_path)

    class _Ctl:  # what wait_proxy_served uses of the campaign's Controller
        system = s

        @staticmethod
        def sleep(seconds: float) -> None:
            time.sleep(seconds)

    try:
        s.spawn_first_worker()
        assert not s.proxy_served() and wait_proxy_served(_Ctl, 0.3) is None  # no proxy yet
        s.spawn_proxy()
        ms = wait_proxy_served(_Ctl, 30.0)
        assert ms is not None and s.proxy_served(), s.worker_log.read_text()
    finally:
        left = s.close()
        _unlink(name)
    assert left == []
