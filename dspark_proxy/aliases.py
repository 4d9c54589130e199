"""Deprecated flag names that still work: one name per thing (docs/operating.md, "Renamed flags").

The head directory is ``--head``, the target model directory ``--target``, a prompt file ``--prompts FILE``
and a count of prompts ``--n-prompts`` on every command. The old spellings (``--weights``, ``--model``, an
integer ``--prompts``) keep working for a while, each printing one line on stderr that names the new
one, so that scripts written against an older release run unchanged and say what to change.

An alias is a hidden click option that writes the new flag's parameter unless that came from a place at
least as explicit: ``--head`` beats ``DSPARK_PROXY_WEIGHTS``, and either beats a default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

__all__ = ["deprecated_alias", "warn_deprecated", "PromptsArg", "split_prompts", "read_prompts_file"]


def warn_deprecated(old: str, new: str, ctx: click.Context | None = None) -> None:
    """The one line a deprecated spelling prints (stderr)."""
    click.echo(f"dspark-proxy: {old} is deprecated: use {new} (same meaning)", err=True)


def deprecated_alias(old: str, new: str, dest: str, *, envvar: str | None = None, type: Any = None,
                     is_eager: bool = False,
                     then: Callable[[click.Context, click.Parameter, Any], Any] | None = None,
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hidden option ``old`` that sets parameter ``dest`` like ``new`` does, with one warning when used
    (on the command line, or through its old environment variable ``envvar``).

    The alias has a parameter of its own (click's parser keys values by parameter name, so two options
    on one name could not be told apart) and writes ``dest`` from its callback, unless ``dest`` already
    came from a place at least as explicit (the new flag beats the old one's environment variable).
    `then` is the new flag's own callback (an eager one's work, such as reading a head's shapes), run
    on the value when the alias wins."""

    def apply(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        src = ctx.get_parameter_source(param.name or "")
        if value is None or src not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            return
        shown = f"{old} ({envvar})" if src is ParameterSource.ENVIRONMENT and envvar else old
        warn_deprecated(shown, new, ctx)
        have = ctx.get_parameter_source(dest)
        if have is not None and dest in ctx.params and have <= src:
            return  # the new name was given too, as explicitly: it wins
        ctx.params[dest] = then(ctx, param, value) if then is not None else value
        ctx.set_parameter_source(dest, src)

    return click.option(old, f"{dest}__{old.lstrip('-').replace('-', '_')}", hidden=True, envvar=envvar,
                        type=type, callback=apply, expose_value=False, is_eager=is_eager)


class PromptsArg(click.ParamType):
    """``--prompts FILE`` (one prompt a line); an integer is the deprecated spelling of ``--n-prompts N``
    (unless a file of that name exists), returned as an int after one warning line."""

    name = "FILE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if text.isdigit() and not os.path.exists(text):
            warn_deprecated(f"--prompts {text} (a count)", f"--n-prompts {text}", ctx)
            return int(text)
        if not os.path.isfile(text):
            self.fail(f"{text}: no such file (give a text file with one prompt a line)", param, ctx)
        return text


def read_prompts_file(path: str) -> list[str]:
    """The non-empty lines of a prompt file; ``click.BadParameter`` names the file if none or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})",
                                 param_hint="--prompts") from None
    if not lines:
        raise click.BadParameter(f"{path}: no prompts in it (one prompt a line)", param_hint="--prompts")
    return lines


def split_prompts(prompts: str | int | None, n_prompts: int | None) -> tuple[list[str] | None, int | None]:
    """(prompt texts from a ``--prompts`` file or None, the count of held-out prompts): a deprecated integer
    ``--prompts`` is the count unless ``--n-prompts`` is given too."""
    if isinstance(prompts, int):
        return None, n_prompts if n_prompts is not None else prompts
    return (read_prompts_file(prompts) if prompts else None), n_prompts
