"""The package's layering: the CLI is a thin adapter over the library, and options are derived, not copied."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

import dspark_proxy
from dspark_proxy.config import WorkerConfig
from dspark_proxy.worker import FaultPlan, WorkerServer
from dspark_proxy.worker.run import fault_plan, server_options

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
