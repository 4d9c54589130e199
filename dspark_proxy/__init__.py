"""dspark-proxy: an out-of-process proxy for remote DSpark speculative drafting."""

__version__ = "0.1.0"
