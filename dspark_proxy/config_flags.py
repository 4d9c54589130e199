"""The configuration schema on the command line: one click option per field (each also read from
``DSPARK_PROXY_<FIELD>``), an eager ``--config FILE.toml``, and where each value came from.

The schema itself (fields, ranges, defaults, TOML) is config.py's; this module only turns it into
flags and back, so that flags > environment > file > defaults holds for every command alike.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import click
from click.core import ParameterSource

from .aliases import deprecated_alias
from .config import _C, ConfigError, LayoutConfig, Source, _Base, _flag, env_var, load_toml

__all__ = ["build_config", "click_options", "shapes_from"]

_SOURCE_NAMES: dict[ParameterSource, Source] = {
    ParameterSource.COMMANDLINE: "cli",
    ParameterSource.ENVIRONMENT: "env",
    ParameterSource.DEFAULT_MAP: "file",
    ParameterSource.DEFAULT: "default",
}


class _IntList(click.ParamType):
    """A comma list of integers on the command line or in an env var; a list in a TOML file."""

    name = "INT,INT,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, (tuple, list)):
            if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
                return tuple(value)
            self.fail(f"{value!r} is not a list of integers", param, ctx)
        text = str(value).strip()
        try:
            return tuple(int(s.strip(), 10) for s in text.split(",")) if text else ()
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)


def _click_type(tp: Any) -> tuple[Any, bool]:
    """(click type, is_flag) for a field type."""
    args = typing.get_args(tp)
    if type(None) in args:
        (tp,) = (a for a in args if a is not type(None))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return click.Choice([str(a) for a in typing.get_args(tp)], case_sensitive=False), False
    if origin is tuple:
        return _IntList(), False
    if tp is bool:
        return click.BOOL, True
    return {int: click.INT, float: click.FLOAT, str: click.STRING}[tp], False


def _config_callback(cls: type[_Base]) -> Callable[[click.Context, click.Parameter, Any], str | None]:
    def load(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
        if not path:
            return path
        try:
            values = load_toml(path, cls)
        except ConfigError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
        by_name = {p.name: p for p in ctx.command.params}
        for key, value in values.items():
            p = by_name[key]
            try:  # type errors in the file name the file and key, not just the flag
                values[key] = p.type.convert(value, p, ctx)
            except click.BadParameter as e:
                raise click.BadParameter(f"config file {path}: key {key!r}: {e.message}",
                                         ctx=ctx, param=param) from None
        # --shapes-from beats the file whichever of the two eager options click reads first
        ctx.default_map = {**(ctx.default_map or {}), **values, **ctx.meta.get(_SHAPES_KEY, {})}
        return path

    return load


_SHAPES_KEY = "dspark_proxy.shapes_from"


def shapes_from(path: str, flag: str = "--shapes-from") -> dict[str, int]:
    """num_spec, window and row_bytes from a drafter's head manifest (its directory, or manifest.json):
    the shapes proxy, worker and engine must share, read from the one place that fixes them. Errors
    start with `flag PATH` (`start --head`, `worker --shapes-from`)."""
    import os

    from .model.manifest import MANIFEST_NAME, HeadManifest

    p = os.path.join(path, MANIFEST_NAME) if os.path.isdir(path) else path
    if os.path.isdir(path) and not os.path.isfile(p) and os.path.isfile(os.path.join(path, "config.json")):
        from .model.dspark_ckpt import proxy_shapes  # a speculators DSpark checkpoint (JSON only)

        try:
            return proxy_shapes(path)
        except ValueError as e:
            raise ConfigError(f"{flag} {e}", "shapes_from") from None
    if not os.path.isfile(p):
        raise ConfigError(f"{flag} {path}: no {MANIFEST_NAME} there (give a drafter head's directory "
                          f"or its manifest)", "shapes_from")
    try:
        m = HeadManifest.load(p)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{flag} {p}: {e}", "shapes_from") from None
    return {"num_spec": m.num_spec, "window": m.window, "row_bytes": m.row_bytes}


def _shapes_callback(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    if not path:
        return path
    try:
        values = shapes_from(path, param.opts[0])
    except (ConfigError, OSError) as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    ctx.meta[_SHAPES_KEY] = values
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return path


def click_options(cls: type[_Base]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: one click option per field of ``cls`` (``--max-reqs``, ``--sampled/--no-sampled``, Choices
    for Literal fields, comma lists for tuples, each also read from ``DSPARK_PROXY_<FIELD>``) plus an eager
    ``--config FILE.toml``. The command receives every field as a keyword (and ``config``); turn them into a
    config with ``build_config(cls, click.get_current_context())``."""
    hints = typing.get_type_hints(cls)
    opts: list[Callable[[Any], Any]] = [
        click.option("--config", "config", type=click.Path(dir_okay=False), default=None, is_eager=True,
                     expose_value=True, envvar=env_var("config"), show_envvar=True,
                     callback=_config_callback(cls),
                     help="TOML file: top-level keys for every command, "
                          f"[{cls.SECTION}] for this one. Flags and env vars override it."),
    ]
    if issubclass(cls, LayoutConfig) and "head" in {f.name for f in dataclasses.fields(cls)}:
        # the worker: --head serves a head and takes its shapes (worker_main.py); --shapes-from only reads them
        opts.append(click.option("--shapes-from", "shapes_from", type=click.Path(), default=None, is_eager=True,
                                 expose_value=True, envvar=env_var("shapes_from"), show_envvar=True,
                                 callback=_shapes_callback,
                                 help="A drafter head's directory (or its manifest.json): --num-spec, --window "
                                      "and --row-bytes from it. Flags and env vars override it; it overrides "
                                      "--config."))
    elif issubclass(cls, LayoutConfig):
        # start: the head directory is --head (DSPARK_PROXY_HEAD, as the engine's shim reads it), one name
        # for one thing; --shapes-from is its deprecated spelling (aliases.py)
        opts.append(click.option("--head", "shapes_from", type=click.Path(), default=None, is_eager=True,
                                 expose_value=True, envvar=env_var("head"), show_envvar=True,
                                 callback=_shapes_callback,
                                 help="The drafter head's directory (or its manifest.json): --num-spec, --window "
                                      "and --row-bytes from it. Flags and env vars override it; it overrides "
                                      "--config."))
        opts.append(deprecated_alias("--shapes-from", "--head", "shapes_from", envvar=env_var("shapes_from"),
                                     type=click.Path(), is_eager=True, then=_shapes_callback))
    for f in dataclasses.fields(cls):
        if f.name == "config":  # pragma: no cover - a schema bug
            raise TypeError("a config field may not be called 'config'")
        ctype, is_flag = _click_type(hints[f.name])
        decl = f"{_flag(f.name)}/--no-{f.name.replace('_', '-')}" if is_flag else _flag(f.name)
        default = f.default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        env = None if f.metadata.get("flag_only") else env_var(f.name)
        opts.append(click.option(decl, f.name, type=None if is_flag else ctype, default=default,
                                 envvar=env, show_envvar=env is not None, show_default=default is not None
                                 and default != "", help=f.metadata["help"]))
        if f.metadata.get("alias"):  # a deprecated name: works, and says what to use instead (aliases.py)
            old = f.metadata["alias"]
            opts.append(deprecated_alias(_flag(old), _flag(f.name), f.name, envvar=env_var(old), type=ctype))

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


