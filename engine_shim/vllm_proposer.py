"""`engine_shim.vllm_proposer.DSparkProposer`: the class path users put in vLLM's speculative config
(`--speculative-config '{"method": "custom_class", "model": "engine_shim.vllm_proposer.DSparkProposer",
...}'`, docs/vllm.md, docs/serving.md), so it stays importable here; the proposer itself lives in
`engine_shim/vllm/proposer.py`, with the rest of vLLM's adapter.
"""

from __future__ import annotations

from .vllm.proposer import ENV_HEAD, DSparkProposer, VllmShapes, shapes_from_config

__all__ = ["DSparkProposer", "ENV_HEAD", "VllmShapes", "shapes_from_config"]
