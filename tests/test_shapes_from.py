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
