"""The one rule for text from outside lanectl on its way to a terminal.

Engine logs, webhook bodies, state files, results and path arguments can hold control characters that a
terminal obeys: ESC starts colour changes, cursor moves and OSC sequences (window titles, hyperlinks,
clipboard writes), CR and BS overwrite what was printed before them, C1 codes (U+0080-U+009F) act as ESC
sequences on some terminals, and bidirectional overrides reorder what a reader sees. Any HTTP client can put
such bytes in an engine's log. Every text view therefore prints them escaped (`\\x1b`, `\\u202e`), the way
Python writes them, so the reader sees that they were there and the terminal does nothing.

The rule itself lives in `lanectl.output`, shared with the release note, which writes the same text into
Markdown and HTML. `TerminalConsole` applies the rule to everything it prints, so no view, note or error
message has to remember it; lanectl's own styles are rich styles, applied after the text is escaped.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from lanectl.output import has_controls, shown

__all__ = ["TerminalConsole", "has_controls", "shown"]


class TerminalConsole(Console):
    """A rich console that prints every string and `Text` with its control characters escaped (newlines
    kept: a printed object may be several lines)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(self._escaped(obj) for obj in objects), **kwargs)

    def _escaped(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return shown(obj, keep_newlines=True)
        if isinstance(obj, Text) and has_controls(obj.plain):
            # Escaping changes lengths, so the styled runs are rebuilt one by one rather than re-offset.
            return Text.assemble(*((shown(seg.text, keep_newlines=True), seg.style or "")
                                   for seg in obj.render(self, end="")),
                                 end=obj.end, no_wrap=obj.no_wrap, overflow=obj.overflow)
        return obj
