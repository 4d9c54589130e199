"""vLLM's adapter: the proposer vLLM builds for its `custom_class` speculative method, and what it
needs of vLLM (docs/vllm.md).

- `proposer.py`: `DSparkProposer`, one vLLM step as one round of the shim;
- `step.py`: the mapping from the model runner's state to a round's arrays (numpy, no vLLM);
- `hook.py`: the wrappers of the model runner's private methods, the only code that touches them;
- `link.py`: the target id the engine names, and the log lines about its link to the proxy;
- `probs.py`: the draft probabilities vLLM's rejection sampler takes for sampled requests.

Importing this package imports neither vLLM nor torch (the engine-agnostic shim never needs them);
the modules above do, where they must. The class path users name in their speculative config stays
`engine_shim.vllm_proposer.DSparkProposer` (a re-export of `proposer.DSparkProposer`).
"""
