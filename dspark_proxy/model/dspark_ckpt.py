"""Reading a DSpark checkpoint as `speculators` 0.9.0 saves it (docs/dspark.md), for the `dspark` drafter.

A checkpoint directory holds `config.json` (`speculators_model_type: "dspark"`, the draft's decoder
layers in `transformer_layer_config`, `block_size`, `aux_hidden_state_layer_ids`, `draft_vocab_size`,
`mask_token_id`, the Markov and confidence heads' switches) and its weights in safetensors. It never
holds the embedding, and holds lm_head only for a reduced draft vocabulary: those come from the target
(`--target`, default `speculators_config.verifier.name_or_path`).

Everything here is checked before the drafter starts; a bad checkpoint or target raises `CheckpointError`
with one line naming the file and the field, so the worker refuses to start having made nothing.
`read_spec` reads only JSON (no torch): the worker's shape defaults come from it (worker_main.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CheckpointError", "DSparkSpec", "read_spec", "resolve_target", "load_tensors", "proxy_shapes",
           "ROW_ITEMSIZE"]

ROW_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}  # the row dtypes the drafter reads
_REQUIRED = ("transformer_layer_config", "block_size", "aux_hidden_state_layer_ids", "draft_vocab_size",
             "mask_token_id")
_LAYER_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
_REPO_ROOT = Path(__file__).resolve().parents[2]


class CheckpointError(ValueError):
    """A checkpoint or target the drafter cannot serve: the message names the file and the field."""


@dataclass(frozen=True)
class DSparkSpec:
    """What the checkpoint's config.json says, with speculators' defaults for the optional fields."""

    head_dir: Path
    layer: dict[str, Any]  # transformer_layer_config, as saved
    block_size: int
    aux_layer_ids: tuple[int, ...]
    draft_vocab_size: int
    vocab_size: int  # the target's (transformer_layer_config.vocab_size)
    mask_token_id: int
    sample_from_anchor: bool
    sliding_window_non_causal: bool
    markov_rank: int
    markov_head_type: str
    enable_confidence_head: bool
    confidence_head_with_markov: bool
    target_hidden_size: int | None
    verifier_path: str | None
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    sliding: tuple[bool, ...]  # per draft layer: sliding attention (with an int sliding_window)
    sliding_window: int | None

    @property
    def num_spec(self) -> int:
        """N: every block position drafts when sample_from_anchor, else the anchor is the bonus token."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def window(self) -> int | None:
        """W when every draft layer uses sliding attention (the rows it ever reads), else None."""
        return self.sliding_window if self.sliding and all(self.sliding) else None

    @property
    def row_width(self) -> int:
        """Values a row: the tapped layers' hidden states, concatenated (fc's input)."""
        return len(self.aux_layer_ids) * self.hidden_size

    def row_bytes(self, row_dtype: str) -> int:
        return self.row_width * ROW_ITEMSIZE[row_dtype]


def _int(cfg: dict, key: str, where: str, *, lo: int = 0) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise CheckpointError(f"{where}: field {key}: expected an integer >= {lo}, got {v!r}")
    return v


