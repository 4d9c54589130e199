"""The atheris harness (scripts/fuzz_atheris.py) runs its targets without atheris installed: each one on a
few random inputs, so a long fuzzing session does not start by finding a broken harness."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fuzz_atheris.py"


@pytest.mark.timeout(60)
def test_harness_smoke():
    out = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "40"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    for target in ("step", "reply", "control", "descriptor", "header"):
        assert f"'{target}': 40" in out.stdout


def test_harness_without_atheris_says_how_to_install():
    try:
        import atheris  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - atheris installed: nothing to check here
        pytest.skip("atheris is installed")
    out = subprocess.run([sys.executable, str(SCRIPT), "step", "-runs=1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "pip install atheris" in out.stderr
