"""The package's layering: the house's rules (docs/design.md, "Where each protocol lives": one package
per job, no import circles, each room importing only the rooms below it), and the CLI as a thin
adapter over the library whose options are derived, not copied.

The house is read from the source as text, nothing imported: every `import` counts wherever it stands (inside a
function, under `TYPE_CHECKING`); in C, a file that uses a name another `.c` file defines depends on
that file, and a header belongs to the `.c` file of its name (`_x.h` to `_x.c`; a header with no `.c`
of its name belongs to no file).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import dspark_proxy
from dspark_proxy.config import WorkerConfig
from dspark_proxy.worker import FaultPlan, WorkerServer
from dspark_proxy.worker_main import fault_plan, server_options

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dspark_proxy", "engine_shim")

# Each room and the rooms it may import, bottom first (a room: a package under dspark_proxy/, one of the
# few modules left in dspark_proxy/ itself, engine_shim, engine_shim/vllm; `face`: dspark_proxy's
# __init__). A new import across rooms is a decision: make it here, keeping the table free of circles.
ALLOWED: dict[str, set[str]] = {
    "limits": set(),
    "crc": set(),
    "integrity": set(),
    "round._fastround": set(),
    "native": {"round._fastround"},
    "shm": {"limits", "native"},
    "wire": {"limits", "native"},
    "ops": {"native", "shm"},
    "link": {"wire"},
    "round": {"round._fastround", "native", "shm", "wire", "ops", "link"},
    "model": set(),
    "aliases": set(),
    "pool": {"wire", "link", "round"},
    "face": set(),
    "worker": {"crc", "integrity", "wire", "ops", "link", "model", "face"},
    "config": {"shm", "pool", "worker"},
    "worker_main": {"ops", "model", "worker", "config"},
    "config_flags": {"model", "aliases", "config"},
    "engine_alive": {"shm"},
    "proxy": {"shm", "ops", "link", "round", "pool", "worker", "config", "engine_alive"},
    "engine_shim": {"native", "shm", "ops", "link", "round", "config", "proxy"},
    "engine_shim.vllm": {"shm", "model", "engine_shim"},
    "plotting": {"ops"},
    "sim": {"crc", "integrity"},
    "demo": {"ops", "engine_shim", "sim"},
    "spec": {"ops", "model", "worker", "proxy", "engine_shim", "plotting"},
    "integrations": {"shm", "ops", "model", "engine_shim", "engine_shim.vllm"},
    "chaos": {"shm", "wire", "ops", "worker", "engine_shim", "plotting", "sim"},
    "bench": {"shm", "wire", "ops", "link", "round", "model", "worker", "engine_shim", "plotting", "spec",
              "integrations"},
    "commands": {"shm", "ops", "model", "aliases", "config", "worker_main", "config_flags", "proxy",
                 "plotting", "demo", "spec", "integrations", "chaos", "bench"},
    "cli": {"ops", "face", "commands"},
}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the two packages -> (its file, whether it is a package's __init__)."""
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
        for p in (ROOT / pkg).rglob("*.c"):  # a C extension is a module too (named by setup.py)
            out.setdefault(".".join(p.relative_to(ROOT).with_suffix("").parts), (p, False))
    return out


def _base(cur: str, is_pkg: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    parts = cur.split(".") if is_pkg else cur.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _known(name: str, mods: dict) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def python_imports() -> dict[str, set[str]]:
    """module -> the project's modules it imports (a name imported from a package is the submodule of
    that name where one exists; otherwise the package's __init__)."""
    mods = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for m, (p, is_pkg) in mods.items():
        if p.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(a.name, mods) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base(m, is_pkg, node.level, node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else _known(base, mods))
            edges[m].update(t for t in targets if t and t != m)
    return edges


_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _c_top_level_definitions(text: str, header: bool = False) -> set[str]:
    """Names a C file defines for other files: its non-static functions and file-scope variables, and
    (for a header) its macros, typedefs, prototypes and inline functions. A macro a .c file defines is
    its own."""
    names: set[str] = set()
    for m in re.finditer(r"^\s*#\s*define\s+([A-Za-z_]\w*)", text, re.M):
        if header:
            names.add(m.group(1))
    for m in re.finditer(r"\benum\b[^{;]*\{([^}]*)\}", text):  # enum constants
        names.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=[^,]*)?(?:,|$)", m.group(1).strip()))
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                decl = text[start:i]
                if not re.search(r"\bstatic\b", decl) or decl.strip().startswith("static inline"):
                    names.update(_declared_names(decl))
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                start = i + 1
        elif ch == ";" and depth == 0:
            decl = text[start:i]
            if not re.search(r"\bstatic\b", decl) or " inline " in decl:
                names.update(_declared_names(decl))
            start = i + 1
    return names


