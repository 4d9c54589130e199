"""Drafts accepted per drafting step for sampled requests through vLLM (docs/vllm.md, "Sampled requests").

    PYTHONPATH=. python scripts/vllm_sampled.py [--temperatures 0.7,1.0] [--tokens 64] [--drafts greedy,q,ngram]

One vLLM per arm (the shipped target and head, the demo's prompts in one batch): `greedy` (a proxy and
worker without --sampled), `q` (both with --sampled, DSPARK_PROXY_SAMPLED=1), `ngram` (vLLM's own).
The proxy's acceptance gate is off and its deadline 200 ms, so every step drafts on a busy machine.
Prints one JSON object: per arm and temperature, vLLM's accepted per drafting step and the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dspark_proxy.integrations.vllm_demo import (
    DEFAULT_HEAD,
    DEFAULT_MODEL,
    PROMPTS,
    run_arm_process,
    shapes_args,
    vllm_threads_env,
)
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker


def _arm(kind: str, temps: list[float], tokens: int) -> dict:
    layout = shapes_args(DEFAULT_HEAD, 8)
    name = f"vllm-sampled-{os.getpid()}-{kind}"
    spec = {"model": os.fspath(DEFAULT_MODEL), "arm": "ngram" if kind == "ngram" else "dspark",
            "num_spec": int(layout[3]), "prompts": PROMPTS, "max_tokens": 4,
            "sampled": {"temperatures": temps, "max_tokens": tokens},
            "env": {"DSPARK_PROXY": name, "DSPARK_PROXY_HEAD": os.fspath(DEFAULT_HEAD),
                    "DSPARK_PROXY_SAMPLED": "1" if kind == "q" else "0", **vllm_threads_env()}}
    if kind == "ngram":
        return run_arm_process(spec)["sampled"]
    extra = ["--sampled"] if kind == "q" else []
    worker = spawn_worker(*layout, "--drafter", "torch", "--head", os.fspath(DEFAULT_HEAD), *extra)
    try:
        proxy = spawn_proxy(name, worker.address, *layout, *extra, "--deadline-ms", "200", "--accept-break-even", "0",
                            "--log-every", "0")
        try:
            return run_arm_process(spec)["sampled"]
        finally:
            proxy.stop()
    finally:
        worker.stop()
        for p in os.listdir("/dev/shm"):  # vLLM ends without the shim's close: its ring stays
            if name in p:
                os.unlink(os.path.join("/dev/shm", p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--drafts", default="greedy,q")
    a = ap.parse_args(argv)
    temps = [float(t) for t in a.temperatures.split(",")]
    out = {k: _arm(k, temps, a.tokens) for k in a.drafts.split(",")}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
