"""A vLLM proposer that drafts through dspark-proxy: `DSparkProposer`, for vLLM's `custom_class` method.

    LLM(model=TARGET, speculative_config={"method": "custom_class",
        "model": "engine_shim.vllm_proposer.DSparkProposer", "num_speculative_tokens": N})

with `DSPARK_PROXY=<segment name>` (default "dspark") and `DSPARK_PROXY_HEAD=<head dir or manifest>`
in the environment. vLLM builds the proposer in the process that owns the model runner, so this is
the one process that attaches a shim; its shapes come from vLLM's config and the head's manifest
(row = the tapped layers' residual stream x hidden x row dtype, M = max_num_seqs, N =
num_speculative_tokens, W = the manifest's window). Anything that does not fit (an untested vLLM, no
manifest, shapes that disagree with the manifest or the running proxy) is one log line and a
target-only engine: `propose` then returns an empty list for every request. docs/vllm.md has the
mapping from a vLLM step to a round (step.py implements it).

This module is `engine_shim.vllm.proposer`; `engine_shim/vllm_proposer.py` re-exports the class under the
path users name in their speculative config.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, ClassVar

import numpy as np

from dspark_proxy.shm.segment import DEFAULT_NAME

from . import hook
from .link import LinkLog, ensure_visible, target_of
from .step import NO_LIMIT, SlotMap, StepArrays, clip_drafts, plan_step

__all__ = ["DSparkProposer", "ENV_HEAD", "VllmShapes", "shapes_from_config"]

# the logger's name from before the move to engine_shim/vllm/ (a logging config may name it)
log = logging.getLogger("engine_shim.vllm_proposer")

ENV_NAME = "DSPARK_PROXY"
ENV_HEAD = "DSPARK_PROXY_HEAD"
ENV_DEFER = "DSPARK_PROXY_VLLM_DEFER"
ENV_SAMPLED = "DSPARK_PROXY_SAMPLED"
SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy
_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


class VllmShapes:
    """What the engine side needs to know, from vLLM's config and the head manifest."""

    def __init__(self, *, max_reqs: int, num_spec: int, window: int, tap_layers: list[int], hidden: int,
                 row_dtype: str, vocab_size: int, max_model_len: int) -> None:
        self.max_reqs, self.num_spec, self.window = max_reqs, num_spec, window
        self.tap_layers, self.hidden, self.row_dtype = list(tap_layers), hidden, row_dtype
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        from dspark_proxy.model.manifest import ROW_DTYPES

        self.row_bytes = len(self.tap_layers) * hidden * ROW_DTYPES[row_dtype]

    def as_dict(self) -> dict[str, Any]:
        return {"max_reqs": self.max_reqs, "num_spec": self.num_spec, "window": self.window,
                "row_bytes": self.row_bytes, "tap_layers": self.tap_layers, "row_dtype": self.row_dtype}


def shapes_from_config(vllm_config: Any, head: str | os.PathLike | None) -> VllmShapes:
    """The shapes, or ValueError naming what disagrees (the manifest against vLLM's model and N)."""
    from dspark_proxy.model.head_shapes import load_head_shapes

    if not head:
        raise ValueError(f"no head manifest: set {ENV_HEAD} to the drafter's head directory (its "
                         f"manifest.json, or a DSpark checkpoint's config.json, gives the tap layers, the row "
                         f"dtype and the window)")
    m = load_head_shapes(os.fspath(head))
    hf = vllm_config.model_config.hf_config
    no_aux = _no_aux_hidden_states(vllm_config)
    if no_aux:
        raise ValueError(no_aux)
    hidden, layers = int(hf.hidden_size), int(hf.num_hidden_layers)
    n_spec = int(vllm_config.speculative_config.num_speculative_tokens)
    vocab = int(vllm_config.model_config.get_vocab_size())
    if m.hidden != hidden:
        raise ValueError(f"head manifest hidden={m.hidden} but the vLLM model's hidden_size is {hidden}")
    if any(not 0 <= i <= layers for i in m.tap_layers):
        raise ValueError(f"head manifest tap_layers={m.tap_layers}: the vLLM model has {layers} layers")
    if m.num_spec != n_spec:
        raise ValueError(f"head manifest num_spec={m.num_spec} but vLLM's num_speculative_tokens is {n_spec}")
    if m.vocab_size != vocab:
        raise ValueError(f"head manifest vocab_size={m.vocab_size} but the vLLM model's vocabulary is {vocab}")
    return VllmShapes(max_reqs=int(vllm_config.scheduler_config.max_num_seqs), num_spec=n_spec,
                      window=int(m.window), tap_layers=list(m.tap_layers), hidden=hidden, row_dtype=m.row_dtype,
                      vocab_size=vocab, max_model_len=int(vllm_config.model_config.max_model_len))


