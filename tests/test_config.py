"""config.py: one schema, four precedence levels, validation that names the field, the derived sizes."""

from __future__ import annotations

import dataclasses
import json
import os

import click
import pytest
from click.testing import CliRunner

from dspark_proxy.config import (
    ConfigError,
    LayoutConfig,
    ProxyConfig,
    WorkerConfig,
    config_to_dict,
    derive_sizes,
    env_var,
    format_settings,
    parse_hostport,
)
from dspark_proxy.config_flags import build_config, click_options

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ambient DSPARK_PROXY_* variables must not leak into the precedence tests."""
    for k in list(os.environ):
        if k.startswith("DSPARK_PROXY_"):
            monkeypatch.delenv(k)


def _command(cls):
    """A tiny command that prints the built config and its sources as JSON."""

    @click.command()
    @click_options(cls)
    def cmd(**_kw):
        cfg, sources = build_config(cls, click.get_current_context())
        click.echo(json.dumps({"cfg": config_to_dict(cfg), "sources": sources}))

    return cmd


def _run(cls, args=(), env=None):
    r = CliRunner().invoke(_command(cls), list(args), env=env or {})
    return r


def _ok(cls, args=(), env=None):
    r = _run(cls, args, env)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# ------------------------------------------------------------------------------------------ derivation


@pytest.mark.parametrize(
    "m,n,w,row_bytes,budget_mb,expected",
    [
        (64, 5, 16, 256, 256, (1024, 64)),  # defaults: capped by M*W and by M
        (256, 5, 128, 71680, 256, (3744, 29)),  # realistic rows: the budget decides both
        (64, 5, 128, 71680, 1, (384, 4)),  # tiny budget: floor of one decode round, and of 4 windows
        (2, 5, 128, 71680, 1, (14, 2)),  # budget above one decode round; fewer slots than the 4-window floor
        (4, 5, 2, 8, 256, (8, 4)),  # M*W below M*(N+1): M*W wins
    ],
)
def test_derive_sizes_formula(m, n, w, row_bytes, budget_mb, expected):
    assert derive_sizes(m, n, w, row_bytes, budget_mb) == expected


def test_resolved_fills_only_unset_sizes():
    cfg = ProxyConfig(max_reqs=256, window=128, row_bytes=71680)
    assert (cfg.max_rows, cfg.resync_per_round) == (None, None)
    r = cfg.resolved()
    assert (r.max_rows, r.resync_per_round) == (3744, 29)
    assert cfg.max_rows is None  # a copy, the original is untouched
    r2 = ProxyConfig(max_reqs=256, window=128, row_bytes=71680, max_rows=1000).resolved()
    assert (r2.max_rows, r2.resync_per_round) == (1000, 29)


def test_build_config_returns_resolved_proxy_config():
    cfg, sources = build_config(ProxyConfig, {"max_reqs": 8})
    assert cfg.max_rows == derive_sizes(8, 5, 16, 256, 256)[0]
    assert sources["max_reqs"] == "cli" and sources["max_rows"] == "default"


# ------------------------------------------------------------------------------------------ precedence


def test_defaults_only():
    out = _ok(ProxyConfig)
    assert out["cfg"]["max_reqs"] == 64 and out["cfg"]["deadline_ms"] == 5.0
    assert out["cfg"]["n_out_table"] == [] and out["cfg"]["sampled"] is False
    assert set(out["sources"].values()) == {"default"}


def test_env_sets_values(tmp_path):
    out = _ok(ProxyConfig, env={"DSPARK_PROXY_MAX_REQS": "8", "DSPARK_PROXY_SAMPLED": "1",
                                "DSPARK_PROXY_N_OUT_TABLE": "5,4,3", "DSPARK_PROXY_LOG_LEVEL": "debug"})
    assert out["cfg"]["max_reqs"] == 8 and out["cfg"]["sampled"] is True
    assert out["cfg"]["n_out_table"] == [5, 4, 3] and out["cfg"]["log_level"] == "DEBUG"
    for k in ("max_reqs", "sampled", "n_out_table", "log_level"):
        assert out["sources"][k] == "env"
    assert out["sources"]["window"] == "default"


def test_file_sets_values_top_level_and_section(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('window = 32\nrow_bytes = 512\nlisten = "127.0.0.1:9"\n'
                 '[proxy]\nrow_bytes = 1024\nn_out_table = [5, 3]\nsampled = true\n'
                 '[worker]\nwindow = 999\n')
    out = _ok(ProxyConfig, ["--config", str(f)])
    # top-level shared key; [proxy] overrides a top-level key; [worker] and `listen` are not the proxy's
    assert out["cfg"]["window"] == 32 and out["cfg"]["row_bytes"] == 1024
    assert out["cfg"]["n_out_table"] == [5, 3] and out["cfg"]["sampled"] is True
    assert out["sources"]["window"] == "file" and out["sources"]["row_bytes"] == "file"
    assert out["sources"]["max_reqs"] == "default"
    w = _ok(WorkerConfig, ["--config", str(f)])
    assert w["cfg"]["window"] == 999 and w["cfg"]["row_bytes"] == 512 and w["cfg"]["listen"] == "127.0.0.1:9"


def test_config_file_from_env_var(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("num_spec = 7\n")
    out = _ok(ProxyConfig, env={"DSPARK_PROXY_CONFIG": str(f)})
    assert out["cfg"]["num_spec"] == 7 and out["sources"]["num_spec"] == "file"


def test_env_overrides_file_and_flag_overrides_env(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[proxy]\nmax_reqs = 16\nwindow = 32\nnum_spec = 3\ndeadline_ms = 2\n")
    env = {"DSPARK_PROXY_MAX_REQS": "24", "DSPARK_PROXY_WINDOW": "48"}
    out = _ok(ProxyConfig, ["--config", str(f), "--window", "64"], env)
    cfg, src = out["cfg"], out["sources"]
    assert (cfg["max_reqs"], src["max_reqs"]) == (24, "env")  # env > file
    assert (cfg["window"], src["window"]) == (64, "cli")  # flag > env > file
    assert (cfg["num_spec"], src["num_spec"]) == (3, "file")  # file > default
    assert (cfg["deadline_ms"], src["deadline_ms"]) == (2.0, "file")  # TOML int widened to float
    assert (cfg["row_bytes"], src["row_bytes"]) == (256, "default")


def test_bool_flag_overrides_its_env_var():
    out = _ok(ProxyConfig, ["--no-sampled"], {"DSPARK_PROXY_SAMPLED": "true"})
    assert out["cfg"]["sampled"] is False and out["sources"]["sampled"] == "cli"
    out = _ok(ProxyConfig, ["--want-margin"], {"DSPARK_PROXY_WANT_MARGIN": "0"})
    assert out["cfg"]["want_margin"] is True and out["sources"]["want_margin"] == "cli"


def test_worker_command_choices_and_flags():
    out = _ok(WorkerConfig, ["--drafter", "torch", "--random-weights", "--fault-crash-after", "3", "--listen", "[::1]:0"])
    assert out["cfg"]["drafter"] == "torch" and out["cfg"]["fault_crash_after"] == 3
    r = _run(WorkerConfig, ["--drafter", "nope"])
    assert r.exit_code == 2 and "--drafter" in r.output


def test_every_field_has_an_option_and_help():
    for cls in (ProxyConfig, WorkerConfig):
        r = CliRunner().invoke(_command(cls), ["--help"], terminal_width=200)
        assert r.exit_code == 0
        for f in dataclasses.fields(cls):
            assert f.metadata["help"]
            assert "--" + f.name.replace("_", "-") in r.output
            assert (env_var(f.name) in r.output) != bool(f.metadata.get("flag_only"))


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-reqs", "0"], "max_reqs=0 is out of range: must be in [1, 65536]"),
        (["--num-spec", "256"], "num_spec=256 is out of range: must be in [1, 255]"),
        (["--deadline-ms", "0"], "deadline_ms=0.0 is out of range: must be in (0, 60000]"),
        (["--worker", "nohost"], "worker: expected HOST:PORT"),
        (["--worker", "h:70000"], "port 70000"),
        (["--worker", "h:0"], "must be in [1, 65535]"),
        (["--num-spec", "3", "--n-out-table", "4,2"], "n_out_table=[4, 2]: entries must be in [0, num_spec=3]"),
        (["--max-reqs", "2", "--window", "4", "--max-rows", "9"], "max_rows=9 is out of range: must be in [1, max_reqs*window=8]"),
        (["--resync-per-round", "65"], "resync_per_round=65"),
        (["--breaker-threshold", "0"], "breaker_threshold=0"),
        (["--name", "a/b"], "segment name"),
    ],
)
def test_bad_cli_values_are_usage_errors_naming_the_field(args, needle):
    r = _run(ProxyConfig, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "value from the command line" in r.output


def test_bad_env_value_names_the_env_var():
    r = _run(ProxyConfig, env={"DSPARK_PROXY_WINDOW": "-1"})
    assert r.exit_code == 2
    assert "window=-1 is out of range" in r.output and "environment variable DSPARK_PROXY_WINDOW" in r.output
    r = _run(ProxyConfig, env={"DSPARK_PROXY_WINDOW": "abc"})
    assert r.exit_code == 2 and "DSPARK_PROXY_WINDOW" in r.output and "not a valid integer" in r.output


def test_bad_file_values_name_the_file_and_key(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[proxy]\nwindow = 0\n")
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "window=0 is out of range" in r.output and str(f) in r.output
    f.write_text('[proxy]\nwindow = "big"\n')
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "key 'window'" in r.output
    f.write_text("windw = 3\n")
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "unknown key 'windw'" in r.output
    f.write_text("[proxy]\nlisten = '127.0.0.1:1'\n")  # a worker key in the proxy's table
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "unknown key 'listen' in [proxy]" in r.output
    f.write_text("window = = 3\n")
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "not valid TOML" in r.output
    r = _run(ProxyConfig, ["--config", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "cannot read it" in r.output


def test_worker_refuses_open_listen_without_token():
    with pytest.raises(ConfigError, match="not a loopback address") as e:
        WorkerConfig(listen="0.0.0.0:7470")
    assert e.value.field == "listen"
    assert WorkerConfig(listen="0.0.0.0:7470", insecure=True).insecure
    assert WorkerConfig(listen="0.0.0.0:7470", token_file="/t").token_file == "/t"
    assert WorkerConfig(listen="localhost:7470").listen == "localhost:7470"


def test_programmatic_construction_is_validated_and_frozen():
    with pytest.raises(ConfigError, match="num_spec") as e:
        ProxyConfig(num_spec=0)
    assert e.value.field == "num_spec"
    with pytest.raises(ConfigError, match="expected an integer"):
        ProxyConfig(max_reqs="8")
    with pytest.raises(ConfigError, match="expected an integer"):
        ProxyConfig(max_reqs=True)
    with pytest.raises(ConfigError, match="one of DEBUG"):
        ProxyConfig(log_level="LOUD")
    with pytest.raises(ConfigError, match="finite"):
        ProxyConfig(deadline_ms=float("nan"))
    cfg = ProxyConfig(n_out_table=[5, 4])
    assert cfg.n_out_table == (5, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_reqs = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="deadline_ms"):
        dataclasses.replace(cfg, deadline_ms=-1.0)
    with pytest.raises(ConfigError, match="unknown settings"):
        build_config(ProxyConfig, {"max_reqz": 1})


def test_layout_is_shared():
    p = ProxyConfig(max_reqs=8, window=32, sampled=True)
    w = WorkerConfig(max_reqs=8, window=32, sampled=True)
    assert p.layout() == w.layout() == LayoutConfig(max_reqs=8, window=32, sampled=True)
    assert p.layout() != ProxyConfig().layout()


# ------------------------------------------------------------------------------------------ helpers


@pytest.mark.parametrize(
    "value,expected",
    [("127.0.0.1:7470", ("127.0.0.1", 7470)), ("localhost:1", ("localhost", 1)), ("[::1]:80", ("::1", 80)),
     ("host.example:65535", ("host.example", 65535))],
)
def test_parse_hostport_good(value, expected):
    assert parse_hostport(value) == expected


@pytest.mark.parametrize("value", ["", "host", ":80", "host:", "host:x", "::1:80", "[::1]80", "h:-1", "h:65536"])
def test_parse_hostport_bad(value):
    with pytest.raises(ConfigError, match="listen"):
        parse_hostport(value, field="listen")


def test_parse_hostport_port_zero_only_when_allowed():
    assert parse_hostport("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)
    with pytest.raises(ConfigError):
        parse_hostport("127.0.0.1:0")


def test_format_settings_marks_non_default_sources():
    cfg, src = build_config(WorkerConfig, {"window": 8})
    line = format_settings(cfg, src)
    assert "window=8(cli)" in line and "num_spec=5 " in line and "\n" not in line


def test_fault_hooks_are_flag_only(tmp_path):
    """--fault-round-hang-ms takes effect from the command line only: no env var, no config file."""
    r = _run(ProxyConfig, env={env_var("fault_round_hang_ms"): "500"})
    assert r.exit_code == 0 and json.loads(r.output)["cfg"]["fault_round_hang_ms"] == 0.0, r.output
    r = _run(ProxyConfig, ["--fault-round-hang-ms", "250"])
    assert r.exit_code == 0 and json.loads(r.output)["cfg"]["fault_round_hang_ms"] == 250.0, r.output
    f = tmp_path / "c.toml"
    f.write_text("[proxy]\nfault_round_hang_ms = 500\n")
    r = _run(ProxyConfig, ["--config", str(f)])
    assert r.exit_code == 2 and "command line only" in r.output, r.output
