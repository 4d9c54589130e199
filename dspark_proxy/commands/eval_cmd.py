"""`dspark-proxy eval`: what the drafts earn in the reference engine (dspark_proxy/spec/evaluate.py):
acceptance, tokens/s against target-only, prompt lookup and thread mode (interleaved, medians),
lossless checks, and faults. Needs the `model` extra."""

from __future__ import annotations

import json

import click

__all__ = ["eval_cmd", "format_eval"]


def format_eval(r: dict) -> str:
    tps = r["tokens_per_s"]
    lines = [
        f"{r['prompts']} held-out prompts x {r['max_new']} tokens, batch {r['max_batch']}, N={r['num_spec']}, "
        f"{r['reps']} interleaved repetitions (medians), {r['elapsed_s']} s",
        f"mean accepted      {r['mean_accepted']:.2f} of {r['num_spec']} (n-gram {r['mean_accepted_ngram']:.2f}); by position "
        f"{r['accept_by_position']} (n-gram {r['accept_by_position_ngram']})",
        f"target forwards    {r['target_forwards_per_token']} per token (n-gram {r['target_forwards_per_token_ngram']})",
        f"tokens/s           target-only {tps['target_only']}, n-gram {tps['ngram']}, proxy {tps['proxy']}, "
        f"thread mode {tps['thread']}",
        f"speed-up           {r['speedup']}x (n-gram {r['speedup_ngram']}x, thread mode {r['speedup_thread']}x)",
        f"per step (p50, ms) target step {r['target_step_ms']}, verification {r['verify_step_ms']}, head "
        f"{r['head_ms']}, round {r['round_ms']} (thread mode {r['round_ms_thread']})",
        f"greedy distinct-4-gram rate {r['greedy_distinct_4gram_rate']}",
        f"lossless mismatches {r['lossless_mismatches']}",
    ]
    for m in r.get("mismatches", []):
        lines.append(f"  MISMATCH {m}")
    for kind, f in r.get("faults", {}).items():
        lines.append(f"fault {kind:13s} output mismatches {f.get('mismatches')} of {f.get('prompts_checked')}; "
                     f"tokens/s before {f.get('tokens_per_s_before')}, during {f.get('tokens_per_s_during')} "
                     f"({f.get('failed_rounds')} failed rounds), after {f.get('tokens_per_s_after')} "
                     f"(good again {f.get('recovered_s_after_fault')} s after the fault)")
    return "\n".join(lines)


@click.command("eval")
@click.option("--quick", is_flag=True, help="16 prompts x 64 tokens, batch 4 (CI-sized; faults included).")
@click.option("--model", default=None, help="Local HF causal-LM directory (default: models/stdlib-llama).")
@click.option("--weights", "head", default=None, help="Head directory (default: models/stdlib-llama-head).")
@click.option("--prompts", type=int, default=None, help="Held-out prompts (default 48; --quick 16).")
@click.option("--max-new", type=int, default=None, help="Tokens per prompt (default 96; --quick 64).")
@click.option("--max-batch", type=int, default=None, help="Requests decoded together (default 8; --quick 4).")
@click.option("--reps", default=3, show_default=True, help="Interleaved repetitions of every arm.")
@click.option("--faults/--no-faults", default=True, show_default=True)
@click.option("--deadline-ms", default=50.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (last line).")
def eval_cmd(quick: bool, model: str | None, head: str | None, prompts: int | None, max_new: int | None,
             max_batch: int | None, reps: int, faults: bool, deadline_ms: float, as_json: bool) -> None:
    """Measure what the head earns: acceptance, speed-up over target-only and n-gram, losslessness, faults."""
    try:
        from ..spec.evaluate import run_eval
        from ..spec.run import DEFAULT_HEAD, DEFAULT_MODEL
    except ImportError as e:
        raise click.ClickException(f"{e}; install the model extra: pip install -e '.[model]'") from None
    r = run_eval(quick=quick, model=model or DEFAULT_MODEL, head=head or DEFAULT_HEAD, prompts=prompts,
                 max_new=max_new, max_batch=max_batch, reps=reps, faults=faults, deadline_ms=deadline_ms,
                 say=lambda m: click.echo(f"[eval] {m}", err=True))
    click.echo(json.dumps(r) if as_json else format_eval(r))
