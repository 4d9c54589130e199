"""The `--worker` value: one address, several (comma-separated), ``@FILE`` listing them, or
``dns:NAME:PORT`` (every address NAME resolves to, re-resolved every few seconds: pool/dns.py).

A file lists one ``HOST:PORT`` a line (commas also separate; ``#`` starts a comment; blank lines are
skipped). It is re-read on SIGHUP (`PoolClient.reload`): a file that no longer parses is reported and
the pool keeps the workers it has, so a typo never empties a running pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, parse_hostport

__all__ = ["WorkerSpec", "parse_worker_spec", "parse_address_list", "read_address_file"]


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
