"""The user's prompts for training a head: a text or JSONL file, one prompt a line.

A head learns what its target says after the prompts it is shown; a head trained on stdlib code and
served on chat accepts little (docs/dspark.md, "Train a head on your own prompts"), so `train-drafter --prompts FILE` trains on the user's own
prompts, through the target's chat template where the tokenizer has one, and measures acceptance on a
held-out split of the same file. The split is by a hash of each prompt's text, so adding lines to the
file never moves an old prompt between train and held-out.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

__all__ = ["PromptError", "read_prompts", "encode_prompts", "split_prompts"]

_TEXT_KEYS = ("prompt", "text", "input", "question")


class PromptError(ValueError):
    """A prompt file that cannot be read (one line: path, line number, what is wrong)."""


def _from_json(path: Path, lineno: int, line: str) -> str | list[dict]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{path}:{lineno}: not JSON ({e.msg})") from None
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        msgs = obj.get("messages")
        if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                   for m in msgs):
            return msgs
        for k in _TEXT_KEYS:
            if isinstance(obj.get(k), str):
                return obj[k]
    raise PromptError(f"{path}:{lineno}: a JSON string or an object with one of {list(_TEXT_KEYS)} "
                      "(a string) or 'messages' (a list of {role, content})")


def read_prompts(path: str | Path) -> list[str | list[dict]]:
    """Prompts from a file: JSONL when it ends in .jsonl/.json or its first prompt line starts with '{'
    (each line a string, {"prompt": ...} / {"text": ...}, or {"messages": [...]}), else plain text, one
    prompt a line. Blank lines are skipped; an empty file is refused."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"{p}: cannot read ({e.__class__.__name__}: {e})") from None
    lines = [(i + 1, ln) for i, ln in enumerate(raw.splitlines()) if ln.strip()]
    if not lines:
        raise PromptError(f"{p}: no prompts (one prompt a line, text or JSONL)")
    as_json = p.suffix in (".jsonl", ".json") or lines[0][1].lstrip().startswith("{")
    if as_json:
        return [_from_json(p, n, ln) for n, ln in lines]
    return [ln for _, ln in lines]


def encode_prompts(tok, prompts: list[str | list[dict]], max_len: int | None = None) -> list[np.ndarray]:
    """Token ids of each prompt: through the chat template where the tokenizer has one (a user turn,
    then the generation prompt), else the plain text; the last max_len tokens when longer."""
    out = []
    template = getattr(tok, "chat_template", None)
    for pr in prompts:
        if template:
            msgs = pr if isinstance(pr, list) else [{"role": "user", "content": pr}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
                ids = ids["input_ids"]
        else:
            text = pr if isinstance(pr, str) else "\n".join(m["content"] for m in pr)
            ids = tok(text, add_special_tokens=True)["input_ids"]
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        if max_len:
            arr = arr[-max_len:]
        out.append(arr)
    return out


def _key(pr: str | list[dict]) -> bytes:
    return (pr if isinstance(pr, str) else json.dumps(pr, sort_keys=True)).encode()


def split_prompts(prompts: list, held_share: float) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a prompt is held out when a hash of its text falls under
    held_share; at least one prompt on each side (two prompts at least)."""
    if len(prompts) < 2:
        raise PromptError(f"{len(prompts)} prompt(s): at least two (one to train on, one held out)")
    u = [int.from_bytes(hashlib.sha256(_key(p)).digest()[:8], "little") / 2 ** 64 for p in prompts]
    held = [i for i in range(len(prompts)) if u[i] < held_share]
    if not held:
        held = [int(np.argmin(u))]
    if len(held) == len(prompts):
        held.remove(int(np.argmax(u)))
    hs = set(held)
    return [i for i in range(len(prompts)) if i not in hs], held