def build_config(cls: type[_C], ctx_or_params: click.Context | Mapping[str, Any]) -> tuple[_C, dict[str, Source]]:
    """Build and validate a ``cls`` from a click context (after ``click_options``) or from a plain mapping.

    Returns ``(cfg, sources)``: ``sources[field]`` is "cli", "env", "file" or "default". From a mapping,
    the keys given count as "cli" and the rest as "default" (no env var or file is consulted). A
    ``ProxyConfig`` comes back ``resolved()``: derived sizes filled, their source "default".

    From a context, an invalid value raises ``click.BadParameter`` naming the option and where the value
    came from (so the CLI prints a usage error, exit code 2); from a mapping, ``ConfigError``.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    if isinstance(ctx_or_params, click.Context):
        ctx = ctx_or_params
        values = {n: ctx.params[n] for n in names if n in ctx.params}
        sources: dict[str, Source] = {}
        for n in names:
            src = ctx.get_parameter_source(n)
            sources[n] = _SOURCE_NAMES.get(src, "cli") if src is not None else "default"
            if sources[n] == "file" and n in ctx.meta.get(_SHAPES_KEY, {}):
                sources[n] = "head"  # from the head's manifest (--head / --shapes-from), not a TOML file
        try:
            cfg = _construct(cls, values)
        except ConfigError as e:
            param = next((p for p in ctx.command.params if p.name == e.field), None)
            raise click.BadParameter(f"{e}; {_origin(ctx, e.field, sources)}", ctx=ctx, param=param) from None
    else:
        unknown = set(ctx_or_params) - set(names) - {"config"}
        if unknown:
            raise ConfigError(f"unknown settings for {cls.__name__}: {', '.join(sorted(unknown))}")
        values = {n: ctx_or_params[n] for n in names if n in ctx_or_params}
        sources = {n: ("cli" if n in values else "default") for n in names}
        cfg = _construct(cls, values)
    return cfg, sources


def _origin(ctx: click.Context, name: str | None, sources: Mapping[str, Source]) -> str:
    """Where the offending value came from, in words, so the user knows which layer to fix."""
    src = sources.get(name or "", "default")
    if src == "cli":
        return "value from the command line"
    if src == "env":
        return f"value from environment variable {env_var(name or '')}"
    if src == "file":
        return f"value from config file {ctx.params.get('config')}"
    if src == "head":
        return f"value from the head's manifest ({ctx.params.get('shapes_from')})"
    return "value is the default (check the settings it depends on)"


def _construct(cls: type[_C], values: dict[str, Any]) -> _C:
    cfg = cls(**values)
    resolved = getattr(cfg, "resolved", None)
    return resolved() if resolved is not None else cfg


