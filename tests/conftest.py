"""Shared fixtures: every shared-memory segment a test run creates is removed, and a leak fails the run.

Segments are named per test from a run-unique prefix (`seg_name`), so a leftover is attributable to
this run even while other pytest sessions use /dev/shm at the same time. Segments created under other
names (a test that picks its own) are caught too: `posix_ipc.SharedMemory` is wrapped for the session
so that every exclusive create made by this process or a forked child is logged to a per-run file.
(Children started with the 'spawn' method do not load this file: give them names from `seg_name`.)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import posix_ipc
import pytest
from hypothesis import HealthCheck, settings

# Every property test is bounded by pytest-timeout, not by hypothesis's per-example deadline or its
# data-generation health check: both fail on a loaded machine alone. A test's own @settings inherit these.
settings.register_profile("dspark", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dspark")

DEV_SHM = Path("/dev/shm")
_SHM_PREFIX = "dspark-proxy."  # segment.shm_name(): "/dspark-proxy.<name>"

# one prefix per pytest run: names look like "t<pid>x<hex>-<n>" (segment names allow [A-Za-z0-9_.-])
RUN_PREFIX = f"t{os.getpid()}x{uuid.uuid4().hex[:6]}"
_CREATED_LOG = Path(os.environ.get("TMPDIR", "/tmp")) / f"dspark-test-shm-{RUN_PREFIX}.log"
_counter = iter(range(1 << 30))


def _unlink(name: str) -> bool:
    """Remove /dev/shm/dspark-proxy.<name> (True if it was there) and the engines' rings of that name
    (a shim of a child process killed mid-test never closes its own)."""
    from dspark_proxy.shm.ring_shm import unlink_rings

    unlink_rings(name)
    try:
        posix_ipc.unlink_shared_memory(f"/{_SHM_PREFIX}{name}")
    except posix_ipc.ExistentialError:
        return False
    return True


def new_segment_name(tag: str = "") -> str:
    """A segment name no other test (or other concurrent test run) uses."""
    tag = "".join(c if c.isalnum() else "_" for c in tag)[:40]
    return f"{RUN_PREFIX}-{next(_counter)}{'-' + tag if tag else ''}"


@pytest.fixture
def seg_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique segment name for this test; whatever is left under it is unlinked on teardown, pass or fail."""
    name = new_segment_name(request.node.name)
    yield name
    _unlink(name)


@pytest.fixture
def make_seg_name() -> Iterator[Callable[[str], str]]:
    """A factory of unique names for a test that needs several; each one is unlinked on teardown."""
    names: list[str] = []

    def make(tag: str = "") -> str:
        names.append(new_segment_name(tag))
        return names[-1]

    yield make
    for n in names:
        _unlink(n)


# ---------------------------------------------------------------- the run's leak check

_real_shared_memory = posix_ipc.SharedMemory


def _logging_shared_memory(name, flags=0, *args, **kwargs):
    """posix_ipc.SharedMemory, logging every create of one of ours (this process and forked children)."""
    shm = _real_shared_memory(name, flags, *args, **kwargs)
    if flags & posix_ipc.O_CREAT and str(name).startswith(f"/{_SHM_PREFIX}"):
        with open(_CREATED_LOG, "a") as f:  # O_APPEND: lines from several processes do not interleave
            f.write(str(name)[len(_SHM_PREFIX) + 1:] + "\n")
    return shm


def pytest_sessionstart(session: pytest.Session) -> None:
    posix_ipc.SharedMemory = _logging_shared_memory


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    posix_ipc.SharedMemory = _real_shared_memory
    created: set[str] = set()
    if _CREATED_LOG.exists():
        created = {ln for ln in _CREATED_LOG.read_text().split("\n") if ln}
        _CREATED_LOG.unlink()
    ours = {p.name[len(_SHM_PREFIX):] for p in DEV_SHM.glob(f"{_SHM_PREFIX}{RUN_PREFIX}-*")}
    leaked = sorted(n for n in created | ours if (DEV_SHM / f"{_SHM_PREFIX}{n}").exists())
    if not leaked:
        return
    for n in leaked:
        _unlink(n)
    msg = (f"\n{'!' * 100}\nLEAKED SHARED MEMORY: this test run left {len(leaked)} segment(s) in /dev/shm "
           f"(now removed):\n" + "\n".join(f"  /dev/shm/{_SHM_PREFIX}{n}" for n in leaked) +
           "\nEvery test must unlink what it creates (use the seg_name fixture, or try/finally).\n"
           f"{'!' * 100}")
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(msg, red=True, bold=True)
    else:  # pragma: no cover - run without the terminal reporter
        print(msg)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
