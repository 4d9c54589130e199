"""Fault kinds against the engine's shared ring (shm_layout.md §1 and §9): truncated, its names squatted by
another user, its engine gone without closing. The table is kinds.py; each injector notes what the
report checks (report.py: a ring that outlives its engine by more than 2 s fails the campaign).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["ring_truncate", "ring_squat", "engine_exit", "proxy_ring_maps", "RING_GONE_S"]

RING_GONE_S = 2.0  # no ring may outlive its engine by more than this
SQUAT_UID = 65534  # "nobody": the other local user


def proxy_ring_maps(c: Controller) -> int | None:
    """How many rings of our name the proxy maps (at most one: its attached engine's); None unreadable."""
    proxy = c.system.proxy
    if proxy is None:
        return None
    try:
        with open(f"/proc/{proxy.pid}/maps") as f:
            text = f.read()
    except OSError:
        return None
    return len({ln.split()[4] for ln in text.splitlines()
                if f"dspark-ring.{c.system.name}" in ln and len(ln.split()) > 4})


def ring_truncate(c: Controller) -> None:
    """ftruncate the engine's ring to 0, as anything with its uid may: refused (a sealed memfd), and the
    proxy drafts on. A named ring (only where memfd is refused) would be cut: noted, and the report fails."""
    ring = getattr(c.system.shim, "_shared", None)
    if ring is None:
        c.note(skipped="the engine's ring is private")
        c.cleared()
        return
    path = ring.shm_name if ring.shm_name.startswith("/proc/") else "/dev/shm" + ring.shm_name
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        c.note(truncated=True)
    except PermissionError:
        c.note(truncate_refused=1)
    finally:
        os.close(fd)
    c.sleep(c.hold_s)
    c.note(proxy_alive=c.system.proxy is not None and c.system.proxy.alive())
    c.cleared()


def _squat(paths: list[str], uid: int) -> int:
    """Create each path as `uid` (a forked child that makes only system calls, then _exit): how many."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        n = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            for p in paths:
                try:
                    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                    n += 1
                except OSError:
                    pass
        finally:
            os.write(w, bytes([min(n, 255)]))
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return got[0] if got else 0


def ring_squat(c: Controller) -> None:
    """Another user (uid 65534) takes every ring name an engine of ours could have used before (its pid
    with n = 0..7, and a dead pid's), then a new engine starts and attaches (a new incarnation): both
    must draft as usual. Needs root to act as another user; otherwise skipped (never a pass)."""
    if os.geteuid() != 0:
        c.note(skipped="needs root")
        c.cleared()
        return
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = c.system.name
    paths = [f"/dev/shm/dspark-ring.{name}.{os.getpid()}.{n}" for n in range(8)]
    paths.append(f"/dev/shm/dspark-ring.{name}.{dead.pid}.0")
    try:
        c.note(squatted=_squat(paths, SQUAT_UID), squatter=f"uid {SQUAT_UID}")
        restarted = c.restart_engine(10.0)
        c.note(restarted=restarted)
        c.cleared()
        c.wait_resumed(c.probe.count, c.cfg.resume_timeout_s)
        c.note(proxy_ring_maps=proxy_ring_maps(c))
    finally:
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass


_ENGINE = textwrap.dedent("""
    import os, sys
    import engine_shim
    from dspark_proxy.sim import SimConfig, SimEngine
    name, M, N, W, B = sys.argv[1], *map(int, sys.argv[2:6])
    shim = engine_shim.Shim(name, max_reqs=M, num_spec=N, window=W, row_bytes=B)
    SimEngine(SimConfig(seed=9, max_reqs=M, num_spec=N, window=W, row_bytes=B)).run(shim, rounds=20)
    print(shim._shared.shm_name if shim._shared else "", flush=True)
    os._exit(0)  # no close, no atexit: what a killed engine leaves
""")


def engine_exit(c: Controller) -> None:
    """A second engine of our name (its ring a named one, the kind /dev/shm shows) steps target-only
    beside ours and exits without closing its shim: its ring must be gone within RING_GONE_S (the
    proxy's reap, once a second); ours keeps drafting."""
    m, n, w, b = c.system.layout
    env = dict(os.environ, DSPARK_SHARED_RING="named")
    p = subprocess.Popen([sys.executable, "-c", _ENGINE, c.system.name, str(m), str(n), str(w), str(b)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ring = (p.stdout.readline() if p.stdout else "").strip()
        p.wait(30.0)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10.0)
        if p.stdout:
            p.stdout.close()
    t0 = time.monotonic()
    c.cleared()
    path = "/dev/shm" + ring if ring.startswith("/dspark-ring.") else ""
    while path and os.path.exists(path) and time.monotonic() - t0 < 3 * RING_GONE_S:
        c.sleep(0.02)
    c.note(engines_exited=1, ring_named=bool(path), ring_gone_ms=round((time.monotonic() - t0) * 1e3),
           ring_left=bool(path) and os.path.exists(path), proxy_ring_maps=proxy_ring_maps(c))
    if path and os.path.exists(path):
        os.unlink(path)
