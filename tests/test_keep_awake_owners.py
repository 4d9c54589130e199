"""Keep-awake's spinners are the process's (keep_awake.py): several proxies in one process (thread mode)
share them as counted owners, and under a cgroup CPU quota none is started (said once)."""

from __future__ import annotations

import logging
import os

import pytest

from dspark_proxy.ops import keep_awake
from dspark_proxy.ops.keep_awake import KeepAwake, cpu_quota

pytestmark = pytest.mark.timeout(30)

SCHED_IDLE = 5


def _idle_threads() -> int:
    """Threads of this process at SCHED_IDLE: the spinners (field 41 of /proc/self/task/*/stat)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        n += int(st[st.rindex(")") + 2:].split()[38]) == SCHED_IDLE
    return n


@pytest.fixture
def one_cpu(monkeypatch):
    """This thread pinned to one CPU (keep-awake serves at most 8), no quota seen; restored after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    monkeypatch.setattr(keep_awake, "cpu_quota", lambda: None)
    yield
    os.sched_setaffinity(0, before)


def test_two_owners_in_one_process_do_not_stop_each_others_spinners(one_cpu):
    a, b = KeepAwake(20.0), KeepAwake(20.0)
    try:
        if a.snapshot()["refused"]:
            pytest.skip("SCHED_IDLE refused here: no spinner to share")
        assert a.snapshot()["spinners"] == 1 and _idle_threads() == 1  # one set, shared
        a.close()
        a.close()  # idempotent: the second close is not another owner leaving
        assert b.snapshot()["spinners"] == 1 and _idle_threads() == 1, "a's close stopped b's spinners"
        b.kick()
        c = KeepAwake(20.0)  # a third joins the running set
        b.close()
        assert c.snapshot()["spinners"] == 1 and _idle_threads() == 1
    finally:
        for k in (a, b):
            k.close()
        if "c" in locals():
            c.close()
    assert _idle_threads() == 0 and KeepAwake(0).snapshot()["spinners"] == 0


def test_under_a_cpu_quota_no_spinner_and_said_once(monkeypatch, caplog):
    monkeypatch.setattr(keep_awake, "cpu_quota", lambda: 0.5)
    monkeypatch.setattr(keep_awake, "_quota_said", False)
    caplog.set_level(logging.WARNING, logger="dspark_proxy.ops.keep_awake")
    ks = [KeepAwake(20.0), KeepAwake(20.0)]
    try:
        for k in ks:
            k.kick()
            assert k.ns == 0 and k.snapshot() == {"spinners": 0, "spins": 0, "sleeping": 0, "refused": 0}
        assert _idle_threads() == 0
        said = [r.getMessage() for r in caplog.records if "quota" in r.getMessage()]
        assert len(said) == 1 and "0.50 CPUs" in said[0] and "not kept awake" in said[0], said
    finally:
        for k in ks:
            k.close()


def _tree(tmp_path, cgroup: str, files: dict[str, str]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc").write_text(cgroup)
    for rel, text in files.items():
        p = tmp_path / "fs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path / "proc"), str(tmp_path / "fs")


def test_cpu_quota_reads_cgroup_v2_and_v1_along_the_path(tmp_path):
    # v2: the tightest limit along the path (a parent's counts for its children)
    proc, root = _tree(tmp_path / "v2", "0::/a/b\n", {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n",
                                                      "cpu.max": "max 100000\n"})
    assert cpu_quota(proc, root) == 1.5
    # v1 (cpu,cpuacct joined)
    proc, root = _tree(tmp_path / "v1", "4:memory:/x\n2:cpu,cpuacct:/svc\n",
                       {"cpu,cpuacct/svc/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/svc/cpu.cfs_period_us": "100000\n",
                        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpu_quota(proc, root) == 0.5
    # no quota anywhere (v1's -1, v2's max), or no cgroup files at all
    proc, root = _tree(tmp_path / "none", "1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1\n",
                                                             "cpu/cpu.cfs_period_us": "100000\n",
                                                             "cpu.max": "max 100000\n"})
    assert cpu_quota(proc, root) is None
    assert cpu_quota(str(tmp_path / "missing"), root) is None
