"""The one rule for text from outside lanectl on its way to a terminal.

Engine logs, webhook bodies, state files, results and path arguments can hold control characters that a
terminal obeys: ESC starts colour changes, cursor moves and OSC sequences (window titles, hyperlinks,
clipboard writes), CR and BS overwrite what was printed before them, C1 codes (U+0080-U+009F) act as ESC
sequences on some terminals, and bidirectional overrides reorder what a reader sees. Any HTTP client can put
such bytes in an engine's log. Every text view therefore prints them escaped (`\\x1b`, `\\u202e`), the way
Python writes them, so the reader sees that they were there and the terminal does nothing.

The rule itself lives in `lanectl.output`, shared with the release note, which writes the same text into
Markdown and HTML. Both consoles apply the rule to everything they print, so no view, note or error
message has to remember it.

`console()` picks the console for a stream. On a terminal (or where FORCE_COLOR or TTY_COMPATIBLE asks for
one, as rich decides) it is `TerminalConsole`, a rich console: lanectl's styles are rich style names, applied
after the text is escaped. Everywhere else, where rich would print the text without styles anyway (cron, CI
logs, pipes, `$(lanectl status)`), it is `PlainConsole`, which writes the same text without importing rich:
about a tenth of a quick command's start-up (`make bench ONLY=cli_startup`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Protocol

from lanectl.output import has_controls, shown

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from lanectl.output import Span

__all__ = ["Console", "PlainConsole", "console", "has_controls", "shown"]


class Console(Protocol):
    """What lanectl prints through: strings (newlines kept: a block), or lines of parts, each plain text or
    text and its style name (newlines escaped: a part cannot start a line of its own)."""

    @property
    def is_terminal(self) -> bool: ...

    def print(self, *objects: Any, **kwargs: Any) -> None: ...

    def lines(self, lines: Iterable[Sequence[str | Span]]) -> None: ...


def console(*, stderr: bool) -> Console:
    """The console for stdout or stderr as they are now: rich's where it would show styles, else plain."""
    stream = sys.stderr if stderr else sys.stdout
    if _styles_show(stream):
        return _terminal_console(stderr)
    return PlainConsole(stderr=stderr)


def _styles_show(stream: Any) -> bool:
    # rich's own rule (Console.is_terminal), so that the choice never differs from what rich would print.
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _part(part: str | Span) -> str:
    return shown(part if isinstance(part, str) else part[0])


class PlainConsole:
    """Text without styles, escaped, straight to the stream of the moment (sys.stdout or sys.stderr)."""

    is_terminal = False

    def __init__(self, *, stderr: bool = False) -> None:
        self.stderr = stderr

    def _write(self, text: str) -> None:
        stream = sys.stderr if self.stderr else sys.stdout
        stream.write(text)
        stream.flush()

    def print(self, *objects: Any, **_: Any) -> None:
        """Strings only: never parsed as markup (lanectl's own messages hold none)."""
        self._write(shown(" ".join(str(obj) for obj in objects), keep_newlines=True) + "\n")

    def lines(self, lines: Iterable[Sequence[str | Span]]) -> None:
        self._write("".join("".join(_part(part) for part in parts) + "\n" for parts in lines))


def _terminal_console(stderr: bool) -> Console:
    from lanectl.cli.rich_console import TerminalConsole

    return TerminalConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)
