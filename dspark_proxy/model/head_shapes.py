"""The shapes a head fixes for the engine side, from either kind of head directory (JSON only, no torch).

The engine taps, the proxy sizes its rows and the worker's window from these: the `torch` head's
manifest (manifest.json), or a DSpark checkpoint in speculators' format (config.json with
`speculators_model_type: "dspark"`). For the latter, the tapped layers are its
`aux_hidden_state_layer_ids`, which are exactly our tap ids and vLLM's auxiliary-hidden-state ids (the
input of decoder layer i; i = num_layers: the last layer's output before the final norm); vLLM's own
DSpark model indexes the same states as i - 1 (`target_layer_ids`), an internal offset that changes no
row. A row is those layers' vectors concatenated, each `target_hidden_size` values of the row dtype
(bfloat16: the checkpoint does not name one; docs/dspark.md). N is `block_size` when
`sample_from_anchor`, else `block_size - 1`; W is the draft layers' `sliding_window`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .manifest import MANIFEST_NAME, ROW_DTYPES, HeadManifest, load_head_manifest

__all__ = ["DSparkShapes", "load_head_shapes", "is_dspark_dir", "DSPARK_ROW_DTYPE", "head_drafter", "worker_head_args"]

DSPARK_ROW_DTYPE = "bfloat16"


@dataclass(frozen=True)
class DSparkShapes:
    """What a DSpark checkpoint fixes, under the names HeadManifest uses for the same things."""

    path: str
    tap_layers: list[int]
    hidden: int
    window: int
    num_spec: int
    vocab_size: int
    verifier: str | None
    row_dtype: str = DSPARK_ROW_DTYPE
    kind: str = "dspark"

    @property
    def row_bytes(self) -> int:
        return len(self.tap_layers) * self.hidden * ROW_DTYPES[self.row_dtype]


def is_dspark_dir(path: str | Path) -> bool:
    p = Path(path)
    cfg = p / "config.json" if p.is_dir() else p
    if cfg.name != "config.json" or not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("speculators_model_type") == "dspark"
    except (OSError, ValueError, AttributeError):
        return False


def _dspark(cfg_path: Path) -> DSparkShapes:
    """The shapes of a checkpoint, read and checked by the worker's own reader (dspark_ckpt.read_spec:
    CheckpointError, a ValueError naming the file and the field)."""
    from .dspark_ckpt import read_spec

    s = read_spec(cfg_path.parent)
    return DSparkShapes(path=str(cfg_path.parent), tap_layers=list(s.aux_layer_ids),
                        hidden=int(s.target_hidden_size or s.hidden_size), window=int(s.window or 0),
                        num_spec=int(s.num_spec), vocab_size=int(s.vocab_size), verifier=s.verifier_path)


def load_head_shapes(path: str | Path) -> HeadManifest | DSparkShapes:
    """A head directory (or its manifest.json / config.json) → its shapes; ValueError naming the file
    and the field when they cannot be read."""
    p = Path(path)
    if p.name == "config.json" or (p.is_dir() and not (p / MANIFEST_NAME).is_file() and is_dspark_dir(p)):
        return _dspark(p if p.name == "config.json" else p / "config.json")
    if p.name == MANIFEST_NAME:
        return HeadManifest.load(p)
    return load_head_manifest(p)


def head_drafter(shapes: HeadManifest | DSparkShapes) -> str:
    """The worker drafter that serves a head of these shapes: `dspark` for a speculators DSpark
    checkpoint, `torch` for our manifest head (the name `eval --json` and `demo --engine vllm --json`
    report as `drafter`)."""
    return "dspark" if isinstance(shapes, DSparkShapes) else "torch"


def worker_head_args(head: str | Path, target: str | Path | None = None) -> list[str]:
    """The worker flags that serve the head directory `head`, whichever kind it is: `--drafter torch
    --head DIR` for a manifest head; `--drafter dspark --head DIR --row-dtype D [--target MODEL]` for a
    DSpark checkpoint (its embedding and lm_head come from `target`, by default the checkpoint's
    verifier). Every place that starts a worker for a head (eval, generate, demo --engine vllm) uses
    this, so none can start the wrong drafter. ValueError naming the file and field on a bad head."""
    s = load_head_shapes(head)
    if isinstance(s, DSparkShapes):
        return ["--drafter", "dspark", "--head", s.path, "--row-dtype", s.row_dtype,
                *(["--target", str(target)] if target else [])]
    return ["--drafter", "torch", "--head", str(head)]
