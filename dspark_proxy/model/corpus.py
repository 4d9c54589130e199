"""The text the shipped target learns from: Python standard-library sources, split by top-level package.

Every machine with Python has these files, so the target can be remade anywhere without a download.
Train and held-out lists are disjoint by *top-level* package (a hash of its name decides), so held-out
text is code the target never saw, not a shuffled neighbour of a training file. Test suites, vendored
code and generated tables (encodings/, unicode data, pydoc topics, sysconfig data) are left out: they
teach copying, not Python. The lists (and their hash, recorded beside the model) depend on the Python
version's stdlib; the selection rules do not.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "stdlib_corpus", "HELD_OUT_SHARE"]

HELD_OUT_SHARE = 8  # one top-level name in eight (by hash) is held out

_SKIP_TOP = {"encodings", "test", "site-packages", "lib-dynload", "__pycache__", "pydoc_data", "ensurepip",
             "__phello__"}
_SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "_vendor"}
_SKIP_FILES = {"stringprep.py", "_casefix.py", "entities.py", "__hello__.py", "this.py", "antigravity.py",
               "keysyms.py"}
_MAX_BYTES = 300_000


@dataclass(frozen=True)
class Corpus:
    root: Path
    train: tuple[str, ...]  # paths relative to root, sorted
    held_out: tuple[str, ...]

    def digest(self) -> str:
        """sha256 over both lists and every file's bytes: the same digest means the same text."""
        h = hashlib.sha256()
        for tag, names in (("train", self.train), ("held_out", self.held_out)):
            h.update(tag.encode())
            for n in names:
                h.update(n.encode() + b"\0")
                h.update(hashlib.sha256((self.root / n).read_bytes()).digest())
        return h.hexdigest()

    def read(self, which: str) -> list[str]:
        names = self.train if which == "train" else self.held_out
        return [(self.root / n).read_text(encoding="utf-8", errors="replace") for n in names]


def _top_held_out(top: str) -> bool:
    return hashlib.sha256(top.encode()).digest()[0] % HELD_OUT_SHARE == 0


def _keep(rel: Path, size: int) -> bool:
    if rel.parts[0] in _SKIP_TOP or rel.parts[0].startswith(("config-", "_sysconfigdata")):
        return False
    if any(p in _SKIP_DIRS or p.startswith("test_") for p in rel.parts[:-1]):
        return False
    return rel.name not in _SKIP_FILES and not rel.name.startswith("test_") and 0 < size <= _MAX_BYTES


def stdlib_corpus(root: str | os.PathLike | None = None) -> Corpus:
    """The fixed, disjoint train / held-out file lists of the stdlib at `root` (default: this Python's)."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    held: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            p = Path(dirpath) / f
            rel = p.relative_to(base)
            if not _keep(rel, p.stat().st_size):
                continue
            top = rel.parts[0].removesuffix(".py")
            (held if _top_held_out(top) else train).append(rel.as_posix())
    if not train or not held:
        raise RuntimeError(f"no stdlib sources found under {base}")
    return Corpus(base, tuple(sorted(train)), tuple(sorted(held)))
