"""vLLM general plugin entry point (group `vllm.general_plugins`).

vLLM loads general plugins in every one of its processes (front end, engine core, worker), and only
the one that owns the model runner ever drafts. So the plugin attaches nothing: the proposer
(`engine_shim.vllm_proposer.DSparkProposer`, vLLM's `custom_class` method) is built by vLLM in exactly
that process and attaches there, with shapes from vLLM's config (docs/vllm.md).
"""

from __future__ import annotations

import logging
import os

__all__ = ["register"]

log = logging.getLogger(__name__)


def register() -> None:
    """Called by vLLM in each of its processes at start-up. Never raises, never blocks, attaches nothing."""
    if os.environ.get("DSPARK_PROXY"):
        log.debug("[shim] vLLM plugin: DSPARK_PROXY is set; the shim attaches in the model runner's process "
                  "when vLLM runs with speculative_config method 'custom_class', model "
                  "'engine_shim.vllm_proposer.DSparkProposer'")
