"""The dspark drafter's start and terms: a bad checkpoint or target refused in one line naming the file
and the field, HELLO's tap_layers and row_dtype checked, per-slot state charged to the memory budget."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dspark_proxy import wire
from dspark_proxy.commands.worker import worker
from dspark_proxy.ops.exitcodes import EXIT_STARTUP_FAILURE
from dspark_proxy.worker.server import WorkerServer
from dspark_proxy.worker.session import SLOT_OVERHEAD
from dspark_proxy.worker.testing import RawPeer, make_entries

from . import dspark_ref as R

RB = len(R.TAPS) * R.HIDDEN * 4


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("dspark")
    target = R.make_target(d / "target")
    R.make_head(d / "head", target)
    return d / "head", target


def _copy(tmp_path, head, target):
    import shutil

    h, t = tmp_path / "head", tmp_path / "target"
    shutil.copytree(head, h)
    shutil.copytree(target, t)
    return h, t


def _edit_json(path, **change):
    cfg = json.loads(path.read_text())
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _edit_tensors(path, drop=(), reshape=None):
    t = load_file(str(path))
    for k in drop:
        t.pop(k)
    if reshape:
        t[reshape] = torch.zeros(3, 3)
    save_file(t, str(path))


BAD = {
    "another-type": (lambda h, t: _edit_json(h / "config.json", speculators_model_type="eagle3"),
                     ["config.json", "speculators_model_type", "eagle3"]),
    "missing-field": (lambda h, t: _edit_json(h / "config.json", mask_token_id=None),
                      ["config.json", "mask_token_id", "missing"]),
    "mask-outside-vocab": (lambda h, t: _edit_json(h / "config.json", mask_token_id=256),
                           ["config.json", "mask_token_id", "256", "vocab_size 256"]),
    "missing-tensor": (lambda h, t: _edit_tensors(h / "model.safetensors", drop=["fc.weight"]),
                       ["model.safetensors", "fc.weight", "missing"]),
    "misshapen-tensor": (lambda h, t: _edit_tensors(h / "model.safetensors", reshape="layers.1.mlp.up_proj.weight"),
                         ["model.safetensors", "layers.1.mlp.up_proj.weight", "[3, 3]"]),
    "target-hidden": (lambda h, t: _edit_json(t / "config.json", hidden_size=48),
                      ["target/config.json", "hidden_size", "48", "32"]),
    "target-vocab": (lambda h, t: _edit_json(t / "config.json", vocab_size=300),
                     ["target/config.json", "vocab_size", "300", "256"]),
    "layers-outside": (lambda h, t: _edit_json(h / "config.json", aux_hidden_state_layer_ids=[1, 2, 9]),
                       ["config.json", "aux_hidden_state_layer_ids", "[9]"]),
    "no-target": (lambda h, t: _edit_json(t / "config.json", vocab_size=None) or (t / "config.json").unlink(),
                  ["--target", "config.json"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_or_target_refused_in_one_line(tmp_path, made, case):
    head, target = _copy(tmp_path, *made)
    spoil, words = BAD[case]
    spoil(head, target)
    r = CliRunner().invoke(worker, ["--drafter", "dspark", "--head", str(head), "--target", str(target),
                                    "--row-dtype", "float32", "--device", "cpu", "--listen", "127.0.0.1:0"])
    err = r.stderr if hasattr(r, "stderr") else r.output
    lines = [ln for ln in err.splitlines() if ln.startswith("dspark-proxy worker:")]
    assert r.exit_code == EXIT_STARTUP_FAILURE, r.output
    assert len(lines) == 1 and "Traceback" not in r.output and "listening" not in r.output, r.output
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_full_attention_checkpoint_needs_a_window(tmp_path, made):
    head, target = _copy(tmp_path, *made)
    cfg = json.loads((head / "config.json").read_text())
    cfg["transformer_layer_config"]["layer_types"] = ["full_attention"] * 2
    (head / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(worker, ["--drafter", "dspark", "--head", str(head), "--target", str(target),
                                    "--row-dtype", "float32", "--device", "cpu"])
    assert r.exit_code == EXIT_STARTUP_FAILURE and "window" in r.output and "--window" in r.output


def _server(made, **kw):
    head, target = made
    srv = WorkerServer("127.0.0.1", 0, num_spec=4, window=6, row_bytes=RB, max_reqs=4, drafter="dspark",
                       weights=str(head), target=str(target), row_dtype="float32", torch_device="cpu", **kw)
    return srv


@pytest.mark.parametrize("field,value,shown", [("tap_layers", (1, 2, 3), "client [1, 2, 3], worker [1, 2, 4]"),
                                               ("row_dtype", "bfloat16", "client bfloat16, worker float32")])
def test_hello_row_layout_mismatch_refused_naming_both(made, field, value, shown):
    srv = _server(made)
    srv.start()
    peer = RawPeer(srv.port, wire.WireLayout(4, 6, RB, 4))
    try:
        msg = peer.handshake(**{field: value})
        assert isinstance(msg, wire.ErrorMsg) and msg.field == field and shown in msg.message, msg
    finally:
        peer.close()
        srv.stop()


def test_hello_without_the_row_layout_is_served(made):
    srv = _server(made)
    srv.start()
    peer = RawPeer(srv.port, wire.WireLayout(4, 6, RB, 4))
    try:
        assert isinstance(peer.handshake(), wire.Welcome)
        e = make_entries([dict(slot=0, first_pos=0, n_rows=2, generation=1, flags=3, anchor_token=5)])
        r = peer.step(e, torch.randn(2, RB // 4).numpy().view("uint8"), 1)
        assert r.status[0] == wire.RS_PARTIAL_WINDOW and (r.draft_ids[0] >= 0).all()
    finally:
        peer.close()
        srv.stop()


def test_shapes_other_than_the_checkpoints_refused(made):
    srv = _server(made)
    srv.start()
    peer = RawPeer(srv.port, wire.WireLayout(3, 6, RB, 4))
    try:
        msg = peer.handshake()
        assert isinstance(msg, wire.ErrorMsg) and msg.field == "num_spec" and "client 3, worker 4" in msg.message
    finally:
        peer.close()
        srv.stop()


def test_per_slot_keys_and_values_are_charged_to_the_memory_budget(made):
    srv = _server(made)
    srv.start()
    try:
        kv = 2 * 2 * 2 * 8 * 4  # layers x (k, v) x kv heads x head_dim x float32
        assert srv.drafter.slot_bytes(6, RB) == 6 * (RB + kv)
        assert srv.sessions.session_bytes(4) == 4 * (6 * (RB + kv) + SLOT_OVERHEAD)
    finally:
        srv.stop()
    small = _server(made, memory_budget_bytes=4 * (6 * RB + SLOT_OVERHEAD))  # rows fit, their keys and values not
    with pytest.raises(ValueError, match="memory-budget-mb"):
        small.start()
    small.stop()


def test_shapes_from_a_dspark_checkpoint(made):
    from dspark_proxy.config_flags import shapes_from

    head, _ = made
    assert shapes_from(str(head)) == {"num_spec": 4, "window": 6, "row_bytes": len(R.TAPS) * R.HIDDEN * 2}


def test_the_worker_command_takes_its_shapes_from_the_checkpoint(made):
    """`worker --drafter dspark --head DIR` with no shape flags serves the checkpoint's N, W and rows."""
    from dspark_proxy.ops.launch import spawn_worker

    head, target = made
    w = spawn_worker("--drafter", "dspark", "--head", str(head), "--target", str(target), "--row-dtype", "float32",
                     "--device", "cpu", "--max-reqs", "2", timeout_s=60.0)
    try:
        peer = RawPeer(int(w.address.rsplit(":", 1)[1]), wire.WireLayout(4, 6, RB, 2))
        try:
            msg = peer.handshake(tap_layers=tuple(R.TAPS), row_dtype="float32")
            assert isinstance(msg, wire.Welcome) and (msg.num_spec, msg.window, msg.row_bytes) == (4, 6, RB)
            assert msg.drafter.startswith("dspark") and msg.vocab_size == R.VOCAB
        finally:
            peer.close()
    finally:
        w.stop()
