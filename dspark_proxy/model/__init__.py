"""A small real target model and the tools to train a DSpark head for any local HF causal LM.

Modules import torch / transformers only when used (the `model` extra): `corpus` and `manifest` need
neither, so the worker can check a head's manifest without them.
"""
