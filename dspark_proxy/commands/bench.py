"""`dspark-proxy bench`: the performance case, side by side in one run (see dspark_proxy/bench/)."""

from __future__ import annotations

import json
import time

import click

from .plot_option import plot_option

__all__ = ["bench"]


def _sections(value: str | None) -> list[str] | None:
    from ..bench import OPT_IN, SECTIONS

    if not value:
        return None
    chosen = [s.strip() for s in value.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SECTIONS + OPT_IN]
    if bad:
        raise click.BadParameter(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS + OPT_IN)}",
                                 param_hint="--sections")
    return chosen


@click.command("bench")
@click.option("--quick", is_flag=True, help="Fewer rounds and shapes (CI: well under two minutes).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as one JSON object instead of the table.")
@click.option("--sections", default=None, metavar="LIST",
              help="Comma list of sections to run: handoff,gil,scaling,rows,memory (default: all), and eval "
                   "(only when named: needs the model extra), serve (only when named: needs vLLM; "
                   "docs/performance.md, 'Serving under load').")
@click.option("--plot", "plot_path", default=None, metavar="DIR",
              help="Also draw the figures as PNGs in DIR (created if missing; needs matplotlib, the plot "
                   "extra). A path ending in .png (deprecated) gets the latency panels in one file.")
@click.option("--output", "out_path", default=None, metavar="FILE",
              help="Also write the JSON results to FILE.")
@click.option("--busy", default=0, type=click.IntRange(0, 64), metavar="N",
              help="Start N spinning processes beside the benchmark (a machine shared with other work).")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--name-prefix", default="", metavar="NAME",
              help="Prefix of the shared-memory segment names the benchmark creates (default bench-<pid>).")
def bench(quick: bool, as_json: bool, sections: str | None, plot_path: str | None, out_path: str | None,
          quiet: bool, busy: int, name_prefix: str) -> None:
    """Measure the hand-off, GIL isolation, scaling, rows throughput and memory, with their baselines.

    Every figure is p50 / p99 / p99.9 / max; ratios against each baseline come from the same run. The
    benchmark reports; it asserts nothing about speed."""
    from ..bench import run_bench
    from ..bench.report import format_report

    chosen = _sections(sections)
    if chosen and "serve" in chosen:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise click.UsageError("--sections serve needs vLLM (scripts/setup.sh installs it): docs/performance.md, 'Serving under load'")
    plot_dir, plot_file = plot_option("bench", plot_path, legacy_png=True)
    t0 = time.monotonic()
    say = (lambda msg: None) if quiet else (lambda msg: click.echo(f"[bench] {msg}", err=True))
    results, samples = run_bench(chosen, quick=quick, say=say, prefix=name_prefix, busy=busy)
    results["meta"]["total_s"] = round(time.monotonic() - t0, 2)
    if plot_file:
        from ..bench.plot import plot

        plot(results, samples, plot_file)
        say(f"plot written to {plot_file}")
    elif plot_dir is not None:
        from ..bench.plot import plot_dir as plot_figures

        for path in plot_figures(results, samples, plot_dir):
            say(f"plot written to {path}")
    text = json.dumps(results, default=str)
    if out_path:
        with open(out_path, "w") as f:
            f.write(json.dumps(results, default=str, indent=1) + "\n")
    click.echo(text if as_json else format_report(results))
