"""`start` and `worker` take their shapes from the drafter's manifest (`--shapes-from HEAD_DIR`), so a
user types them once: flags and env vars still override it, a bad path is a usage error naming it."""

from __future__ import annotations

import json

import click
from click.testing import CliRunner

from dspark_proxy.config import ProxyConfig, WorkerConfig
from dspark_proxy.config_flags import build_config, click_options, shapes_from

HEAD = "models/stdlib-llama-head"


def _cmd(cls):
    @click.command()
    @click_options(cls)
    @click.pass_context
    def cmd(ctx: click.Context, **_: object) -> None:
        cfg, src = build_config(cls, ctx)
        click.echo(json.dumps({"num_spec": cfg.num_spec, "window": cfg.window, "row_bytes": cfg.row_bytes,
                               "max_reqs": cfg.max_reqs, "src": src["window"]}))

    return cmd


def _run(cls, *args: str, env: dict | None = None):
    return CliRunner().invoke(_cmd(cls), list(args), env=env or {}, catch_exceptions=False)


def test_both_commands_read_the_manifest():
    want = json.load(open(f"{HEAD}/manifest.json"))
    for cls, flag in ((ProxyConfig, "--head"), (WorkerConfig, "--shapes-from")):
        r = _run(cls, flag, HEAD, "--max-reqs", "8")
        assert r.exit_code == 0, r.output
        got = json.loads(r.output)
        assert (got["num_spec"], got["window"], got["row_bytes"]) == (want["num_spec"], want["window"],
                                                                      want["row_bytes"])
        assert got["max_reqs"] == 8 and got["src"] == "head"  # labelled as the head's, not a file's
    assert shapes_from(f"{HEAD}/manifest.json") == shapes_from(HEAD)


def test_flags_and_env_override_it_and_it_overrides_the_file(tmp_path):
    r = _run(WorkerConfig, "--shapes-from", HEAD, "--window", "8")
    assert json.loads(r.output)["window"] == 8
    r = _run(WorkerConfig, "--shapes-from", HEAD, env={"DSPARK_PROXY_WINDOW": "4"})
    assert json.loads(r.output)["window"] == 4
    toml = tmp_path / "c.toml"
    toml.write_text("window = 32\nnum_spec = 2\n")
    for order in (("--config", str(toml), "--shapes-from", HEAD), ("--shapes-from", HEAD, "--config", str(toml))):
        got = json.loads(_run(WorkerConfig, *order).output)
        assert got["window"] == 16 and got["num_spec"] == 5, order


def test_a_path_without_a_manifest_is_a_usage_error_naming_it(tmp_path):
    r = CliRunner().invoke(_cmd(ProxyConfig), ["--head", str(tmp_path)])
    assert r.exit_code == 2 and "--head" in r.output and "manifest.json" in r.output
    bad = tmp_path / "manifest.json"
    bad.write_text("{}")
    r = CliRunner().invoke(_cmd(ProxyConfig), ["--head", str(bad)])
    assert r.exit_code == 2 and "--head" in r.output and "fields missing" in r.output


def test_start_shapes_from_is_the_deprecated_head_and_the_env_var_is_the_engines():
    want = json.load(open(f"{HEAD}/manifest.json"))
    r = CliRunner().invoke(_cmd(ProxyConfig), ["--shapes-from", HEAD], env={}, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == "dspark-proxy: --shapes-from is deprecated: use --head (same meaning)"
    assert json.loads(r.stdout)["window"] == want["window"]
    r = CliRunner().invoke(_cmd(ProxyConfig), [], env={"DSPARK_PROXY_HEAD": HEAD}, catch_exceptions=False)
    assert json.loads(r.stdout)["window"] == want["window"] and not r.stderr
    r = CliRunner().invoke(_cmd(ProxyConfig), [], env={"DSPARK_PROXY_SHAPES_FROM": HEAD}, catch_exceptions=False)
    assert "DSPARK_PROXY_SHAPES_FROM" in r.stderr and json.loads(r.stdout)["window"] == want["window"]


def test_a_dspark_checkpoint_gives_the_shapes(tmp_path):
    """--head a speculators DSpark checkpoint that train-drafter --arch dspark wrote: N from block_size
    (sample_from_anchor), W from its layers' sliding_window, the row from its tapped layers x
    target_hidden_size x bfloat16; a config missing a field is one line naming the file and the field."""
    import pytest

    pytest.importorskip("speculators")
    from transformers import AutoConfig

    from dspark_proxy.config import ConfigError
    from dspark_proxy.model.dspark_head import build_dspark
    from dspark_proxy.model.head_shapes import load_head_shapes

    cfg = AutoConfig.from_pretrained("models/stdlib-llama", local_files_only=True)
    ck = tmp_path / "ck"
    build_dspark(cfg, verifier_path="models/stdlib-llama", layers=[1, 2, 4], num_spec=4, window=12).save_pretrained(str(ck))
    assert shapes_from(str(ck)) == {"num_spec": 4, "window": 12, "row_bytes": 3 * 192 * 2}
    s = load_head_shapes(ck)
    assert (s.tap_layers, s.num_spec, s.window, s.row_bytes) == ([1, 2, 4], 4, 12, 3 * 192 * 2)
    r = _run(ProxyConfig, "--head", str(ck))  # start --head
    assert r.exit_code == 0 and json.loads(r.output)["window"] == 12, r.output
    raw = json.loads((ck / "config.json").read_text())
    del raw["aux_hidden_state_layer_ids"]
    (ck / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        shapes_from(str(ck))
    assert "config.json" in str(e.value) and "aux_hidden_state_layer_ids" in str(e.value) and "\n" not in str(e.value)
