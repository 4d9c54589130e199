"""`dspark-proxy eval`: what the drafts earn in the reference engine (dspark_proxy/spec/evaluate.py):
acceptance, tokens/s against target-only, prompt lookup and thread mode (interleaved, medians),
lossless checks, and faults. Needs the `model` extra."""

from __future__ import annotations

import json

import click

from ..aliases import PromptsArg, deprecated_alias, split_prompts
from ..ops.exitcodes import EXIT_USAGE
from .errors import fail
from .plot_option import plot_option

__all__ = ["eval_cmd"]


@click.command("eval")
@click.option("--quick", is_flag=True, help="16 prompts x 64 tokens, batch 4 (CI-sized; faults included).")
@click.option("--target", "model", default=None,
              help="The target: a local HF causal-LM directory (default: models/stdlib-llama).")
@deprecated_alias("--model", "--target", "model")
@click.option("--head", "head", default=None, envvar="DSPARK_PROXY_HEAD", show_envvar=True,
              help="Head directory: our manifest head (served by the worker's torch drafter) or a speculators "
                   "DSpark checkpoint (its dspark drafter) (default: models/stdlib-llama-head).")
@deprecated_alias("--weights", "--head", "head")
@click.option("--prompts", "prompts", type=PromptsArg(), default=None,
              help="A text file of prompts, one a line (default: held-out stdlib prompts).")
@click.option("--n-prompts", type=int, default=None, help="Held-out prompts (default 48; --quick 16).")
@click.option("--max-new", type=int, default=None, help="Tokens per prompt (default 96; --quick 64).")
@click.option("--max-batch", type=int, default=None, help="Requests decoded together (default 8; --quick 4).")
@click.option("--reps", default=3, show_default=True, help="Interleaved repetitions of every arm.")
@click.option("--faults/--no-faults", default=True, show_default=True)
@click.option("--deadline-ms", default=50.0, show_default=True)
@click.option("--min-confidence", type=click.FloatRange(0.0, 1.0), default=None,
              help="Draft-length policy of the head's arms: verify drafts while the product of their "
                   "confidences stays at or above this (0: every draft; default: the engine's).")
@click.option("--keep-awake-ms", type=click.FloatRange(0, 60_000), default=0.0, show_default=True,
              help="The worker's and the proxy's --keep-awake-ms: their CPUs kept out of idle between rounds "
                   "(SCHED_IDLE spinners), so a STEP and its reply wake warm CPUs (docs/performance.md).")
@click.option("--spin-us", type=click.FloatRange(0, 1_000_000), default=0.0, show_default=True,
              help="The worker's and the proxy's --spin-us: each waits for the other's frame polling its "
                   "socket this long before sleeping (docs/performance.md).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (last line).")
@click.option("--plot", "plot_path", default=None, metavar="DIR",
              help="Also draw acceptance by draft position and tokens/s per arm as PNGs in DIR (created if "
                   "missing; needs matplotlib, the plot extra).")
def eval_cmd(quick: bool, model: str | None, head: str | None, prompts: str | int | None, n_prompts: int | None,
             max_new: int | None,
             max_batch: int | None, reps: int, faults: bool, deadline_ms: float, min_confidence: float | None,
             keep_awake_ms: float, spin_us: float, as_json: bool, plot_path: str | None) -> None:
    """Measure what the head earns: acceptance, speed-up over target-only and n-gram, losslessness, faults."""
    plot_dir, _ = plot_option("eval", plot_path)
    try:
        from ..spec.evaluate import MIN_CONFIDENCE, run_eval
        from ..spec.report import format_eval
        from ..spec.run import DEFAULT_HEAD, DEFAULT_MODEL
    except ImportError as e:
        raise click.ClickException(f"{e}; install the model extra: pip install -e '.[model]'") from None
    from ..model.head_shapes import load_head_shapes

    texts, count = split_prompts(prompts, n_prompts)
    try:
        load_head_shapes(head or DEFAULT_HEAD)  # a manifest head or a DSpark checkpoint (docs/dspark.md)
    except ValueError as e:
        fail("eval", str(e), EXIT_USAGE)
    r = run_eval(quick=quick, model=model or DEFAULT_MODEL, head=head or DEFAULT_HEAD, prompts=count,
                 prompt_texts=texts,
                 max_new=max_new, max_batch=max_batch, reps=reps, faults=faults, deadline_ms=deadline_ms,
                 min_confidence=MIN_CONFIDENCE if min_confidence is None else min_confidence,
                 keep_awake_ms=keep_awake_ms, spin_us=spin_us, say=lambda m: click.echo(f"[eval] {m}", err=True))
    if plot_dir is not None:
        from ..spec.plot import plot_eval

        for path in plot_eval(r, plot_dir):
            click.echo(f"[eval] plot written to {path}", err=True)
    click.echo(json.dumps(r) if as_json else format_eval(r))
