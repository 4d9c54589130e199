"""What the vLLM proposer says about its link to the proxy, and the target it names (docs/serving.md,
"What the log says").

- `target_of`: the target id of vLLM's served model, derived as the reference engine derives it
  (dspark_proxy/model/hf.py `target_id`: the config and weight files of the model's directory), so a
  worker whose head was made for another target refuses the proxy's HELLO, naming the field.
  DSPARK_PROXY_TARGET_ID overrides it (a model too large to hash at every start-up).
- `LinkLog`: one prefixed line when the shim attaches to a proxy, and one when the proxy's worker
  refuses this engine (a mismatch: the field and both values, from the proxy's published snapshot).
  A refusal of the engine's own shapes is the proposer's (or the watchdog's) line at the attach.
- `ensure_visible`: vLLM configures only its own `vllm` logger; our INFO lines would otherwise go
  nowhere and our errors come out unprefixed through logging's last resort.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

__all__ = ["ENV_TARGET", "target_of", "LinkLog", "ensure_visible"]

log = logging.getLogger("engine_shim.vllm_proposer")

ENV_TARGET = "DSPARK_PROXY_TARGET_ID"
LOOK_EVERY_S = 1.0  # how often the engine thread looks at the link (a monotonic read per step otherwise)


def ensure_visible() -> None:
    """Give the engine_shim loggers a handler at INFO when nothing would show them (no handler on the
    way to the root: vLLM's case); never a second one (pytest's caplog, an embedding app's config)."""
    root = logging.getLogger("engine_shim")
    if root.hasHandlers():
        return
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%m-%d %H:%M:%S"))
    root.addHandler(h)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)


def target_of(vllm_config: Any) -> str:
    """The served model's target id ("" when it cannot be derived: logged once, nothing checked)."""
    named = os.environ.get(ENV_TARGET, "").strip()
    if named:
        return named
    mc = vllm_config.model_config
    model = str(getattr(mc, "model", "") or "")
    path = model if os.path.isdir(model) else _hub_snapshot(model, getattr(mc, "revision", None))
    if not path:
        log.warning("[shim] vLLM proposer: the model %r is not a local directory; this engine names no target "
                    "(set %s to the target id its head's manifest names)", model, ENV_TARGET)
        return ""
    try:
        from dspark_proxy.model.hf import target_id

        return target_id(path)
    except (OSError, ValueError) as e:
        log.warning("[shim] vLLM proposer: no target id for %s (%s); this engine names no target", path, e)
        return ""


def _hub_snapshot(repo: str, revision: str | None) -> str:
    """The local snapshot vLLM loaded a hub model from, or "" (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub id, not cached, no huggingface_hub: no target
        return ""


class LinkLog:
    """Looks at the shim's link at most once a second from the engine thread and logs what changed."""

    def __init__(self, name: str, target_id: str) -> None:
        self.name, self.target_id = name, target_id
        self._next = 0.0
        self._incarnation = -1
        self._refusals: set[str] = set()

    def look(self, shim: Any, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next or shim is None:
            return
        self._next = now + LOOK_EVERY_S
        seg = shim.segment if shim.attached else None
        if seg is None:
            return
        inc = int(seg.incarnation)
        if inc != self._incarnation:
            self._incarnation = inc
            log.info("[shim] vLLM proposer: attached to proxy %r (pid %d, incarnation %d), target_id %s",
                     self.name, int(seg.header["owner_pid"]), inc, self.target_id or "(none named)")
        for reason in _worker_refusals(seg):
            if reason not in self._refusals:
                self._refusals.add(reason)
                log.error("[shim] vLLM proposer: the proxy %r's worker refuses this engine (%s); the engine "
                          "runs without its drafts", self.name, reason)


def _worker_refusals(seg: Any) -> list[str]:
    """The reasons of the proxy's refused worker links, from its published snapshot (status.py's source)."""
    raw = seg.read_block("proxy")
    try:
        links = json.loads(raw).get("gauges", {}).get("workers") if raw else None
    except (ValueError, AttributeError):
        return []
    return [f"{w.get('address')}: {w.get('reason')}" for w in links or []
            if isinstance(w, dict) and w.get("state") == "refused"]
