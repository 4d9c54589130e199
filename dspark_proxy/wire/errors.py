"""The codec's two error classes, after h11.

`LocalProtocolError` means *we* were about to build something illegal: a bug in the caller, raised
loudly. `RemoteProtocolError` means the peer sent bytes we refuse: the receiver counts it (the
`counter` attribute names the stats counter to bump), drops the frame or the connection, and carries
on. Decoding peer data never raises anything else, which is what the fuzz tests hold the codec to.
"""

from __future__ import annotations

__all__ = ["ProtocolError", "LocalProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """Base class: a message that breaks the wire format, with the stats counter it bumps."""

    def __init__(self, msg: str, *, counter: str = "protocol_error") -> None:
        super().__init__(msg)
        self.counter = counter


class LocalProtocolError(ProtocolError):
    """We tried to encode something the format does not allow (a caller bug)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not a valid message: count it and drop the frame or connection."""
