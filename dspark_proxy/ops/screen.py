"""`status --watch`'s screen: each refresh redraws one frame in place, as `watch` and `top` do, instead of
appending a screen to the terminal's scrollback every interval.

On a terminal: the alternate screen (the shell's screen comes back untouched on exit), the cursor
hidden, every frame drawn from the top-left corner with each line cleared to its end and everything
below the frame cleared, lines cut to the terminal's width (a wrapped line would push the frame down)
and the frame to its height. On exit the last frame is printed on the normal screen, so it stays
readable. Not a terminal (a pipe, a file): frames are written one after another, plain.
"""

from __future__ import annotations

import shutil
from typing import TextIO

__all__ = ["Screen"]

_ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
_LEAVE = "\x1b[?25h\x1b[?1049l"  # cursor shown, normal screen
_HOME, _EOL, _EOS = "\x1b[H", "\x1b[K", "\x1b[J"


class Screen:
    """Draws frames to `out`; a context manager (enter: the alternate screen on a terminal)."""

    def __init__(self, out: TextIO, *, tty: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.last = ""
        self._entered = False

    def __enter__(self) -> Screen:
        if self.tty:
            self.out.write(_ENTER)
            self.out.flush()
            self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._entered:
            self.out.write(_LEAVE)
            self._entered = False
            if self.last:
                self.out.write(self.last + "\n")
            self.out.flush()

    def draw(self, text: str) -> None:
        """One frame: in place on a terminal, appended (with a blank line between) elsewhere."""
        self.last = text
        if not self.tty:
            self.out.write(text + "\n\n")
            self.out.flush()
            return
        cols, rows = shutil.get_terminal_size((120, 40))
        lines = [ln[:max(1, cols - 1)] for ln in text.splitlines()][:max(1, rows - 1)]
        self.out.write(_HOME + "".join(ln + _EOL + "\n" for ln in lines) + _EOS)
        self.out.flush()