def _without_attributes(decl: str) -> str:
    """`decl` less its `__attribute__((...))` clauses (balanced parentheses)."""
    while (i := decl.find("__attribute__")) >= 0:
        j, depth = decl.find("(", i), 0
        if j < 0:
            return decl[:i]
        for k in range(j, len(decl)):
            depth += {"(": 1, ")": -1}.get(decl[k], 0)
            if depth == 0:
                break
        decl = decl[:i] + " " + decl[k + 1:]
    return decl


def _declared_names(decl: str) -> set[str]:
    decl = _without_attributes(re.sub(r"^\s*#[^\n]*$", "", decl, flags=re.M)).strip()
    if not decl:
        return set()
    if decl.startswith("typedef") and "(" in decl:  # a function pointer type: typedef R (*NAME)(...)
        m = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)", decl)
        return {m.group(1)} if m else set()
    if decl.startswith(("typedef", "struct", "enum", "union")) or "(" not in decl:
        ids = [i for i in _IDENT.findall(decl.split("=")[0].split("[")[0]) if i not in _C_WORDS]
        return {ids[-1]} if ids else set()  # the type's (or the variable's) name
    m = re.search(r"([A-Za-z_]\w*)\s*\(", decl)  # a function: the name before its parameters
    return {m.group(1)} - _C_WORDS if m else set()


_C_WORDS = {"typedef", "struct", "enum", "union", "const", "static", "inline", "extern", "void", "int", "char",
            "unsigned", "signed", "long", "short", "float", "double", "uint8_t", "uint16_t", "uint32_t",
            "uint64_t", "int8_t", "int16_t", "int32_t", "int64_t", "size_t", "Py_ssize_t", "PyObject", "_Atomic",
            "volatile", "restrict", "__restrict__", "bool"}


