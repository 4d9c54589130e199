"""`dspark-proxy bench` from an installed wheel, not the checkout: the package carries everything its
commands run (the hand-off section's bare hand-off once lived in scripts/, which a wheel lacks).

The wheel is built from a copy of this tree (`pip wheel . --no-deps`, the C extension compiled; a
copy, so no build directory left in the checkout can put a stale module into it) and installed
with `pip install --no-deps --target DIR`; the bench then runs from another directory with DIR first
on the path, over this environment's numpy and click, so the checkout cannot be imported by mistake.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(240)


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, **kw)
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
    return out


def test_bench_runs_from_an_installed_wheel(tmp_path):
    src, wheels, target, cwd = tmp_path / "src", tmp_path / "wheels", tmp_path / "site", tmp_path / "run"
    cwd.mkdir()
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                              "*.so", "tests", ".ruff_cache"))
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
          "-w", str(wheels)], timeout=180)
    (wheel,) = wheels.glob("dspark_proxy-*.whl")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), "-q", str(wheel)], timeout=120)
    assert not (target / "scripts").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = _run([sys.executable, "-c", "import dspark_proxy, engine_shim; print(dspark_proxy.__file__); "
                  "print(engine_shim.__file__)"], cwd=cwd, env=env, timeout=60).stdout.split()
    assert all(Path(p).is_relative_to(target) for p in where), where
    out = _run([sys.executable, "-m", "dspark_proxy.cli", "bench", "--quick", "--sections", "handoff", "--json"],
               cwd=cwd, env=env, timeout=120)
    r = json.loads(out.stdout)
    places = r["handoff"]["placements"]
    assert places
    for place, p in places.items():
        assert "bare_handoff_note" not in p, (place, p.get("bare_handoff_note"))
        assert p["bare_handoff"]["p50_us"] > 0 and p["handoff"]["p50_us"] > 0, place
