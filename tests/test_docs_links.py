"""The documentation's promises about itself, checked without a network: every relative link and image in
README.md, docs/*.md, shm_layout.md and FORMAT.md names a file that exists and, with a #fragment, a
heading of that file (GitHub's anchors); the README stays an operator's five-minute read whose test
command is CI's; docs/guarantees.md's fault-kinds table is chaos/kinds.py's; docs/img/ stays small."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "shm_layout.md", ROOT / "dspark_proxy" / "wire" / "FORMAT.md",
                *(ROOT / "docs").glob("*.md")])
# pages other branches of this wave add (docs/serving.md: `vllm serve`; docs/dspark.md: DSpark
# checkpoints): a link to one passes while it is absent here; once present it is checked like any other
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
README_MAX_LINES = 250
IMG_MAX_BYTES = 200_000


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (a link there is an example, not a link)."""
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"^(```|~~~).*?^\1", "", page.read_text(), flags=re.M | re.S).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(page.read_text()))]


def test_slug_is_githubs() -> None:
    assert slug("Keeping the proxy's CPUs awake (`start --keep-awake-ms`)") == \
        "keeping-the-proxys-cpus-awake-start---keep-awake-ms"
    assert slug("What drafting earns (`eval`)") == "what-drafting-earns-eval"
    assert slug("Ratios against each baseline (p50, from the table)") == "ratios-against-each-baseline-p50-from-the-table"


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    """The check below would see a link to a missing file or heading (so its passing means something)."""
    page = tmp_path / "p.md"
    page.write_text("# Top\n[ok](#top) [gone](missing.md) `[code](nope.md)`\n```\n[fenced](nope.md)\n```\n")
    assert links(page) == ["#top", "missing.md"]
    assert anchors(page) == {"top"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked (no network)
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, len(text.splitlines())
    first_block = re.search(r"^```\n(.*?)^```", text, flags=re.M | re.S).group(1)
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]  # CI runs exactly the README's test command
    assert ci in first_block, (ci, first_block)
    assert "bash scripts/setup.sh && .venv/bin/dspark-proxy demo" in first_block
    assert text.index("```") < 400, "the two commands come first"


def test_guarantees_lists_every_fault_kind_as_the_code_does() -> None:
    """docs/guarantees.md's table of kinds: one row per kind of chaos/kinds.py, its `what` verbatim."""
    from dspark_proxy.chaos import FAULT_KINDS

    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (.*?) \| (?:proxy|shim|notes) `", (ROOT / "docs" / "guarantees.md").read_text(),
                           flags=re.M))
    want = {k.name: k.what for k in FAULT_KINDS}
    missing = [f"| `{k}` | {w} | {dict((f.name, f.effect) for f in FAULT_KINDS)[k].where} `...` |"
               for k, w in want.items() if rows.get(k) != w]
    assert not missing, "docs/guarantees.md, 'Fault kinds': add or fix the rows\n" + "\n".join(missing)
    assert set(rows) == set(want), set(rows) - set(want)


def test_pictures_are_small_pngs() -> None:
    imgs = sorted((ROOT / "docs" / "img").glob("*"))
    assert imgs, "docs/img/ holds the pictures the README and docs/performance.md show"
    for p in imgs:
        data = p.read_bytes()
        assert p.suffix == ".png" and data[:8] == b"\x89PNG\r\n\x1a\n", p
        assert len(data) < IMG_MAX_BYTES, (p.name, len(data))
