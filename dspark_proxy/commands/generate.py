"""`dspark-proxy generate`: the reference speculative-decoding engine (dspark_proxy/spec/): a local HF
causal LM with its KV cache, drafting through a real proxy and worker (`--drafter proxy`, the
default), prompt lookup (`ngram`) or nothing (`none`). Needs the `model` extra."""

from __future__ import annotations

import json

import click

from ..aliases import PromptsArg, deprecated_alias, split_prompts
from ..ops.exitcodes import EXIT_USAGE
from .errors import fail

__all__ = ["generate"]


@click.command("generate")
@click.option("--target", "model", default=None,
              help="The target: a local HF causal-LM directory (default: models/stdlib-llama).")
@deprecated_alias("--model", "--target", "model")
@click.option("--head", "head", default=None, envvar="DSPARK_PROXY_HEAD", show_envvar=True,
              help="The worker's head directory (default: models/stdlib-llama-head); its manifest sets the tap.")
@deprecated_alias("--weights", "--head", "head")
@click.option("--prompt", "prompts", multiple=True, help="A prompt (repeatable). Default: held-out stdlib prompts.")
@click.option("--prompts", "prompts_file", type=PromptsArg(), default=None,
              help="A text file of prompts, one a line (beside any --prompt).")
@click.option("--n-prompts", default=8, show_default=True, help="Held-out prompts when no --prompt is given.")
@click.option("--prompt-len", default=32, show_default=True, help="Tokens of each held-out prompt.")
@click.option("--max-new", default=64, show_default=True, help="Tokens to generate per prompt.")
@click.option("--max-batch", default=4, show_default=True, help="Requests decoded together (others wait).")
@click.option("--drafter", type=click.Choice(["proxy", "ngram", "none"]), default="proxy", show_default=True)
@click.option("--proxy", "proxy_name", default=None,
              help="Attach to this running proxy instead of starting a worker and a proxy here.")
@click.option("--temperature", default=0.0, show_default=True, help="0: greedy; > 0: sampled (rejection sampling).")
@click.option("--seed", default=0, show_default=True)
@click.option("--deadline-ms", default=50.0, show_default=True, help="The round deadline of the proxy started here.")
@click.option("--threads", default=1, show_default=True, help="torch CPU threads of the engine.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Greedy: also decode target-only and count the prompts whose output differs.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (last line).")
def generate(model: str | None, head: str | None, prompts: tuple[str, ...], prompts_file: str | int | None,
             n_prompts: int, prompt_len: int,
             max_new: int, max_batch: int, drafter: str, proxy_name: str | None, temperature: float, seed: int,
             deadline_ms: float, threads: int, check: bool, as_json: bool) -> None:
    """Generate with speculative decoding through dspark-proxy; print the texts and what it took."""
    try:
        import numpy as np

        from ..spec.run import DEFAULT_HEAD, DEFAULT_MODEL, held_out_prompts
        from ..spec.run import generate as run
    except ImportError as e:
        raise click.ClickException(f"{e}; install the model extra: pip install -e '.[model]'") from None
    model, head = model or DEFAULT_MODEL, head or DEFAULT_HEAD
    from ..model.head_shapes import load_head_shapes

    texts, count = split_prompts(prompts_file, None)
    prompts = (*prompts, *(texts or ()))
    n_prompts = count if count is not None else n_prompts
    try:
        man = load_head_shapes(head)  # a head manifest or a DSpark checkpoint: its tap and shapes
    except ValueError as e:
        fail("generate", str(e), EXIT_USAGE)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    ids = [np.asarray(tok(p, add_special_tokens=False)["input_ids"], np.int64) for p in prompts] if prompts \
        else held_out_prompts(tok, n_prompts, prompt_len)
    if any(len(p) == 0 for p in ids):
        raise click.BadParameter("a prompt encodes to no tokens", param_hint="--prompt")
    st, _ = run(ids, model=model, head=head, drafter=drafter, proxy=proxy_name, max_new=max_new,
                max_batch=max_batch, temperature=temperature, seed=seed, deadline_ms=deadline_ms,
                num_spec=man.num_spec, threads=threads)
    out = {"drafter": drafter, "prompts": len(ids), "tokens": st.tokens, "tokens_per_s": round(st.tokens_per_s, 1),
           "steps": st.steps, "mean_accepted": round(st.mean_accepted, 3), "num_spec": man.num_spec,
           "target_forwards_per_token": round(st.request_forwards / max(1, st.tokens), 4),
           "failed_rounds": st.failed_rounds}
    if check and temperature == 0 and drafter != "none":
        ref, _ = run(ids, model=model, head=head, drafter="none", max_new=max_new, max_batch=max_batch,
                     num_spec=man.num_spec, threads=threads)
        out["lossless_mismatches"] = sum(not np.array_equal(st.outputs[i], ref.outputs[i]) for i in ref.outputs)
    if as_json:
        click.echo(json.dumps(out))
        return
    for i in range(len(ids)):
        click.echo(f"--- [{i}] {tok.decode(ids[i])!r}\n{tok.decode(st.outputs[i])}")
    click.echo(" ".join(f"{k}={v}" for k, v in out.items()))