def read_spec(head_dir: str | Path) -> DSparkSpec:
    """The checkpoint's config.json, checked (CheckpointError naming the file and the field)."""
    d = Path(head_dir)
    path = d / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file (--head must be a speculators checkpoint directory)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read it as JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    kind = cfg.get("speculators_model_type")
    if kind != "dspark":
        raise CheckpointError(f"{path}: field speculators_model_type: expected 'dspark', got {kind!r}")
    for k in _REQUIRED:
        if cfg.get(k) is None:
            raise CheckpointError(f"{path}: field {k}: missing")
    layer = cfg["transformer_layer_config"]
    if not isinstance(layer, dict):
        raise CheckpointError(f"{path}: field transformer_layer_config: expected an object")
    lw = f"{path}: transformer_layer_config"
    for k in _LAYER_REQUIRED:
        _int(layer, k, lw, lo=1)
    hidden, n_heads = layer["hidden_size"], layer["num_attention_heads"]
    n_kv = _int(layer, "num_key_value_heads", lw, lo=1) if layer.get("num_key_value_heads") is not None else n_heads
    head_dim = layer.get("head_dim") or hidden // n_heads
    if n_heads % n_kv:
        raise CheckpointError(f"{lw}: field num_key_value_heads: {n_kv} does not divide num_attention_heads {n_heads}")
    n_layers = layer["num_hidden_layers"]
    types = layer.get("layer_types") or ["full_attention"] * n_layers
    if len(types) != n_layers:
        raise CheckpointError(f"{lw}: field layer_types: {len(types)} entries for {n_layers} layers")
    sw = layer.get("sliding_window")
    sliding = tuple(t == "sliding_attention" and isinstance(sw, int) and sw > 0 for t in types)
    ids = cfg["aux_hidden_state_layer_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"{path}: field aux_hidden_state_layer_ids: expected a non-empty list of integers, "
                              f"got {ids!r}")
    block = _int(cfg, "block_size", str(path), lo=1)
    sfa = bool(cfg.get("sample_from_anchor", True))
    if not sfa and block < 2:
        raise CheckpointError(f"{path}: field block_size: {block} leaves no draft with sample_from_anchor false")
    head_type = cfg.get("markov_head_type", "vanilla")
    if head_type not in ("vanilla", "gated", "rnn"):
        raise CheckpointError(f"{path}: field markov_head_type: expected vanilla, gated or rnn, got {head_type!r}")
    rank = _int(cfg, "markov_rank", str(path)) if "markov_rank" in cfg else 256
    conf, with_markov = bool(cfg.get("enable_confidence_head", True)), bool(cfg.get("confidence_head_with_markov", True))
    if conf and with_markov and rank == 0:
        raise CheckpointError(f"{path}: field confidence_head_with_markov: true needs markov_rank > 0")
    mask = _int(cfg, "mask_token_id", str(path))
    if isinstance(layer.get("vocab_size"), int) and mask >= layer["vocab_size"]:
        raise CheckpointError(f"{path}: field mask_token_id: {mask} is outside the vocabulary "
                              f"(transformer_layer_config.vocab_size {layer['vocab_size']})")
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    ths = cfg.get("target_hidden_size")
    return DSparkSpec(
        head_dir=d, layer=layer, block_size=block, aux_layer_ids=tuple(ids),
        draft_vocab_size=_int(cfg, "draft_vocab_size", str(path), lo=1), vocab_size=layer["vocab_size"],
        mask_token_id=mask, sample_from_anchor=sfa,
        sliding_window_non_causal=bool(cfg.get("sliding_window_non_causal", False)), markov_rank=rank,
        markov_head_type=head_type, enable_confidence_head=conf, confidence_head_with_markov=with_markov,
        target_hidden_size=ths if isinstance(ths, int) else None, verifier_path=verifier, hidden_size=hidden,
        n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=int(head_dim), sliding=sliding,
        sliding_window=sw if isinstance(sw, int) and sw > 0 else None)


def proxy_shapes(head_dir: str | Path, row_dtype: str = "bfloat16") -> dict[str, int]:
    """num_spec, window and row_bytes a proxy shares with a worker serving this checkpoint (`start
    --shapes-from CKPT_DIR`); a full-attention checkpoint has no window of its own (CheckpointError)."""
    spec = read_spec(head_dir)
    if spec.window is None:
        raise CheckpointError(f"{spec.head_dir / 'config.json'}: field transformer_layer_config.sliding_window: "
                              "its draft layers attend to the whole prefix; give --num-spec, --window and "
                              "--row-bytes instead")
    return {"num_spec": spec.num_spec, "window": spec.window, "row_bytes": spec.row_bytes(row_dtype)}


def resolve_target(spec: DSparkSpec, target: str | None) -> Path:
    """The target directory: `target`, else the checkpoint's verifier path; a relative path is tried
    against the current directory, then the repository's root (where shipped heads name theirs)."""
    name = target or spec.verifier_path
    if not name:
        raise CheckpointError(f"{spec.head_dir / 'config.json'}: field speculators_config.verifier.name_or_path: "
                              "missing; give --target MODEL_DIR")
    p = Path(name)
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, _REPO_ROOT / p]):
        if (cand / "config.json").is_file():
            return cand
    field = "--target" if target else f"{spec.head_dir / 'config.json'}: field speculators_config.verifier.name_or_path"
    raise CheckpointError(f"{field}: {name!r} is not a local model directory with a config.json (give --target "
                          "MODEL_DIR)")


def _safetensors(d: Path) -> list[Path]:
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors file")
    return files