def c_uses() -> dict[str, set[str]]:
    """C file -> the C files it uses a name of (through the header of that file's name, or a name the
    .c file itself defines). Keys and values are repository paths of .c files."""
    edges: dict[str, set[str]] = defaultdict(set)
    for pkg in PACKAGES:
        for folder in {p.parent for p in (ROOT / pkg).rglob("*.c")}:
            units = {}
            for c in folder.glob("*.c"):
                h = c.with_suffix(".h")
                text = _C_COMMENT.sub(" ", c.read_text())
                own = _c_top_level_definitions(text)
                if h.exists():
                    own |= _c_top_level_definitions(_C_COMMENT.sub(" ", h.read_text()), header=True)
                units[c] = (own, set(_IDENT.findall(text)))
            for a, (_, used) in units.items():
                for b, (defined, _) in units.items():
                    if a != b and used & defined:
                        edges[str(a.relative_to(ROOT))].add(str(b.relative_to(ROOT)))
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    counter = 0
    for root in list(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def room(module: str) -> str:
    """The room a module stands in (see ALLOWED)."""
    parts = module.split(".")
    if parts[0] == "engine_shim":  # vllm_proposer.py: the adapter's documented class path
        return "engine_shim.vllm" if parts[1:2] == ["vllm"] or module == "engine_shim.vllm_proposer" else "engine_shim"
    if len(parts) == 1:
        return "face"
    if module == "dspark_proxy.round._fastround":
        return "round._fastround"
    return parts[1]


def test_no_python_import_circles() -> None:
    assert _cycles(python_imports()) == []


def test_no_c_circles() -> None:
    assert _cycles(c_uses()) == []


def test_each_room_imports_only_the_rooms_below_it() -> None:
    bad = []
    for a, targets in python_imports().items():
        for b in targets:
            ra, rb = room(a), room(b)
            if ra != rb and rb not in ALLOWED.get(ra, set()):
                bad.append(f"{a} -> {b} ({ra} may import {sorted(ALLOWED.get(ra, ()))})")
    assert not bad, "\n".join(bad)


def test_the_rooms_table_has_no_circle() -> None:
    assert _cycles(ALLOWED) == []


def test_every_room_is_in_the_table() -> None:
    assert {room(m) for m in _modules()} <= set(ALLOWED)


def test_the_hall_is_small() -> None:
    """dspark_proxy/ itself: at most 15 .py and .c files; everything else lives in a room."""
    files = [p.name for p in (ROOT / "dspark_proxy").iterdir() if p.suffix in (".py", ".c")]
    assert len(files) <= 15, sorted(files)


def test_the_c_extensions_are_imported_only_in_their_rooms() -> None:
    """Each C extension is used through its Python face: `_fastround` by native.py and the round,
    `_headmm` by model/, `_keepawake` by ops/; `_hostflag` (shm.hostflag's) is not even named outside
    shm/ in the product (its own tests, tests/test_hostflag*.py, call it directly)."""
    homes = {"dspark_proxy.round._fastround": ("dspark_proxy.native", "dspark_proxy.round."),
             "dspark_proxy.model._headmm": ("dspark_proxy.model.",), "dspark_proxy.ops._keepawake": ("dspark_proxy.ops.",),
             "dspark_proxy.shm._hostflag": ("dspark_proxy.shm.",)}
    bad = [f"{m} imports {t}" for m, ts in python_imports().items() for t in ts
           if t in homes and not m.startswith(homes[t])]
    for p in [*ROOT.glob("dspark_proxy/**/*.py"), *ROOT.glob("engine_shim/**/*.py"), *ROOT.glob("scripts/*.py")]:
        rel = str(p.relative_to(ROOT))
        if not rel.startswith("dspark_proxy/shm/") and re.search(r"\b_hostflag\b", _code_only(p.read_text())):
            bad.append(f"{rel} names _hostflag")
    assert not bad, "\n".join(bad)


def _code_only(source: str) -> str:
    """Python source less its comments and docstrings: what a module does, not what it says."""
    tree = ast.parse(source)
    drop = {id(n.body[0]) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    body = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and id(n) not in drop and not hasattr(n, "body")]
    return "\n".join(ast.unparse(n) for n in body)


def test_only_the_vllm_adapter_imports_vllm() -> None:
    bad = []
    for p in (ROOT / "engine_shim").rglob("*.py"):
        rel = p.relative_to(ROOT)
        if rel.parts[1] == "vllm" or rel.name == "vllm_proposer.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{rel}: {n}" for n in names if n.split(".")[0] == "vllm"]
    assert not bad, "\n".join(bad)


