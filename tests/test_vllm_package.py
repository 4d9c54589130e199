"""engine_shim/vllm/, vLLM's adapter, as a package of its own (docs/design.md, the code map): importing
the shim and the package costs neither vLLM nor torch, the shim's modules import one another without a
circle, and the hook knows our drafter without importing the proposer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from unittest import mock

import engine_shim
from engine_shim.vllm import hook

SHIM = Path(engine_shim.__file__).parent


def _module(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(SHIM.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _edges() -> dict[str, set[str]]:
    """Module -> the engine_shim modules it imports: every import anywhere in the file (inside functions
    and under TYPE_CHECKING too), relative ones resolved; `from P import n` is P.n where that is a module."""
    mods = dict(_module(p) for p in SHIM.rglob("*.py"))
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for path in SHIM.rglob("*.py"):
        m, is_pkg = _module(path)
        here = m.split(".") if is_pkg else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                b = ".".join(base + ([node.module] if node.module else []))
                names = [f"{b}.{a.name}" if f"{b}.{a.name}" in mods else b for a in node.names]
            edges[m].update(n for n in names if n in mods and n != m)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the path around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_shim_has_no_import_circle():
    edges = _edges()
    assert "engine_shim.vllm.proposer" in edges["engine_shim.vllm_proposer"]  # the checker sees imports
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_the_cycle_check_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_importing_the_shim_and_its_vllm_package_imports_neither_vllm_nor_torch():
    code = ("import sys, engine_shim, engine_shim.vllm; "
            "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=SHIM.parent, check=True).stdout.strip()
    assert out == "[]", out


def test_the_documented_class_path_is_the_proposer():
    from engine_shim.vllm.proposer import DSparkProposer
    from engine_shim.vllm_proposer import DSparkProposer as documented

    assert documented is DSparkProposer and getattr(DSparkProposer, hook.MARK) is True


def test_the_hook_hands_any_other_drafter_to_vllm():
    """Only a drafter whose class says it is ours (hook.MARK is True) is driven by the wrappers: a mock,
    whose every attribute is truthy, goes to vLLM's own methods like any other drafter."""
    calls: list[str] = []

    class Runner:
        def _setup_eagle3_aux_hidden_state_outputs(self) -> None:
            calls.append("setup")

        def propose_draft_token_ids(self, *args) -> list:
            calls.append("propose")
            return [[5]]

        def _input_fits_in_drafter(self, cam) -> bool:
            return False

        def _get_draft_token_ids_cpu(self):
            calls.append("drafts")
            return None, []

        def _prepare_inputs(self, scheduler_output, n):
            calls.append(f"prepare {self.speculative_config}")

    hook._wrap(Runner)
    for drafter in (mock.MagicMock(), None, object()):
        r = Runner()
        r.drafter = drafter
        r._setup_eagle3_aux_hidden_state_outputs()
        assert r.propose_draft_token_ids(*([None] * 9)) == [[5]]
        assert r._input_fits_in_drafter(object()) is False
        assert r._get_draft_token_ids_cpu() == (None, [])
        r.speculative_config = "spec"
        r._prepare_inputs(mock.MagicMock(scheduled_spec_decode_tokens={}), None)
        if drafter is not None and hasattr(drafter, "bind"):
            drafter.bind.assert_not_called()
    assert calls == ["setup", "propose", "drafts", "prepare spec"] * 3