def _read_all(d: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """Every tensor of the checkpoint's safetensors files, and the file each came from."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    src: dict[str, Path] = {}
    for f in _safetensors(d):
        try:
            got = load_file(str(f))
        except Exception as e:  # a corrupt file: say which
            raise CheckpointError(f"{f}: cannot read it as safetensors ({e})") from None
        out.update(got)
        src.update(dict.fromkeys(got, f))
    return out, src


def _target_tensor(d: Path, suffixes: tuple[str, ...]) -> Any | None:
    from safetensors import safe_open

    for f in _safetensors(d):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has no __iter__
                if k.endswith(suffixes):
                    return h.get_tensor(k)
    return None


def _expect(t: dict, src: dict[str, Path], key: str, shape: tuple[int, ...], d: Path) -> Any:
    if key not in t:
        files = sorted({p.name for p in src.values()}) or ["*.safetensors"]
        raise CheckpointError(f"{d / files[0] if len(files) == 1 else d}: tensor {key}: missing")
    got = tuple(t[key].shape)
    if got != shape:
        raise CheckpointError(f"{src[key]}: tensor {key}: shape {list(got)}, expected {list(shape)}")
    return t[key]


def load_tensors(spec: DSparkSpec, target_dir: Path) -> dict[str, Any]:
    """Every tensor the drafter needs, float32 on the CPU, by the checkpoint's names; embed_tokens (and
    lm_head for a full draft vocabulary without one) from the target. Checks every shape."""
    import torch

    tcfg_path = target_dir / "config.json"
    try:
        tcfg = json.loads(tcfg_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{tcfg_path}: cannot read it as JSON ({e})") from None
    tcfg = tcfg.get("text_config", tcfg) if isinstance(tcfg.get("text_config"), dict) else tcfg
    t_hidden = tcfg.get("hidden_size", tcfg.get("n_embd"))
    t_vocab = tcfg.get("vocab_size")
    t_layers = tcfg.get("num_hidden_layers", tcfg.get("n_layer"))
    cpath = spec.head_dir / "config.json"
    want_hidden = spec.target_hidden_size or spec.hidden_size
    if t_hidden != want_hidden:
        raise CheckpointError(f"{tcfg_path}: field hidden_size: target {t_hidden}, checkpoint {cpath} "
                              f"target_hidden_size {want_hidden}")
    if t_vocab != spec.vocab_size:
        raise CheckpointError(f"{tcfg_path}: field vocab_size: target {t_vocab}, checkpoint {cpath} "
                              f"transformer_layer_config.vocab_size {spec.vocab_size}")
    if isinstance(t_layers, int):
        bad = [i for i in spec.aux_layer_ids if not 0 <= i <= t_layers]
        if bad:
            raise CheckpointError(f"{cpath}: field aux_hidden_state_layer_ids: {bad} outside the target's layers "
                                  f"0..{t_layers} ({tcfg_path} num_hidden_layers {t_layers})")
    t, src = _read_all(spec.head_dir)
    where = spec.head_dir
    H, hd, L = spec.hidden_size, spec.head_dim, spec.n_layers
    nq, nkv, inter = spec.n_heads * hd, spec.n_kv_heads * hd, spec.layer["intermediate_size"]
    bias = bool(spec.layer.get("attention_bias", False))
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (H, len(spec.aux_layer_ids) * H),
                                          "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(L):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (nq, H), p + "self_attn.k_proj.weight": (nkv, H),
                       p + "self_attn.v_proj.weight": (nkv, H), p + "self_attn.o_proj.weight": (H, nq),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                       p + "mlp.down_proj.weight": (H, inter)})
        if bias:
            shapes.update({p + "self_attn.q_proj.bias": (nq,), p + "self_attn.k_proj.bias": (nkv,),
                           p + "self_attn.v_proj.bias": (nkv,), p + "self_attn.o_proj.bias": (H,)})
    V, Vd, r = spec.vocab_size, spec.draft_vocab_size, spec.markov_rank
    if r > 0:
        shapes.update({"markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (Vd, r)})
        if spec.markov_head_type == "gated":
            shapes.update({"markov_head.gate_proj.weight": (r, H + r), "markov_head.gate_proj.bias": (r,)})
        elif spec.markov_head_type == "rnn":
            shapes.update({"markov_head.joint_proj.weight": (3 * r, 2 * r + H), "markov_head.joint_proj.bias": (3 * r,)})
    if spec.enable_confidence_head:
        cin = H + (r if spec.confidence_head_with_markov else 0)
        shapes.update({"confidence_head.proj.weight": (1, cin), "confidence_head.proj.bias": (1,)})
    reduced = Vd != V
    if reduced:
        shapes.update({"lm_head.weight": (Vd, H), "d2t": (Vd,)})
    out = {k: _expect(t, src, k, s, where) for k, s in shapes.items()}
    for k, v in out.items():
        if k != "d2t" and not torch.isfinite(v.float()).all():
            raise CheckpointError(f"{src[k]}: tensor {k}: holds non-finite values")
    if reduced:
        d2t = out["d2t"].long()
        ids = torch.arange(Vd) + d2t
        if bool(((ids < 0) | (ids >= V)).any()):
            raise CheckpointError(f"{src['d2t']}: tensor d2t: maps draft ids outside the target vocabulary 0..{V - 1}")
        out["draft_to_target"] = ids
    embed = _target_tensor(target_dir, ("embed_tokens.weight", "wte.weight", "word_embeddings.weight"))
    if embed is None:
        raise CheckpointError(f"{target_dir}: tensor embed_tokens.weight: not in any *.safetensors file")
    if tuple(embed.shape) != (V, H):
        raise CheckpointError(f"{target_dir}: tensor embed_tokens.weight: shape {list(embed.shape)}, expected {[V, H]}")
    out["embed_tokens.weight"] = embed
    if not reduced:
        lm = t.get("lm_head.weight")
        if lm is None:
            lm = _target_tensor(target_dir, ("lm_head.weight",))
            lm = embed if lm is None else lm  # tied embeddings
        if tuple(lm.shape) != (V, H):
            raise CheckpointError(f"{target_dir}: tensor lm_head.weight: shape {list(lm.shape)}, expected {[V, H]}")
        out["lm_head.weight"] = lm
    return {k: (v if k in ("d2t", "draft_to_target") else v.float().contiguous()) for k, v in out.items()}
