"""DSPARK_PROXY_REPLY_SPIN_US: how long read_reply may spin for its reply before it sleeps
(engine_shim/attachment.py `reply_spin`): read when the shim attaches; a bad value is one warning and
the default; never a spin when engine and proxy can only share one CPU (AdaptiveSpin)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from engine_shim.attachment import ENV_REPLY_SPIN_US, REPLY_SPIN_US, reply_spin
from tests.rig import Rig, decode_batch

pytestmark = pytest.mark.timeout(60)

TWO_CPUS = len(os.sched_getaffinity(0)) > 1


@pytest.mark.parametrize("raw, us", [("", REPLY_SPIN_US), ("2000", 2000.0), ("0", 0.0)])
def test_the_bound_comes_from_the_environment(monkeypatch, raw, us):
    monkeypatch.setenv(ENV_REPLY_SPIN_US, raw)
    s = reply_spin(os.getpid())
    assert s.max_ns == (int(us * 1000) if TWO_CPUS else 0)


@pytest.mark.parametrize("raw", ["fast", "-5", "1e9", "nan"])
def test_a_bad_value_is_one_warning_and_the_default(monkeypatch, caplog, raw):
    monkeypatch.setenv(ENV_REPLY_SPIN_US, raw)
    with caplog.at_level(logging.WARNING, logger="engine_shim.shim"):
        s = reply_spin(os.getpid())
    assert s.max_ns == (int(REPLY_SPIN_US * 1000) if TWO_CPUS else 0)
    assert [r.getMessage() for r in caplog.records if ENV_REPLY_SPIN_US in r.getMessage()], caplog.text


@pytest.mark.skipif(not TWO_CPUS, reason="one CPU: the shim never spins")
def test_the_attached_shim_waits_with_it(monkeypatch, seg_name):
    monkeypatch.setenv(ENV_REPLY_SPIN_US, "1500")
    with Rig(seg_name) as rig:
        reply = rig.run(decode_batch(1, rig.B))
        assert reply.status == 0 and np.asarray(reply.ok_mask).all()
        assert rig.shim._att.flags.spin.max_ns == 1_500_000
