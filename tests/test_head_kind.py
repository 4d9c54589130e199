"""Every place that starts a worker for a head picks the drafter from the head directory's kind
(model/head_shapes.worker_head_args): our manifest head -> torch, a speculators DSpark checkpoint ->
dspark with its row dtype and the engine's target."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dspark_proxy.model.head_shapes import head_drafter, load_head_shapes, worker_head_args

CARRY, DSPARK = "models/stdlib-llama-head", "models/stdlib-llama-dspark"


def test_a_manifest_head_is_served_by_the_torch_drafter() -> None:
    assert head_drafter(load_head_shapes(CARRY)) == "torch"
    assert worker_head_args(CARRY, "models/stdlib-llama") == ["--drafter", "torch", "--head", CARRY]


def test_a_dspark_checkpoint_is_served_by_the_dspark_drafter(tmp_path) -> None:
    assert head_drafter(load_head_shapes(DSPARK)) == "dspark"
    assert worker_head_args(DSPARK, "models/stdlib-llama") == [
        "--drafter", "dspark", "--head", DSPARK, "--row-dtype", "bfloat16", "--target", "models/stdlib-llama"]
    assert worker_head_args(DSPARK) == ["--drafter", "dspark", "--head", DSPARK, "--row-dtype", "bfloat16"]
    # its config.json named directly: the directory is what the worker is given
    assert worker_head_args(f"{DSPARK}/config.json")[3] == DSPARK
    # a DSpark config.json without a required field: one ValueError naming the file and the field
    bad = tmp_path / "bad"
    shutil.copytree(DSPARK, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["block_size"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="block_size"):
        worker_head_args(bad)


def test_worker_head_args_start_a_worker_of_that_drafter() -> None:
    """The flags as the worker parses them: its config takes each drafter's shapes from the head."""
    from dspark_proxy.ops.launch import spawn_worker

    for head, n in ((CARRY, "torch"), (DSPARK, "dspark")):
        w = spawn_worker(*worker_head_args(head, "models/stdlib-llama"), "--max-reqs", "2", timeout_s=120.0)
        try:
            assert w.address
        finally:
            w.stop()
        assert head_drafter(load_head_shapes(head)) == n


def test_demo_head_needs_the_vllm_engine() -> None:
    from dspark_proxy.cli import cli

    res = CliRunner().invoke(cli, ["demo", "--head", CARRY, "--rounds", "1"])
    assert res.exit_code == 2 and "--head: only with --engine vllm" in res.output
