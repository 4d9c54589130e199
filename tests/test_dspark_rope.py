"""The dspark drafter's rotary embedding without transformers for the default rope type: the same cos/sin
as transformers' Qwen3 module (what the reference applies), every other type read from that module, and
a worker serving the shipped head that never imports transformers (some 5 s of its start)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from dspark_proxy.worker.drafters.dspark_rope import Rotary, _DefaultRope

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(model_type="qwen3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


def _reference(layer: dict, pos: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = Qwen3Config(**{k: v for k, v in layer.items() if k != "model_type"})
    m = Qwen3RotaryEmbedding(cfg)
    cos, sin = m(torch.empty(0), torch.from_numpy(pos).reshape(1, -1))
    hd = cos.shape[-1]
    sign = torch.cat((-torch.ones(hd // 2), torch.ones(hd // 2)))
    return cos.reshape(*pos.shape, hd), (sin * sign).reshape(*pos.shape, hd)


@pytest.mark.parametrize("layer", [
    dict(BASE, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    dict(BASE, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1000000}),
    dict(BASE, head_dim=8, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                            "full_attention": {"rope_type": "default", "rope_theta": 500.0}}),
], ids=["theta-1e4", "int-theta", "by-layer-type"])
def test_default_rope_without_transformers_equals_its_module(layer):
    rot = Rotary(layer, layer.get("head_dim") or 16, torch.device("cpu"))
    assert isinstance(rot.module, _DefaultRope)
    pos = np.array([[0, 1, 2, 5000], [17, 900, 65535, 70000]], dtype=np.int64)  # past the table too
    flat = layer if "sliding_attention" not in layer["rope_parameters"] else \
        dict(layer, rope_parameters=layer["rope_parameters"]["sliding_attention"])
    cos, sin = rot.cos_sin(pos)
    rc, rs = _reference(flat, pos)
    assert torch.equal(cos, rc) and torch.equal(sin, rs)


@pytest.mark.parametrize("layer", [
    dict(BASE, head_dim=16, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    dict(BASE, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
         rope_scaling={"rope_type": "linear", "factor": 2.0}),  # a legacy field: transformers decides
    dict(BASE, head_dim=16),  # no rope_parameters at all: transformers' defaults
    dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),  # head_dim: Qwen3's 128
], ids=["linear", "legacy-rope-scaling", "unstated", "no-head-dim"])
def test_other_rope_types_are_read_from_transformers(layer):
    rot = Rotary(layer, 16, torch.device("cpu"))
    assert not isinstance(rot.module, _DefaultRope)


def test_worker_with_the_shipped_head_starts_without_transformers():
    code = ("import sys; from dspark_proxy.worker.drafters.registry import make_drafter; "
            "make_drafter('dspark', num_spec=5, window=16, row_bytes=1152, head='models/stdlib-llama-dspark', "
            "target='models/stdlib-llama', row_dtype='bfloat16', device='cpu'); "
            "print('transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False"
