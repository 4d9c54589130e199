"""``python -m dspark_proxy.sim``: run the simulated engine against the in-process OracleShim and print
the result as JSON. A quick look at a workload (rates, chunking, preemption) and at the simulator's own
cost per round, with no proxy or worker involved; exits 1 if any draft was wrong."""

from __future__ import annotations

import argparse
import json
import sys

from .config import SimConfig
from .engine import SimEngine
from .loopback import CORRUPTIONS, OracleShim


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dspark_proxy.sim", description=__doc__)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--realistic", action="store_true", help="realistic shapes (W=128, 71,680-byte rows)")
    p.add_argument("--max-reqs", type=int)
    p.add_argument("--window", type=int)
    p.add_argument("--row-bytes", type=int)
    p.add_argument("--token-budget", type=int)
    p.add_argument("--preempt-prob", type=float)
    p.add_argument("--oracle", choices=("fast", "bytes"))
    p.add_argument("--partial-prob", type=float, default=0.0, help="OracleShim: cut windows short")
    p.add_argument("--fail-prob", type=float, default=0.0, help="OracleShim: fail requests")
    p.add_argument("--corrupt", choices=CORRUPTIONS, help="OracleShim: answer wrongly on purpose")
    a = p.parse_args(argv)
    over = {k: v for k, v in {"seed": a.seed, "max_reqs": a.max_reqs, "window": a.window,
                              "row_bytes": a.row_bytes, "token_budget": a.token_budget,
                              "preempt_prob": a.preempt_prob, "oracle": a.oracle}.items() if v is not None}
    cfg = SimConfig.realistic(**over) if a.realistic else SimConfig(**over)
    shim = OracleShim(max_reqs=cfg.max_reqs, num_spec=cfg.num_spec, window=cfg.window, row_bytes=cfg.row_bytes,
                      partial_prob=a.partial_prob, fail_prob=a.fail_prob, corrupt=a.corrupt, seed=a.seed)
    res = SimEngine(cfg).run(shim, rounds=a.rounds)
    json.dump(res.to_dict(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 1 if res.wrong_drafts else 0


if __name__ == "__main__":
    sys.exit(main())