def _no_aux_hidden_states(vllm_config: Any) -> str | None:
    """Why vLLM's model for this target gives no auxiliary hidden states (the rows are those), or None.
    vLLM gives them only for models that implement its EAGLE-3 interface (Llama, Qwen2/3, Mistral...);
    GPT-2 does not."""
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_eagle3

        mc = vllm_config.model_config
        cls, arch = ModelRegistry.resolve_model_cls(mc.architectures, model_config=mc)
    except Exception:  # noqa: BLE001 - an untested vLLM: bind() still finds out, in one line too
        return None
    if supports_eagle3(cls):
        return None
    return (f"the target's vLLM model {arch} gives no auxiliary hidden states (it does not implement vLLM's "
            "EAGLE-3 interface), so there are no rows to draft from")


def _check_cores() -> None:
    """vLLM's CPU forward runs OpenMP threads that spin between kernels; when they can cover every core
    of the machine, the proxy's round must preempt one, and the spinning team stalls for a time slice
    (measured on 2 vCPUs: 2 threads 4-99 ms per token under load, 1 thread 1.3-2.2 ms). Say so once.
    (vLLM pinned to part of the machine leaves the rest to the proxy: no warning then.)"""
    try:
        import torch

        threads, mine, machine = torch.get_num_threads(), len(os.sched_getaffinity(0)), os.cpu_count() or 1
    except (ImportError, AttributeError, OSError):
        return
    if threads >= mine and mine >= machine:
        log.warning("[shim] vLLM proposer: vLLM's forward runs %d threads and may use all %d CPUs, leaving none "
                    "to the proxy and its round; give the proxy a core of its own (for example "
                    "OMP_NUM_THREADS=%d for vLLM, docs/vllm.md)", threads, machine, max(machine - 1, 1))


