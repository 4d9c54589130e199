"""The head manifest: what a trained head was made for, checked before it serves (no torch needed).

A head is only right for the target, tap and shapes it was trained on; a head of the right byte size
made for another target or tap drafts garbage without any error. So the manifest records them, and
`check` refuses a mismatch at start, naming the field. Row layout: the tapped layers' vectors
concatenated in `tap_layers` order, each `hidden` values of `row_dtype`, little-endian.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path

__all__ = ["HeadManifest", "ManifestMismatch", "ROW_DTYPES", "MANIFEST_NAME", "WEIGHTS_NAME", "head_paths", "load_head_manifest"]

FORMAT = "dspark-head/1"
# /2 adds `step` ("markov": /1's head; "carry": its sequential step also carries the previous
# position's state) and `hops` (1: /1's backbone; 2: it looks at the window twice). A head that /1
# describes fully is saved as /1, so an older reader still loads it; an older reader refuses a /2 head
# by its format, not by drafting garbage.
FORMATS = {"dspark-head/1": ("markov",), "dspark-head/2": ("markov", "carry")}
MANIFEST_NAME = "manifest.json"
WEIGHTS_NAME = "head.safetensors"
ROW_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


class ManifestMismatch(ValueError):
    """The head's manifest disagrees with the settings it is asked to serve under."""

    def __init__(self, field_name: str, manifest_value, expected) -> None:
        super().__init__(f"head manifest {field_name}={manifest_value!r} but the worker has {expected!r}")
        self.field = field_name


@dataclass
class HeadManifest:
    target_id: str  # dspark_proxy.model.hf.target_id of the target the head was trained on
    target_name: str
    tap_layers: list[int]
    tap_point: str
    hidden: int
    row_dtype: str
    window: int
    num_spec: int
    vocab_size: int
    d_model: int
    n_heads: int
    format: str = ""  # "": the first of FORMATS that describes the head (a loaded manifest keeps its own)
    draft_vocab: int = 0  # output rows (head.safetensors' draft_ids); 0: the whole vocabulary
    training: dict = field(default_factory=dict)
    step: str = "markov"  # the head's sequential step (format /2; FORMATS)
    hops: int = 1  # the backbone's looks at the window (format /2: 1 or 2)

    def __post_init__(self) -> None:
        if not self.format:
            self.format = FORMAT if (self.step, self.hops) == ("markov", 1) else "dspark-head/2"

    @property
    def row_bytes(self) -> int:
        return len(self.tap_layers) * self.hidden * ROW_DTYPES[self.row_dtype]

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"head manifest format {self.format!r}; this version reads {sorted(FORMATS)}")
        if self.step not in FORMATS[self.format]:
            raise ValueError(f"head manifest step={self.step!r}; format {self.format!r} has {FORMATS[self.format]}")
        if self.hops not in ((1,) if self.format == FORMAT else (1, 2)):
            raise ValueError(f"head manifest hops={self.hops!r}; format {self.format!r} has "
                             f"{'1' if self.format == FORMAT else '1 or 2'}")
        if self.row_dtype not in ROW_DTYPES:
            raise ValueError(f"head manifest row_dtype={self.row_dtype!r}; one of {sorted(ROW_DTYPES)}")
        for name in ("hidden", "window", "num_spec", "vocab_size", "d_model", "n_heads"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"head manifest {name}={getattr(self, name)!r} must be positive")
        if not 0 <= int(self.draft_vocab) <= int(self.vocab_size):
            raise ValueError(f"head manifest draft_vocab={self.draft_vocab!r} must be in 0..vocab_size")
        if not self.tap_layers:
            raise ValueError("head manifest tap_layers is empty")

    def check(self, *, row_bytes: int, window: int, num_spec: int, target_id: str | None = None) -> None:
        """Refuse to serve under other shapes (or another target, when one is named)."""
        if self.row_bytes != row_bytes:
            raise ManifestMismatch("row_bytes", self.row_bytes, row_bytes)
        if self.window != window:
            raise ManifestMismatch("window", self.window, window)
        if self.num_spec != num_spec:
            raise ManifestMismatch("num_spec", self.num_spec, num_spec)
        if target_id is not None and self.target_id != target_id:
            raise ManifestMismatch("target_id", self.target_id, target_id)

    def save(self, path: str | Path) -> None:
        d = asdict(self) | {"row_bytes": self.row_bytes}
        if self.format == FORMAT:
            del d["step"], d["hops"]  # /1 has no such fields: an older reader refuses unknown fields
        Path(path).write_text(json.dumps(d, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> HeadManifest:
        """The manifest at `path`. Every problem is one ValueError (OSError: unreadable) naming the file:
        not JSON (with the line and column), not an object, fields missing or unknown, a bad value."""
        text = Path(path).read_text()
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: a head manifest is a JSON object, this is a {type(d).__name__}")
        rb = d.pop("row_bytes", None)
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"{path}: unknown manifest fields {sorted(unknown)}")
        required = [n for n, f in cls.__dataclass_fields__.items()
                    if f.default is MISSING and f.default_factory is MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise ValueError(f"{path}: manifest fields missing: {', '.join(missing)} (is this a head written "
                             f"by train-drafter?)")
        m = cls(**d)
        try:
            m.validate()
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: {e}") from None
        if rb is not None and rb != m.row_bytes:
            raise ValueError(f"{path}: row_bytes={rb} disagrees with tap_layers x hidden x row_dtype = {m.row_bytes}")
        return m


def head_paths(weights: str | Path) -> tuple[Path, Path]:
    """(weights file, manifest) from a head directory or its .safetensors file (manifest beside it).

    A path that does not exist is taken as the directory it most likely names (unless it ends in
    .safetensors), so that an error names `<it>/manifest.json`, not a file in its parent."""
    p = Path(weights)
    if p.is_dir() or (not p.exists() and p.suffix != ".safetensors"):
        return p / WEIGHTS_NAME, p / MANIFEST_NAME
    return p, p.parent / MANIFEST_NAME


def load_head_manifest(head: str | Path) -> HeadManifest:
    """The manifest of a head directory (or of its .safetensors file): one ValueError naming the path when
    the head is missing or its manifest unreadable, for a one-line error at the command line."""
    mpath = head_paths(head)[1]
    if not Path(head).exists():
        raise ValueError(f"head {head}: no such directory (a head directory holds {WEIGHTS_NAME} and "
                         f"{MANIFEST_NAME})")
    try:
        return HeadManifest.load(mpath)
    except OSError as e:
        raise ValueError(f"head {head}: cannot read {mpath} ({e.strerror or e})") from None
