"""The simulated engine's settings: the workload (arrivals, lengths, budget, preemption, acceptance) and
the layout it must agree with the shim on (max_reqs, num_spec, window, row_bytes)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["SimConfig"]

_ORACLES = ("fast", "bytes")
_WORK = ("sleep", "busy")


@dataclass(frozen=True)
class SimConfig:
    """One simulated workload. Defaults are small (test-sized rows); `realistic()` gives the realistic shapes of docs/deploy.md."""

    seed: int = 0
    """Seeds arrivals, lengths, scheduling choices and acceptance (rows and tokens do not depend on it)."""
    max_reqs: int = 64
    """Slots (request-state indices) and so the largest batch; must equal the shim's max_reqs."""
    num_spec: int = 5
    """N, draft positions per request; must equal the shim's num_spec."""
    window: int = 16
    """W, rows the drafter looks back; must equal the shim's window."""
    row_bytes: int = 64
    """Bytes of one hidden-state row; must equal the shim's row_bytes."""
    vocab_size: int = 152064
    """Tokens are drawn from [0, vocab_size)."""
    arrivals_per_round: float = 4.0
    """Mean new requests per engine step (Poisson)."""
    prompt_len: tuple[int, int] = (8, 256)
    """Inclusive range of prompt lengths (uniform)."""
    output_len: tuple[int, int] = (8, 128)
    """Inclusive range of output lengths (uniform); a request finishes after this many sampled tokens."""
    token_budget: int = 512
    """Tokens a step may compute (vLLM's max_num_batched_tokens): running requests first, then new ones;
    a prompt longer than what is left is prefilled in chunks over several steps."""
    max_waiting: int | None = None
    """Queue bound; arrivals beyond it are dropped (counted). None: max_reqs."""
    max_requests: int | None = None
    """Stop admitting arrivals after this many (a finite workload: `run` ends when all are served)."""
    preempt_prob: float = 0.01
    """Chance per step that one running request is evicted: its slot is freed and it later recomputes
    from position 0, possibly in another slot, under the same request id."""
    accept_prob: float = 0.7
    """Chance that each draft is accepted, given the ones before it were (accepted k is 0..proposed)."""
    sampled_mode: bool = False
    """Pass per-request seed and temperature to enqueue (a segment started with --sampled)."""
    engine_work_us: float = 0.0
    """Time the engine spends between enqueue and read_reply (the target forward), per step."""
    engine_work: str = "sleep"
    """How that time is spent: "sleep" (GIL released) or "busy" (a Python loop holding the GIL)."""
    oracle: str = "fast"
    """"fast": drafts recomputed by CRC algebra from the rows' known CRCs; "bytes": by hashing
    regenerated rows with integrity_hash (slow at large rows; the reference the fast one is tested on)."""
    stamp_stride_bytes: int = 4096
    """Distance between the (uid, pos) stamps inside a row (a page: a copy cut at any page boundary
    shows); see dspark_proxy.sim.rows."""
    max_wrong_details: int = 8
    """How many wrong drafts are recorded in detail."""
    uid_base: int = 1
    """The first request id."""

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"SimConfig.{field}: {why}")

        for f in ("max_reqs", "num_spec", "window", "row_bytes", "vocab_size", "token_budget"):
            if int(getattr(self, f)) < 1:
                raise bad(f, f"must be >= 1, got {getattr(self, f)}")
        if self.vocab_size >= 2**31:
            raise bad("vocab_size", "tokens must fit int32")
        for f in ("prompt_len", "output_len"):
            lo, hi = getattr(self, f)
            if not 1 <= lo <= hi:
                raise bad(f, f"need 1 <= lo <= hi, got {(lo, hi)}")
        if self.prompt_len[1] + self.output_len[1] >= 2**31:
            raise bad("prompt_len", "positions must stay below 2**31")
        if not self.arrivals_per_round >= 0:
            raise bad("arrivals_per_round", f"must be >= 0, got {self.arrivals_per_round}")
        for f in ("preempt_prob", "accept_prob"):
            if not 0.0 <= getattr(self, f) <= 1.0:
                raise bad(f, f"must be in [0, 1], got {getattr(self, f)}")
        if self.max_waiting is not None and self.max_waiting < 1:
            raise bad("max_waiting", f"must be >= 1 or None, got {self.max_waiting}")
        if self.max_requests is not None and self.max_requests < 0:
            raise bad("max_requests", f"must be >= 0 or None, got {self.max_requests}")
        if self.engine_work_us < 0:
            raise bad("engine_work_us", f"must be >= 0, got {self.engine_work_us}")
        if self.engine_work not in _WORK:
            raise bad("engine_work", f"must be one of {_WORK}, got {self.engine_work!r}")
        if self.oracle not in _ORACLES:
            raise bad("oracle", f"must be one of {_ORACLES}, got {self.oracle!r}")
        if self.stamp_stride_bytes < 16:
            raise bad("stamp_stride_bytes", f"must be >= 16, got {self.stamp_stride_bytes}")
        if self.uid_base < 0:
            raise bad("uid_base", f"must be >= 0, got {self.uid_base}")

    @property
    def waiting_cap(self) -> int:
        return self.max_reqs if self.max_waiting is None else int(self.max_waiting)

    @classmethod
    def realistic(cls, **overrides: object) -> SimConfig:
        """The realistic shapes of docs/deploy.md: N = 5, W = 128, 71,680-byte rows, a few hundred requests, long
        prompts."""
        base = dict(max_reqs=256, num_spec=5, window=128, row_bytes=71680, prompt_len=(128, 4096),
                    output_len=(64, 1024), token_budget=8192, arrivals_per_round=2.0, preempt_prob=0.002)
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> SimConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
