"""The `--worker` value: one address, several (comma-separated), ``@FILE`` listing them, or
``dns:NAME:PORT`` (every address NAME resolves to, re-resolved every few seconds: pool/dns.py).

A file lists one ``HOST:PORT`` a line (commas also separate; ``#`` starts a comment; blank lines are
skipped). It is re-read on SIGHUP (`PoolClient.reload`): a file that no longer parses is reported and
the pool keeps the workers it has, so a typo never empties a running pool.

`ConfigError` (every bad setting's one error, naming its field) and `parse_hostport` are defined here,
below config.py, because an address list is the lowest place that raises them; config.py re-exports
both, so `dspark_proxy.config.ConfigError` is the name everyone else uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ConfigError", "WorkerSpec", "parse_hostport", "parse_worker_spec", "parse_address_list",
           "read_address_file"]


class ConfigError(ValueError):
    """A setting is invalid. ``field`` names the setting (None for a file-level problem)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def parse_hostport(value: str, *, field: str = "address", allow_port_zero: bool = False) -> tuple[str, int]:
    """Split ``"HOST:PORT"`` (``"[::1]:7470"`` for IPv6) into ``(host, port)``; ConfigError names ``field``.

    Port 0 (let the OS choose) makes sense for a listening socket in tests, never for a peer address,
    hence ``allow_port_zero``.
    """
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{field}: expected HOST:PORT, got {value!r}", field)
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"{field}: expected [IPV6]:PORT, got {value!r}", field)
        port_s = rest[1:]
    else:
        host, sep, port_s = value.rpartition(":")
        if not sep:
            raise ConfigError(f"{field}: expected HOST:PORT, got {value!r} (no port)", field)
        if ":" in host:
            raise ConfigError(f"{field}: an IPv6 host must be bracketed, [HOST]:PORT; got {value!r}", field)
    if not host:
        raise ConfigError(f"{field}: empty host in {value!r}", field)
    try:
        port = int(port_s, 10)
    except ValueError:
        raise ConfigError(f"{field}: port {port_s!r} in {value!r} is not an integer", field) from None
    lo = 0 if allow_port_zero else 1
    if not lo <= port <= 65535:
        raise ConfigError(f"{field}: port {port} in {value!r} must be in [{lo}, 65535]", field)
    return host, port


@dataclass(frozen=True)
class WorkerSpec:
    """The parsed `--worker`: the addresses, and the file they came from (None: given inline)."""

    addresses: tuple[str, ...]
    file: str | None = None
    dns: tuple[str, int] | None = None  # (name, port) of dns:NAME:PORT; addresses then come from it

    @property
    def is_pool(self) -> bool:
        """A pool client (pool/client.py) rather than the plain one: several workers, or a file that a
        reload may grow."""
        return self.file is not None or self.dns is not None or len(self.addresses) > 1


def parse_address_list(text: str, *, field: str = "worker", where: str = "") -> tuple[str, ...]:
    """Addresses from comma- or line-separated text (``#`` comments); each checked, duplicates refused."""
    out: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0]
        for item in line.split(","):
            a = item.strip()
            if not a:
                continue
            try:
                parse_hostport(a, field=field)
            except ConfigError as e:
                at = f"{where}:{lineno}: " if where else ""
                raise ConfigError(f"{at}{e}", field) from None
            if a in out:
                raise ConfigError(f"{field}: {a} is listed twice{' in ' + where if where else ''}", field)
            out.append(a)
    if not out:
        raise ConfigError(f"{field}: no worker address{' in ' + where if where else ''}", field)
    return tuple(out)


def read_address_file(path: str, *, field: str = "worker") -> tuple[str, ...]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{field}: cannot read the worker list {path}: {e.strerror or e}", field) from None
    return parse_address_list(text, field=field, where=path)


def parse_worker_spec(value: str, *, field: str = "worker") -> WorkerSpec:
    """``HOST:PORT``, ``HOST:PORT,HOST:PORT,...`` or ``@FILE``; ConfigError names what is wrong."""
    v = value.strip()
    if v.startswith("dns:"):
        name, sep, port = v[4:].rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{field}={value!r}: dns:NAME:PORT needs a name and a port in 1..65535 "
                              f"(e.g. dns:drafters.default.svc.cluster.local:7470)", field)
        return WorkerSpec((), dns=(name, int(port)))
    if v.startswith("@"):
        path = v[1:].strip()
        if not path:
            raise ConfigError(f"{field}: '@' needs a file name (@FILE lists the workers)", field)
        return WorkerSpec(read_address_file(path, field=field), path)
    return WorkerSpec(parse_address_list(v, field=field))
