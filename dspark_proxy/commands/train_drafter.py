"""`dspark-proxy train-drafter`: train the `torch` drafter's head for a local HF causal LM (the `model`
extra), save head.safetensors + manifest.json, and report acceptance on held-out text beside
prompt-lookup (n-gram) drafting."""

from __future__ import annotations

import json

import click

__all__ = ["train_drafter"]


def _layers(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        got = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: comma-separated layer numbers, e.g. 1,2,4") from None
    if not got:
        raise click.BadParameter("at least one layer")
    return got


def _seeds(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: comma-separated integers", param_hint="--extra-seeds") from None


@click.command("train-drafter")
@click.option("--target", "target", required=True, type=click.Path(exists=True, file_okay=False),
              help="Local Hugging Face causal-LM directory (e.g. models/stdlib-llama).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Head directory to write.")
@click.option("--layers", default="1,2,4", callback=_layers, show_default=True,
              help="Tapped layers: input of decoder layer i (num_layers = last output, before the final norm).")
@click.option("--row-dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True)
@click.option("--window", default=16, show_default=True, help="W: rows before the anchor the head reads.")
@click.option("--num-spec", default=5, show_default=True, help="N: drafts per anchor.")
@click.option("--d-model", default=192, show_default=True)
@click.option("--heads", "n_heads", default=4, show_default=True)
@click.option("--sequences", default=1200, show_default=True, help="Greedy generations to train on.")
@click.option("--eval-sequences", default=48, show_default=True, help="Held-out generations to measure on.")
@click.option("--prompt-len", default=32, show_default=True)
@click.option("--gen-len", default=96, show_default=True)
@click.option("--epochs", default=4, show_default=True)
@click.option("--batch", default=8, show_default=True)
@click.option("--lr", default=2e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", default=1, show_default=True, help="torch CPU threads.")
@click.option("--draft-vocab", default=1024, show_default=True,
              help="Draft only the ids most frequent in the generations (0: the whole vocabulary).")
@click.option("--distill", default=0.5, show_default=True,
              help="Weight of the target's top-k probabilities in the loss (0: its greedy tokens only).")
@click.option("--init", "init", type=click.Path(exists=True), default=None,
              help="Start from this head's weights (same shapes, or a longer --window), e.g. to train a shipped "
              "head on more text.")
@click.option("--extra-seeds", default="", help="More training sets of --sequences generations, one per "
              "seed (comma-separated), e.g. to add text to a head trained with --seed 0.")
@click.option("--step", type=click.Choice(["markov", "carry"]), default="markov", show_default=True,
              help="The head's sequential step: carry also feeds each draft position the previous one's "
              "state (manifest format /2); a markov --init head starts it.")
@click.option("--hops", type=click.IntRange(1, 2), default=1, show_default=True,
              help="The backbone's looks at the window: 2 adds a second, its query made from the first's "
              "output (manifest format /2); a 1-hop --init head starts it.")
@click.option("--resume", is_flag=True, help="Continue from <out>/.work/checkpoint.pt.")
@click.option("--checkpoint-every", default=500, show_default=True, type=click.IntRange(0),
              help="Steps between checkpoints inside an epoch (0: at each epoch's end only).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object (last line).")
def train_drafter(target: str, out: str, layers: tuple[int, ...], row_dtype: str, window: int, num_spec: int,
                  d_model: int, n_heads: int, sequences: int, eval_sequences: int, prompt_len: int,
                  gen_len: int, epochs: int, batch: int, lr: float, seed: int, threads: int, draft_vocab: int,
                  distill: float, init: str | None, extra_seeds: str, step: str, hops: int, resume: bool, checkpoint_every: int,
                  as_json: bool) -> None:
    """Train a DSpark head on TARGET's own greedy generations of stdlib prompts."""
    try:
        from dspark_proxy.model.train_head import HeadConfig, train_head
    except ImportError as e:
        raise click.ClickException(f"{e}; install the model extra: pip install -e '.[model]'") from None
    cfg = HeadConfig(layers=layers, row_dtype=row_dtype, window=window, num_spec=num_spec, d_model=d_model,
                     n_heads=n_heads, sequences=sequences, eval_sequences=eval_sequences, prompt_len=prompt_len,
                     gen_len=gen_len, epochs=epochs, batch=batch, lr=lr, seed=seed, threads=threads,
                     draft_vocab=draft_vocab, distill=distill, init=init,
                     extra_seeds=_seeds(extra_seeds), step=step, hops=hops,
                     checkpoint_every=checkpoint_every)
    res = train_head(target, out, cfg, resume=resume, log=lambda m: click.echo(m, err=True))
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"head saved to {out}: mean accepted {res['mean_accepted']:.2f} of {num_spec} "
                   f"(n-gram {res['mean_accepted_ngram']:.2f}) over {res['rounds']} held-out rounds")
