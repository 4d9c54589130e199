"""Messages for people: each error a user can make is one line on stderr naming the path,
address or field, with an exit code from exitcodes.py; deprecated names work and say what to use."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dspark_proxy.cli import cli
from dspark_proxy.ops.exitcodes import EXIT_FAILURE, EXIT_STARTUP_FAILURE, EXIT_USAGE

pytestmark = pytest.mark.timeout(60)


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "worker", "--listen", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=50)


def test_torch_drafter_without_a_head_refuses_unless_random_weights():
    r = CliRunner().invoke(cli, ["worker", "--drafter", "torch", "--listen", "127.0.0.1:0"])
    assert r.exit_code == EXIT_USAGE and "--head" in r.output and "--random-weights" in r.output
    assert "DSPARK_PROXY_HEAD" in r.output


def test_a_missing_head_names_its_own_path():
    r = _worker("--drafter", "torch", "--head", "/nonexistent/head")
    assert r.returncode == EXIT_STARTUP_FAILURE
    line = _one_line(r.stderr)
    assert "/nonexistent/head" in line and "/nonexistent/manifest.json" not in line


def test_manifest_missing_fields_names_the_file_and_fields(tmp_path):
    (tmp_path / "manifest.json").write_text('{"target_id": "x", "hidden": 8}')
    r = _worker("--drafter", "torch", "--head", str(tmp_path))
    assert r.returncode == EXIT_STARTUP_FAILURE
    line = _one_line(r.stderr)
    assert str(tmp_path / "manifest.json") in line and "tap_layers" in line and "__init__" not in line


def test_malformed_manifest_json_names_the_file(tmp_path):
    (tmp_path / "manifest.json").write_text('{"target_id": "x",\n')
    r = _worker("--drafter", "torch", "--head", str(tmp_path))
    assert r.returncode == EXIT_STARTUP_FAILURE
    line = _one_line(r.stderr)
    assert str(tmp_path / "manifest.json") in line and "not valid JSON" in line and "line 2" in line


def test_deprecated_weights_works_and_says_so_in_one_line(tmp_path):
    (tmp_path / "manifest.json").write_text("[]")
    r = _worker("--drafter", "torch", "--weights", str(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "dspark-proxy: --weights is deprecated: use --head (same meaning)"
    assert r.returncode == EXIT_STARTUP_FAILURE and str(tmp_path / "manifest.json") in lines[1] and len(lines) == 2
    r = _worker("--drafter", "torch", "--head", str(tmp_path))
    assert "is deprecated: use" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_busy_worker_port_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", "worker", "--listen", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=50)
    assert r.returncode == EXIT_STARTUP_FAILURE and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("dspark-proxy worker:")]  # beside the log
    assert f"127.0.0.1:{port}" in line and "in use" in line


@pytest.mark.parametrize("command", ["start", "worker"])
def test_a_busy_metrics_port_names_the_address(command, seg_name):
    pytest.importorskip("prometheus_client")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        extra = ["--name", seg_name, "--worker", "inproc"] if command == "start" else ["--listen", "127.0.0.1:0"]
        r = subprocess.run([sys.executable, "-m", "dspark_proxy.cli", command, *extra, "--metrics-port", str(port)],
                           capture_output=True, text=True, timeout=50)
    assert r.returncode == EXIT_STARTUP_FAILURE
    line = [ln for ln in r.stderr.splitlines() if ln.startswith(f"dspark-proxy {command}:")]
    assert len(line) == 1 and f"127.0.0.1:{port}" in line[0] and "--metrics-port" in line[0], r.stderr
    assert "Traceback" not in r.stderr


def test_status_json_on_a_missing_proxy_prints_json(seg_name):
    r = CliRunner().invoke(cli, ["status", "--name", seg_name, "--json"])
    assert r.exit_code == EXIT_FAILURE
    got = json.loads(r.stdout)
    assert got["name"] == seg_name and seg_name in got["error"]
    assert _one_line(r.stderr).startswith("dspark-proxy status:")


def test_eval_integer_prompts_is_the_deprecated_count(tmp_path):
    """`eval --prompts 3` (a count) still works, says to use --n-prompts; a head's bad manifest stops it
    before anything loads (so this test needs no model)."""
    (tmp_path / "manifest.json").write_text("{")
    r = CliRunner().invoke(cli, ["eval", "--prompts", "3", "--head", str(tmp_path)])
    assert r.exit_code == EXIT_USAGE
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "dspark-proxy: --prompts 3 (a count) is deprecated: use --n-prompts 3 (same meaning)"
    assert str(tmp_path / "manifest.json") in lines[1] and len(lines) == 2
    r = CliRunner().invoke(cli, ["eval", "--prompts", str(tmp_path / "none.txt")])
    assert r.exit_code == EXIT_USAGE and "none.txt: no such file" in r.output


def test_old_toml_key_weights_is_read_as_head(tmp_path):
    from dspark_proxy.config import WorkerConfig, load_toml

    f = tmp_path / "c.toml"
    f.write_text('[worker]\nweights = "/h"\n')
    assert load_toml(str(f), WorkerConfig) == {"head": "/h"}


def test_an_empty_metrics_host_is_refused_naming_the_flag(seg_name):
    """An empty host would bind every interface without anyone asking for it."""
    for argv in (["start", "--name", seg_name, "--worker", "inproc"], ["worker"]):
        r = CliRunner().invoke(cli, [*argv, "--metrics-host", " ", "--metrics-port", "0"])
        assert r.exit_code == EXIT_USAGE and "--metrics-host" in r.output and "0.0.0.0" in r.output
