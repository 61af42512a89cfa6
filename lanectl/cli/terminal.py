"""The one rule for text from outside lanectl on its way to a terminal.

Engine logs, webhook bodies, state files, results and path arguments can hold control characters that a
terminal obeys: ESC starts colour changes, cursor moves and OSC sequences (window titles, hyperlinks,
clipboard writes), CR and BS overwrite what was printed before them, C1 codes (U+0080-U+009F) act as ESC
sequences on some terminals, and bidirectional overrides reorder what a reader sees. Any HTTP client can put
such bytes in an engine's log. Every text view therefore prints them escaped (`\\x1b`, `\\u202e`), the way
Python writes them, so the reader sees that they were there and the terminal does nothing.

`TerminalConsole` applies the rule to everything it prints, so no view, note or error message has to
remember it; lanectl's own styles are rich styles, applied after the text is escaped.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

# C0 but tab and newline, DEL, C1; the bidirectional embeddings, overrides and isolates; the Unicode line
# and paragraph separators (a terminal may break the line there); lone surrogates (bytes of an argument or
# file name that were not UTF-8: printed raw, 0x9b is a C1 CSI again).
_OTHERS = "\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_CONTROL = re.compile(f"[\x00-\x08\x0a{_OTHERS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x08{_OTHERS}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape kept it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control character escaped, tab kept; newline kept only when `keep_newlines` (a
    block of lines, a log), else escaped too, so that a field cannot start a line that looks like lanectl's."""
    return (_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL).sub(_escaped, text)


def has_controls(text: str) -> bool:
    return _CONTROL_BUT_NEWLINE.search(text) is not None


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
