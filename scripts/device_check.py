"""The GPU check (docs/dspark.md, "Checking it on a GPU"): a greedy speculative loop over the target on
--device, its rows handed to the shim as device tensors (the shim's CUDA rows path on cuda), a real
proxy, and a worker serving a DSpark checkpoint with the `dspark` drafter on the same device. Prints one
JSON line: lossless mismatches (requests whose output differs from target-only greedy decoding), mean
accepted, the engine's wait for a reply (p99) against the deadline, and the drafter's ms a round.

Without --head it serves models/stdlib-llama-dspark when present, else a random-weight DSpark checkpoint
written here in speculators' layout (acceptance then means nothing; losslessness still does).
`--device cpu` is a dry run of the same path on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_proxy.model.dspark_ckpt import read_spec  # noqa: E402
from dspark_proxy.ops.launch import spawn_proxy, spawn_worker  # noqa: E402


def random_head(d: Path, target: Path, taps: list[int], block: int = 5, window: int = 16) -> Path:
    """A random-weight DSpark checkpoint for `target`, in the layout speculators saves (config.json +
    model.safetensors; no embedding, no lm_head for a full draft vocabulary)."""
    from safetensors.torch import save_file

    tc = json.loads((target / "config.json").read_text())
    H, V, hd, heads, kv, inter = tc["hidden_size"], tc["vocab_size"], 32, 4, 2, 2 * tc["hidden_size"]
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return (torch.randn(*s, generator=g) / s[-1] ** 0.5).contiguous()

    t = {"fc.weight": r(H, len(taps) * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H),
         "markov_head.markov_w1.weight": r(V, 16), "markov_head.markov_w2.weight": r(V, 16),
         "confidence_head.proj.weight": r(1, H + 16), "confidence_head.proj.bias": torch.zeros(1)}
    for i in range(1):
        p = f"layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                  p + "self_attn.q_proj.weight": r(heads * hd, H), p + "self_attn.k_proj.weight": r(kv * hd, H),
                  p + "self_attn.v_proj.weight": r(kv * hd, H), p + "self_attn.o_proj.weight": r(H, heads * hd),
                  p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                  p + "mlp.gate_proj.weight": r(inter, H), p + "mlp.up_proj.weight": r(inter, H),
                  p + "mlp.down_proj.weight": r(H, inter)})
    d.mkdir(parents=True, exist_ok=True)
    save_file(t, str(d / "model.safetensors"))
    layer = {"model_type": "qwen3", "hidden_size": H, "intermediate_size": inter, "num_hidden_layers": 1,
             "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "vocab_size": V,
             "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
             "layer_types": ["sliding_attention"], "sliding_window": window, "use_sliding_window": True,
             "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    cfg = {"speculators_model_type": "dspark", "architectures": ["DSparkDraftModel"], "transformer_layer_config": layer,
           "block_size": block, "aux_hidden_state_layer_ids": taps, "draft_vocab_size": V, "mask_token_id": V - 1,
           "target_hidden_size": H, "sample_from_anchor": True, "markov_rank": 16, "markov_head_type": "vanilla",
           "enable_confidence_head": True, "confidence_head_with_markov": True,
           "speculators_config": {"algorithm": "dspark", "verifier": {"name_or_path": str(target)}}}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


class Target:
    """The target on the device, float32, one request at a time (a verification's logits then equal
    target-only decoding's up to the kernels: the lossless check compares like with like)."""

    def __init__(self, path: Path, device: str, taps: list[int], row_dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()
        self.device, self.taps, self.row_dtype = device, taps, row_dtype

    @torch.inference_mode()
    def forward(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([tokens], device=self.device)
        out = self.m(x, output_hidden_states=True)
        rows = torch.cat([out.hidden_states[i][0] for i in self.taps], dim=-1).to(self.row_dtype)
        return out.logits[0].argmax(-1), rows

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(self.forward(seq)[0][-1]))
        return seq[len(prompt):]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--target", default=str(ROOT / "models" / "stdlib-llama"))
    ap.add_argument("--head", default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--deadline-ms", type=float, default=50.0)
    ap.add_argument("--spin-us", type=float, default=20000.0,
                    help="the worker's and the proxy's --spin-us (such a machine has cores to spare: the STEP's "
                         "round trip beyond the worker's time is measured with it); 0: off")
    a = ap.parse_args()
    import engine_shim
    from dspark_proxy.ops.status import read_status

    tmp = Path(tempfile.mkdtemp(prefix="dspark-devcheck-"))
    target = Path(a.target)
    head = Path(a.head) if a.head else ROOT / "models" / "stdlib-llama-dspark"
    if not (head / "config.json").is_file():
        head = random_head(tmp / "head", target, taps=[1, 2, 3])
    spec = read_spec(head)
    N, W, RB = spec.num_spec, spec.window or 16, spec.row_bytes("bfloat16")
    tgt = Target(target, a.device, list(spec.aux_layer_ids), torch.bfloat16)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, spec.vocab_size - 1, 24).tolist() for _ in range(a.n_prompts)]
    name = f"devcheck-{os.getpid()}"
    port = 20000 + os.getpid() % 20000
    lay = ["--max-reqs", str(a.batch), "--num-spec", str(N), "--window", str(W), "--row-bytes", str(RB)]
    spin = ["--spin-us", str(a.spin_us)] if a.spin_us > 0 else []
    t0 = time.monotonic()
    worker = spawn_worker(*lay, "--drafter", "dspark", "--head", str(head), "--target", str(target),
                          "--device", a.device, *spin, listen=f"127.0.0.1:{port}", timeout_s=120.0, stderr=None)
    proxy = None
    res: dict = {"device": a.device, "torch": torch.__version__, "head": str(head), "num_spec": N, "window": W}
    try:
        proxy = spawn_proxy(name, f"127.0.0.1:{port}", *lay, "--deadline-ms", str(a.deadline_ms), "--log-every", "0",
                            *spin)
        shim = engine_shim.attach(name, max_reqs=a.batch, num_spec=N, window=W, row_bytes=RB, timeout_s=30.0)
        waits, accepted, rounds, mismatches, t = [], 0, 0, 0, 0
        for start in range(0, len(prompts), a.batch):
            group = prompts[start:start + a.batch]
            seqs = [list(p) for p in group]
            drafts: list[list[int]] = [[] for _ in group]
            first = [True] * len(group)
            while any(len(s) - len(p) < a.max_new for s, p in zip(seqs, group, strict=True)):
                live = [i for i, (s, p) in enumerate(zip(seqs, group, strict=True)) if len(s) - len(p) < a.max_new]
                valid, first_pos, anchors, kwin, rows, qlen = [], [], [], [], [], []
                for i in live:
                    s, d = seqs[i], drafts[i]
                    pred, h = tgt.forward(s + d)
                    base = len(s) - 1
                    acc = 0
                    while acc < len(d) and int(pred[base + acc]) == d[acc]:
                        acc += 1
                    if d:
                        accepted += acc
                        rounds += 1
                    new = d[:acc] + [int(pred[base + acc])]
                    if first[i]:
                        fp, v = max(0, len(s) - W), min(len(s), W)
                        first[i] = False
                    else:
                        fp, v = base, 1 + acc
                    seqs[i] = s + new
                    valid.append(v)
                    first_pos.append(fp)
                    anchors.append(seqs[i][-1])
                    kwin.append(len(d))
                    qlen.append(len(s) + len(d))
                    rows.append(h[fp:fp + v])
                t += 1
                n = len(live)
                qsl = np.zeros(n + 1, np.int64)
                np.cumsum(qlen, out=qsl[1:])
                shim.enqueue(t, req_ids=np.array([start + i for i in live], np.int64),
                             slots=np.array(live, np.int64), qsl=qsl, need_draft=np.ones(n, bool),
                             k_window=np.minimum(np.array(kwin, np.int64), 255), rows=torch.cat(rows),
                             valid=np.array(valid, np.int64), first_pos=np.array(first_pos, np.int64),
                             anchor=np.array(anchors, np.int64))
                w0 = time.perf_counter()
                r = shim.read_reply(t)
                waits.append((time.perf_counter() - w0) * 1e3)
                for k, i in enumerate(live):
                    drafts[i] = r.draft_ids[k, :int(r.n_drafts[k])].tolist() if r.ok else []
            for s, p in zip(seqs, group, strict=True):
                out = s[len(p):len(p) + a.max_new]
                mismatches += int(out != tgt.greedy(p, a.max_new)[:len(out)])
        lat = read_status(name)["proxy"].get("latency", {})
        shim.close()
        res.update({"lossless_mismatches": mismatches, "mean_accepted": round(accepted / max(1, rounds), 3),
                    "engine_wait_p99_ms": round(float(np.percentile(waits, 99)), 3),
                    "deadline_ms": a.deadline_ms, "rounds": t,
                    "drafter_ms_p50": round(lat.get("worker_us", {}).get("p50_us", 0.0) / 1e3, 3),
                    "proxy_worker_rtt_ms_p50": round(lat.get("rtt_us", {}).get("p50_us", 0.0) / 1e3, 3),
                    "spin_us": a.spin_us,
                    "wall_s": round(time.monotonic() - t0, 1)})
        # the STEP's round trip beyond the worker's own time (p50s; docs/performance.md, "The STEP's round
        # trip beyond the worker's own time")
        res["proxy_worker_gap_ms_p50"] = round(res["proxy_worker_rtt_ms_p50"] - res["drafter_ms_p50"], 3)
    finally:
        if proxy is not None:
            proxy.stop()
        worker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res), flush=True)
    return 0 if res.get("lossless_mismatches", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
