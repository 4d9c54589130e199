"""The reference speculative-decoding engine in torch (`dspark-proxy generate`) and its evaluation
(`dspark-proxy eval`): a target with its own KV cache driving `engine_shim` through a real proxy and
worker. Needs the `model` extra; nothing outside this package imports it."""
