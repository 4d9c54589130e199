"""The engine's shared ring's life (shm_layout.md §1 and §9).

- another local user squatting /dev/shm names never stops a Shim() (item 3);
- truncating the engine's ring never kills the proxy: the memfd is sealed, its ftruncate refused (item 4);
- however the engine ends (killed, exit without close, zombie), its ring is gone within 2 s while a
  proxy of the name runs (item 5);
- a Shim() whose construction fails leaves no ring (item 6).
"""

from __future__ import annotations

import fcntl
import gc
import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dspark_proxy.config import ProxyConfig
from dspark_proxy.proxy import Proxy
from dspark_proxy.shm import ring_shm
from engine_shim.shim import Shim, ShimError
from tests.rig import ScriptedClient

pytestmark = pytest.mark.timeout(120)
M, N, W, B = 4, 3, 8, 64
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(kind: str) -> dict[str, str]:
    env = dict(os.environ, DSPARK_SHARED_RING="1" if kind == "memfd" else "named")
    env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _mapped(seg_name: str) -> bool:
    """This process maps a memfd ring of that name (the proxy's view of an engine's ring)."""
    with open("/proc/self/maps") as f:
        return f"memfd:dspark-ring.{seg_name} " in f.read()


def _memfd_fds(seg_name: str) -> int:
    n = 0
    for p in glob.glob("/proc/self/fd/*"):
        try:
            n += os.readlink(p).startswith(f"/memfd:dspark-ring.{seg_name} ")
        except OSError:
            pass
    return n


# ---------------------------------------------------------------------------------------------- item 4

_TRUNCATE = textwrap.dedent("""
    import os, sys
    from tests.rig import Rig
    with Rig(sys.argv[1], M=4, N=3, W=4, B=64) as rig:
        reply, b = rig.round([(1, 0, 3), (2, 1, 2)])
        ring = rig.shim._shared
        path = ring.shm_name if ring.shm_name.startswith("/proc/") else "/dev/shm" + ring.shm_name
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, 0)  # what anything with the engine's uid may do
            print("truncated", flush=True)
        except PermissionError:
            print("refused", flush=True)
        os.close(fd)
        reply, b = rig.round([(1, 0, 1), (2, 1, 1)])  # the proxy reads the ring's rows again
        print("round", reply.status, rig.check_drafts(reply, b), flush=True)
""")


