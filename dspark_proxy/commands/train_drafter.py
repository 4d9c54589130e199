"""`dspark-proxy train-drafter`: train a head for a local HF causal LM (the `model` extra) and report
acceptance on held-out text beside prompt-lookup (n-gram) drafting. `--arch head` (the default) trains
the `torch` drafter's head (head.safetensors + manifest.json); `--arch dspark` a DSpark head in
speculators 0.9.0's own checkpoint format, on the user's prompts (`--prompts FILE`; docs/dspark.md)."""

from __future__ import annotations

import json
from pathlib import Path

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


def _prompts(_ctx, _param, value: str | None) -> str | int | None:
    """--prompts FILE; an integer is the deprecated alias of --n-prompts."""
    if value is None:
        return None
    if value.strip().isdigit() and not Path(value).exists():
        click.echo("train-drafter: an integer --prompts is deprecated; use --n-prompts", err=True)
        return int(value)
    if not Path(value).is_file():
        raise click.ClickException(f"--prompts {value}: no such file (one prompt a line, text or JSONL)")
    return value


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
@click.option("--prompt-len", type=click.IntRange(1), default=None,
              help="Tokens of a stdlib prompt (default 32); with --prompts FILE, the most kept, the last ones "
              "(default 256).")
@click.option("--gen-len", default=96, show_default=True)
@click.option("--epochs", default=4, show_default=True)
@click.option("--batch", type=click.IntRange(1), default=None,
              help="Sequences a step (head: 8; dspark: 2).")
@click.option("--lr", type=float, default=None, help="Learning rate (head: 2e-3; dspark: 3e-3).")
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", default=1, show_default=True, help="torch CPU threads.")
@click.option("--draft-vocab", type=click.IntRange(0), default=None,
              help="Draft only the ids most frequent in the generations (0: the whole vocabulary; "
              "default: head 1024, dspark 0).")
@click.option("--distill", default=0.5, show_default=True,
              help="Weight of the target's top-k probabilities in the loss (0: its greedy tokens only).")
@click.option("--init", "init", type=click.Path(exists=True), default=None,
              help="Start from this head's weights (same shapes, or a longer --window), e.g. to train a shipped "
              "head on more text; dspark: a DSpark checkpoint, whose shapes the new head takes.")
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
@click.option("--arch", type=click.Choice(["head", "dspark"]), default="head", show_default=True,
              help="head: the torch drafter's head; dspark: a speculators-format DSpark checkpoint "
              "(needs speculators 0.9.0; docs/dspark.md).")
@click.option("--prompts", "prompts", default=None, callback=_prompts,
              help="dspark: a prompt file, text or JSONL, one prompt a line (default: stdlib prompts). "
              "An integer is the deprecated alias of --n-prompts.")
@click.option("--n-prompts", type=click.IntRange(1), default=None,
              help="Prompts to train on (dspark; default 1200, or all of --prompts); head: --sequences.")
@click.option("--held-share", default=0.1, show_default=True, type=click.FloatRange(0.0, 0.9),
              help="dspark with --prompts: the share of the file's prompts held out to measure on.")
@click.option("--draft-layers", default=1, show_default=True, type=click.IntRange(1), help="dspark: draft layers.")
@click.option("--markov-rank", default=64, show_default=True, type=click.IntRange(0), help="dspark: Markov head rank.")
@click.option("--markov-head", "markov_head", type=click.Choice(["vanilla", "gated", "rnn"]), default="vanilla",
              show_default=True, help="dspark: Markov head type (vLLM 0.32 serves vanilla only).")
@click.option("--anchors", default=0, show_default=True, type=click.IntRange(0),
              help="dspark: anchors a step (the reference's max_anchors); 0: every valid position of the step.")
@click.option("--mask-token-id", default=-1, show_default=True,
              help="dspark: the block's mask token (-1: the tokenizer's pad, else eos).")
@click.option("--loss-fn", type=click.Choice(["kl_div", "ce"]), default="kl_div", show_default=True,
              help="dspark: the reference's loss against the target: its whole distribution (kl_div) or its "
              "greedy token (ce).")
@click.option("--per-position-loss-weight", "position_weight", type=click.Choice(["fixed-exp-decay", "dpace"]),
              default="fixed-exp-decay", show_default=True,
              help="dspark: block position k weighs exp(-k/gamma), or by D-PACE (needs --loss-fn ce).")
@click.option("--decay-gamma", default=4.0, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="dspark: gamma of fixed-exp-decay (larger: later positions weigh more).")
@click.option("--dpace-alpha", default=0.5, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True),
              help="dspark: D-PACE's smoothing constant.")
@click.option("--device", default="cpu", show_default=True, help="dspark: cpu or cuda.")
@click.option("--reference-forward", is_flag=True,
              help="dspark: train with the reference's own dense-mask forward (slow; the default block-local "
              "one equals it, tests/test_dspark_fast.py).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object (last line).")