def test_the_checks_find_what_they_look_for() -> None:
    """The graph readers on small made-up cases, so a reader that finds nothing cannot pass for a clean
    house."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    src = _C_COMMENT.sub(" ", "/* int hidden(void) { } */\nstatic int quiet(void) { return 1; }\n"
                              "int loud(int x) { return x; }\n#define WIDTH 8\nint counter = 0;\n"
                              "__attribute__((target(\"avx2\"))) void wide(float *x) { }\n"
                              "typedef void (*chunk_fn)(int);\nenum { RED, GREEN = 2 };\n")
    assert _c_top_level_definitions(src, header=True) == {"loud", "WIDTH", "counter", "wide", "chunk_fn", "RED",
                                                          "GREEN"}
    assert "WIDTH" not in _c_top_level_definitions(src)  # a .c file's macro is its own
    imports = python_imports()
    assert "dspark_proxy.round.core" in imports["dspark_proxy.proxy"]
    assert any(t.startswith("dspark_proxy.shm") for t in imports["engine_shim.shim"])
    assert c_uses()  # the C files do use each other's names


# ---------------------------------------------------------------- the CLI over the library

PKG = Path(dspark_proxy.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module name `path` imports, made absolute (relative imports resolved against the package)."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(parts[:-1])
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_library_never_imports_the_cli():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel == "cli.py" or rel.startswith("commands/"):
            continue
        bad = {m for m in _imports(path) if m.split(".")[:2] in (["dspark_proxy", "commands"],
                                                                 ["dspark_proxy", "cli"])}
        if bad:
            offenders.append((rel, sorted(bad)))
    assert not offenders, offenders


def test_worker_server_options_come_from_the_config_schema():
    cfg = WorkerConfig(num_spec=3, window=8, row_bytes=64, max_reqs=5, drafter="integrity", sampled=True,
                       insecure=True, memory_budget_mb=7, device="cpu", head=None, seed=9,
                       fault_delay_ms=1.5, fault_drop_every=4, fault_crash_after=0)
    opts = server_options(cfg)
    assert opts["num_spec"] == 3 and opts["window"] == 8 and opts["row_bytes"] == 64 and opts["max_reqs"] == 5
    assert opts["sampled"] is True and opts["insecure"] is True and opts["seed"] == 9
    assert opts["memory_budget_bytes"] == 7 << 20 and opts["torch_device"] == "cpu"
    assert opts["faults"] == FaultPlan(delay_ms=1.5, drop_every=4)
    assert server_options(WorkerConfig())["memory_budget_bytes"] is None
    assert server_options(WorkerConfig(drafter="torch", head="/h"))["weights"] == "/h"  # --head: the server's weights
    # every keyword the server takes that the schema also names is passed through
    fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    kw = {n for n, p in inspect.signature(WorkerServer.__init__).parameters.items()
          if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert (kw & fields) <= set(opts)


def test_every_fault_plan_field_has_its_config_flag():
    for f in dataclasses.fields(FaultPlan):
        assert "fault_" + f.name in {g.name for g in dataclasses.fields(WorkerConfig)}, f.name
    assert fault_plan(WorkerConfig()) == FaultPlan()


def test_support_size_is_one_constant():
    from dspark_proxy import wire
    from dspark_proxy.shm import layout as shm_layout

    assert shm_layout.SUPPORT_K is wire.TOP_K  # the reply page and the wire carry the same top-k support


def test_drafters_come_from_one_table():
    import typing

    from dspark_proxy.config import Drafter
    from dspark_proxy.worker.drafters import DRAFTER_NAMES, DRAFTERS, IntegrityDrafter, make_drafter

    assert typing.get_args(Drafter) == DRAFTER_NAMES == tuple(DRAFTERS)
    assert isinstance(make_drafter("integrity", num_spec=2, window=4, row_bytes=8), IntegrityDrafter)
    with pytest.raises(ValueError, match="choose one of integrity"):
        make_drafter("nope", num_spec=2, window=4, row_bytes=8)
def test_drafter_modules_never_import_the_drafters_face_or_table():
    # one module per drafter over drafters/base.py; the table (registry.py) and the face import them,
    # never the other way round, so no import circle runs through the drafters (docs/design.md's code map)
    face = "dspark_proxy.worker.drafters"
    offenders = []
    for path in (PKG / "worker" / "drafters").glob("*.py"):
        if path.stem in ("__init__", "registry"):
            continue
        bad = _imports(path) & {face, f"{face}.registry", "dspark_proxy.worker"}
        if bad:
            offenders.append((path.name, sorted(bad)))
    assert not offenders, offenders


def test_the_package_never_loads_files_by_path():
    hits = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py") if "spec_from_file_location" in p.read_text()]
    assert not hits, hits




def test_both_clients_implement_the_draft_client_protocol():
    from dspark_proxy import wire
    from dspark_proxy.link.client import TcpDraftClient
    from dspark_proxy.link.draft_client import DraftClient, StepOutcome
    from dspark_proxy.worker.inproc import InProcessClient

    shape = dict(max_reqs=4, num_spec=2, window=4, row_bytes=8)
    clients = [TcpDraftClient("127.0.0.1", 1, **shape), InProcessClient(**shape)]
    members = [n for n in vars(DraftClient) if not n.startswith("_")]
    assert {"disabled", "counters", "start", "stop", "connection_epoch", "new_session", "step"} <= set(members)
    want = inspect.signature(DraftClient.step).parameters
    for c in clients:
        for n in members:
            assert hasattr(c, n), (type(c).__name__, n)
        got = inspect.signature(type(c).step).parameters
        assert list(got) == list(want), (type(c).__name__, list(got))
        assert all(got[k].kind == want[k].kind for k in want), type(c).__name__
    out = clients[1].step(bytearray(), np.zeros(0, dtype=wire.ENTRY_DTYPE), 0, step_id=1, step_flags=0, epoch=2,
                          rows=[])
    assert isinstance(out, StepOutcome) and out.reason == "reconnected"  # the shared outcome type
