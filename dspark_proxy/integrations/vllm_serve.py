"""vLLM's OpenAI-compatible server (`vllm serve`) with or without the proxy's proposer, as a child process:
the command line a user types (docs/serving.md), started and stopped for sure, for the end-to-end test
and benchmarks.

    srv = spawn_server(model, port=0, head=HEAD, name="dspark")   # drafting through the proxy "dspark"
    srv = spawn_server(model, port=0)                              # no speculation, same settings
    ...  # the OpenAI API at srv.base_url
    srv.stop()                                                     # SIGTERM, then SIGKILL of its group

The server runs in a process group of its own (vLLM's front end starts an engine-core process), so
stop() reaches every process it started even when the front end dies first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PROPOSER", "CPU_SETTINGS", "serve_args", "serve_env", "spawn_server", "Server", "free_port"]

PROPOSER = "engine_shim.vllm_proposer.DSparkProposer"
# vLLM's CPU build on a small machine (docs/serving.md, "This CPU build"): no graph capture, a short
# context, float32 (the shipped target's dtype), a fixed seed
CPU_SETTINGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_args(model: str | os.PathLike, *, port: int, num_spec: int = 0, max_num_seqs: int = 8,
               extra: tuple[str, ...] = CPU_SETTINGS) -> list[str]:
    """`vllm serve` arguments: with the proposer when num_spec > 0 (= the head's num_spec)."""
    args = ["serve", os.fspath(model), "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(max_num_seqs), *extra]
    if num_spec > 0:
        args += ["--speculative-config", json.dumps({"method": "custom_class", "model": PROPOSER,
                                                     "num_speculative_tokens": num_spec})]
    return args


def serve_env(*, head: str | os.PathLike | None = None, name: str | None = None,
              threads: int = 1) -> dict[str, str]:
    """The server's environment: vLLM's CPU KV cache of 1 GiB, its forward on `threads` OpenMP threads
    (leave the proxy a core: docs/vllm.md, "CPU placement"), and the proposer's segment and head."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    if head is not None:
        env["DSPARK_PROXY_HEAD"] = os.fspath(head)
    if name is not None:
        env["DSPARK_PROXY"] = name
    return env


@dataclass
class Server:
    """A running `vllm serve`; its log goes to `log_path`."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def group_pids(self) -> list[int]:
        """Every live process of the server's process group (front end, engine core, helpers)."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    st = f.read()
                fields = st[st.rindex(b")") + 2:].split()
                if int(fields[2]) == self.proc.pid and fields[0] != b"Z":
                    out.append(int(d))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def wait_ready(self, timeout_s: float) -> None:
        """Until /health answers 200; RuntimeError with the log's tail if the server died or took too long."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.port}/health"
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def terminate(self) -> None:
        """SIGTERM to the front end only, as a service manager sends it."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, a wait, then SIGKILL of the whole group. Idempotent."""
        self.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5.0
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        return self.proc.returncode


def spawn_server(model: str | os.PathLike, *, log_path: str | os.PathLike, port: int = 0,
                 head: str | os.PathLike | None = None, name: str | None = None, num_spec: int = 0,
                 max_num_seqs: int = 8, cpus: list[int] | None = None, env: dict[str, Any] | None = None,
                 ready_timeout_s: float = 300.0) -> Server:
    """Start `vllm serve` (through vLLM's CLI module, what the `vllm` script runs) and wait until it
    answers; the proposer is on when `head` is given (num_spec from its manifest unless given)."""
    if head is not None and num_spec <= 0:
        from ..model.head_shapes import load_head_shapes  # a manifest head or a DSpark checkpoint

        num_spec = load_head_shapes(os.fspath(head)).num_spec
    port = port or free_port()
    args = serve_args(model, port=port, num_spec=num_spec if head is not None else 0, max_num_seqs=max_num_seqs)
    e = serve_env(head=head, name=name)
    e.update({k: str(v) for k, v in (env or {}).items()})
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", *args]
    if cpus:
        cmd = ["taskset", "-c", ",".join(str(c) for c in cpus), *cmd]
    logf = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed below once handed over
    try:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e,
                                start_new_session=True)
    finally:
        logf.close()
    srv = Server(proc, port, Path(log_path), args)
    try:
        srv.wait_ready(ready_timeout_s)
    except BaseException:
        srv.stop(5.0)
        raise
    return srv
