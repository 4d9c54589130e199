"""Sizes that the segment (shm_layout) and the wire (wire/) must agree on: one constant each.

A leaf module: no imports, so the engine side (shm_layout) and the sans-IO wire can both use it
without loading each other.
"""

from __future__ import annotations

__all__ = ["SUPPORT_K"]

# sampled mode: each draft position's top-k support ids and proposal probabilities, in the REPLY
# (the wire's TOP_K) and on the reply page (shm_layout's SUPPORT_K)
SUPPORT_K = 32