class DSparkProposer:
    """vLLM's drafter object (`custom_class`). `active` is False when anything did not fit (logged once):
    then every request gets no drafts. Thread ownership: the model runner's thread."""

    # how hook.py's wrappers know the runner's drafter is one of these (hook.py does not import this module)
    dspark_proxy_drafter: ClassVar[bool] = True
    _handed: tuple[Any, list[str]] | None = None  # the last step's (draft probs, their req ids)

    def __init__(self, vllm_config: Any) -> None:
        ensure_visible()
        self.active = False
        self.bound = False
        self.shim: Any = None
        self.shapes: VllmShapes | None = None
        self._pending: tuple[StepArrays, float, float] | None = None  # begun, not yet finished
        self._t_enq = 0.0
        self._t = 0
        self._errors = 0
        # per-step engine-side time (enqueue, read_reply, the rest of step()) in us, for the demo and bench
        self.timings: list[tuple[float, float, float]] = []
        self.keep_timings = os.environ.get("DSPARK_PROXY_VLLM_TIMINGS", "") == "1"
        # read the reply where vLLM reads the drafts (hook.py), not inside its propose call; "0": at once
        self.deferred = os.environ.get(ENV_DEFER, "1").strip() != "0"
        # verification as vLLM did it: request-steps that verified drafts, and the drafts it accepted
        self.verified_rounds = 0
        self.accepted = 0
        self.drafted_rounds = 0  # request-steps that got at least one draft back
        self.preemptions_seen = 0
        # sampled mode (a proxy started with --sampled): drafts of sampled requests drawn from the head's
        # distribution, which vLLM's rejection sampler is then given (docs/vllm.md, "Sampled requests")
        self.sampled = os.environ.get(ENV_SAMPLED, "").strip() == "1"
        self._sp: dict[str, tuple[float, int]] = {}  # req id -> (temperature, seed), read at admission
        self._probs: Any = None  # probs.DraftProbs
        self.name = os.environ.get(ENV_NAME) or DEFAULT_NAME
        self.target_id = ""
        self.link = LinkLog(self.name, "")
        try:
            self.shapes = shapes_from_config(vllm_config, os.environ.get(ENV_HEAD))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("[shim] vLLM proposer: %s; the engine runs without drafts", e)
            return
        if not hook.install():
            log.error("[shim] vLLM proposer: %s; the engine runs without drafts", hook.why_not())
            return
        s = self.shapes
        self.target_id = target_of(vllm_config)  # a head made for another target is then refused
        self.link = LinkLog(self.name, self.target_id)
        self.slots = SlotMap(s.max_reqs)
        self._rows_buf = None  # the step's rows, grown to the largest step seen
        self._rows_np = np.zeros((0, s.row_bytes), np.uint8)  # its bytes, as enqueue takes them
        self._sel_buf: dict[int, Any] = {}
        self._order: list[int] = []
        self._runner: Any = None  # the step's model runner, for the limits read at admission
        self.active = True
        self._attach()

    def _attach(self) -> None:
        """Attach to the proxy segment (process mode, never blocking): until a proxy with these shapes is
        there, rounds are target-only; a proxy with other shapes is one log line (the watchdog's or ours)."""
        from dspark_proxy.shm.segment import LayoutMismatch

        from ..api import attach

        s = self.shapes
        assert s is not None
        try:
            self.shim = attach(self.name, max_reqs=s.max_reqs, num_spec=s.num_spec, window=s.window,
                               row_bytes=s.row_bytes, target_id=self.target_id, sampled=self.sampled)
        except LayoutMismatch as e:
            log.error("[shim] vLLM proposer: the proxy %r has other shapes (%s); the engine runs without drafts",
                      self.name, e)
            self.active = False
            return
        log.info("[shim] vLLM proposer: shapes %s, target_id %s; drafts once the proxy %r is there", s.as_dict(),
                 self.target_id or "(none named)", self.name)

    # ---------------------------------------------------------------- vLLM's side of the interface

    def load_model(self, model: Any) -> None:
        """vLLM's CPU runner calls this with the target; the tap is set up in `bind` (the runner's hook)."""

    def propose(self, sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        """vLLM's plain custom_class call, reached only when the hook is not installed: no drafts."""
        return [[] for _ in sampled_token_ids]

    def bind(self, runner: Any) -> None:
        """The model is loaded: ask it for the auxiliary hidden states of the tap layers."""
        s = self.shapes
        assert s is not None
        try:
            runner.use_aux_hidden_state_outputs = True
            runner.model.set_aux_hidden_state_layers(tuple(s.tap_layers))
            held = sorted(set(s.tap_layers))  # vLLM returns them in layer order, once each
            self._order = [held.index(i) for i in s.tap_layers]
            self.bound = True
            _check_cores()
            hook.fix_cpu_expand()
        except Exception as e:  # noqa: BLE001 - a model without auxiliary outputs runs without drafts
            runner.use_aux_hidden_state_outputs = False
            log.error("[shim] vLLM proposer: the model cannot output hidden states at layers %s (%s); "
                      "the engine runs without drafts", s.tap_layers, e)

    def step(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]], aux: Any,
             spec_decode_metadata: Any, common_attn_metadata: Any) -> list[list[int]]:
        """One vLLM step as one round: enqueue its rows, read the reply, return the drafts. Never raises."""
        self.begin(runner, scheduler_output, sampled_token_ids, aux, spec_decode_metadata, common_attn_metadata)
        return self.finish()

    def begin(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]], aux: Any,
              spec_decode_metadata: Any, common_attn_metadata: Any) -> list[list[int]]:
        """The step's first half: enqueue its rows and return at once, an empty list per request
        standing in for the drafts until `finish` (hook.py calls it when vLLM reads them, after its
        own bookkeeping of the step, so the proxy's round runs meanwhile). Never raises."""
        if self._pending is not None:
            self.finish()  # vLLM never read the last step's drafts: its round is read and dropped
        n = len(runner.input_batch.req_ids)
        try:
            self._begin(runner, scheduler_output, sampled_token_ids, aux, spec_decode_metadata,
                        common_attn_metadata, n)
        except Exception:  # noqa: BLE001 - the engine must run whatever we do
            self._pending = None
            self._failed()
        return [[] for _ in range(n)]

    @property
    def pending(self) -> bool:
        """A round was enqueued whose drafts vLLM has not read yet."""
        return self._pending is not None

    def finish(self) -> list[list[int]]:
        """The drafts of the step `begin` enqueued (read_reply, then the list vLLM takes); [] when
        none is pending. Never raises."""
        got, self._pending = self._pending, None
        self.link.look(self.shim)  # logs an attach or a refusal, once a second at most
        if got is None:
            return []
        plan, t0, t1 = got
        try:
            return self._finish(plan, t0, t1)
        except Exception:  # noqa: BLE001 - the engine must run whatever we do
            self._failed()
            return [[] for _ in range(int(plan.slots.shape[0]))]

    def _failed(self) -> None:
        self._errors += 1
        if self._errors == 1 or self._errors % 1000 == 0:
            log.exception("[shim] vLLM proposer: step failed (%d so far); this step runs without drafts",
                          self._errors)

    def _begin(self, runner: Any, so: Any, sampled: list[list[int]], aux: Any, sdm: Any, cam: Any,
               n: int) -> None:
        t0 = time.perf_counter()
        s = self.shapes
        assert s is not None
        ib = runner.input_batch
        req_ids = ib.req_ids
        self._runner = runner
        self.slots.release(so.finished_req_ids)
        if self._sp:
            for r in so.finished_req_ids or ():
                self._sp.pop(r, None)
        if so.preempted_req_ids:
            self.preemptions_seen += len(so.preempted_req_ids)
            self.slots.release(so.preempted_req_ids)
        new = getattr(so, "scheduled_new_reqs", None)
        if new:  # a streaming request re-sent with a new prompt and max_tokens keeps its slot
            self.slots.refresh([r.req_id for r in new], self._limit_of)
        slots = self.slots.slots_for(req_ids, self._limit_of)
        if n and slots.min() < 0:
            raise RuntimeError(f"no free slot among max_num_seqs={s.max_reqs} for a request of this step")
        d = np.zeros(n, np.int64) if sdm is None else np.asarray(sdm.num_draft_tokens, dtype=np.int64)
        n_sampled = np.fromiter(map(len, sampled), dtype=np.int64, count=n)
        plan = plan_step(slots=slots, owners=self.slots.owner[slots], qsl=cam.query_start_loc_cpu[:n + 1].numpy(),
                         c0=ib.num_computed_tokens_cpu[:n], d=d,
                         n_sampled=n_sampled,
                         n_tokens=ib.num_tokens_no_spec[:n], token_ids=ib.token_ids_cpu, window=s.window,
                         num_spec=s.num_spec, max_model_len=s.max_model_len, limit=self.slots.limit[slots])
        checked = (d > 0) & (n_sampled > 0)
        self.verified_rounds += int(np.count_nonzero(checked))
        self.accepted += int(n_sampled[checked].sum()) - int(np.count_nonzero(checked))
        rows = self._gather(aux, plan.row_index)
        t1 = time.perf_counter()
        self._enqueue(plan, rows, self._sampling(req_ids, n) if self.sampled else None)
        self._pending = (plan, t0, t1)
        self._step_req_ids = list(req_ids)

    def _limit_of(self, req_id: str) -> int:
        """The request's own end in tokens, prompt + max_tokens (where vLLM stops it: no draft past it);
        read from the runner's request state once per admission. NO_LIMIT when the runner has none."""
        reqs = getattr(self._runner, "requests", None)
        st = reqs.get(req_id) if reqs is not None else None
        max_tokens = getattr(getattr(st, "sampling_params", None), "max_tokens", None)
        if max_tokens is None:
            return NO_LIMIT
        return int(st.num_prompt_tokens) + int(max_tokens)

    def _sampling(self, req_ids: list[str], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sampled, seed, temperature) of the step's requests, from each request's SamplingParams,
        read once per request. A request without a seed gets a random one: the worker's draws are a
        function of (seed, position), so requests sharing a seed would draw the same drafts."""
        temp = np.zeros(n, np.float32)
        seed = np.zeros(n, np.int64)
        reqs = getattr(self._runner, "requests", None)
        for i, r in enumerate(req_ids[:n]):
            got = self._sp.get(r)
            if got is None:
                sp = getattr(reqs.get(r) if reqs is not None else None, "sampling_params", None)
                t = float(getattr(sp, "temperature", 0.0) or 0.0)
                sd = getattr(sp, "seed", None)
                got = self._sp[r] = (t if t >= SAMPLING_EPS else 0.0,
                                     int(sd) & (2**63 - 1) if sd is not None else int.from_bytes(os.urandom(8), "little") >> 1)
            temp[i], seed[i] = got
        return temp > 0, seed, temp

    def draft_probs(self) -> tuple[Any, list[str]] | None:
        """The last step's drafts' probabilities as vLLM's runner keeps them (`_draft_probs` [n, N, V],
        `_draft_prob_req_ids`), or None when no request of the step had drafts drawn from q (vLLM then
        takes each draft as a point mass, right for greedy drafts). probs.py."""
        got, self._handed = self._handed, None
        return got

    def _finish(self, plan: StepArrays, t0: float, t1: float) -> list[list[int]]:
        t2 = time.perf_counter()
        self._reply = None
        draft_ids, n_drafts = self._read()
        t3 = time.perf_counter()
        s = self.shapes
        assert s is not None
        out = clip_drafts(draft_ids, n_drafts, plan.need_draft, plan.max_drafts, s.vocab_size)
        self._handed = None
        reply = getattr(self, "_reply", None)
        if reply is not None and reply.sample_mask is not None and bool(reply.sample_mask.any()):
            from .probs import DraftProbs

            if self._probs is None:
                self._probs = DraftProbs(s.max_reqs, s.num_spec, s.vocab_size)
            probs = self._probs.fill(out, reply.sample_mask, reply.support_ids, reply.proposal_q)
            self._handed = (probs, self._step_req_ids[:len(out)])
        self.drafted_rounds += sum(map(bool, out))
        if self.keep_timings:
            t4 = time.perf_counter()
            # enqueue (to the end of begin), read_reply, the rest of both halves (vLLM's work between
            # them not counted)
            self.timings.append(((self._t_enq - t1) * 1e6, (t3 - t2) * 1e6, (t1 - t0 + t4 - t3) * 1e6))
        return out

    def _enqueue(self, plan: StepArrays, rows: Any, sampling: tuple[np.ndarray, ...] | None = None) -> None:
        """Round t into the shim (a ShimError is logged by the shim: round t is then in flight as failed,
        and read_reply(t) says so). `sampling`: (sampled, seed, temperature), in sampled mode."""
        from ..inputs import ShimError

        t = self._t + 1
        kw = {} if sampling is None else dict(zip(("sampled", "seed", "temperature"), sampling, strict=True))
        try:
            self.shim.enqueue(t, req_ids=plan.owners, slots=plan.slots, qsl=plan.qsl, need_draft=plan.need_draft,
                              k_window=plan.k_window, rows=rows, valid=plan.valid, first_pos=plan.first_pos,
                              anchor=plan.anchor, **kw)
        except ShimError:
            pass
        self._t = t
        self._t_enq = time.perf_counter()

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        """Round t's reply: (draft ids [n, N], n_drafts [n])."""
        reply = self._reply = self.shim.read_reply(self._t)
        return reply.draft_ids, reply.n_drafts

    def _gather(self, aux: Any, index: np.ndarray) -> np.ndarray:
        """The rows of the finalised positions, tapped layers side by side in the manifest's order and
        dtype: [rows, row_bytes] uint8, a view of one buffer reused across steps (the bytes enqueue
        copies, handed over as numpy so the shim does no torch conversion of its own)."""
        import torch

        s = self.shapes
        assert s is not None
        total, H = int(index.shape[0]), s.hidden
        width = len(s.tap_layers) * H
        buf = self._rows_buf
        if buf is None or buf.shape[0] < total:
            buf = self._rows_buf = torch.empty((max(total, 64), width), dtype=getattr(torch, s.row_dtype))
            self._rows_np = buf.view(torch.uint8).numpy()
        if total:
            out = buf[:total]
            idx = torch.from_numpy(index)
            for j, k in enumerate(self._order):
                if aux[k].device.type != "cpu":  # a GPU build: select there, one copy to the host (untested here)
                    out[:, j * H:(j + 1) * H].copy_(torch.index_select(aux[k], 0, idx.to(aux[k].device)))
                    continue
                torch.index_select(aux[k], 0, idx, out=self._sel(k, total, aux[k].dtype))
                out[:, j * H:(j + 1) * H].copy_(self._sel_buf[k][:total])
        return self._rows_np[:total]

    def _sel(self, k: int, total: int, dtype: Any) -> Any:
        """Layer k's selected rows, before the cast: a buffer per tapped layer, grown like the rows'."""
        import torch

        b = self._sel_buf.get(k)
        if b is None or b.shape[0] < total or b.dtype != dtype:
            b = self._sel_buf[k] = torch.empty((max(total, 64), self.shapes.hidden), dtype=dtype)
        return b[:total]

    @property
    def mean_accepted(self) -> float:
        """Drafts vLLM accepted per request-step that verified drafts (the bonus token not counted)."""
        return self.accepted / max(1, self.verified_rounds)

    def close(self) -> None:
        if self._pending is not None:
            self.finish()
        if self.shim is not None:
            self.shim.close()