def train_drafter(target: str, out: str, layers: tuple[int, ...], row_dtype: str, window: int, num_spec: int,
                  d_model: int, n_heads: int, sequences: int, eval_sequences: int, prompt_len: int,
                  gen_len: int, epochs: int, batch: int, lr: float, seed: int, threads: int, draft_vocab: int | None,
                  distill: float, init: str | None, extra_seeds: str, step: str, hops: int, resume: bool, checkpoint_every: int,
                  arch: str, prompts: str | int | None, n_prompts: int | None, held_share: float, draft_layers: int,
                  markov_rank: int, markov_head: str, anchors: int, mask_token_id: int, loss_fn: str,
                  position_weight: str, decay_gamma: float, dpace_alpha: float, device: str,
                  reference_forward: bool, as_json: bool) -> None:
    """Train a head on TARGET's own greedy generations of stdlib prompts (or, --arch dspark, yours)."""
    if isinstance(prompts, int):
        n_prompts, prompts = n_prompts or prompts, None
    lr = lr if lr is not None else (3e-3 if arch == "dspark" else 2e-3)
    prompt_len = prompt_len or (256 if arch == "dspark" and prompts else 32)
    batch = batch or (2 if arch == "dspark" else 8)
    if arch == "dspark":
        _train_dspark(target, out, layers=layers, row_dtype=row_dtype, window=window, num_spec=num_spec,
                      prompts=prompts, n_prompts=n_prompts, held_share=held_share, eval_prompts=eval_sequences,
                      prompt_len=prompt_len, gen_len=gen_len, epochs=epochs, batch=batch, lr=lr, seed=seed,
                      threads=threads, draft_layers=draft_layers, markov_rank=markov_rank, draft_vocab=draft_vocab or 0,
                      markov_head=markov_head, anchors=anchors, mask_token_id=mask_token_id, device=device,
                      loss_fn=loss_fn, position_weight=position_weight, decay_gamma=decay_gamma,
                      dpace_alpha=dpace_alpha,
                      reference_forward=reference_forward, checkpoint_every=checkpoint_every, resume=resume,
                      init=init, as_json=as_json)
        return
    if prompts is not None:
        raise click.ClickException(f"--prompts {prompts}: a prompt file needs --arch dspark")
    if n_prompts:
        sequences = n_prompts
    try:
        from dspark_proxy.model.train_head import HeadConfig, train_head
    except ImportError as e:
        raise click.ClickException(f"{e}; install the model extra: pip install -e '.[model]'") from None
    cfg = HeadConfig(layers=layers, row_dtype=row_dtype, window=window, num_spec=num_spec, d_model=d_model,
                     n_heads=n_heads, sequences=sequences, eval_sequences=eval_sequences, prompt_len=prompt_len,
                     gen_len=gen_len, epochs=epochs, batch=batch, lr=lr, seed=seed, threads=threads,
                     draft_vocab=1024 if draft_vocab is None else draft_vocab, distill=distill, init=init,
                     extra_seeds=_seeds(extra_seeds), step=step, hops=hops,
                     checkpoint_every=checkpoint_every)
    res = train_head(target, out, cfg, resume=resume, log=lambda m: click.echo(m, err=True))
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"head saved to {out}: mean accepted {res['mean_accepted']:.2f} of {num_spec} "
                   f"(n-gram {res['mean_accepted_ngram']:.2f}) over {res['rounds']} held-out rounds")


# --init with --arch dspark: the config fields the head's own shapes set, and the flag for each
_INIT_FLAGS = {"layers": "layers", "window": "window", "num_spec": "num-spec", "draft_layers": "draft-layers",
               "markov_rank": "markov-rank", "markov_head_type": "markov-head", "mask_token_id": "mask-token-id",
               "draft_vocab": "draft-vocab"}


def _init_dspark(init: str, kw: dict) -> None:
    """The --init head's shapes into kw; a flag given on the command line that disagrees is refused."""
    from click.core import ParameterSource

    from ..model.dspark_ckpt import CheckpointError
    from ..model.dspark_train import init_shapes

    try:
        shapes = init_shapes(init)
    except CheckpointError as e:
        raise click.ClickException(f"--init {e}") from None
    ctx = click.get_current_context()
    for field, value in shapes.items():
        value = tuple(value) if field == "layers" else value
        flag = _INIT_FLAGS.get(field)  # draft_heads, intermediate: no flag, always the head's
        if flag and ctx.get_parameter_source(flag.replace("-", "_")) == ParameterSource.COMMANDLINE \
                and kw[field] != value:
            shown = ",".join(map(str, value)) if field == "layers" else value
            raise click.BadParameter(f"{kw[field]!r}, but --init {init} has {shown}", param_hint=f"--{flag}")
        kw[field] = value


def _train_dspark(target: str, out: str, *, prompts: str | None, n_prompts: int | None, as_json: bool,
                  resume: bool, markov_head: str, init: str | None, **kw) -> None:
    """--arch dspark: checks (tap ids, prompt file) before anything is written, then the reference's
    own model and loss (dspark_proxy/model/dspark_train.py)."""
    try:
        import speculators  # noqa: F401  (a test dependency: scripts/setup.sh installs it)

        from ..model.dspark_train import DSparkTrainConfig, train_dspark
        from ..model.prompts import PromptError
        from ..model.taps import TapError
    except ImportError as e:
        raise click.ClickException(f"{e}; --arch dspark needs speculators==0.9.0 (scripts/setup.sh)") from None
    if kw["position_weight"] == "dpace" and kw["loss_fn"] != "ce":  # as the reference's trainer refuses it
        raise click.BadParameter("dpace needs --loss-fn ce", param_hint="--per-position-loss-weight")
    if kw["device"].startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter(f"{kw['device']}: torch sees no CUDA device", param_hint="--device")
    kw["markov_head_type"] = markov_head
    if init:
        _init_dspark(init, kw)
    cfg = DSparkTrainConfig(layers=tuple(kw.pop("layers")), prompts_file=prompts,
                            n_prompts=n_prompts or (0 if prompts else 1200), init=init, **kw)
    try:
        res = train_dspark(target, out, cfg, resume=resume, log=lambda m: click.echo(m, err=True))
    except (TapError, PromptError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"DSpark head saved to {out}: mean accepted {res['mean_accepted']:.2f} of {res['num_spec']} "
                   f"(n-gram {res['mean_accepted_ngram']:.2f}) over {res['rounds']} held-out rounds")