def test_truncating_the_engines_ring_is_refused_and_the_proxy_goes_on(seg_name):
    """Before, the ring was a named object: the ftruncate succeeded and the proxy's next read of a row
    died of SIGBUS (exit -7)."""
    p = subprocess.run([sys.executable, "-c", _TRUNCATE, seg_name], cwd=_ROOT, env=_env("memfd"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.split("\n")[:2] == ["refused", "round 0 2"], p.stdout


def test_the_proxy_maps_only_a_sealed_ring_of_the_attached_engine(tmp_path):
    nbytes = 8192
    fd = os.memfd_create("dspark-ring.unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        path = f"/proc/{os.getpid()}/fd/{fd}"
        with pytest.raises(ring_shm.RingError, match="not sealed against shrinking"):
            ring_shm.open_ring(path, nbytes, os.getpid())
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, ring_shm.SEALS)
        with pytest.raises(ring_shm.RingError, match="not the attached engine's"):
            ring_shm.open_ring(path, nbytes, os.getpid() + 1)
        with pytest.raises(ring_shm.RingError, match="holds 8192 bytes, the layout says 4096"):
            ring_shm.open_ring(path, 4096, os.getpid())
        assert ring_shm.open_ring(path, nbytes, os.getpid()).shape == (nbytes,)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    with pytest.raises(ring_shm.RingError, match="cannot be opened"):
        ring_shm.open_ring(path, nbytes, os.getpid())
    os.mkfifo(tmp_path / "fifo")  # a FIFO without a writer: a blocking open would wait for one for ever
    r = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(ring_shm.RingError, match="not a sealed memfd"):
            ring_shm.open_ring(f"/proc/{os.getpid()}/fd/{r}", nbytes, os.getpid())
    finally:
        os.close(r)
    page = bytearray(4096)
    for good in (path, "/dspark-ring.a.1.0f3a"):
        ring_shm.write_ring_name(page, good)
        assert ring_shm.read_ring_name(page) == good
    for bad in ("/proc/self/fd/3", "/proc/1/fd/3/x", "/proc/1/mem"):
        ring_shm.write_ring_name(page, bad)
        assert ring_shm.read_ring_name(page) == "", bad


# ---------------------------------------------------------------------------------------------- item 5

_ENGINE = textwrap.dedent("""
    import sys, time
    import engine_shim
    from dspark_proxy.sim import SimConfig, SimEngine
    name, M, N, W, B = sys.argv[1], *map(int, sys.argv[2:6])
    shim = engine_shim.attach(name, max_reqs=M, num_spec=N, window=W, row_bytes=B, timeout_s=10.0)
    sim = SimEngine(SimConfig(seed=5, max_reqs=M, num_spec=N, window=W, row_bytes=B))
    sim.run(shim, rounds=20)
    print("ran", shim._shared.kind, flush=True)
    if sys.argv[6] == "exit":
        sys.stdin.readline()  # told to go
        sys.exit(0)  # a clean exit that never closes its shim (vLLM never calls the proposer's close)
    time.sleep(120)  # killed here
""")


@pytest.mark.parametrize("kind", ["memfd", "named"])
@pytest.mark.parametrize("how", ["kill", "exit", "zombie"])
def test_an_ended_engines_ring_is_gone_within_2_s_while_the_proxy_runs(seg_name, kind, how):
    """Before: a zombie engine's named ring stayed (reap_stale's kill(pid, 0) called it alive after
    the proxy's pidfd had fired), and there was no memfd ring."""
    cfg = ProxyConfig(name=seg_name, worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=500.0, log_every=0)
    proxy = Proxy(cfg, client=ScriptedClient(max_reqs=M, num_spec=N, window=W, row_bytes=B))
    th = threading.Thread(target=proxy.serve, name="test-proxy", daemon=True)
    th.start()
    child = None
    try:
        assert proxy.ready.wait(10.0)
        child = subprocess.Popen([sys.executable, "-c", _ENGINE, seg_name, str(M), str(N), str(W), str(B), how],
                                 cwd=_ROOT, env=_env(kind), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().split() == ["ran", kind]
        named = glob.glob(f"/dev/shm/dspark-ring.{seg_name}.{child.pid}.*")
        if kind == "memfd":
            assert _mapped(seg_name) and not named, "the proxy maps the engine's memfd, /dev/shm holds nothing"
        else:
            assert len(named) == 1
        t0 = time.monotonic()
        if how == "exit":
            child.stdin.write("go\n")
            child.stdin.flush()
        else:
            os.kill(child.pid, signal.SIGKILL)  # "zombie": never waited for until the end of the test
        if how == "kill":
            child.wait(10.0)

        def left() -> bool:
            return _mapped(seg_name) if kind == "memfd" else any(os.path.exists(p) for p in named)

        while left() and time.monotonic() - t0 < 5.0:
            time.sleep(0.02)
        gone_s = time.monotonic() - t0
        assert not left(), f"the ended engine's ring is still there after {gone_s:.1f} s"
        assert gone_s < 2.0, f"the ended engine's ring went after {gone_s:.2f} s"
    finally:
        if child is not None:
            child.stdin.close()
            if child.poll() is None:
                child.kill()
            child.wait(10.0)
        proxy.stop()
        th.join(10.0)
    assert not th.is_alive()


def test_a_zombie_is_an_ended_engine_and_its_named_ring_is_reaped(seg_name):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stale = f"/dev/shm/dspark-ring.{seg_name}.{child.pid}.0"
    try:
        with open(stale, "wb") as f:
            f.write(b"\0" * 64)
        ring_shm.reap_stale(seg_name)
        assert os.path.exists(stale), "a live engine's ring was reaped"
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # a zombie now (not waited for)
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if b") Z " in f.read():
                    break
            time.sleep(0.01)
        ring_shm.reap_stale(seg_name)
        assert not os.path.exists(stale), "a zombie engine's ring was kept"
    finally:
        child.kill()
        child.wait(10.0)
        if os.path.exists(stale):
            os.unlink(stale)


# ---------------------------------------------------------------------------------------------- item 6

@pytest.mark.parametrize("kind", ["memfd", "named"])
def test_a_shim_that_fails_to_construct_leaves_no_ring(seg_name, monkeypatch, kind):
    """Before, the ring was made first and nothing removed it when a later check raised."""
    monkeypatch.setenv("DSPARK_SHARED_RING", "1" if kind == "memfd" else "named")
    fds = _memfd_fds(seg_name)
    with pytest.raises(ValueError, match="target_id="):
        Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, start_watchdog=False, target_id="bad\nid")
    with pytest.raises(ShimError, match="window must be an int > 0"):
        Shim(seg_name, max_reqs=M, num_spec=N, window=0, row_bytes=B, start_watchdog=False)
    from engine_shim import watchdog

    def broken_start(self):
        raise RuntimeError("no thread for the watchdog")

    monkeypatch.setattr(watchdog.Watchdog, "start", broken_start)
    for _ in range(3):  # each retry used to add a ring
        with pytest.raises(RuntimeError, match="no thread"):
            Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B)
    gc.collect()
    assert not glob.glob(f"/dev/shm/dspark-ring.{seg_name}.*"), "a refused Shim() left its named ring"
    assert _memfd_fds(seg_name) == fds and not _mapped(seg_name), "a refused Shim() left its memfd ring"


# ---------------------------------------------------------------------------------------------- item 3

@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the squatter and the engine run as two other uids")
@pytest.mark.parametrize("kind", ["memfd", "named"])
def test_another_user_squatting_ring_names_never_stops_the_engine(seg_name, kind):
    """Another user's objects under the names an engine would use (its pid with n = 0..7, as the
    names were made before, and a dead pid's) while the engine runs as a third uid, in a sticky
    /dev/shm. Before: posix_ipc.PermissionsError escaped Shim()."""
    squatter_uid, engine_uid = 65534, 65533
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    engine = os.fork()
    if engine == 0:  # the engine: waits until the squatter is done, then makes its Shim as another user
        code = 1
        try:
            os.close(go_w)
            os.read(go_r, 1)
            os.setgid(engine_uid)
            os.setuid(engine_uid)
            os.environ["DSPARK_SHARED_RING"] = "1" if kind == "memfd" else "named"
            shim = Shim(seg_name, max_reqs=M, num_spec=N, window=W, row_bytes=B, start_watchdog=False)
            msg = f"ok {shim._shared.kind if shim._shared else 'private'}"
            shim.close()
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = f"err {e!r}"
        os.write(res_w, msg.encode()[:200])
        os._exit(code)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"/dev/shm/dspark-ring.{seg_name}.{engine}.{n}" for n in range(8)]
    names.append(f"/dev/shm/dspark-ring.{seg_name}.{dead.pid}.0")
    squat = os.fork()
    if squat == 0:
        try:
            os.setgid(squatter_uid)
            os.setuid(squatter_uid)
            for p in names:
                fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.close(fd)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    try:
        assert os.waitpid(squat, 0)[1] == 0
        os.write(go_w, b"g")
        _, status = os.waitpid(engine, 0)
        msg = os.read(res_r, 256).decode()
        assert msg == f"ok {kind}" and status == 0, msg
        assert all(os.path.exists(p) for p in names[:-1]), "another user's object was removed"
    finally:
        for p in names:
            if os.path.exists(p):
                os.unlink(p)
        for fd in (go_r, go_w, res_r, res_w):
            os.close(fd)


def test_a_ring_the_proxy_cannot_map_fails_rounds_closed_with_one_line(seg_name, monkeypatch, caplog):
    """Where the proxy may not open the engine's memfd (another PID namespace, a non-dumpable engine)
    every round fails closed; the log says why once, without a traceback (before: a traceback per
    10 s, counted as an internal error)."""
    import logging

    from dspark_proxy.round import ring_rows
    from dspark_proxy.shm.layout import STATUS_ROUND_FAILED
    from tests.rig import Rig

    def refused(name, nbytes, pid=None):
        raise ring_shm.RingError(f"the engine's ring {name} cannot be opened: Permission denied")

    monkeypatch.setattr(ring_rows, "open_ring", refused)
    with caplog.at_level(logging.WARNING, logger="dspark_proxy.round.core"), Rig(seg_name, M=4, N=3, W=4, B=64) as rig:
        for _ in range(3):
            reply, _b = rig.round([(1, 0, 1)])
            assert reply.status == STATUS_ROUND_FAILED and not reply.ok_mask.any()
        assert rig.stats.counter("fallback_ring_refused") == 3 and rig.stats.counter("fallback_internal_error") == 0
    lines = [r for r in caplog.records if "cannot be opened" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in caplog.records]


def test_a_running_proxy_reaps_a_named_ring_of_an_engine_that_never_attached(seg_name):
    """An engine that ended detached (it never attached, or after a detach) never reaches the proxy's
    pidfd: its named ring goes by the heartbeat's reap, once a second (before: at the next incarnation)."""
    cfg = ProxyConfig(name=seg_name, worker="inproc", max_reqs=M, num_spec=N, window=W, row_bytes=B,
                      deadline_ms=500.0, log_every=0)
    proxy = Proxy(cfg, client=ScriptedClient(max_reqs=M, num_spec=N, window=W, row_bytes=B))
    th = threading.Thread(target=proxy.serve, name="test-proxy", daemon=True)
    th.start()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"/dev/shm/dspark-ring.{seg_name}.{dead.pid}.0f3a"
    try:
        assert proxy.ready.wait(10.0)
        time.sleep(0.2)  # past the reap at the heartbeat's start
        with open(stale, "wb") as f:
            f.write(b"\0" * 64)
        t0 = time.monotonic()
        while os.path.exists(stale) and time.monotonic() - t0 < 5.0:
            time.sleep(0.02)
        assert not os.path.exists(stale) and time.monotonic() - t0 < 2.0, time.monotonic() - t0
        assert proxy.incarnations == 1
    finally:
        proxy.stop()
        th.join(10.0)
        if os.path.exists(stale):
            os.unlink(stale)
    assert not th.is_alive()
